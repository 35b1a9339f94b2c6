"""The only code that appends: catch up, fence, check, write, fsync, rotate, group commit.

One commit, under the cross-process append lock (flock on ``.lock``):

1. catch up on records other processes appended since this handle last looked
   (feeding the subscribers), following the chain of segments (``_position``);
2. cut a torn tail if one is there (a crashed appender's leftovers: ``_repair``);
3. per queued batch, in order: refuse an epoch older than the journal's highest
   (FencedError), call ``fence(epoch)`` and ``check()``; a refusal fails that batch
   only, and nothing of it is written or fed.  An accepted batch gets its seqs and is
   encoded, and its records go at once to the *early* subscribers
   (``subscribe(..., before_durable=True)``), so the next batch's check sees them;
4. ONE ``pwrite`` of all accepted lines at the end of the last record, ONE fdatasync;
   rotate first if the active segment would pass ``segment_bytes_max``;
5. only now are the records committed: feed them to the other subscribers, wake the
   callers.

Preallocation: records are written over zeros the segment already holds whenever it
can.  When a write would reach past the end of the file, zeros follow the lines in the
same write (as many again as the segment holds, between PREALLOC_MIN_BYTES and
PREALLOC_MAX_BYTES, never past ``segment_bytes_max``, and only while the file system
has room for twice that: near a full disk the lines go alone).  So most commits change no file
size, and their fdatasync flushes data only: no file-system journal commit, about 1.5
times the commits per second of a growing file on ext4.  (Why not O_APPEND: every
append would grow the file.  The append lock already orders the writers, and each
writes at the end of the records it caught up on.)  Readers take a run of NULs up to
the end of a segment for unused space; sealing a segment cuts it (``_position``).

Group commit (leader/follower): a thread that finds a commit in progress queues its
batch and sleeps on the batch's own lock; when the commit ends, the leader wakes the
threads of the batches it settled, one after another (each wakes the next when it
runs), and the handle stays reserved until all of them have run: what they append
meanwhile queues too.  Then the thread of the first batch still queued (or the last
woken thread itself, if it appends again first) leads, and commits every batch queued
together.  So threads that each append a record and wait for it (``ferry work -j
N``) share each fsync, instead of half of them going into every other commit; no
delay is involved, and a lone appender wakes nobody and waits for nothing.
(``append_one``, a single record when no other thread is appending, takes the same
steps without the group's bookkeeping: on a slow disk every microsecond of CPU
between two fsyncs costs about three.)  A batch's ``check`` must see every record
before it.  With early subscribers it does, through them, and the whole group
shares one write and one fsync.  Without any, the records of earlier batches pending
in the group are written and fsynced first (one more fsync), then the check runs.

What early subscribers see that the others never do: records of the group being
committed, before they are durable.  If the write or the fsync fails, the handle is
failed (WriterFailedError for every caller in the group and for every later call) and
the early subscribers have seen records whose outcome is unknown (on disk or not:
reopen and replay to learn which).  If the process dies between feeding and writing,
other threads of that process may have seen records that no disk ever held.  No caller
is ever told "committed" before the fsync returned; the subscriber's state must be
thrown away with a failed handle, and must not drive side effects on its own.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from itertools import chain, repeat

from journal import _fsutil
from journal._codec import Prepared, Record, encode_batch, encode_line
from journal._errors import (
    CorruptionError,
    FencedError,
    FormatVersionError,
    JournalClosedError,
    JournalError,
    TakenBackError,
    WriterFailedError,
)
from journal._position import TAIL_BYTES, Position
from journal._reader import TornTail
from journal._segment import LOCK_NAME
from journal._survey import Survey

Subscriber = Callable[[Record], None]
_new_tuple = tuple.__new__
_get_ident = threading.get_ident
Hook = Callable[[], None]
Fence = Callable[[int], None]
PREALLOC_MIN_BYTES = 64 << 10
PREALLOC_MAX_BYTES = 1 << 20


class _SubscriberFailed(Exception):
    """A subscriber raised: the handle can no longer deliver every record exactly once."""


class _Batch:
    __slots__ = (
        "check",
        "epoch",
        "error",
        "pending",
        "prepared",
        "records",
        "returning",
        "settled",
        "signalled",
        "wake",
    )

    def __init__(self, prepared: list[Prepared], epoch: int, check: Hook | None) -> None:
        self.prepared = prepared
        self.epoch = epoch
        self.check = check
        self.pending: list[Record] = []  # its records, once accepted (not yet durable)
        self.records: list[Record] | None = None  # set once committed
        self.error: BaseException | None = None  # set once refused or failed
        # Its thread, queued behind a commit, sleeps on ``wake`` (held) until released:
        # once the batch is settled, or to lead.  ``signalled``: released, not yet seen
        # (a Lock released twice raises).  ``settled``: its commit has ended (set with
        # the wake-up, so the thread never leaves before the leader counts it);
        # ``returning``: the handle waits for its thread to wake (see _release).  All
        # change under the writer's _mutex.
        self.wake: threading.Lock | None = None
        self.signalled = False
        self.settled = False
        self.returning = False

    def signal(self) -> None:
        """Wake the batch's thread, if it sleeps (call with the writer's _mutex held)."""
        if self.wake is not None and not self.signalled:
            self.signalled = True
            self.wake.release()


# The handles of this process, for ``_forked``.
_LIVE: weakref.WeakSet[Writer] = weakref.WeakSet()


def _forked() -> None:
    """In the child of ``fork()``: every handle inherited fails.  Parent and child share
    its lock's open file description, so flock no longer excludes the two (both
    appended "committed" records over each other's); the child opens its own."""
    for writer in list(_LIVE):
        writer._failed = WriterFailedError(
            "a journal handle inherited across fork(): open a new one in the child"
        )


_fsutil.at_fork_in_child(_forked)


class Writer:
    """Appends for one handle; owns its Position, subscribers and group-commit queue."""

    def __init__(
        self,
        directory: str,
        lock_fd: int,
        found: Survey,
        *,
        max_epoch: int,
        segment_bytes_max: int,
        fence: Fence | None,
        entry_durable: bool = False,
        read_only: bool = False,
    ) -> None:
        self.directory = directory
        self._lock_fd = lock_fd
        self._segment_bytes_max = segment_bytes_max
        self._fence = fence
        # Called once a wait for the append lock has lasted a while (``_fsutil.lock``).
        self.on_lock_wait: Callable[[], None] | None = None
        # The records the survey at open read (up to its last_seq), for the first
        # subscriber (``Journal.subscribe``), then dropped.
        self.surveyed: Sequence[Record] = found.records
        self.subscribers: list[Subscriber] = []  # fed once a record is durable
        self.early_subscribers: list[Subscriber] = []  # fed once its batch is accepted
        self.pos = Position(
            directory,
            lock_fd,
            found,
            max_epoch=max_epoch,
            entry_durable=entry_durable,
            read_only=read_only,
        )
        # _mutex guards _busy, _owner, _queue, _waiting, _returning; _cond waits on the
        # same lock.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._waiting = 0  # threads in _wait(): notify only when someone listens
        self._busy = False  # one thread at a time owns the handle's position and I/O
        self._owner = 0  # the thread that owns it while _busy (0: handed over, below)
        self._queue: list[_Batch] = []
        # Threads of the last commit's batches that have not yet run: until they have,
        # the handle stays _busy and new batches queue (see _release).  _to_wake: those
        # not yet woken, last first (each one that runs wakes the next).
        self._returning = 0
        self._to_wake: list[_Batch] = []
        # Commits (one write and one fdatasync each) and the records they carried, for
        # benchmarks and tests (plain counters, updated by the committing thread).
        self.commits = 0
        self.committed_records = 0
        self._failed: WriterFailedError | None = None
        self._closed = False
        _LIVE.add(self)

    # -- ownership --------------------------------------------------------------------

    def _wait(self, timeout_s: float | None = None) -> None:
        """Wait for the handle to change hands (call with _mutex held), or at most
        ``timeout_s``."""
        self._waiting += 1
        try:
            self._cond.wait(timeout_s)
        finally:
            self._waiting -= 1

    def _release(self, group: Iterable[_Batch] = (), own: _Batch | None = None) -> None:
        """Give the handle up after a commit: wake the threads of ``group`` (settled by
        it; ``own`` is the leader's batch), and once they have all run, the thread of the
        first batch still queued (to lead the next commit) and any thread waiting to own
        the handle.

        Why not at once: the threads woken here are the appenders most likely to append
        again right away (``ferry work -j N``: each thread appends one record and waits
        for it).  Leading at once, the next leader took only what was queued during the
        fsync, and these threads' next records went to the commit after it: with 8
        threads each fsync carried 4 records on average, whatever the disk.  So the
        handle stays reserved (_busy, no _owner) until each woken thread has run
        (``_check_in``): what they append meanwhile queues and joins the next commit.
        The wait ends when the last of them is scheduled, not after a delay, and it is
        empty for a lone appender (no thread to wake).

        One at a time: this wakes the first thread, and each one, when it runs, wakes
        the next (``_to_wake``).  They run one after another anyway (the GIL); woken
        all at once, they made the leader spend 60 us in the wake-ups alone and fought
        over the GIL (measured: 8 waiting appenders, about 15% more records/s so).

        A KeyboardInterrupt while this waits for the _mutex must not leave the handle
        reserved for ever (``_surely``)."""
        self._surely(self._release_held, group, own)

    def _release_held(self, group: Iterable[_Batch], own: _Batch | None) -> None:
        to_wake = self._to_wake
        for batch in group:
            if batch is own:
                continue
            batch.settled = True
            if batch.wake is not None:  # (None: its thread gave up waiting)
                batch.returning = True
                to_wake.append(batch)
        self._returning = len(to_wake)
        if to_wake:
            self._owner = 0
            to_wake.reverse()
            to_wake.pop().signal()
        else:
            self._hand_over()

    def _surely(self, step: Callable[..., None], *args: object) -> None:
        """``step(*args)`` with _mutex held, even if a KeyboardInterrupt comes while this
        waits for the _mutex (the main thread handles signals where it blocks): the wait
        is taken up again, and the interrupt raised once ``step`` has run.  For the
        bookkeeping other threads wait on (a handle left reserved, a thread never woken
        or never counted back, would hang them all; and close() with them).  One raised
        from the interpreter's check inside ``step`` still cuts it short: that window is
        a few bytecodes, not a wait."""
        interrupted: BaseException | None = None
        while True:
            taken = False
            try:
                with self._mutex:
                    taken = True
                    step(*args)
                break
            except BaseException as exc:
                if taken:
                    raise
                interrupted = exc
        if interrupted is not None:
            raise interrupted

    def _hand_over(self) -> None:
        """Free the handle: wake the thread of the first queued batch (to lead) and any
        thread waiting to own the handle (call with _mutex held)."""
        self._busy = False
        if self._queue:
            self._queue[0].signal()
        if self._waiting:
            self._cond.notify_all()

    def _check_in(self, batch: _Batch) -> None:
        """The thread of a settled batch has woken (call with _mutex held): it wakes the
        next one, and the last one frees the handle."""
        if batch.returning:
            batch.returning = False
            self._returning -= 1
            to_wake = self._to_wake
            if batch in to_wake:  # (up early: woken to lead just before it was settled)
                to_wake.remove(batch)
            elif to_wake:
                to_wake.pop().signal()
            if not self._returning:
                self._hand_over()

    def _give_up(self, batch: _Batch, group: list[_Batch] | None) -> None:
        """The thread of ``batch`` stops appending before it returns (interrupted:
        KeyboardInterrupt, or refused): leave nothing waiting for it (call with _mutex
        held).  Still queued, the batch is dropped (never written); taken by a leader,
        it is committed or not, and its caller is not told (the records' outcome is
        unknown, as documented); settled, its thread checks in (once).  ``group``: the
        thread took the lead but never led: the other batches go back to the queue,
        unwritten, for the next leader."""
        batch.wake = None  # (a leader that has it counts no thread to wake)
        if group is not None:
            self._queue[:0] = [other for other in group if other is not batch]
            self._hand_over()
        elif batch.settled:
            self._check_in(batch)
        elif batch in self._queue:
            self._queue.remove(batch)
            if self._queue and not self._busy:  # it may have been woken to lead
                self._queue[0].signal()

    def _check_usable(self) -> None:
        if self._closed:
            raise JournalClosedError("the journal handle is closed")
        if self._failed is not None:
            raise WriterFailedError(self._failed.message) from self._failed.__cause__

    def _refuse_reentry(self) -> None:
        """A subscriber or hook calling back into the handle that runs it would wait for
        itself forever: refuse instead (call with _mutex held)."""
        if self._busy and self._owner == _get_ident():
            raise JournalError(
                "journal called from its own subscriber or hook (this would deadlock)"
            )

    @contextmanager
    def owned(self, deadline: float | None = None) -> Iterator[bool]:
        """Own the handle (no commit in progress) for the duration; ``deadline`` (of
        ``time.monotonic``): unless another thread still has it then (the context gets
        False, and owns nothing)."""
        with self._mutex:
            self._refuse_reentry()
            while self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._wait(left)
            free = not self._busy
            if free:
                self._check_usable()
                self._busy, self._owner = True, _get_ident()
        if not free:
            yield False
            return
        try:
            yield True
        finally:
            self._release()

    def can_lock(self) -> bool:
        """Has this handle the lock file (the caller owns the handle)?  A read-only one
        opened before the journal was made has none: it looks for it again."""
        if self._lock_fd < 0:
            lock_fd = _fsutil.open_lockfile_read(_fsutil.join(self.directory, LOCK_NAME))
            self._lock_fd = self.pos.lock_fd = lock_fd
        return self._lock_fd >= 0

    @contextmanager
    def locked(self, within_s: float | None = None) -> Iterator[bool]:
        """The cross-process append lock (the caller owns the handle); ``within_s``: only
        if it is free within that time (the context then gets False, and holds none)."""
        if within_s is None:
            _fsutil.lock(self._lock_fd, self.on_lock_wait)
        elif not _fsutil.lock_within(self._lock_fd, within_s):
            yield False
            return
        try:
            yield True
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
        group: list[_Batch] | None = None
        # A KeyboardInterrupt may end this anywhere from queuing to leading (signals
        # are handled where the main thread blocks, the _mutex included, or at its next
        # check): _give_up leaves nothing waiting for this thread, not even a count.
        try:
            with self._mutex:
                if self._closed or self._failed is not None:
                    self._check_usable()
                if self._busy:
                    self._refuse_reentry()
                    batch.wake = wake = threading.Lock()
                    wake.acquire()
                    self._queue.append(batch)
                else:
                    # Batches may be queued by threads not yet awake: they go first.
                    group = [*self._queue, batch] if self._queue else [batch]
                    self._queue = []
                    self._busy, self._owner = True, _get_ident()
            while group is None:
                wake.acquire()  # (released once the batch is settled, or for us to lead)
                with self._mutex:
                    batch.signalled = False
                    if batch.settled:
                        self._check_in(batch)
                        break
                    if self._busy:
                        continue  # another thread took the lead (and our batch, or not yet)
                    if self._closed or self._failed is not None:
                        self._queue.remove(batch)
                        if self._queue:  # each queued thread learns it in turn
                            self._queue[0].signal()
                        self._check_usable()
                    # Nobody took our batch: lead, taking everything queued meanwhile.
                    group, self._queue = self._queue, []
                    self._busy, self._owner = True, _get_ident()
        except BaseException:
            self._surely(self._give_up, batch, group)
            raise
        if group is not None:
            try:
                self._lead(group)
            finally:
                self._release(group, batch)
        if batch.error is not None:
            raise batch.error
        assert batch.records is not None
        return batch.records

    def _lead(self, group: list[_Batch]) -> None:
        try:
            _fsutil.lock(self._lock_fd, self.on_lock_wait)
            try:
                self._commit(group)
            finally:
                _fsutil.unlock(self._lock_fd)
        except (CorruptionError, FormatVersionError) as exc:
            self._settle(group, exc)  # nothing was written; the handle stays usable
        except WriterFailedError as exc:  # (the catch-up found records taken back)
            self._settle(group, exc)
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

    def append_one(self, item: Prepared, epoch: int, check: Hook | None) -> Record:
        """``append_batch([item], epoch, check)[0]``, without the group's bookkeeping
        when no other thread is appending through this handle (the common case)."""
        alone = False
        try:
            with self._mutex:
                alone = not (self._busy or self._queue or self._closed or self._failed)
                if alone:
                    self._busy, self._owner = True, _get_ident()
        except BaseException:  # (a KeyboardInterrupt as it leaves the _mutex)
            if alone:
                self._release()
            raise
        if not alone:
            return self.append_batch([item], epoch, check)[0]
        try:
            lock_fd = self._lock_fd
            _fsutil.lock(lock_fd, self.on_lock_wait)
            try:
                outcome = self._commit_one(item, epoch, check)
            finally:
                _fsutil.unlock(lock_fd)
        except (CorruptionError, FormatVersionError, WriterFailedError):
            raise  # nothing was written (the handle stays usable, unless it failed)
        except _SubscriberFailed as exc:
            raise self.fail("a subscriber raised; the handle is unusable", exc) from exc
        except OSError as exc:
            raise self.fail(f"journal write failed: {exc}", exc) from exc
        except BaseException as exc:
            error = self.fail(f"commit interrupted: {exc!r}", exc)
            if not isinstance(exc, Exception):
                raise
            raise error from exc
        finally:
            self._release()
        if isinstance(outcome, Record):
            return outcome
        raise outcome

    def _commit_one(self, item: Prepared, epoch: int, check: Hook | None) -> Record | Exception:
        """_commit for a group of one batch of one record."""
        pos = self.pos
        self._catch_up_and_cut()
        try:
            max_epoch = pos.max_epoch
            if 0 < epoch < max_epoch:
                raise FencedError(
                    f"epoch {epoch} is older than the journal's epoch {max_epoch}",
                    epoch=epoch,
                    current_epoch=max_epoch,
                )
            if self._fence is not None:
                self._fence(epoch)
            if check is not None:
                check()
        except Exception as exc:
            return exc
        seq = pos.last_seq + 1
        records = [_new_tuple(Record, (seq, item.epoch, item.ts, item.type, item.data))]
        if self.early_subscribers:
            self._feed(self.early_subscribers, records)
        self._flush([encode_line(seq, item)], records, epoch)
        if self.subscribers:
            try:
                self._feed(self.subscribers, records)
            except _SubscriberFailed as exc:  # committed all the same: say so, then fail
                self.fail("a subscriber raised; the handle is unusable", exc)
        return records[0]

    def _catch_up_and_cut(self) -> None:
        """Under the lock, before a commit: catch up, and cut a torn tail if one is there
        (never one that a valid snapshot covers: ``cut_tail`` refuses it)."""
        pos = self.pos
        torn = self._catch_up(locked=True)
        if torn is not None:
            pos.cut(torn)

    def _commit(self, group: list[_Batch]) -> None:
        pos = self.pos
        self._catch_up_and_cut()
        early = self.early_subscribers
        fence = self._fence
        lines: list[bytes] = []
        accepted: list[_Batch] = []
        seq, max_epoch = pos.last_seq, pos.max_epoch
        for batch in group:
            epoch = batch.epoch
            try:
                if 0 < epoch < max_epoch:
                    raise FencedError(
                        f"epoch {epoch} is older than the journal's epoch {max_epoch}",
                        epoch=epoch,
                        current_epoch=max_epoch,
                    )
                if fence is not None:
                    fence(epoch)
                if batch.check is not None:
                    if lines and not early:
                        # Nothing shows the check the batches before it until they are
                        # durable (and fed): write and sync them first.
                        self._flush_batches(lines, accepted, max_epoch)
                        lines, accepted = [], []
                    batch.check()
            except Exception as exc:
                batch.error = exc
                continue
            prepared = batch.prepared
            if len(prepared) == 1:  # (the common case of many waiting appenders)
                item = prepared[0]
                seq += 1
                lines.append(encode_line(seq, item))
                batch.pending = records = [
                    _new_tuple(Record, (seq, item.epoch, item.ts, item.type, item.data))
                ]
            else:
                epochs, stamps, types, datas, inners = zip(*prepared, strict=True)
                seqs = range(seq + 1, seq + 1 + len(inners))
                lines.append(encode_batch(seq + 1, inners))  # (marked: all or none)
                batch.pending = records = list(
                    map(
                        _new_tuple,
                        repeat(Record),
                        zip(seqs, epochs, stamps, types, datas, strict=True),
                    )
                )
                seq = seqs[-1]
            accepted.append(batch)
            if epoch > max_epoch:
                max_epoch = epoch
            if early:  # accepted: the next batch's check sees its effects
                self._feed(early, records)
        if lines:
            self._flush_batches(lines, accepted, max_epoch)

    def _flush_batches(self, lines: list[bytes], accepted: list[_Batch], max_epoch: int) -> None:
        records = list(chain.from_iterable(batch.pending for batch in accepted))
        self._flush(lines, records, max_epoch)
        for batch in accepted:  # committed: their callers may learn it
            batch.records = batch.pending
        if self.subscribers:  # (a raise here fails the handle, not these batches)
            self._feed(self.subscribers, records)

    def _flush(self, lines: list[bytes], records: list[Record], max_epoch: int) -> None:
        """Write ``lines`` (the ``records``) with one write and one fdatasync; the
        position follows.  The caller feeds the subscribers."""
        pos = self.pos
        data = lines[0] if len(lines) == 1 else b"".join(lines)
        if pos.fd is None or (pos.end > 0 and pos.end + len(data) > self._segment_bytes_max):
            self._new_segment()
        if not pos.durable:
            pos.make_durable()
        fd, start = pos.fd, pos.end
        assert fd is not None
        end = start + len(data)
        if end > pos.allocated:
            pos.allocated = _fsutil.size(fd)  # (another handle may have preallocated)
            if end > pos.allocated:
                grow = min(max(end, PREALLOC_MIN_BYTES), PREALLOC_MAX_BYTES)
                zeros = max(min(end + grow, self._segment_bytes_max), end) - end
                # Never let the zeros be what fills the disk: a failed write fails the
                # handle for good, and these records alone may fit.
                if zeros and _fsutil.free_bytes(fd) >= 2 * (zeros + len(data)):
                    data += bytes(zeros)
        try:
            _fsutil.pwrite_durably(fd, data, start)
        except OSError:
            _take_back(fd, start)
            raise
        # Durable. (An error above left these records' outcome unknown: the handle
        # failed, and no caller was told they are committed.)
        pos.end, pos.tail = end, lines[-1][-TAIL_BYTES:]
        pos.allocated = max(pos.allocated, start + len(data))
        pos.last_seq = records[-1].seq
        self.commits += 1
        self.committed_records += len(records)
        if max_epoch > pos.max_epoch:
            pos.max_epoch = max_epoch

    def _new_segment(self) -> None:
        # (A named step: tests/integration/test_journal_powercut.py removes the
        # directory fsync made under this frame and expects the loss to be caught.)
        self.pos.new_segment()

    @staticmethod
    def _feed(subscribers: list[Subscriber], records: list[Record]) -> None:
        for record in records:
            for subscriber in subscribers:
                try:
                    subscriber(record)
                except Exception as exc:
                    raise _SubscriberFailed(repr(exc)) from exc

    def _feed_one(self, record: Record) -> None:
        """A record caught up from disk: every subscriber, early ones first."""
        for subscriber in (*self.early_subscribers, *self.subscribers):
            try:
                subscriber(record)
            except Exception as exc:
                raise _SubscriberFailed(repr(exc)) from exc

    def catch_up_feeding(self, *, locked: bool = False) -> None:
        """Catch up outside a commit (the caller owns the handle; ``locked``: and holds
        the append lock).  A torn tail is left alone: without the lock it may be an
        append in progress, and with it the next commit cuts it."""
        try:
            self._catch_up(locked=locked)
        except _SubscriberFailed as exc:
            raise self.fail("a subscriber raised; the handle is unusable", exc) from exc

    def _catch_up(self, *, locked: bool) -> TornTail | None:
        """``Position.catch_up``, feeding the subscribers; records this handle read
        and then taken back fail it (its subscribers' state holds them)."""
        try:
            return self.pos.catch_up(self._feed_one, locked=locked)
        except TakenBackError as exc:
            raise self.fail(exc.message, exc) from exc

    def sync_read(self) -> None:
        """fdatasync the active segment (the caller holds the append lock): every record
        read is durable, another process's too. A failure fails the handle for good:
        retried, an fdatasync may "succeed" without the data (Linux may have dropped the
        dirty pages whose write failed)."""
        if self.pos.fd is None:
            return
        try:
            _fsutil.sync_data(self.pos.fd)
        except OSError as exc:
            raise self.fail(f"journal sync failed: {exc}", exc) from exc

    def refresh(self) -> None:
        with self.owned():
            self.catch_up_feeding()

    def close(self) -> None:
        with self._mutex:
            self._refuse_reentry()
            # Closed first, then wait for the commit in progress: appends from now on
            # are refused, and queued ones learn it in turn.  (Waiting first, a steady
            # stream of appends from other threads kept the handle busy for ever.)
            closed_before, self._closed = self._closed, True
            while self._busy:
                self._wait()
            if closed_before:
                return
        self.pos.close()
        if self._lock_fd >= 0:  # (a read-only handle may have none)
            _fsutil.close(self._lock_fd)

    def ensure_usable(self) -> None:
        with self._mutex:
            self._check_usable()


def _take_back(fd: int, start: int) -> None:
    """A write or sync of a commit failed (its callers will be told so): cut the segment
    back to where the commit began, and sync that, so that no later reader finds some
    of its records (a short write on a full disk leaves whole lines: a batch is all or
    none).  Best effort: if this fails too, the records' outcome stays unknown, and a
    reader finds a prefix of them and a torn tail (see the module docstring)."""
    with suppress(OSError):
        _fsutil.truncate(fd, start)
        _fsutil.sync_file(fd)
