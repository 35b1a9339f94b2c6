"""Where one handle stands in the journal, and how it follows other processes.

A ``Position`` knows the active segment (an O_APPEND descriptor, its first seq and the
end of its last valid record), the last seq and the highest epoch seen.  It catches up
on what other processes appended (new bytes in the active segment, new segments named
by the next seq) and creates the next segment.  The lock file's size counts segment
creations, so noticing a new segment costs one lseek instead of a directory listing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from journal import _fsutil
from journal._codec import Record
from journal._errors import CorruptionError
from journal._reader import SegmentScan, TornTail, damage_error
from journal._segment import segment_name
from journal._survey import Survey

Feed = Callable[[Record], None]


class Position:
    def __init__(self, directory: Path, lock_fd: int, found: Survey, *, max_epoch: int) -> None:
        self.directory = directory
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
        # Is the active segment's name known durable?  Not for one we did not create
        # (its creator may have died before fsyncing the directory).
        self.durable = False
        if found.segments:
            last = found.segments[-1]
            self.fd = _fsutil.open_append(last.path)
            self.path, self.first, self.end = last.path, last.first_seq, found.end_offset

    def _switch(self, fd: int, path: Path, first_seq: int, *, durable: bool) -> None:
        if self.fd is not None:
            _fsutil.close(self.fd)
        self.fd, self.path, self.first, self.end, self.durable = fd, path, first_seq, 0, durable

    def new_segment(self) -> None:
        """Create the next segment (named by the next seq) and make it the active one."""
        if self.fd is not None:
            # The segment we leave may end with records this handle only caught up on:
            # a process that died between its write and its fdatasync leaves them in
            # the page cache alone.  Make them durable before anything is created after
            # them, else a power cut drops them under the next segment (a seq gap:
            # corruption, in front of records we then report committed).
            _fsutil.sync_data(self.fd)
        # Count it in the lock file *before* it exists: a creator that dies in between
        # must never leave a segment the others do not know of (they would go on
        # appending to the previous one: an overlap).  The count lives in the page
        # cache only; after a crash every handle starts over with a full scan.
        _fsutil.write_all(self.lock_fd, b"+")
        self._rotations = _fsutil.size(self.lock_fd)
        path = self.directory / segment_name(self.last_seq + 1)
        fd = _fsutil.open_append(path, create=True)
        self._switch(fd, path, self.last_seq + 1, durable=False)
        # The new name must be durable before a record in it is reported committed:
        # else a power cut can drop the whole file with its committed records.
        _fsutil.fsync_dir(self.directory)
        self.durable = True

    def make_durable(self) -> None:
        """fsync the directory (and its parent) once for a segment we did not create:
        its creator may have died before doing it.  Before committing into it."""
        if not self.durable:
            _fsutil.fsync_dir(self.directory)
            _fsutil.fsync_dir(self.directory.parent)
            self.durable = True

    def catch_up(self, feed: Feed, *, locked: bool) -> TornTail | None:
        """Read what other processes appended since we last looked, calling ``feed``
        for each record.  Returns the torn tail at the end, if any (not cut here).

        Cheap when nothing changed: the sizes of the lock file and of the active
        segment (two ``lseek`` calls).  The segment count is remembered only when
        ``locked``: without the lock a creator may have counted a segment it has not
        created yet."""
        rotations = _fsutil.size(self.lock_fd)
        fd = self.fd
        if rotations == self._rotations and fd is not None and _fsutil.size(fd) == self.end:
            return None  # the usual case under the lock: nobody else appended
        torn = None if fd is None else self._catch_up_segment(fd, feed)
        if rotations != self._rotations:
            torn = self._follow_segments(torn, feed)
            if locked:
                self._rotations = rotations
        return torn

    def _follow_segments(self, torn: TornTail | None, feed: Feed) -> TornTail | None:
        """Move to segments created by others after ours (named by the next seq)."""
        while self.fd is None or self.last_seq + 1 != self.first:
            path = self.directory / segment_name(self.last_seq + 1)
            try:
                fd = _fsutil.open_append(path)
            except FileNotFoundError:
                return torn
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

    def _catch_up_segment(self, fd: int, feed: Feed) -> TornTail | None:
        size = _fsutil.size(fd)
        if size == self.end:
            return None
        if size < self.end:
            raise CorruptionError(
                f"segment shrank to {size} bytes below its last known record end",
                segment=self.path,
                offset=self.end,
                seq=self.last_seq,
            )
        scan = SegmentScan(fd, self.path, self.end, self.last_seq + 1)
        try:
            for record in scan.records():
                self.last_seq = record.seq
                if record.epoch > self.max_epoch:
                    self.max_epoch = record.epoch
                feed(record)
        finally:
            self.end = scan.end_offset
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
