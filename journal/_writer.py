"""The only code that appends: catch up, fence, check, write, fsync, rotate, group commit.

One commit, under the cross-process append lock (flock on ``.lock``):

1. catch up on records other processes appended since this handle last looked
   (feeding the subscribers), following the chain of segments by name;
2. cut a torn tail if one is there (a crashed appender's leftovers: ``_repair``);
3. per queued batch, in order: refuse an epoch older than the journal's highest
   (FencedError), call ``fence(epoch)`` and ``check()``; a refusal fails that batch only;
4. ONE ``os.write`` of all accepted lines, ONE fdatasync; rotate first if the active
   segment would pass ``segment_bytes_max``;
5. only now are the records committed: feed them to the subscribers, wake the callers.

Group commit (leader/follower): a thread that finds a commit in progress queues its
batch and waits; when the commit ends, one waiting thread becomes the leader and
commits every batch queued meanwhile together.  A batch with a ``check`` hook is checked
against everything committed before it: if records of earlier batches are pending in
the group, they are written and fsynced first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from journal import _fsutil
from journal._codec import Prepared, Record, encode_line
from journal._errors import (
    CorruptionError,
    FencedError,
    FormatVersionError,
    JournalClosedError,
    JournalError,
    WriterFailedError,
)
from journal._reader import SegmentScan, Survey, TornTail, damage_error
from journal._repair import cut_tail
from journal._segment import segment_name

Subscriber = Callable[[Record], None]
_new_tuple = tuple.__new__
Hook = Callable[[], None]
Fence = Callable[[int], None]


class _SubscriberFailed(Exception):
    """A subscriber raised: the handle can no longer deliver every record exactly once."""


class _Batch:
    __slots__ = ("check", "epoch", "error", "prepared", "records")

    def __init__(self, prepared: list[Prepared], epoch: int, check: Hook | None) -> None:
        self.prepared = prepared
        self.epoch = epoch
        self.check = check
        self.records: list[Record] | None = None  # set once committed
        self.error: BaseException | None = None  # set once refused or failed


class Writer:
    def __init__(
        self,
        directory: Path,
        lock_fd: int,
        found: Survey,
        *,
        rotations: int,
        max_epoch: int,
        segment_bytes_max: int,
        fence: Fence | None,
    ) -> None:
        self.directory = directory
        self._lock_fd = lock_fd
        self._segment_bytes_max = segment_bytes_max
        self._fence = fence
        self.subscribers: list[Subscriber] = []
        self.last_seq = found.last_seq
        self.max_epoch = max_epoch
        self.first_seq = found.first_seq
        # Lock file size when we last followed the segments under the lock (-1: never).
        self._rotations = rotations
        # Is the active segment's name known durable?  Not for one we did not create
        # (its creator may have died before fsyncing the directory): fsync it ourselves
        # before committing into it.
        self._seg_durable = False
        self._seg_fd: int | None = None
        self._seg_path = directory
        self._seg_first = 0
        self._seg_end = 0
        if found.segments:
            last = found.segments[-1]
            self._seg_fd = _fsutil.open_append(last.path)
            self._seg_path, self._seg_first, self._seg_end = (
                last.path,
                last.first_seq,
                found.end_offset,
            )
        # _mutex guards _busy, _queue, _waiting; _cond is the same lock with wait/notify.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._waiting = 0  # threads in _wait(): notify only when someone listens
        self._busy = False  # one thread at a time owns the handle's position and I/O
        self._owner = 0  # the thread that owns it while _busy
        self._queue: list[_Batch] = []
        self._failed: WriterFailedError | None = None
        self._closed = False

    # -- ownership --------------------------------------------------------------------

    def _wait(self) -> None:
        """Wait for the handle to change hands (call with _mutex held)."""
        self._waiting += 1
        try:
            self._cond.wait()
        finally:
            self._waiting -= 1

    def _wake(self) -> None:
        if self._waiting:
            self._cond.notify_all()

    def _check_usable(self) -> None:
        if self._closed:
            raise JournalClosedError("the journal handle is closed")
        if self._failed is not None:
            raise WriterFailedError(self._failed.message) from self._failed.__cause__

    def _refuse_reentry(self) -> None:
        """A subscriber or hook calling back into the handle that runs it would wait for
        itself forever: refuse instead (call with _mutex held)."""
        if self._busy and self._owner == threading.get_ident():
            raise JournalError(
                "journal called from its own subscriber or hook (this would deadlock)"
            )

    @contextmanager
    def owned(self) -> Iterator[None]:
        """Own the handle (no commit in progress) for the duration."""
        with self._mutex:
            self._refuse_reentry()
            while self._busy:
                self._wait()
            self._check_usable()
            self._busy, self._owner = True, threading.get_ident()
        try:
            yield
        finally:
            with self._mutex:
                self._busy = False
                self._wake()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The cross-process append lock (the caller owns the handle)."""
        _fsutil.lock(self._lock_fd)
        try:
            yield
        finally:
            _fsutil.unlock(self._lock_fd)

    def fail(self, message: str, cause: BaseException) -> WriterFailedError:
        error = WriterFailedError(message)
        error.__cause__ = cause
        self._failed = error
        return error

    # -- appending --------------------------------------------------------------------

    def append_batch(
        self, prepared: list[Prepared], epoch: int, check: Hook | None
    ) -> list[Record]:
        batch = _Batch(prepared, epoch, check)
        with self._mutex:
            self._check_usable()
            self._refuse_reentry()
            self._queue.append(batch)
            while self._busy and batch.records is None and batch.error is None:
                self._wait()
            if batch.records is None and batch.error is None:
                # Nobody committed our batch: lead, taking everything queued meanwhile.
                self._check_usable()
                self._busy, self._owner = True, threading.get_ident()
                group, self._queue = self._queue, []
            else:
                group = []
        if group:
            try:
                self._lead(group)
            finally:
                with self._mutex:
                    self._busy = False
                    self._wake()
        if batch.error is not None:
            raise batch.error
        assert batch.records is not None
        return batch.records

    def _lead(self, group: list[_Batch]) -> None:
        try:
            _fsutil.lock(self._lock_fd)
            try:
                self._commit(group)
            finally:
                _fsutil.unlock(self._lock_fd)
        except (CorruptionError, FormatVersionError) as exc:
            self._settle(group, exc)  # nothing was written; the handle stays usable
        except _SubscriberFailed as exc:
            self._settle(group, self.fail("a subscriber raised; the handle is unusable", exc))
        except OSError as exc:
            self._settle(group, self.fail(f"journal write failed: {exc}", exc))
        except BaseException as exc:
            self._settle(group, self.fail(f"commit interrupted: {exc!r}", exc))
            if not isinstance(exc, Exception):
                raise

    @staticmethod
    def _settle(group: list[_Batch], error: BaseException) -> None:
        for batch in group:
            if batch.records is None and batch.error is None:
                batch.error = error

    def _commit(self, group: list[_Batch]) -> None:
        torn = self.catch_up(locked=True)
        if torn is not None:
            cut_tail(self.directory, torn)
        lines: list[bytes] = []
        accepted: list[tuple[_Batch, list[Record]]] = []
        seq, max_epoch = self.last_seq, self.max_epoch
        for batch in group:
            try:
                if 0 < batch.epoch < max_epoch:
                    raise FencedError(
                        f"epoch {batch.epoch} is older than the journal's epoch {max_epoch}",
                        epoch=batch.epoch,
                        current_epoch=max_epoch,
                    )
                if self._fence is not None:
                    self._fence(batch.epoch)
                if batch.check is not None:
                    if lines:  # the check must see every record committed before it
                        self._flush(lines, accepted)
                        lines, accepted = [], []
                    batch.check()
            except Exception as exc:
                batch.error = exc
                continue
            records = []
            for item in batch.prepared:
                seq += 1
                lines.append(encode_line(seq, item))
                records.append(_new_tuple(Record, (seq, item.epoch, item.ts, item.type, item.data)))
            accepted.append((batch, records))
            max_epoch = max(max_epoch, batch.epoch)
        if lines:
            self._flush(lines, accepted)

    def _flush(self, lines: list[bytes], accepted: list[tuple[_Batch, list[Record]]]) -> None:
        data = b"".join(lines)
        if self._seg_fd is None or (
            self._seg_end > 0 and self._seg_end + len(data) > self._segment_bytes_max
        ):
            self._new_segment(self.last_seq + 1)
        assert self._seg_fd is not None
        if not self._seg_durable:
            # A segment (or journal directory) created by a process that died before
            # fsyncing the directory: make the names durable before committing into it.
            _fsutil.fsync_dir(self.directory)
            _fsutil.fsync_dir(self.directory.parent)
            self._seg_durable = True
        _fsutil.write_all(self._seg_fd, data)
        _fsutil.sync_data(self._seg_fd)
        # Committed: only now may a caller learn it (an error above left every batch
        # of this flush without records: its outcome is unknown, the handle failed).
        self._seg_end += len(data)
        for batch, records in accepted:
            batch.records = records
            self.last_seq = records[-1].seq
            self.max_epoch = max(self.max_epoch, batch.epoch)
        for _batch, records in accepted:
            self._feed(records)

    def _new_segment(self, first_seq: int) -> None:
        # Tell other handles a segment is coming: one more byte in the lock file (its
        # size counts segment creations; in memory only, a crash makes every handle
        # start over with a full scan).  Before the file exists, so that a creator that
        # dies in between never leaves a segment the others do not know of (they would
        # go on appending to the previous one: an overlap).
        _fsutil.write_all(self._lock_fd, b"+")
        self._rotations = _fsutil.size(self._lock_fd)
        path = self.directory / segment_name(first_seq)
        fd = _fsutil.open_append(path, create=True)
        if self._seg_fd is not None:
            _fsutil.close(self._seg_fd)
        self._seg_fd, self._seg_path, self._seg_first, self._seg_end = fd, path, first_seq, 0
        # The new name must be durable before a record in it is reported committed:
        # else a power cut can drop the whole file with its committed records.
        _fsutil.fsync_dir(self.directory)
        self._seg_durable = True

    def _feed(self, records: list[Record]) -> None:
        for record in records:
            for subscriber in self.subscribers:
                try:
                    subscriber(record)
                except Exception as exc:
                    raise _SubscriberFailed(repr(exc)) from exc

    # -- catching up ----------------------------------------------------------------

    def catch_up(self, *, locked: bool) -> TornTail | None:
        """Read what other processes appended since we last looked, feeding subscribers.

        Returns the torn tail at the end of the last segment, if any (not cut here).
        Cheap when nothing changed: one fstat of the active segment and one of the lock
        file, whose size counts the segments ever created (see ``_new_segment``).  The
        count is remembered only when ``locked``: without the lock a creator may have
        counted a segment it has not created yet."""
        rotations = _fsutil.size(self._lock_fd)
        torn = None if self._seg_fd is None else self._catch_up_segment(self._seg_fd)
        if rotations != self._rotations:
            torn = self._follow_segments(torn)
            if locked:
                self._rotations = rotations
        return torn

    def _follow_segments(self, torn: TornTail | None) -> TornTail | None:
        """Move to segments created by others after ours (named by the next seq)."""
        while self._seg_fd is None or self.last_seq + 1 != self._seg_first:
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
            if self._seg_fd is not None:
                _fsutil.close(self._seg_fd)
            self._seg_fd, self._seg_path = fd, path
            self._seg_first, self._seg_end = self.last_seq + 1, 0
            self._seg_durable = False
            torn = self._catch_up_segment(fd)
        return torn  # the active segment has no record yet: nothing can follow it

    def _catch_up_segment(self, fd: int) -> TornTail | None:
        size = _fsutil.size(fd)
        if size == self._seg_end:
            return None
        if size < self._seg_end:
            raise CorruptionError(
                f"segment shrank to {size} bytes below its last known record end",
                segment=self._seg_path,
                offset=self._seg_end,
                seq=self.last_seq,
            )
        scan = SegmentScan(fd, self._seg_path, self._seg_end, self.last_seq + 1)
        try:
            for record in scan.records():
                self.last_seq = record.seq
                self._seg_end = scan.end_offset
                if record.epoch > self.max_epoch:
                    self.max_epoch = record.epoch
                self._feed([record])
        finally:
            self._seg_end = scan.end_offset
        damage = scan.damage
        if damage is None:
            return None
        if damage.corrupt:
            raise damage_error(damage, self._seg_path, last=True)
        return TornTail(self._seg_path, damage.offset, damage.seq, damage.tail_bytes, damage.reason)

    def catch_up_feeding(self, *, locked: bool = False) -> None:
        """catch_up for callers outside a commit (the caller owns the handle): a torn
        tail is left alone (without the lock it may be an append in progress)."""
        try:
            self.catch_up(locked=locked)
        except _SubscriberFailed as exc:
            raise self.fail("a subscriber raised; the handle is unusable", exc) from exc

    def refresh(self) -> None:
        with self.owned():
            self.catch_up_feeding()

    def close(self) -> None:
        with self._mutex:
            self._refuse_reentry()
            while self._busy:
                self._wait()
            if self._closed:
                return
            self._closed = True
        if self._seg_fd is not None:
            _fsutil.close(self._seg_fd)
            self._seg_fd = None
        _fsutil.close(self._lock_fd)

    def ensure_usable(self) -> None:
        with self._mutex:
            self._check_usable()
