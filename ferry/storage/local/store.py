"""Typed events over ``journal/``, with the task table kept folded and every write
validated against the caught-up table under the journal's append lock.

Why the check runs under the lock: two processes (two ``ferry claim``, a runner and a
``ferry recover``) may race to move the same task. ``journal.append_batch`` catches up
on what the others wrote, then calls our ``check`` with the cross-process lock held, so
the table it validates against is the journal's true end, and nothing illegal is ever
written. A late runner whose claim recovery already decided is refused here
(``task.stale_claim``), not papered over at read time.

Snapshots (``compact``) keep start-up cost following live work, not history: the
journal snapshot holds live tasks and the small indexes; settled tasks go to a separate
archive file (``archive/settled-<seq>-<random>.jsonl``) that is read only when a command needs
history, with an index beside it (``archive/index-<seq>-<random>.idx``,
``archive_index``) so that ``ls --limit N`` and ``show`` of an old task read a few
lines of it, not all (``history``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

import journal
from ferry.core import events as ev
from ferry.core.errors import (
    EX_TEMPFAIL,
    TAKEN_BACK,
    FerryError,
    JournalIntegrityError,
    LeaseHeldError,
    StateDirError,
    UsageError,
    from_os_error,
)
from ferry.core.fold import MAY_RUN_ON_VALUES
from ferry.core.model import Task
from ferry.core.state import States, Table
from ferry.failpoints import failpoint
from ferry.proc import alivelock
from ferry.storage.claiming import ClaimsUnderLock
from ferry.storage.local.statedir import fsync_dir, make_dir_durable, private_open, write_atomic
from journal import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    pass

# Compact once this many records follow the last snapshot (and a quarter as many as
# there are live tasks: Store.compaction_due). Every command folds them: opening a home
# whose snapshot holds no live task took 2.1 ms with 55 records after it and 5.0 ms with
# 245 (15 µs each), and a compaction of it 3.8 and 5.1 ms. With 5 records per `ferry run
# -- true`, a run pays 0.8 ms a time at 60 (a fold of 30 on average, a compaction in
# 12) against 2.0 at 250: 2026-12-05, 300 runs each, interleaved, pip-installed, median
# 41.4 ms against 42.6. A busy `work` compacts at most once a second whatever this is
# (it looks no more often: worker.COMPACT_CHECK_S). Earlier: at 5,000, `ferry run --
# true` took 140 ms just before a compaction against 70 ms just after; 580 runs each,
# interleaved, mean 78.3 ms at 1,000, 72.5 at 500, 69.4 at 250. It merges the archives
# by tiers.
SNAPSHOT_TAIL_RECORDS = 60
# ... and more than this many live tasks per record after the snapshot
# (Store.compaction_due).
LIVE_PER_TAIL_RECORD = 4
# Small segments: compaction can drop history sooner. Opening finds the snapshot's seq
# in the active segment by bisection (journal/_seek.py), not by reading up to it.
SEGMENT_BYTES_MAX = 8 << 20
# A SUBMITTED record holds the task's argv and env. Linux accepts up to 6 MiB of argv +
# environment for one exec (a quarter of the stack limit, capped at 3/4 of 8 MiB), so any
# command the kernel can run fits, with room for JSON escaping; larger is refused up front
# (usage.too_large), nothing written. Readers have no line limit: this bounds writes only.
RECORD_BYTES_MAX = 16 << 20
# Archives are merged into one past this many by a compaction that may (not work's
# between its turns): a merge reads and rewrites all history. With the tiers below, a
# home gets there only if work left many big archives and nothing else compacted.
ARCHIVES_MAX = 160
# Archives are merged by size tiers (``tiering``): so many newest ones of one tier
# become one of the tier above. Between work's turns, at most this many records are
# read and written again per compaction (about 0.3 to 0.6 s here: 8 to 20 µs each,
# once in some 25,000 tasks); a bigger one is started beside the loop (merge_aside).
LOOP_MERGE_RECORDS_MAX = 32_768
# A table that holds more settled tasks than this after a compaction (a long-lived
# work's: it folded them all) is made again from the snapshot just written, its
# history not loaded (about 1.5 KB a task held).
SETTLED_HELD_MAX = 20_000
# An explicit compaction that waits this long for compact.lock says so (as a writer
# does for the journal's append lock).
COMPACT_LOCK_NOTICE_S = 5.0
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
_ARCHIVE_PREFIX = "settled-"
_LEASE_ACQUIRED = ev.EventType.LEASE_ACQUIRED.value


def journal_error(error: journal.JournalError) -> FerryError:
    """A journal library error as ferry's coded error. Corruption and format trouble
    exit 4; a fenced write 75 (another leader is responsible); a record too large is
    bad input (2); a failed write or fsync (a full disk) is ferry failing (125)."""
    details = dict(error.details)
    if isinstance(error, journal.WriterFailedError):
        cause, seen = error.__cause__, set()
        while cause is not None and not isinstance(cause, FerryError) and id(cause) not in seen:
            seen.add(id(cause))
            cause = cause.__cause__
        if isinstance(cause, FerryError):
            # Our own subscriber (the table's fold) raised: its coded error (a history
            # load that failed) stops the command, not a vague "handle unusable".
            return cause
    if isinstance(error, journal.FencedError):
        return LeaseHeldError(
            f"fenced: a newer leader holds the journal ({error})", code=error.code, details=details
        )
    if isinstance(error, journal.RecordTooLargeError):
        return UsageError(
            f"the task is too large to journal (its argv and env may take at most "
            f"{RECORD_BYTES_MAX >> 20} MiB as JSON): {error}",
            code="usage.too_large",
            details=details,
        )
    if isinstance(error, journal.InvalidRecordError):
        return UsageError(str(error), code=error.code, details=details)
    if isinstance(error, journal.WriterFailedError):
        cause = error.__cause__
        if isinstance(cause, journal.TakenBackError):
            # Another process's write failed after this one read it: nothing was
            # written or done on it; a new process reads the journal as it is.
            return FerryError(
                f"{cause}: nothing was written; try again",
                code=cause.code,
                details=dict(cause.details),
                exit_code=EX_TEMPFAIL,
            )
        if isinstance(cause, OSError):
            details["errno"] = cause.errno
            if cause.errno in journal.NO_LOCK_ERRNOS:  # the append lock (flock) failed
                return StateDirError(
                    f"file locks do not work on the journal's filesystem: {cause.strerror}",
                    code="state_dir.no_locks",
                    details=details,
                )
            mapped = from_os_error(cause)
            if mapped.code != "io.error":  # a full disk, a read-only one...: say which
                return type(mapped)(
                    str(error), code=mapped.code, details={**details, **mapped.details}
                )
        return FerryError(str(error), code=error.code, details=details)
    if isinstance(
        error, journal.CorruptionError | journal.FormatVersionError | journal.TornTailError
    ):
        return JournalIntegrityError(str(error), code=error.code, details=details)
    if isinstance(error, journal.CompactedError):
        # ferry always starts from its latest snapshot: records compacted away that it
        # still needs mean that snapshot is gone or damaged (as 'journal verify' says).
        return JournalIntegrityError(
            f"{error}, and no valid snapshot covers them", code="journal.corrupt", details=details
        )
    if type(error) is journal.JournalError and isinstance(error.__cause__, OSError):
        # The journal's files could not be opened: say why (a symlink, a full disk...).
        mapped = from_os_error(error.__cause__)
        return type(mapped)(str(error), code=mapped.code, details={**details, **mapped.details})
    return FerryError(str(error), code=error.code, details=details)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class LeaseFence:
    """The journal refuses a write whose epoch is older than the highest it holds; this
    also refuses one older than the lease's (asked under the append lock). A successor
    that took the lease and has not journaled yet (``recover`` and ``claim`` probe
    first) fences a woken old leader all the same. Epoch 0 is no leader's write (run,
    submit, cancel): not fenced. An unreadable lease refuses every leader's write.

    ferry only ever replaces the lease file (written aside, renamed): the file last
    read is kept open, and while the path still names it, unchanged (one ``stat``: same
    inode, size and change time), its epoch is the one read. Holding it open keeps its
    inode from being reused, so no other file can pass for it. A write then opens no
    file: a process short of descriptors fails no commit for it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        self.file: tuple[int, ...] = ()  # _identity() of the file open on fd
        self.epoch = 0

    def __call__(self, epoch: int) -> None:
        if epoch <= 0:
            return
        current = self.current_epoch()
        if epoch < current:
            raise journal.FencedError(
                f"epoch {epoch} is older than the lease's epoch {current}",
                epoch=epoch,
                current_epoch=current,
            )

    def current_epoch(self) -> int:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return 0  # no lease was ever taken (or it was moved aside: epochs go on)
        if _identity(st) != self.file:
            from ferry.storage.local.lease import (  # (leaders have it loaded)
                parse_lease,
                read_lease_fd,
            )

            fd = private_open(self.path, os.O_RDONLY)
            try:
                opened = os.fstat(fd)
                epoch = parse_lease(read_lease_fd(fd)).epoch
            except BaseException:
                os.close(fd)
                raise
            self.close()
            self.fd, self.file, self.epoch = fd, _identity(opened), epoch
        return self.epoch

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd, self.file = -1, ()


class Store(ClaimsUnderLock):
    """The journal plus the folded table. Thread-safe: ``lock`` guards the table."""

    def __init__(self, home: str, wal: journal.Journal, table: Table) -> None:
        self.home = home
        self.wal = wal
        self.table = table
        self.lock = threading.RLock()
        self.snapshot_seq = 0  # the snapshot the table was loaded from (or last written)
        # The newest snapshot file (seq, inode) a compaction between work's turns looked
        # at while this table had to rewrite history: not looked at again.
        self._looked_at = (0, 0)
        self.fence: LeaseFence | None = None  # the journal's lease check (see LeaseFence)
        self.on_lock_wait: Callable[[], None] | None = None  # (given to a reopen: _reopen)
        # What a reader that shows what it can found damaged (``tolerate_damage``): the
        # command warns with it, once, after its output, and exits 4.
        self.damage: list[JournalIntegrityError] = []

    # ---- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        home: str | os.PathLike[str],
        *,
        on_lock_wait: Callable[[], None] | None = None,
        read_only: bool = False,
        tolerate_damage: bool = False,
    ) -> Store:
        """``on_lock_wait``: see ``journal.Journal.open`` (a long wait for the lock).

        ``read_only``: a reader's store; it creates nothing, takes no lock and cannot
        commit (the state directory may be on a disk mounted read-only).
        ``tolerate_damage`` (with ``read_only``): a damaged journal is read as far as
        it can be (``journal.Journal.open_view``: its newest usable snapshot, then
        every record up to the damage), and a settled-task archive that is missing or
        damaged is left out; ``damage`` says what, instead of an error."""
        home = os.fspath(home)
        if not tolerate_damage:
            return cls._open(home, on_lock_wait, read_only, damage=None)
        damage: list[JournalIntegrityError] = []
        try:
            return cls._open(home, None, True, damage=damage)
        except JournalIntegrityError as error:
            if error.code == "journal.format_version":
                raise  # (written by a newer ferry: not damage)
        return cls.open_view(home)

    @classmethod
    def open_view(cls, home: str | os.PathLike[str], accept: journal.Accept | None = None) -> Store:
        """What is readable of a damaged journal, as a read-only store (``accept``:
        which snapshot is usable, see ``journal.Journal.open_view``; by default one
        that decodes)."""
        home = os.fspath(home)
        try:
            wal = journal.Journal.open_view(
                os.path.join(home, "journal"), accept=accept or _decodable
            )
        except journal.JournalError as error:
            raise journal_error(error) from error
        view = wal.view
        assert view is not None
        damage = view_damage(view)
        base = wal.latest_snapshot()
        on_damaged = damage.append
        table = _table_from_snapshot(home, base.data, on_damaged) if base else Table()
        store = cls(home, wal, table)
        store.snapshot_seq = view.base_seq
        store.damage = damage
        try:
            wal.subscribe(store._apply, after_seq=table.last_seq)
        except journal.JournalError as error:
            raise journal_error(error) from error
        return store

    @classmethod
    def _open(
        cls,
        home: str,
        on_lock_wait: Callable[[], None] | None,
        read_only: bool,
        *,
        damage: list[JournalIntegrityError] | None,
    ) -> Store:
        fence = None if read_only else LeaseFence(os.path.join(home, "lease.json"))
        on_damaged = None if damage is None else damage.append
        wal: journal.Journal | None = None
        try:
            wal = journal.Journal.open(
                os.path.join(home, "journal"),
                segment_bytes_max=SEGMENT_BYTES_MAX,
                record_bytes_max=RECORD_BYTES_MAX,
                fence=fence,
                on_lock_wait=on_lock_wait,
                read_only=read_only,
            )
            snapshot = wal.latest_snapshot()
            for attempt in range(1, _OPEN_TRIES + 1):
                table = (
                    _table_from_snapshot(home, snapshot.data, on_damaged) if snapshot else Table()
                )
                store = cls(home, wal, table)
                if damage is not None:
                    store.damage = damage
                store.fence, store.on_lock_wait = fence, on_lock_wait
                store.snapshot_seq = snapshot.seq if snapshot else 0
                failpoint("before:replay")
                try:
                    # before_durable: every commit carries a check against this table,
                    # so the table must see the batches ahead in a group commit for
                    # checked commits of several threads (work -j N) to share one
                    # fsync. The table may then hold a record for the length of its
                    # fsync before it is durable (and keep it if that fsync fails: the
                    # handle is then dead). Nothing acts on the table alone: every side
                    # effect follows its own commit (docs/journal-format.md).
                    wal.subscribe(store._apply, after_seq=table.last_seq, before_durable=True)
                    break
                except journal.CompactedError:
                    # A compaction since we read the snapshot removed the records after
                    # it: a newer snapshot covers them, start again from that one. No
                    # newer snapshot: they are lost (journal.corrupt, as before).
                    newer = wal.latest_snapshot()
                    if attempt == _OPEN_TRIES or newer is None:
                        raise
                    if snapshot is not None and newer.seq <= snapshot.seq:
                        raise
                    snapshot = newer
            failpoint("after:replay")
        except BaseException as error:
            if wal is not None:
                wal.close()  # (a reader that shows what it can opens a view instead)
            if isinstance(error, journal.JournalError):
                raise journal_error(error) from error
            raise
        return store

    def close(self) -> None:
        self.wal.close()
        if self.fence is not None:
            self.fence.close()

    def _apply(self, record: journal.Record) -> None:
        with self.lock:
            self.table.apply_record(record)

    # ---- writing -------------------------------------------------------------------

    def commit(
        self, *events: ev.Event | tuple[str, dict[str, Any]], epoch: int = 0
    ) -> list[journal.Record]:
        """Validate and append ``events`` (Event objects or encoded (type, data) pairs)
        together: one write, one fsync. Durable on return. Raises the table's coded
        refusal, or a journal error (fenced, writer failed) as a FerryError."""
        batch = [e if isinstance(e, tuple) else e.encode() for e in events]
        if any(ev.WAIT in data for _, data in batch):  # (this host's clock is the journal's)
            batch = ev.resolve_waits(batch, None)

        def check() -> None:
            with self.lock:
                for record_type, data in batch:
                    if record_type == _LEASE_ACQUIRED:
                        self._check_new_epoch(int(data["epoch"]))
                self.table.validate_batch(batch, now=time.time())

        for record_type, _ in batch:
            failpoint("before:" + record_type)
        try:
            records = self.wal.append_batch(batch, epoch=epoch, check=check)
        except journal.JournalError as error:
            raise self._failed(error) from error
        for record_type, _ in batch:
            failpoint("after:" + record_type)
        return records

    def _failed(self, error: journal.JournalError) -> FerryError:
        """``error`` as ferry's; if it says records this handle read were taken back
        (their writer's fdatasync failed), the journal is opened again first, so that
        the next call reads it as it is (a ``work``, a ``wait`` go on)."""
        if isinstance(error.__cause__, journal.TakenBackError):
            with contextlib.suppress(FerryError, OSError):
                self._reopen()
        return journal_error(error)

    def _reopen(self) -> None:
        """This store, on the journal opened again: a new handle, the table folded
        from the latest snapshot again (what a new process loads), in place, so that
        whoever holds the store goes on with it."""
        if self.wal.view is not None:
            return  # (a damaged journal's view reads no further: nothing to read again)
        fresh = Store._open(self.home, self.on_lock_wait, self.wal.read_only, damage=None)
        with self.lock:
            old, fence = self.wal, self.fence
            fresh.lock = self.lock  # (its subscriber folds into this table, under this lock)
            self.wal, self.table, self.fence = fresh.wal, fresh.table, fresh.fence
            self.snapshot_seq, self._looked_at = fresh.snapshot_seq, (0, 0)
        old.close()
        if fence is not None:
            fence.close()

    def _check_new_epoch(self, epoch: int) -> None:
        """A leader announces its epoch (LEASE_ACQUIRED) in its first write: refused if
        any record already used that epoch. So two processes that were both handed one
        epoch (``lease.json`` lost or restored from a backup while one was paused)
        cannot both write with it: the first to journal it is the only holder."""
        used = self.wal.max_epoch
        if epoch <= used:
            raise LeaseHeldError(
                f"epoch {epoch} was already used in the journal (its highest is {used}):"
                " another leader holds it",
                code="journal.fenced",
                details={"epoch": epoch, "current_epoch": used},
            )

    def refresh(self) -> None:
        """Catch up on what other processes appended. Records read before and taken
        back since by their writer (its fdatasync failed): the journal is read again,
        as it is (``_failed``), and that is the catch-up."""
        self._catch_up(journal.Journal.refresh)

    def bound_calls(self) -> None:
        """Local calls wait on no network and no other session's lock."""

    def beat(self, task: Task) -> bool:
        """Beats are the heartbeat file the supervisor touches: nothing to record."""
        return True

    def host_lost(self, task: Task, ttl_s: float) -> bool | None:
        """One host: every task is this host's to decide."""
        return None

    def log_tails(self, task_id: str, attempt: int) -> dict[str, tuple[bytes, int]]:
        """One host: the logs are here, nothing is kept of them."""
        return {}

    def sync(self, within_s: float | None = None) -> bool:
        """Catch up under the append lock, and make every record read durable
        (``journal.Journal.sync``): before acting on a read that writes nothing.
        ``within_s``: False if the lock was not free within it."""
        return self._catch_up(lambda wal: wal.sync(within_s))

    def _catch_up(self, how: Callable[[journal.Journal], bool | None]) -> bool:
        try:
            return how(self.wal) is not False
        except journal.JournalError as error:
            failed = self._failed(error)
            if failed.code != TAKEN_BACK:
                raise failed from error
        try:  # (on the handle _failed opened: the journal as it is now)
            return how(self.wal) is not False
        except journal.JournalError as error:
            raise self._failed(error) from error

    # ---- reading -------------------------------------------------------------------

    def get(self, task_id: str) -> Task | None:
        with self.lock:
            return self.table.get(task_id)

    def resolve(self, prefix: str) -> Task:
        """The task ``prefix`` names: an id or a unique prefix of it, a number, ``last``."""
        with self.lock:
            return self.table.resolve(prefix)

    def live(self) -> list[Task]:
        with self.lock:
            return self.table.live()

    def in_flight(self) -> list[Task]:
        with self.lock:
            return self.table.in_flight()

    def newest(self, limit: int, state: States = None) -> list[Task]:
        """``Table.newest``: the newest ``limit`` tasks (0: all), oldest first."""
        with self.lock:
            return self.table.newest(limit, state)

    def count(self, state: States = None) -> int:
        with self.lock:
            return self.table.count(state)

    def queued(
        self,
        limit: int,
        *,
        skip: Collection[str] = (),
        extra: Mapping[str, int] | None = None,
    ) -> list[Task]:
        with self.lock:
            return self.table.candidates(limit, now=time.time(), skip=skip, extra=extra)

    def groups(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.table.groups()

    def doomed(self) -> list[tuple[Task, str]]:
        with self.lock:
            return self.table.doomed()

    def quarantined(self) -> list[Task]:
        with self.lock:
            return self.table.quarantined()

    def succeeded_with_key(self, key: str) -> str | None:
        with self.lock:
            return self.table.succeeded_with_key(key)

    def settled_before(self, seconds: float, states: Iterable[str]) -> list[Task]:
        with self.lock:
            return self.table.settled_before(seconds, states)

    def now(self) -> float:
        """This host's clock: the journal's."""
        return time.time()

    def forgotten_here(self) -> list[str]:
        with self.lock:
            return self.table.forgotten_ids()

    def files_removed(self, task_ids: Iterable[str]) -> None:
        """Nothing to record: the compaction that drops the ids removes their files
        first (``_compact_locked``)."""

    @property
    def highest_epoch(self) -> int:
        return self.wal.max_epoch

    # ---- snapshots -----------------------------------------------------------------

    def tail_records(self) -> int:
        """Records after the snapshot this store loaded (or last wrote): no I/O."""
        return self.wal.last_seq - self.snapshot_seq

    def compact(
        self, *, wait: bool = True, on_lock_wait: Callable[[], None] | None = None
    ) -> dict[str, Any] | None:
        """Write a snapshot of the table at the journal's end and drop what it covers.

        Settled tasks go to archive files: each compaction writes only the tasks that
        settled since the previous snapshot (so its cost follows recent work), merges
        the newest archives by size tiers (``tiering``), and merges them all into one
        when there are more than ARCHIVES_MAX or history must be rewritten.

        Compactions are serialised by ``compact.lock`` in the state directory: two at
        once could otherwise each prune an archive the other's (newer) snapshot names.
        When another compaction holds it: ``wait=False`` returns None at once (nothing
        done); ``wait=True`` waits, calling ``on_lock_wait`` (from a timer thread) once
        the wait has lasted COMPACT_LOCK_NOTICE_S: its holder may be stopped, and keeps
        the lock until it is continued or killed."""
        return self._compact(wait, on_lock_wait, may_merge=True)

    def _compact(
        self, wait: bool, on_lock_wait: Callable[[], None] | None, *, may_merge: bool
    ) -> dict[str, Any] | None:
        directory = os.path.join(self.home, "archive")
        make_dir_durable(directory)
        lock_fd = os.open(os.path.join(self.home, "compact.lock"), _LOCK_FLAGS, 0o600)
        try:
            if not _lock_compaction(lock_fd, wait, on_lock_wait):
                return None
            return self._compact_locked(directory, may_merge)
        finally:
            os.close(lock_fd)  # releases the flock

    def _compact_locked(self, directory: str, may_merge: bool) -> dict[str, Any] | None:
        try:
            # Under the append lock, durable: a record read without it may be taken back
            # (its writer's fdatasync failed), and a compaction removes the files of the
            # tasks forgotten (a gc's FORGOTTEN taken back lost a task's log).
            self.sync()
            previous = self.wal.latest_snapshot()
            if not may_merge and previous is not None and previous.seq >= self.snapshot_seq:
                self._adopt(previous)  # (the same seq: written again by an idle merge)
            prev_seq, previous_archives = 0, []
            if previous is not None:
                prev_seq = previous.seq
                previous_archives = list(_json.loads(previous.data).get("settled_archives", []))
            archives = list(previous_archives)
            with self.lock:
                data = self.table.live_snapshot()
                seq = self.table.last_seq
                delta = newly_settled = self.table.settled_since(prev_seq)
                # Tasks forgotten (ferry gc) may be in the archives: they are rewritten
                # without them, as a merge does, so that the snapshot need not name them.
                # So are archives without an index, or a table that cannot count its
                # settled tasks without loading them (written before indexes, or by
                # such a ferry since): once, and ls and show read a few lines again.
                rewrite = self.table.history_needs_rewrite() or not _all_indexed(
                    directory, archives
                )
                if rewrite and not may_merge:
                    return dict(_MERGE_WAITING)  # (by a compaction that may: see maybe_compact)
                merge = rewrite or (may_merge and len(archives) >= ARCHIVES_MAX)
                forgotten: list[str] = []
                if merge:
                    delta, archives = self.table.to_snapshot()["settled"], []
                    data.pop("forgotten", None)
                    data["settled_counts"] = self.table.settled_counts()
                    forgotten = self.table.forgotten_ids(seq)
            if delta:
                archives.append(_write_archive(directory, seq, delta))
            waiting = False
            if not merge:
                bound = None if may_merge else LOOP_MERGE_RECORDS_MAX
                archives, waiting = _merge_tiers(directory, seq, archives, bound)
            data["settled_archives"] = archives
            # The snapshot about to drop the forgotten ids is the last place that names
            # them: their files go first (a gc killed before it removed them).
            _remove_task_files(self.home, forgotten)
            failpoint("before:snapshot_write")
            blob = _json.dumps(data)
            self.wal.write_snapshot(seq, blob)
            failpoint("after:snapshot_write")
            self.snapshot_seq = seq
            with self.lock:
                self.table.archived(seq)
                if merge:
                    self.table.forget_done(seq)
                held = self.table.settled_held()
            if held > SETTLED_HELD_MAX and not may_merge:  # (work's loop: a long life)
                # A long-lived table (work) holds every task settled since it started
                # (about 1.5 KB each: 103 MB after 50,000): it lets go of them for
                # the history it just archived them in, as a fresh process has it.
                self._rebase(journal.Snapshot(seq, blob))
            removed = self.wal.compact()
            if previous is not None:
                named = [*archives, *previous_archives]
                keep = {a["name"] for a in named}
                keep.update(a["index"] for a in named if isinstance(a.get("index"), str))
                _prune_archives(directory, keep)
            _prune_heartbeats(self.home, newly_settled)
        except journal.JournalError as error:
            raise journal_error(error) from error
        return {
            "snapshot_seq": seq,
            "removed": [str(p) for p in removed],
            "archives": len(archives),
            **(_MERGE_WAITING if waiting else {}),  # (work: done beside it)
        }

    def maybe_compact(
        self, *, merge: bool = True, unless_led: bool = False
    ) -> dict[str, Any] | None:
        """Compact when enough records follow the last snapshot (leaders, and ``run``
        after it settled: so a journal only ever written by ``ferry run`` in CI still
        keeps start-up cost bounded). Skipped, never awaited, while another compaction
        holds ``compact.lock``: one stopped inside its compaction (Ctrl-Z, a frozen
        container) made every later ``ferry run`` finish its task and never return.
        The compaction in progress, or the next, does the work. None if skipped.

        ``merge=False`` (between ``work``'s turns): the archives are merged by tiers
        only within LOOP_MERGE_RECORDS_MAX, never all into one, even past ARCHIVES_MAX,
        and a compaction that must rewrite history is skipped, at no cost: a merge of
        all history reads and rewrites it, for seconds with a long one. What is left
        undone is said (``merges_waiting``: work has it done beside its loop). (A
        table that folded a ``gc``'s FORGOTTEN records must rewrite history, until
        another process's compaction did: its snapshot is then taken, ``_adopt``; a
        listing of the journal's directory says whether there is a new one.)"""
        if not self.compaction_due():
            return None
        if unless_led:
            with self.lock:
                lease = self.table.lease
            if lease is not None and lease.get("held"):
                # A leader's LEASE_ACQUIRED with no LEASE_RELEASED after it (one that
                # died holding it too: then the next work, recover or run compacts).
                return None
        listed = None  # (the newest snapshot file, if this table must rewrite history)
        if not merge:
            with self.lock:  # (no I/O but a listing: work looks once a second)
                stuck = self.table.history_needs_rewrite()
            if stuck:
                listed = self.wal.newest_snapshot_file()
                if listed == self._looked_at:
                    return dict(_MERGE_WAITING)  # (nothing new to _adopt)
        report = self._compact(False, None, may_merge=merge)
        if listed is not None and report is not None:
            # Looked at once, whatever it holds (a newest file that fails its checks
            # made every look take the lock and write nothing: 372 ms of CPU a second
            # with 26,000 live tasks); not while another held the lock (then the one it
            # writes would never be looked at).
            self._looked_at = listed
        return report

    def _adopt(self, snapshot: journal.Snapshot) -> None:
        """Take ``snapshot``, written by another process since this table was loaded,
        as this table's base, when this table must rewrite history and that snapshot's
        does not: a ``gc`` beside a long-lived ``work`` forgot tasks and rewrote the
        archives without them in its own compaction; the worker's table, which folded
        the FORGOTTEN records, still remembered their ids and could not count its
        settled tasks, so every compaction between its turns was skipped until it
        restarted (a review: 11,500 records after the snapshot, ``ls`` 0.22 s against
        0.05). Under ``compact.lock`` (no snapshot newer, no segment removed,
        meanwhile)."""
        with self.lock:
            if not self.table.history_needs_rewrite():
                return
        self._rebase(snapshot)

    def _rebase(self, snapshot: journal.Snapshot) -> None:
        """Make this table ``snapshot``'s, with the records since folded again from
        disk: what a fresh process would load, its history not loaded. Not if that
        table would have to rewrite history, nor while a record this table folded is
        not on disk yet. Under ``compact.lock``."""
        table = _table_from_snapshot(self.home, snapshot.data)
        if table.history_needs_rewrite():
            return
        with self.lock:  # (records folded meanwhile are folded again below)
            end = self.table.last_seq
            for record in self.wal.read(snapshot.seq + 1):
                if record.seq > end:
                    break
                table.apply_record(record)
            if table.last_seq != end:
                return  # (a record not on disk yet: one accepted before its fsync)
            self.table = table
            self.snapshot_seq = snapshot.seq

    def compaction_due(self) -> bool:
        """At least SNAPSHOT_TAIL_RECORDS follow the snapshot, and more than a
        quarter as many as there are live tasks (LIVE_PER_TAIL_RECORD). A snapshot
        holds every live task, and writing one costs about as much as folding as many
        records: with a long queue, a compaction due by the tail alone wrote it all
        again at every look of work (once a second). But every command folds the tail:
        with ``tail > live`` (the rule before), 20,000 queued tasks let it reach 19,950
        records and ``ls`` took 1,090 ms against 526 after a compaction (a review,
        /tmp/review2/tailq.py). Now the tail costs a command at most a quarter more
        than the snapshot, and a compaction is paid by a quarter of its size in
        records. No I/O."""
        tail = self.tail_records()
        if tail < SNAPSHOT_TAIL_RECORDS:
            return False
        with self.lock:
            return tail * LIVE_PER_TAIL_RECORD > self.table.count_live()


def _lock_compaction(fd: int, wait: bool, on_wait: Callable[[], None] | None) -> bool:
    """Take ``compact.lock`` (an flock: released on close and when the process dies).
    False if another compaction holds it and ``wait`` is False."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if not wait:
            return False
    timer = None
    if on_wait is not None:
        timer = threading.Timer(COMPACT_LOCK_NOTICE_S, on_wait)
        timer.daemon = True
        timer.start()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        if timer is not None:
            timer.cancel()
    return True


def compaction_running(home: str | os.PathLike[str]) -> bool:
    """Another process holds ``compact.lock`` now (a probe: the lock is let go at once).
    For ``journal compact --no-wait``, before it opens the store (that alone reads the
    snapshot and folds what follows it: 0.55 s of CPU with 20,000 tasks queued)."""
    try:
        fd = os.open(os.path.join(home, "compact.lock"), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        return not _lock_compaction(fd, False, None)
    finally:
        os.close(fd)


# A snapshot that passed the journal's checksums but is not a table ferry can read (from
# another tool, or a bug): what decoding it may raise.
# (A UsageError too: a spec in a snapshot that no submit could have made.)
_SNAPSHOT_DECODE_ERRORS = (
    ValueError, TypeError, KeyError, AttributeError, ev.MalformedEventError, UsageError
)  # fmt: skip


def _undecodable_snapshot(error: Exception) -> JournalIntegrityError:
    return JournalIntegrityError(
        f"the journal's snapshot is not a task table this ferry can read "
        f"({type(error).__name__}: {error})",
        code="journal.snapshot_mismatch",
    )


ArchiveRefs = list[tuple[str, str]]  # (file name, SHA-256) of a snapshot's archives
# What a compaction between work's turns says when it could not do all that is due: a
# merge bigger than its bound, or history to rewrite (a table that folded a gc's
# FORGOTTEN records, and no newer snapshot to _adopt: the gc's compaction was skipped
# while another held compact.lock). work then starts `journal compact` beside.
_MERGE_WAITING = {"merges_waiting": True}
# Opening tries again from a newer snapshot when a compaction removed the records after
# the one it read (each try needs a compaction to have finished since the last).
_OPEN_TRIES = 3
# Newer snapshots a history load falls back to in a row (each is one whose archives a
# compaction pruned while this load read them: rare, see _load_history).
_HISTORY_TRIES = 5


def _parse_snapshot(blob: bytes) -> tuple[dict[str, Any], ArchiveRefs]:
    """The table part of a snapshot and the archives it names (the snapshot's own
    entries for them stay in ``data["settled_archives"]``)."""
    try:
        data = _json.loads(blob)
        archives = data.get("settled_archives", [])
        return data, [(str(ref["name"]), str(ref["sha256"])) for ref in archives]
    except _SNAPSHOT_DECODE_ERRORS as error:
        raise _undecodable_snapshot(error) from error


OnDamaged = Callable[[JournalIntegrityError], None]


def _table_from_snapshot(home: str, blob: bytes, on_damaged: OnDamaged | None = None) -> Table:
    data, refs = _parse_snapshot(blob)
    return _table_from(home, data, refs, on_damaged)


def _decodable(snapshot: journal.Snapshot) -> bytes:
    """A view's test of a snapshot (``journal.Journal.open_view``): a task table this
    ferry reads (its archives are read later, each left out if damaged)."""
    snapshot_refs(snapshot)
    return snapshot.data


def snapshot_refs(snapshot: journal.Snapshot) -> ArchiveRefs:
    """The archives (name, SHA-256) a snapshot names, once its data proved a task table
    this ferry reads (``journal.SnapshotRejected`` otherwise: a view or a salvage then
    tries an older snapshot)."""
    try:
        data, refs = _parse_snapshot(snapshot.data)
        Table.from_snapshot(data)  # (its live tasks checked as decoding needs: check_record)
    except JournalIntegrityError as error:
        raise journal.SnapshotRejected(error.message) from error
    except _SNAPSHOT_DECODE_ERRORS as error:
        raise journal.SnapshotRejected(_undecodable_snapshot(error).message) from error
    return refs


def view_damage(view: journal.View, *, shown: bool = True) -> list[JournalIntegrityError]:
    """What a view of a damaged journal found, as coded errors, the worst first: the
    damage that ends what it shows, sound snapshots it could not use, damage in
    records its snapshot covers. ``shown``: said to a reader (what it was shown)."""
    found: list[JournalIntegrityError] = []
    last = f"seq {view.last_seq}" if view.last_seq else "nothing"
    if view.damage is not None:
        said = f"; shown as of {last}, the last record before the damage" if shown else ""
        found.append(
            JournalIntegrityError(
                f"the journal is damaged: {view.damage}{said}",
                code="journal.corrupt",
                details=dict(view.damage.details),
            )
        )
    for path, why, kind in view.unusable:
        # Beyond the records: records it covers were lost (as the journal says of it).
        code = "journal.corrupt" if kind == "beyond" else "journal.snapshot_mismatch"
        instead = f"the snapshot at seq {view.base_seq}" if view.base else "seq 1"
        found.append(
            JournalIntegrityError(
                f"snapshot {os.path.basename(path)} is unusable ({why}); read from {instead} instead",
                code=code,
                details={"path": str(path)},
            )
        )
    if view.covered is not None:
        found.append(
            JournalIntegrityError(
                f"the journal is damaged in records its snapshot at seq {view.base_seq} covers"
                f" ({view.covered}): nothing shown depends on them",
                code="journal.corrupt",
                details=dict(view.covered.details),
            )
        )
    return found


def _table_from(
    home: str, data: dict[str, Any], refs: ArchiveRefs, on_damaged: OnDamaged | None = None
) -> Table:
    def load_settled(table_seq: int) -> Iterable[Mapping[str, Any]] | Table:
        return _load_history(home, refs, table_seq, on_damaged)

    history = None
    if refs:
        from ferry.storage.local.history import ArchiveHistory  # (lazy: a fresh home's run)

        history = ArchiveHistory.of(os.path.join(home, "archive"), data.pop("settled_archives"))
    try:
        return Table.from_snapshot(
            data, load_settled=load_settled if refs else None, history=history
        )
    except _SNAPSHOT_DECODE_ERRORS as error:
        raise _undecodable_snapshot(error) from error


def _load_history(
    home: str, refs: ArchiveRefs, table_seq: int, on_damaged: OnDamaged | None = None
) -> Iterable[Mapping[str, Any]] | Table:
    """The settled tasks of a table loaded from the snapshot naming ``refs``, folded
    through ``table_seq`` since (a ``state.SettledLoader``).

    A process that keeps its table (``work``) may need history long after it loaded its
    snapshot: compactions meanwhile may have merged the archives that snapshot names
    into one and pruned them. Then the newest snapshot's archives serve: they hold every
    task settled up to that snapshot, and where the table folded a task since, its own
    version is as new or newer. A newest snapshot past ``table_seq`` could hold a task
    in a state later than the table's; the table becomes that snapshot's instead (the
    records in between are covered by it). Missing archives the newest snapshot names
    too are lost: ``journal.snapshot_mismatch``, never skipped; unless the caller
    shows what it can (``on_damaged``): it is told, and the other archives serve."""
    directory = os.path.join(home, "archive")
    first_refs = refs
    try:
        return _read_archives(directory, refs)
    except JournalIntegrityError as error:
        lost = error
    for _ in range(_HISTORY_TRIES):
        try:
            latest = journal.read_latest_snapshot(os.path.join(home, "journal"))
        except journal.JournalError as error:
            raise journal_error(error) from error
        if latest is None:
            break
        data, newer = _parse_snapshot(latest.data)
        if newer == refs:
            break  # the newest snapshot names them too: gone, not superseded
        if latest.seq > table_seq:
            return _table_from(home, data, newer)
        try:
            return _read_archives(directory, newer)
        except JournalIntegrityError as error:
            refs, lost = newer, error  # pruned while read: a newer snapshot replaced them
    if on_damaged is not None:
        return _read_archives(directory, first_refs, on_damaged)
    raise lost


def _read_archives(
    directory: str, refs: ArchiveRefs, on_damaged: OnDamaged | None = None
) -> list[Mapping[str, Any]]:
    """Every task the archives hold, its newest record each (oldest archive first: a
    later one has the newer record). ``on_damaged``: a missing or damaged archive is
    left out (its tasks with it) and told, instead of raised."""
    by_id: dict[str, Mapping[str, Any]] = {}
    for name, sha256 in refs:
        try:
            records = list(_read_archive(os.path.join(directory, name), sha256))
        except JournalIntegrityError as error:
            if on_damaged is None:
                raise
            error.message += "; its settled tasks are left out"
            on_damaged(error)
            continue
        for record in records:
            by_id[record["id"]] = record
    return list(by_id.values())


def check_table(table: Table) -> None:
    """Raise ``journal.snapshot_mismatch`` (exit 4) unless every task of ``table`` decodes,
    the settled ones included: every archive its snapshot names is loaded, and checked
    against its recorded hash (``Store.open`` decodes those only when asked)."""
    try:
        for _ in table.tasks():  # loads the archives, and decodes every task in them
            pass
    except _SNAPSHOT_DECODE_ERRORS as error:
        raise _undecodable_snapshot(error) from error


def check_indexes(home: str | os.PathLike[str], snapshot: journal.Snapshot | None) -> None:
    """Raise ``journal.snapshot_mismatch`` unless the index of every archive the
    snapshot names is the one its archive makes (``archive_index.check_index``). A
    damaged index loses nothing (``ls`` and ``show`` then read the archive whole): the
    way out is to remove it, and the next compaction writes the archives again with a
    new one."""
    from ferry.storage.local.archive_index import check_index

    if snapshot is None:
        return
    directory = os.path.join(home, "archive")
    for ref in _json.loads(snapshot.data).get("settled_archives", []):
        if not isinstance(ref.get("index"), str):
            continue  # (written before indexes: the next compaction writes one)
        path = os.path.join(directory, ref["name"])
        body = b"".join(_archive_lines(path, ref["sha256"]))
        wrong = check_index(directory, ref, body)
        if wrong is not None:
            raise JournalIntegrityError(
                f"settled-task archive {ref['name']}: {wrong}; ls and show read it whole"
                f" instead (remove {ref['index']}: the next compaction writes a new one)",
                code="journal.snapshot_mismatch",
                details={"path": path, "index": os.path.join(directory, ref["index"])},
            )


def _write_archive(
    directory: str, seq: int, records: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Settled tasks as JSON Lines in ``ls``'s order, then their index, each written
    atomically BEFORE the snapshot naming them: a crash in between leaves unreferenced
    files (pruned later), never a snapshot pointing at a missing or half-written one.

    The name is new: ``settled-<seq>-<random>.jsonl``, never one present (nor its
    index's). Named by the seq alone, a merge at the seq of the current snapshot (two
    compactions with nothing in between) replaced the very archive that snapshot names,
    so it no longer matched its SHA-256: killed before its own snapshot was written, the
    merge left history unreadable for good. (Compactions are serialised: no other
    writer picks a name.)"""
    from ferry.storage.local.archive_index import build_index, index_name, order_key

    present = set(os.listdir(directory))  # (made by the compaction: Store._compact)
    name = _archive_name(seq)
    while name in present or index_name(name) in present:
        name = _archive_name(seq)
    records = sorted(records, key=order_key)
    _json.expect(len(records))
    lines = [_json.dumps(record) + b"\n" for record in records]
    body = b"".join(lines)
    index, about = build_index(name, records, lines)
    write_atomic(directory, name, body)
    failpoint("before:archive_index")
    write_atomic(directory, about["index"], index)
    failpoint("after:archive_index")
    return {"name": name, "sha256": _sha256_hex(body), "count": len(records), **about}


def _merge_tiers(
    directory: str, seq: int, archives: list[dict[str, Any]], records_max: int | None
) -> tuple[list[dict[str, Any]], bool]:
    """``archives`` with their newest merged by size tiers (``tiering``), as many
    times as due, within ``records_max`` records read in all (None: no bound); and
    whether a merge beyond that bound is due."""
    from ferry.storage.local import tiering  # (lazy: a compaction's, not every run's)

    while True:
        counts = [ref["count"] for ref in archives]
        run = tiering.next_merge(counts, records_max)
        if not run:
            return archives, records_max is not None and tiering.next_merge(counts) > 0
        merged = archives[-run:]
        records = _read_archives(directory, [(ref["name"], ref["sha256"]) for ref in merged])
        archives = [*archives[:-run], _write_archive(directory, seq, records)]
        if records_max is not None:
            records_max -= sum(counts[-run:])


def _all_indexed(directory: str, refs: Sequence[Mapping[str, Any]]) -> bool:
    """Every archive has its index, there (one ``stat`` each): one missing is written
    again by the merge this asks for."""
    for ref in refs:
        name = ref.get("index")
        if not isinstance(name, str) or not os.path.isfile(os.path.join(directory, name)):
            return False
    return True


def _archive_name(seq: int) -> str:
    return f"{_ARCHIVE_PREFIX}{seq:020d}-{os.urandom(6).hex()}.jsonl"


def _sha256_hex(body: bytes) -> str:
    import hashlib  # lazy: only archives need it, and it costs `ferry run` ~2 ms to load

    return hashlib.sha256(body).hexdigest()


def _archive_lines(path: str, sha256: str) -> list[bytes]:
    """An archive's lines (each with its newline), once it matched its SHA-256."""
    try:
        with open(path, "rb") as file:
            body = file.read()
    except OSError as error:
        raise JournalIntegrityError(
            f"settled-task archive {os.path.basename(path)} is missing or unreadable:"
            f" {error.strerror}",
            code="journal.snapshot_mismatch",
            details={"path": path},
        ) from error
    if _sha256_hex(body) != sha256:
        raise JournalIntegrityError(
            f"settled-task archive {os.path.basename(path)} does not match its snapshot",
            code="journal.snapshot_mismatch",
            details={"path": path},
        )
    return body.splitlines(keepends=True)


def _read_archive(path: str, sha256: str) -> Iterator[Mapping[str, Any]]:
    lines = _archive_lines(path, sha256)
    _json.expect(len(lines))
    for line in lines:
        try:
            yield _json.loads(line)
        except ValueError as error:  # it matched its hash: written so by a bug
            raise _undecodable_snapshot(error) from error


def _prune_heartbeats(home: str, settled: list[dict[str, Any]]) -> None:
    """Remove the heartbeat files of tasks that became terminal: nothing reads such a
    task's beat or alive-lock again (in-flight tasks are probed, and a retry runs a new
    attempt with a file of its own), except a quarantined one's.  Its orphan may still
    run, and an orphan that left the task's session and cleared its environment shows
    only by the alive-lock it inherited: ``retry`` and ``kill`` look there.  Without
    this, heartbeats/ would keep a file per attempt forever.  A file a crash leaves
    behind here costs an inode, nothing else."""
    settled = [r for r in settled if r.get("reason") not in MAY_RUN_ON_VALUES]
    if not settled:
        return
    try:
        directory = os.open(os.path.join(home, alivelock.DIRECTORY), _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        for record in settled:
            for attempt in range(1, int(record.get("attempt") or 0) + 1):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(alivelock.alive_name(record["id"], attempt), dir_fd=directory)
    finally:
        os.close(directory)


def _remove_task_files(home: str, task_ids: Sequence[str]) -> None:
    """Remove the log directory and heartbeat files of tasks ``ferry gc`` forgot (gone
    already, as a rule: gc removes them right after its write). Never through a
    symlink: ``shutil.rmtree`` works by descriptors, and a link itself is unlinked."""
    if not task_ids:
        return
    import shutil

    wanted = set(task_ids)
    for task_id in task_ids:
        path = os.path.join(home, "logs", task_id)
        with contextlib.suppress(FileNotFoundError):
            if os.path.islink(path) or not os.path.isdir(path):
                os.unlink(path)
            else:
                shutil.rmtree(path)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(os.path.join(home, alivelock.DIRECTORY)):
            if entry.name.partition(".")[0] in wanted:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    # Durable before the snapshot that stops naming these ids: after a power cut the
    # files would otherwise come back, belonging to no task (gc never guesses by files).
    for directory in (os.path.join(home, "logs"), os.path.join(home, alivelock.DIRECTORY)):
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(directory)


def _prune_archives(directory: str, keep: set[str]) -> None:
    """Drop archives (and indexes) neither the new nor the previous snapshot names: a
    process that loaded the previous snapshot a moment ago may still read them lazily."""
    from ferry.storage.local.archive_index import INDEX_PREFIX

    if not os.path.isdir(directory):
        return
    for entry in os.listdir(directory):
        if entry.startswith((_ARCHIVE_PREFIX, INDEX_PREFIX)) and entry not in keep:
            os.unlink(os.path.join(directory, entry))
    fsync_dir(directory)
