"""Cut a torn tail, keeping a ``.broken`` copy of the bytes cut.  Nothing else.

Repair never touches corruption (it raises CorruptionError instead; a "torn tail" in
records a valid snapshot covers is damage, not a tear), never removes a valid record
and never resets a journal to empty.  It runs under the append lock, so no
append is in progress while it decides what is torn.
"""

from __future__ import annotations

from typing import NamedTuple

from journal import _fsutil
from journal._reader import TornTail
from journal._segment import LOCK_NAME, broken_copy_path, no_journal
from journal._snapshot import latest_snapshot
from journal._survey import survey

_COPY_CHUNK_BYTES = 1 << 20


class RepairReport(NamedTuple):
    repaired: bool  # False: nothing to cut (the journal was clean)
    segment: str | None  # the segment that was cut
    offset: int | None  # its new length: where the valid records end
    bytes_cut: int
    broken_copy: str | None  # where the cut bytes were kept
    last_seq: int  # the last valid record, unchanged by the repair


def cut_tail(directory: str, torn: TornTail) -> tuple[str, int]:
    """Copy the torn bytes (``torn.tail_bytes`` from ``torn.offset``: the zero tail
    after them is not evidence) to a new ``.broken`` file, then truncate at the offset.

    The caller holds the append lock.  Returns (broken copy path, bytes copied).
    CorruptionError, touching nothing, if a valid snapshot covers records past the
    tail: they were durable (a snapshot follows its records' fsync, and nothing is
    written after a commit that did not return), so what looks torn is damage."""
    latest_snapshot(directory, torn.seq - 1)
    broken = broken_copy_path(torn.segment, _fsutil.listdir(directory))
    fd = _fsutil.open_rdwr(torn.segment)
    try:
        end = torn.offset + torn.tail_bytes
        out = _fsutil.open_new(broken)
        try:
            pos = torn.offset
            while pos < end:
                chunk = _fsutil.pread(fd, min(_COPY_CHUNK_BYTES, end - pos), pos)
                if not chunk:
                    break
                _fsutil.write_all(out, chunk)
                pos += len(chunk)
            _fsutil.sync_file(out)
        finally:
            _fsutil.close(out)
        # The copy and its name are durable before the original bytes are destroyed: a
        # crash in between leaves both, never neither.
        _fsutil.fsync_dir(directory)
        _fsutil.truncate(fd, torn.offset)
        # The cut is durable before anything is appended after it: else a crash could
        # bring the torn bytes back in front of new, committed records.
        _fsutil.sync_file(fd)
    finally:
        _fsutil.close(fd)
    return broken, end - torn.offset


def repair(directory: _fsutil.StrPath) -> RepairReport:
    """Cut a torn tail if there is one (under the append lock).  Raises CorruptionError
    for any other damage and JournalError if ``directory`` is not a journal."""
    directory = _fsutil.fspath(directory)
    try:
        lock_fd = _fsutil.open_lockfile(_fsutil.join(directory, LOCK_NAME))
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise no_journal(directory, exc) from None
    try:
        _fsutil.lock(lock_fd)
        found = survey(directory)
        if found.corruption is not None:
            raise found.corruption
        if found.torn is None:
            return RepairReport(False, None, None, 0, None, found.last_seq)
        broken, bytes_cut = cut_tail(directory, found.torn)
        return RepairReport(
            True, found.torn.segment, found.torn.offset, bytes_cut, broken, found.last_seq
        )
    finally:
        _fsutil.close(lock_fd)  # closing releases the flock
