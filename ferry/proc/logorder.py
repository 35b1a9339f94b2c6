"""The order in which a task's stdout and stderr reached their logs: a small index beside them.

Each stream has its own log (``<attempt>.stdout``, ``<attempt>.stderr``), so the logs
alone cannot say whether a line of stderr came before or after a line of stdout. The
supervisor also appends to ``<attempt>.order``, one 16-byte entry each time the stream
it logs changes: *this stream's bytes up to this offset come before anything logged
after this entry*. So a task that writes only one stream, or writes the other only at
its end, gets no index at all, or one entry; what it costs is one small ``write`` per
switch between the streams, no fsync (the index is fdatasynced with the logs, before
SETTLED).

An entry: the stream (1 byte: 0 stdout, 1 stderr), 3 zero bytes, the stream's end
offset in its log (unsigned 64-bit, little-endian), a CRC-32 of those 12 bytes.

Why this is enough, through crashes (the reader is :mod:`ferry.app.logs`):

* The entry for a stream's run is written *before* the first byte of the next run of
  the other stream is logged. So whatever point a kill -9 stops the supervisor at, the
  bytes past the last entries belong to one stream only (the run being logged), and
  they come after everything the index orders: shown last, nothing lost, nothing out
  of order. A reader that takes the logs' sizes *before* reading the index sees the
  same thing while the task runs (``logs -f``).
* A torn entry (a power cut; a disk that filled mid-write) is a short tail, ignored; an
  entry whose CRC is wrong (zeros a power cut left, a flipped bit) is skipped. The
  offsets are absolute, so a skipped entry only merges two runs. A writer that finds
  the index not a whole number of entries long pads it first, so that later entries
  stay aligned.
* Entries may name bytes the log lost (a power cut before the fdatasync): the reader
  takes each offset as at most the log's size.
* A log that already holds bytes when a run starts (a task released and run again
  under the same attempt appends to its logs): before its first byte, the run records
  where both logs end, so the earlier run's bytes come first.
* The index could not be written (disk full): from then on no entry is added, the
  logs still get every byte, and the reader shows what follows the last entry one
  stream after the other (stdout first), as it shows logs written before this index
  existed. Order is lost there, never bytes.

What it cannot know: the supervisor reads two pipes, in the order in which they became
readable. Writes of the task to both streams that land within one wake-up of the
supervisor (microseconds: a shell's ``echo a; echo b >&2``) are logged in the order
it reads them: each stream's bytes in their order, the stream that became readable
first first. No capture through two pipes can do better; writes further apart than
that are kept in the order the task made them.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator, Sequence

from ferry.failpoints import failpoint
from ferry.proc._outputs import LogFile, open_private

STDOUT, STDERR = 0, 1
_HEAD = struct.Struct("<B3xQ")
ENTRY_BYTES = _HEAD.size + 4  # 16: an entry never straddles a page


def order_path(stdout_log: str) -> str:
    """``logs/<id>/<attempt>.order`` beside ``<attempt>.stdout``."""
    return os.path.splitext(stdout_log)[0] + ".order"


def pack(stream: int, end: int) -> bytes:
    head = _HEAD.pack(stream, end)
    return head + struct.pack("<I", zlib.crc32(head))


def unpack(data: bytes) -> Iterator[tuple[int, int]]:
    """The sound entries of ``data`` (read from an entry boundary), in order: a
    partial last entry is ignored, an entry whose CRC or stream is wrong skipped."""
    whole = len(data) - len(data) % ENTRY_BYTES
    for start in range(0, whole, ENTRY_BYTES):
        head = data[start : start + _HEAD.size]
        (crc,) = struct.unpack_from("<I", data, start + _HEAD.size)
        if zlib.crc32(head) != crc:
            continue
        stream, end = _HEAD.unpack(head)
        if stream in (STDOUT, STDERR):
            yield stream, end


class OrderWriter:
    """The supervisor's side: :meth:`before_chunk` before each chunk is logged.

    ``logs`` are the two logs (opened ``O_APPEND`` at their first byte: after a write,
    the position is the log's end). Never raises: an index it cannot write is given up
    (``error`` says why), the logs go on.
    """

    def __init__(self, path: str, logs: Sequence[LogFile]) -> None:
        self.path = path
        self.logs = tuple(logs)
        self.current: int | None = None  # the stream logged last
        self.fd: int | None = None
        self.created = False  # this run made the file (its directory entry needs a sync)
        self.wrote = False
        self.error: str | None = None
        # A re-run's logs hold an earlier run's bytes: they go before this run's.
        self._earlier = [
            (stream, log.size_at_start)
            for stream, log in zip((STDOUT, STDERR), logs, strict=True)
            if log.size_at_start
        ]

    def before_chunk(self, stream: int) -> None:
        if stream == self.current:
            return  # the common case: the same stream again, nothing to record
        previous, self.current = self.current, stream
        if previous is None:
            if len(self._earlier) > 1 or (self._earlier and self._earlier[0][0] != stream):
                self._append(self._earlier)
            self._earlier = []
            return
        try:
            fd = self.logs[previous].fd
            if fd is None:  # (it could not be made: the stream's bytes are not logged)
                raise OSError(f"the {('stdout', 'stderr')[previous]} log could not be made")
            end = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError as e:
            self._give_up(e)
            return
        failpoint("before:log_order")  # (the previous run logged, not yet recorded)
        self._append([(previous, end)])
        failpoint("after:log_order")  # (recorded; this chunk not yet logged)

    def _append(self, entries: Sequence[tuple[int, int]]) -> None:
        if self.error is not None:
            return
        data = b"".join(pack(stream, end) for stream, end in entries)
        try:
            if self.fd is None:
                self.created = not os.path.lexists(self.path)
                self.fd = open_private(self.path)
                # A torn entry (a crash of an earlier run) would misalign every later one.
                torn = os.fstat(self.fd).st_size % ENTRY_BYTES
                if torn:
                    data = bytes(ENTRY_BYTES - torn) + data
            done = 0
            while done < len(data):
                done += os.write(self.fd, data[done:])
            self.wrote = True
        except OSError as e:
            self._give_up(e)

    def _give_up(self, error: OSError) -> None:
        self.error = f"the order index could not be written: {error}"

    def sync_and_close(self) -> None:
        """fdatasync the index if this run wrote to it (with the logs, before SETTLED:
        a power cut then keeps the order too), close it. Errors cost the order only."""
        if self.fd is None:
            return
        try:
            if self.wrote and self.error is None:
                try:
                    getattr(os, "fdatasync", os.fsync)(self.fd)
                except OSError as e:
                    self._give_up(e)
        finally:
            os.close(self.fd)
            self.fd = None
