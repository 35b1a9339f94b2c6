"""Where one handle stands in the journal, and how it follows other processes.

A ``Position`` knows the active segment (a read-write descriptor, its first seq, the
end of its last valid record and how far the file is known to reach), the last seq and
the highest epoch seen.  It catches up on what other processes appended (new records
in the active segment, new segments named by the next seq), creates the next segment
and seals the one it leaves.  The lock file's size counts segment creations, so
noticing a new segment costs one lseek instead of a directory listing, and noticing a
new record one pread of the byte after the last one known (a NUL, or the end of the
file: nothing new), with the last bytes of that record (still as this handle read or
wrote them: else records it read were taken back, ``TakenBackError``).
"""

from __future__ import annotations

from collections.abc import Callable

from journal import _fsutil
from journal._codec import CRC_SUFFIX_BYTES, Record
from journal._errors import CorruptionError, JournalError, TakenBackError
from journal._reader import SegmentScan, TornTail, damage_error
from journal._segment import SALVAGE_MARKER, segment_name
from journal._survey import Survey

Feed = Callable[[Record], None]
# The bytes of a record's end a handle remembers and checks: its line's fixed tail,
# ``,"crc":"xxxxxxxx"}\n`` (the checksum makes them its own).
TAIL_BYTES = CRC_SUFFIX_BYTES


class Position:
    def __init__(
        self,
        directory: str,
        lock_fd: int,
        found: Survey,
        *,
        max_epoch: int,
        entry_durable: bool = False,
        read_only: bool = False,
    ) -> None:
        self.directory = directory
        # A read-only handle opens its segments for reading only, may have no lock file
        # (``lock_fd`` -1: it then looks for a new segment on every catch-up), and
        # never writes (the Journal refuses its appends).
        self.read_only = read_only
        # Is the directory's own entry (in its parent) known durable?  Yes if this
        # handle made it (``_fsutil.makedirs`` fsynced the parent), or once a handle
        # made the first segment (below); unknown for a directory found empty.
        self.entry_durable = entry_durable
        self.lock_fd = lock_fd
        self.first_seq = found.first_seq
        self.last_seq = found.last_seq
        self.max_epoch = max_epoch
        # Lock file size when we last followed the segments under the lock; -1 = never
        # (read at open without the lock, it could count a segment not yet created).
        self._rotations = -1
        self.fd: int | None = None  # the active segment, or None before the first one
        self.path = directory
        self.first = 0  # the active segment's first seq
        self.end = 0  # the end of its last valid record
        # That record's last bytes (``,"crc":"..."}\n``) as this handle read or wrote
        # them: still there, or the records it read were taken back (``_unchanged``).
        self.tail = b""
        # How far the file is known to reach (its zero tail included): a lower bound,
        # 0 when not known; the writer preallocates beyond it (``_writer``).
        self.allocated = 0
        # Has a read of the active segment reached a clean end (the survey at open, or
        # a catch-up since)?  Until one has, bytes after a NUL may be a torn write from
        # before a crash: they are read, not trusted to be the zero tail.
        self.tail_checked = found.torn is None and found.corruption is None
        # Is the active segment's name known durable?  Not for one we did not create
        # (its creator may have died before fsyncing the directory).
        self.durable = False
        if found.segments:
            last = found.segments[-1]
            # (FileNotFoundError: compacted meanwhile)
            fd = _fsutil.open_segment(last.path, read_only=read_only)
            _fsutil.pin(fd)
            if _fsutil.moved(fd, last.path):
                # Compacted meanwhile; or the directory was swapped by a salvage (which
                # holds every segment while it swaps: the pin waited for it), so that
                # this file is now the damaged copy's and must not be appended to.
                _fsutil.close(fd)
                raise FileNotFoundError(f"segment {last.path} was compacted meanwhile")
            self.fd = fd
            self.path, self.first, self.end = last.path, last.first_seq, found.end_offset
            # (Not read by the survey: the end of a record a snapshot covers, durable.)
            if self.end:
                self.tail = found.tail or _fsutil.pread(fd, TAIL_BYTES, self.end - TAIL_BYTES)

    def _switch(self, fd: int, path: str, first_seq: int, *, durable: bool) -> None:
        # The active segment is pinned (``_fsutil.pin``): compaction keeps it and every
        # segment after it, so however far behind this handle falls, the chain of
        # segments it follows is whole.  The new one is pinned before the old is let go.
        _fsutil.pin(fd)
        if self.fd is not None:
            _fsutil.close(self.fd)
        self.fd, self.path, self.first, self.end, self.durable = fd, path, first_seq, 0, durable
        self.tail = b""
        self.allocated = 0

    def new_segment(self) -> None:
        """Create the next segment (named by the next seq) and make it the active one."""
        first = self.fd is None  # the journal's first segment (none was there to follow)
        if not first:
            self._seal()
        # Count it in the lock file *before* it exists: a creator that dies in between
        # must never leave a segment the others do not know of (they would go on
        # appending to the previous one: an overlap).  The count lives in the page
        # cache only; after a crash every handle starts over with a full scan.
        _fsutil.write_all(self.lock_fd, b"+")
        self._rotations = _fsutil.size(self.lock_fd)
        path = _fsutil.join(self.directory, segment_name(self.last_seq + 1))
        fd = _fsutil.open_segment(path, create=True)
        self._switch(fd, path, self.last_seq + 1, durable=False)
        # The new name must be durable before a record in it is reported committed:
        # else a power cut can drop the whole file with its committed records.
        _fsutil.fsync_dir(self.directory)
        if first and not self.entry_durable:
            # And so must the journal directory's own entry, once: whoever made the
            # directory (a caller; ferry's ensure_home did) may not have fsynced its
            # parent, and a power cut drops a directory whose entry never reached the
            # disk, with everything in it.  (Its parent's own entry is the caller's.)
            _fsutil.fsync_dir(_fsutil.parent(self.directory))
            self.entry_durable = True
        self.durable = True

    def _seal(self) -> None:
        """Make the segment we leave end at its last record, durably."""
        fd = self.fd
        assert fd is not None
        if _fsutil.size(fd) > self.end:
            # Cut its zero tail: a sealed segment is exactly its records (as readers
            # older than preallocation expect).
            _fsutil.truncate(fd, self.end)
        # fsync (size and data) even when nothing was cut: the segment may end with
        # records this handle only caught up on, and a process that died between its
        # write and its fdatasync leaves them in the page cache alone.  They must be
        # durable before anything is created after them, else a power cut drops them
        # under the next segment (a seq gap: corruption, in front of records we then
        # report committed).
        _fsutil.sync_file(fd)

    def make_durable(self) -> None:
        """fsync the directory (and its parent) once for a segment we did not create,
        before writing into it: its creator may have died before doing it.  Not when
        the segment holds a record already: every writer made the segment's entry (and
        the journal directory's) durable before it wrote its first record there (here,
        or ``new_segment``), so a record proves it was done.  (Two directory fsyncs at
        every process's first commit otherwise: 0.3 to 0.5 ms of a ``ferry submit``.)
        Records a salvage copied prove nothing: its journal's entry is durable once
        its marker is gone (``_salvage``: a salvage killed between its swap and the
        parent's fsync leaves it), so the marker's presence means fsync."""
        if not self.durable:
            # (end: after our catch-up under the lock, which a salvage holds too)
            if self.end == 0 or _fsutil.exists(_fsutil.join(self.directory, SALVAGE_MARKER)):
                _fsutil.fsync_dir(self.directory)
                _fsutil.fsync_dir(_fsutil.parent(self.directory))
            self.durable = True

    def catch_up(self, feed: Feed, *, locked: bool) -> TornTail | None:
        """Read what other processes appended since we last looked, calling ``feed``
        for each record.  Returns the torn tail at the end, if any (not cut here).

        Cheap when nothing changed: the size of the lock file and the byte after the
        active segment's last record (an ``lseek`` and a ``pread``).  The segment count
        is remembered only when ``locked``: without the lock a creator may have counted
        a segment it has not created yet."""
        # (No lock file, for a read-only handle: unknown, so look for a new segment.)
        rotations = _fsutil.size(self.lock_fd) if self.lock_fd >= 0 else -2
        fd = self.fd
        # One look at the byte after our last record, when it can be trusted:
        looked = fd is not None and self.tail_checked
        same = fd is not None and self.tail_checked and self._unchanged(fd)
        if same and rotations == self._rotations:
            return None  # the usual case under the lock: nobody else appended
        torn = None if fd is None or same else self._catch_up_segment(fd, feed, looked)
        if rotations != self._rotations:
            torn = self._follow_segments(torn, feed)
            if locked:
                self._rotations = rotations
        if torn is None:
            # Read to a clean end (every byte after it a NUL, when we looked): from now
            # on appends only write over those zeros, from our end on, and a process
            # dying mid-write leaves a prefix, which starts with no NUL.  (A torn tail
            # stays unchecked until cut: ``cut()``.)
            self.tail_checked = True
        return torn

    def cut(self, torn: TornTail) -> None:
        """Cut a torn tail (under the lock): the segment then ends at our last record."""
        from journal._repair import cut_tail  # (lazy: a torn tail is rare)

        cut_tail(self.directory, torn)
        self.allocated = 0  # (the zero tail went with it)
        self.tail_checked = True

    def _follow_segments(self, torn: TornTail | None, feed: Feed) -> TornTail | None:
        """Move to segments created by others after ours (named by the next seq)."""
        while self.fd is None or self.last_seq + 1 != self.first:
            path = _fsutil.join(self.directory, segment_name(self.last_seq + 1))
            try:
                fd = _fsutil.open_segment(path, read_only=self.read_only)
            except FileNotFoundError:
                if self.fd is not None and _fsutil.unlinked(self.fd):
                    # Never by compaction (the active segment is pinned): by hand.
                    raise JournalError(
                        f"segment {_fsutil.name(self.path)} was removed while this handle still"
                        " read it; its later records cannot be found: reopen the journal"
                    ) from None
                return torn  # not created yet (its creator counted it first)
            if torn is not None:
                # Read without the lock, the tail may have been cut since (and records
                # appended) by the writer that then made this segment: read again.
                assert self.fd is not None  # (the torn tail is its)
                torn = self._catch_up_segment(self.fd, feed)
            if torn is not None:
                _fsutil.close(fd)
                raise CorruptionError(
                    f"bad record in a sealed segment: {torn.reason}",
                    segment=torn.segment,
                    offset=torn.offset,
                    seq=torn.seq,
                )
            self._switch(fd, path, self.last_seq + 1, durable=False)
            torn = self._catch_up_segment(fd, feed)
        return torn  # the active segment has no record yet: nothing can follow it

    def _unchanged(self, fd: int) -> bool:
        """Nothing follows our last record: a NUL (the zero tail) or the end of file.
        Read with the last bytes of that record, which must be as this handle knows
        them (one pread all the same): TakenBackError if not."""
        known = len(self.tail)
        got = _fsutil.pread(fd, known + 1, self.end - known)
        if got[:known] != self.tail:
            raise self._taken_back()
        after = got[known:]
        if after:
            return after == b"\0"
        self.allocated = _fsutil.size(fd)  # (exact: no zero tail; another may have cut it)
        return True

    def _taken_back(self) -> TakenBackError:
        """Bytes before our end changed, or the file ends before it: records this handle
        read were cut off again by their writer, whose fdatasync failed (a lock-free
        catch-up reads what is written, synced or not), or by hand. Nothing this handle
        knows past that point can be trusted, nor may it write at its end."""
        return TakenBackError(
            "records this handle read are no longer in the journal (their writer's"
            " fdatasync failed and it took them back, or the segment was cut)",
            segment=self.path,
            offset=self.end,
            seq=self.last_seq,
        )

    def _catch_up_segment(self, fd: int, feed: Feed, looked: bool = False) -> TornTail | None:
        """Read the records after our end (``looked``: the caller already saw that
        something follows it)."""
        if not looked and self._unchanged(fd) and self.tail_checked:
            return None
        # Once checked, appends only write over zeros from the end of the records on:
        # the first NUL where a line should start is the end.
        scan = SegmentScan(
            fd, self.path, self.end, self.last_seq + 1, trust_zeros=self.tail_checked
        )
        try:
            for record in scan.records():
                self.last_seq = record.seq
                if record.epoch > self.max_epoch:
                    self.max_epoch = record.epoch
                feed(record)
        finally:
            if scan.end_offset != self.end:
                self.end, self.tail = scan.end_offset, scan.tail
        damage = scan.damage
        if damage is None:
            return None
        if damage.corrupt:
            raise damage_error(damage, self.path, last=True)
        return TornTail(self.path, damage.offset, damage.seq, damage.tail_bytes, damage.reason)

    def close(self) -> None:
        if self.fd is not None:
            _fsutil.close(self.fd)
            self.fd = None
