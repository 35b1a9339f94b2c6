"""``--log-max BYTES``: a stream's log keeps the first and the last BYTES/2 of it.

The log stays one file whose offsets are the stream's own (byte N of the stream is at
offset N, as without a cap): the bytes dropped from the middle become a **hole**
(``fallocate(FALLOC_FL_PUNCH_HOLE)``), which takes no disk space. So:

* nothing has to be rewritten at the end, and a kill -9 of the supervisor at any
  moment leaves a log that holds the head and the last bytes written, with at most a
  little more than BYTES on disk (the tail is cut back in steps, and one chunk read
  from the task may be on its way);
* the order index (:mod:`ferry.proc.logorder`), which records stream offsets, needs
  no change, and the splice/tee fast path is simply not used (the dropped bytes are
  read and let go);
* readers skip the hole (``SEEK_DATA``/``SEEK_HOLE``: :mod:`ferry.app.logs`), and can
  say where bytes were dropped and how many.

The hole's edges are file system blocks (``st_blksize``): the head kept runs to the
block boundary after BYTES/2, the tail kept starts at the block boundary before the
last BYTES/2. Every byte outside the hole is a byte of the stream; the hole holds none
(a region is punched only once whole blocks of it are written, and a write that skips
ahead starts on a block boundary, so no block is ever half hole, half zeros that a
reader would take for data). A log is the stream's from its first byte; a run that
appends to an earlier run's log (a task released and run again under one attempt)
caps its own part.

A file system without hole punching (``EOPNOTSUPP``: FAT, some FUSE and network file
systems) cannot do this: from the first refusal on, nothing more is logged (the head
is kept, and what was written before the refusal), and ``error`` says so.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable

PUNCH_STEP_BYTES_MAX = 8 << 20  # the tail is cut back at least every this many bytes
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})

Punch = Callable[[int, int, int], None]
_punch: Punch | None = None


def _load_punch() -> Punch | None:
    """``punch(fd, offset, length)``: ``fallocate`` with PUNCH_HOLE | KEEP_SIZE (from
    libc: Python's ``os.posix_fallocate`` takes no mode), or None where it is missing."""
    global _punch
    if _punch is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fallocate = libc.fallocate
        except (ImportError, OSError, AttributeError):
            return None
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        fallocate.restype = ctypes.c_int

        def punch(fd: int, offset: int, length: int) -> None:
            mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
            if fallocate(fd, mode, offset, length) != 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))

        _punch = punch
    return _punch


def _down(offset: int, block: int) -> int:
    return offset - offset % block


def _up(offset: int, block: int) -> int:
    return _down(offset + block - 1, block)


def write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


class LogCap:
    """Writes one stream to its log ``fd`` (opened for appending; this takes over its
    position), keeping the head and the tail of ``bytes_max`` bytes. ``dropped``: the
    bytes of the stream not kept so far. Raises OSError as ``os.write`` does (a hole
    that cannot be punched for another reason than lack of support too)."""

    def __init__(self, fd: int, bytes_max: int) -> None:
        self.fd = fd
        # A punch deallocates whole blocks only (it zeroes the rest, which a reader would
        # take for data): the larger of the file system's block and its preferred I/O.
        self.block = max(512, os.fstat(fd).st_blksize, os.fstatvfs(fd).f_frsize)
        base = os.lseek(fd, 0, os.SEEK_END)
        # The writes that skip ahead need their own offsets: O_APPEND would ignore them.
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
        head = bytes_max // 2
        self.tail_bytes = bytes_max - head
        self.keep_to = _up(base + head, self.block)  # the head: up to here
        self.hole_end = self.keep_to  # dropped so far: [keep_to, hole_end)
        self.pos = base  # the stream's end
        step = min(self.tail_bytes // 4, PUNCH_STEP_BYTES_MAX)
        self.step = max(self.block, _down(step, self.block))
        self.error: str | None = None  # the file system cannot drop bytes: see the module
        self._probe()

    def _probe(self) -> None:
        """Can this file system punch holes? Asked past the file's end, where a punch
        changes nothing: a file system without it refuses whatever the range."""
        punch = _load_punch()
        try:
            if punch is None:
                raise OSError(errno.ENOSYS, "fallocate is not available")
            punch(self.fd, self.keep_to + (1 << 30), self.block)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            self.error = (
                f"the log's file system cannot drop bytes from the middle of a file ({e}):"
                " with --log-max, only the log's head is kept"
            )

    @property
    def dropped(self) -> int:
        if self.error is not None:
            return max(0, self.pos - self.keep_to)
        return max(0, self.hole_end - self.keep_to)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        start, end = self.pos, self.pos + len(view)
        self.pos = end
        if self.error is not None:  # (the head is all this log keeps)
            if start < self.keep_to:
                write_all(self.fd, view[: min(end, self.keep_to) - start])
            return
        want = _down(end - self.tail_bytes, self.block)  # all before it is dropped
        if want - self.hole_end < self.step:
            write_all(self.fd, view)
            return
        # This chunk's bytes from `skip` to `want` will never be kept: not written at
        # all. What is written first ends on a block boundary (the head's end, or the
        # block the file ended in), so that the skipped part is a hole, not zeros.
        skip = min(end, max(self.keep_to, _up(start, self.block)))
        write_all(self.fd, view[: skip - start])
        if want > skip:
            os.lseek(self.fd, want, os.SEEK_SET)
            write_all(self.fd, view[want - start :])
        else:
            write_all(self.fd, view[skip - start :])
        self._cut(want)

    def finish(self) -> None:
        """The stream ended: the tail is cut to its last ``tail_bytes`` (whole blocks)."""
        if self.error is None:
            want = _down(self.pos - self.tail_bytes, self.block)
            if want > self.hole_end:
                self._cut(want)

    def _cut(self, want: int) -> None:
        """Punch [hole_end, want): whole blocks, below the file's end, written before
        or skipped (a crash before this leaves those bytes: more than the cap, never
        less than the head and the last bytes written)."""
        punch = _load_punch()
        assert punch is not None  # (the probe found it)
        punch(self.fd, self.hole_end, want - self.hole_end)
        self.hole_end = want
