"""The storage seam: what the use cases (``ferry.app``) need from a backend, and nothing
about how a backend keeps it.

Lives here: the protocols (:class:`TaskStore`, :class:`Leases`), the local backend over
``journal/`` (``ferry.storage.local``) and an in-memory one for unit tests of the use
cases (``ferry.storage.memory``). May import ``ferry.core``, ``ferry.proc`` (process
identities, the alive-lock files a compaction prunes), ``ferry.failpoints`` and
``journal``; never ``ferry.app`` or ``ferry.cli``.

The one rule every backend keeps: **a write is decided at write time, against the true
end.** ``TaskStore.commit`` validates its events against the state as it is when they
are written (the fold rules of ``ferry.core.fold``: the claim token of every write about
a task in flight, the legal transitions, the key rules, the leader's epoch) and either
writes all of them, durably, or none. The local backend validates under the journal's
append lock after catching up with what other processes appended; a database backend
validates in the transaction that writes them, against the rows it locked (a
conditional update on the claim token and the expected state: zero rows is a refusal).
A use case never acts on a table read earlier without such a write, or a ``sync``.

Claiming is one write the store decides (``claim_next``): the best candidate under the
queue's gates, CLAIMED with its DISPATCHING intent (``ferry.storage.claiming``). The
local journal picks from its table and commits, skipping a candidate the commit refused
because it moved meanwhile (one writer at a time: the append lock); PostgreSQL does it
in one call of a server-side function, one transaction, one round trip: the pick ``FOR
UPDATE SKIP LOCKED`` (workers on many hosts take different rows), the queue's rules and
the lease's epoch checked on the rows as they are, the events and the row written.

What stays per host: process probes, signals, the alive-lock files and the logs belong
to the machine the task runs on (``ferry.proc``, and the state directory). A shared
backend records the host in the runner identity (``ProcessIdentity.host``) and a host
decides only its own tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from ferry.core.events import Event
    from ferry.core.model import Task
    from ferry.core.state import States
    from ferry.proc.process import ProcessIdentity
    from ferry.storage.local.lease import Lease

    EncodedEvent = tuple[str, dict[str, Any]]
    Claimant = tuple[Mapping[str, Any], str]  # a claim to make: its runner, its token
else:
    Protocol = object  # (the protocols below are for the type checker)

LOG_TAIL_BYTES = 64 * 1024  # of each stream, kept for other hosts by a shared backend
LEASE_TTL_S = 30.0  # work's and claim's --lease-ttl unless told: a lease read, or a bound
# Reads the tails of an attempt's logs on this host (see TaskStore.log_tails).
LogTailReader = Callable[[str, int], dict[str, tuple[bytes, int]]]


class Written:
    """What ``TaskStore.commit_against`` wrote: the tasks it was asked about, as they
    are after the write, and the tasks it claimed, in the order of the claims asked for
    (fewer: nothing more to claim). (A plain class: a NamedTuple is compiled at import,
    and every command imports this module.)"""

    __slots__ = ("claimed", "tasks")

    def __init__(self, tasks: dict[str, Task | None], claimed: list[Task]) -> None:
        self.tasks, self.claimed = tasks, claimed


class TaskStore(Protocol):
    """The events of every task, folded into the table of tasks."""

    # ---- writing: fenced, validated against the true end, durable on return ----------

    def commit(self, *events: Event | EncodedEvent, epoch: int = 0) -> object:
        """Write ``events`` together (one durable write) or refuse them all with the
        coded error of the rule they break (``ferry.core.fold``). ``epoch``: the
        leader's, for a leader's writes; a write under an epoch older than one already
        used is refused (``journal.fenced``), and a LEASE_ACQUIRED for an epoch already
        used too: one holder per epoch."""
        ...

    def claim_next(
        self,
        runner: Mapping[str, Any],
        token: str,
        *,
        by: str,
        epoch: int,
        announce: Sequence[Event] = (),
    ) -> Task | None:
        """Claim the first candidate of ``queued`` now, in one durable write decided at
        write time: CLAIMED with ``token``, naming ``runner`` (the task's supervisor),
        and, for a task without pinned inputs, its DISPATCHING (``ferry.storage.
        claiming``); the task as claimed (DISPATCHING, or CLAIMED: the caller plans it
        and writes its DISPATCHING or its SETTLED), or None: nothing to claim now.
        ``epoch``: the leader's, fenced as ``commit``'s (``journal.fenced``: nothing
        written); ``announce``: the leader's LEASE_ACQUIRED, written only with a claim.
        Raises DatabaseUnavailableError when the write's outcome is not known
        (``claimed_with`` finds out)."""
        ...

    def claimed_with(self, token: str, *, writer_pid: int | None = None) -> Task | None:
        """The task in flight under the claim ``token``, or None: no such claim was
        written (or it is over). For a claim whose outcome was not known: raises
        DatabaseUnavailableError while it still cannot be (the store out of reach; on a
        shared database, a connection of process ``writer_pid`` other than this one still
        open, whose statement may yet commit)."""
        ...

    def commit_against(
        self,
        ids: Sequence[str],
        decide: Callable[[Mapping[str, Task | None]], Sequence[Event | EncodedEvent]],
        *,
        epoch: int = 0,
        claims: Sequence[Claimant] = (),
        by: str = "work",
    ) -> Written:
        """``commit`` the records ``decide`` makes from the tasks ``ids`` (None: no such
        task) as they are when written: a database backend decides on the rows it locked
        for the write; the local journal on its table as last caught up (the commit is
        validated under its lock), and once again if that found a task moved. Then, in the same write, a claim for each of
        ``claims`` (a runner and a token) as ``claim_next`` makes it, of the next
        candidates: the places the records just freed in their groups count as free.
        Nothing is written if there is nothing to. Raises DatabaseUnavailableError when
        the write's outcome is not known (its claims: ``claimed_with`` finds out)."""
        ...

    def refresh(self) -> None:
        """Catch up with what other processes wrote."""
        ...

    def beat(self, task: Task) -> bool:
        """The task's supervisor is alive: a beat other hosts can see. The local backend
        keeps beats in the heartbeat file the supervisor touches (nothing to do here); a
        shared one records it with the task, fenced by its claim token alone (the TTL
        its supervisor keeps to is in its runner: ``beat_ttl_s``). False: refused (the
        claim moved)."""
        ...

    def bound_calls(self) -> None:
        """From now on, no call waits longer than its connection's bound for anything:
        a lock another session holds, a slow statement (a supervisor's deadline must
        not wait on one). Nothing to do on the local backend."""
        ...

    def sync(self, within_s: float | None = None) -> bool:
        """Catch up, and make everything read durable: before acting on a read that
        writes nothing (skipping a task whose key already succeeded). ``within_s``: if
        that cannot be done within it (the local journal's lock held all along: a ferry
        stopped in its append), False, nothing done."""
        ...

    # ---- reading: the table as last caught up --------------------------------------

    def get(self, task_id: str) -> Task | None: ...

    def resolve(self, prefix: str) -> Task:
        """The task whose id is or starts with ``prefix`` (NotFoundError, exit 5, if none
        or several)."""
        ...

    def live(self) -> list[Task]:
        """Tasks not settled (queued and in flight) and those settled since the last
        snapshot."""
        ...

    def in_flight(self) -> list[Task]:
        """The tasks in flight (claimed to settled: what recovery decides and a new
        ``work`` counts), in submission order; without reading the queue, which may
        hold many more."""
        ...

    def newest(self, limit: int, state: States = None) -> list[Task]:
        """The last ``limit`` tasks submitted (0: all), in submission order, optionally
        of one state."""
        ...

    def count(self, state: States = None) -> int:
        """How many tasks there are (in ``state`` if given)."""
        ...

    def queued(
        self,
        limit: int,
        *,
        skip: Collection[str] = (),
        extra: Mapping[str, int] | None = None,
    ) -> list[Task]:
        """Up to ``limit`` candidates for a claim now, in claim order (priority, then
        queue position), under the queue's gates: paused groups, group limits, ``--after``,
        ``--not-before`` (``ferry.core.queue``). ``skip``: queued tasks the caller holds
        and has not claimed yet (not offered again); ``extra``: places the caller holds
        per group beyond the tasks in flight (those, plus those whose ends it is about
        to write, negative). The claim's commit checks the gates again."""
        ...

    def groups(self) -> list[dict[str, Any]]:
        """Each group: ``group``, ``jobs`` (0: no limit), ``paused``, ``queued``,
        ``running`` (in flight under a queue claim)."""
        ...

    def doomed(self) -> list[tuple[Task, str]]:
        """Queued tasks to cancel ``DEPENDENCY_FAILED``, each with the dependency that
        dooms it, dependencies first (the cancels are checked again when written)."""
        ...

    def quarantined(self) -> list[Task]:
        """Settled tasks whose orphan was alive when recovery decided (it may be still),
        or whose host was lost with them (``HOST_LOST``: ``fold.MAY_RUN_ON``)."""
        ...

    def succeeded_with_key(self, key: str) -> str | None:
        """The task that SUCCEEDED (or was resolved as succeeded) with ``key``, if any
        (a task ``ferry gc`` forgot since included: the key stays succeeded)."""
        ...

    def settled_before(self, seconds: float, states: Iterable[str]) -> list[Task]:
        """The settled tasks in ``states`` that ended before ``seconds`` (Unix time, by
        :meth:`now`'s clock), in submission order: what ``ferry gc`` may forget."""
        ...

    def now(self) -> float:
        """The time by the clock that decides ages and queue times (Unix seconds): this
        host's for the local journal; a shared database's own (a host's may be wrong),
        as it stamps when each task settled."""
        ...

    def forgotten_here(self) -> list[str]:
        """Tasks ``ferry gc`` forgot whose files (logs, heartbeat files) on this host may
        still be there: a gc killed between its write and their removal, or, on a shared
        database, a task this host ran that another host's gc forgot."""
        ...

    def files_removed(self, task_ids: Iterable[str]) -> None:
        """The files of these forgotten tasks are gone from this host: not listed by
        ``forgotten_here`` any more (the local journal: the next compaction forgets
        them, having removed them itself)."""
        ...

    @property
    def highest_epoch(self) -> int:
        """The highest leader epoch any record was written with: a new lease's epoch
        must exceed it."""
        ...

    def host_lost(self, task: Task, ttl_s: float) -> bool | None:
        """Whose task is it to decide? None: this host's, by its own probes (the local
        backend: always). False: another host's, alive: leave it. True: another host's
        that lost its lease at least ``ttl_s`` ago (its workers have stopped their
        tasks), the task silent since: recovery decides it as lost (HOST_LOST)."""
        ...

    def log_tails(self, task_id: str, attempt: int) -> dict[str, tuple[bytes, int]]:
        """What this backend keeps of an attempt's logs for other hosts: per stream
        ("stdout", "stderr"), its last bytes and the whole log's size. The local backend
        keeps none (the logs are on this host); a shared database keeps the last
        ``LOG_TAIL_BYTES`` of each, written with the task's SETTLED by the host that
        ran it."""
        ...

    # ---- housekeeping --------------------------------------------------------------

    def maybe_compact(
        self, *, merge: bool = True, unless_led: bool = False
    ) -> dict[str, Any] | None:
        """Keep start-up cost bounded when due; None when not done (not due, or another
        process is at it). Never waits. ``merge=False``: nothing that rewrites all
        history (between ``work``'s turns). ``unless_led``: not while the journal shows
        a leader holding the lease (a ``submit``: the leader compacts between its
        turns, and has the merges its loop must not do done beside it)."""
        ...

    def compact(
        self, *, wait: bool = True, on_lock_wait: Callable[[], None] | None = None
    ) -> dict[str, Any] | None:
        """Compact now (``ferry journal compact``): what was done."""
        ...

    def close(self) -> None: ...


class Leases(Protocol):
    """The leader's lease: compare-and-swap, with an epoch that grows with every new
    holder. The local backend keeps one per state directory (``lease.json``); a shared
    backend keeps one per host, renewed from the database's clock."""

    def read(self) -> Lease | None: ...

    def acquire(self, me: ProcessIdentity, *, min_epoch: int = 0) -> Lease:
        """Take the lease (LeaseHeldError, exit 75, while a live holder has it), with an
        epoch above ``min_epoch`` and above any handed out before."""
        ...

    def renew(self, lease: Lease) -> Lease: ...

    def release(self, lease: Lease) -> bool: ...

    def reset(self, *, min_epoch: int) -> object:
        """Clear a lease whose holder is gone for good (``ferry lease reset``)."""
        ...

    def led(self) -> bool:
        """Whether a leader may be running the queue now, to start its tasks: one whose
        holder is not proven dead (on a shared database: any host's lease that has not
        expired, or this host's holder alive)."""
        ...
