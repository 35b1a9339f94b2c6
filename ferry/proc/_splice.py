"""Zero-copy passthrough for :class:`ferry.proc._sink.Sink`: ``tee(2)`` then ``splice(2)``.

When ferry's own stdout (or stderr) is a pipe, a chunk of the task's output can go to
both destinations without ever entering ferry's memory: ``tee`` duplicates the bytes at
the head of the task's pipe into ferry's pipe (page references, no copy), then
``splice`` moves those same bytes from the task's pipe into the log file (one copy, in
the kernel). The classic path costs three copies (read, write to the log, write to the
pipe); on 1 GiB of output that is most of ferry's CPU.

Python has ``os.splice`` but no ``tee``, so ``tee`` is called through ``ctypes``, which
is imported only once a stream has passed :data:`TEE_AFTER_BYTES` (``ferry run -- true``
and small outputs never pay for it). Anything unusual (no ``tee`` in libc, a log on a
file system that refuses ``splice``) disables the fast path for that stream; the
classic path then does everything, as before.

:func:`start_writeback` (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, also from libc)
lets the disk take a big log while the task still runs, so the fdatasync that must
precede SETTLED has little left to do (1 GiB: ~0.3 s -> ~0.01 s here). It is only a
head start: durability still comes from that fdatasync.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Callable

TEE_AFTER_BYTES = 1 << 20
WRITEBACK_EVERY_BYTES = 32 << 20
SPLICE_F_NONBLOCK = 2  # include/linux/splice.h
SYNC_FILE_RANGE_WRITE = 2  # include/uapi/linux/fs.h: start writeback, do not wait

Tee = Callable[[int, int, int], int]
Writeback = Callable[[int], None]
_tee: Tee | None = None
_writeback: Writeback | None = None
_libc_loaded = False


def available() -> bool:
    return sys.platform == "linux" and hasattr(os, "splice")


def load_tee() -> Tee | None:
    """``tee(src, dst, max_bytes)`` (non-blocking) from libc, or None where it is
    missing. Raises OSError like ``os`` functions do (BlockingIOError for EAGAIN)."""
    _load_libc()
    return _tee


def start_writeback(fd: int) -> None:
    """Start writing the file's dirty pages to disk, without waiting (best effort)."""
    _load_libc()
    if _writeback is not None:
        _writeback(fd)


def _load_libc() -> None:
    global _tee, _writeback, _libc_loaded
    if _libc_loaded:
        return
    _libc_loaded = True
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return
    tee_fn = getattr(libc, "tee", None)
    if tee_fn is not None:
        tee_fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
        tee_fn.restype = ctypes.c_ssize_t

        def tee(src: int, dst: int, max_bytes: int) -> int:
            got = int(tee_fn(src, dst, max_bytes, SPLICE_F_NONBLOCK))
            if got < 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))
            return got

        _tee = tee
    range_fn = getattr(libc, "sync_file_range", None)
    if range_fn is not None:
        range_fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        range_fn.restype = ctypes.c_int

        def writeback(fd: int) -> None:
            range_fn(fd, 0, 0, SYNC_FILE_RANGE_WRITE)  # 0, 0: the whole file

        _writeback = writeback


def unappend(log_fd: int) -> None:
    """``splice`` refuses an O_APPEND target (EINVAL): clear the flag and go to the end.
    The log has one writer (this runner), so appending through the file position keeps
    what O_APPEND promised: earlier attempts' bytes stay in front."""
    flags = fcntl.fcntl(log_fd, fcntl.F_GETFL)
    if flags & os.O_APPEND:
        fcntl.fcntl(log_fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
    os.lseek(log_fd, 0, os.SEEK_END)


def move_to_log(src: int, log_fd: int, n_bytes: int) -> tuple[OSError | None, bool]:
    """Move exactly ``n_bytes`` (already duplicated by ``tee``, so present) from the
    task's pipe into the log. Returns (log error, whether splice worked). If ``splice``
    is refused, the rest is read and written the classic way; if the log itself fails
    (ENOSPC, EIO), the rest is read and dropped so that the pipe stays in step with
    what was echoed, and the error is returned."""
    left = n_bytes
    while left:
        try:
            moved = os.splice(src, log_fd, left)
        except OSError as e:
            if e.errno in _SPLICE_UNSUPPORTED:
                return _copy(src, log_fd, left), False
            _copy(src, None, left)
            return e, True
        if moved == 0:  # cannot happen while tee'd bytes wait in the pipe
            return OSError(errno.EIO, "splice into the log moved nothing"), True
        left -= moved
    return None, True


# A log on a file system (or kernel) that does not splice.
_SPLICE_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV})


def _copy(src: int, log_fd: int | None, n_bytes: int) -> OSError | None:
    """Read ``n_bytes`` from ``src``; write them to ``log_fd`` (None: drop them)."""
    error: OSError | None = None
    while n_bytes > 0:
        try:
            chunk = os.read(src, min(n_bytes, 1 << 20))
        except OSError as e:
            return error or e
        if not chunk:
            return error
        n_bytes -= len(chunk)
        if log_fd is not None and error is None:
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(log_fd, view) :]
            except OSError as e:
                error = e
    return error
