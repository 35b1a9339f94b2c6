"""``ferry work``: the leader loop, one thread, a supervisor per running task.

Standby until it can lead (the CAS lease), recover, then keep up to ``jobs`` tasks
running, each held by a supervisor of its own (:mod:`ferry.app.launch`), forked from this
loop. The loop is single-threaded on purpose: a process with other threads cannot fork
safely (only the forking thread survives in the child; a lock another thread held
stays held there for ever).

A supervisor whose task's end is durable waits for another task: forking costs 4 to
8 ms on the machines measured, more than most of a short task's life, so the loop keeps
its supervisors (up to two per slot: while one's end is being written, the next task's
claim goes to a spare, in the same write).

One loop turn: take in what the supervisors said; renew the lease; recover other
runners' tasks every ``RECOVER_EVERY_S``; catch up on the journal every ``poll_s`` (new
tasks) and for each supervisor that beat since (a cancel request: ask it to stop its
task; a STALE mark: RESUMED); then ONE write (``TaskStore.commit_against``) of what
the supervisors said (their SPAWNED and SETTLED, decided against the tasks as they are
when written: a cancel that landed makes an end CANCELLED) and of a claim for each
free slot (CLAIMED, naming an idle supervisor, or a new one, with the task's
DISPATCHING: the store chooses the task; the places the ends free go to these claims).
Only after that write returns is a supervisor told its end is durable (``ack``), or
given its claimed task with its ``go``: it plans it, checks the plan is the DISPATCHING
the claim wrote, sends the plan and spawns (one message each way, no round trip on this
loop's path; a supervisor gone before its plan arrived started nothing: the claim goes
back). A task with pinned inputs is claimed alone and planned first: its plan's record
(DISPATCHING, or SETTLED FAILED if an input changed) is written, then ``go``. A
supervisor is told a claim naming it is being written (``claiming``): should ``work``
die before it hears the outcome, it looks the claim up and releases it.

Survivors: tasks still running under the supervisors of an earlier ``work`` (killed
with -9, say) count against ``jobs`` until they end; they write their own ends.

Signals (SIGTERM, SIGINT, SIGHUP): the first stops claiming (running tasks finish);
the second asks every supervisor to stop its task (SIGTERM, then SIGKILL after its
``--kill-grace``).

What it settled: each task whose end this loop wrote (or its supervisor wrote, or its
recovery decided) is told to the session's reporter once its end is durable
(``Reporter.settled``), and counted; ``run`` returns the counts (a
:class:`~ferry.app.tally.WorkReport`), from which the command line chooses the exit
status. ``halt`` (``--halt soon|now``): after the first task it settled FAILED, claim
nothing more (a slot freed by a failure is not refilled in the write of that end: the
next claim waits until the end is durable and known); ``now`` also stops the running
tasks, which settle CANCELLED (the user asked for that; their evidence says
``halted_after``: the failed task).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import resource
import select
import signal
import time
from collections.abc import Mapping, Sequence

# Here, once: the supervisors forked share them (and never import them from a
# package upgraded since work started).
import ferry.app.supervisor
import ferry.proc.supervise  # noqa: F401
from ferry import failpoints
from ferry.app import outbox
from ferry.app.launch import Launch, beat_ttl, watch_journal
from ferry.app.leader import Leadership, policy_of, recover_as
from ferry.app.merge_aside import MergeAside
from ferry.app.queueing import settle_doomed
from ferry.app.runner import (
    SHORT_OF_ERRNOS,
    before_spawn_event,
    child_environ,
    unstarted_end,
)
from ferry.app.runner_state import runner_identity, with_runner_state
from ferry.app.tally import Progress, Tally, WorkReport
from ferry.core import events as ev
from ferry.core.errors import (
    TAKEN_BACK,
    DatabaseUnavailableError,
    FerryError,
    InternalError,
    LeaseHeldError,
    RefusedError,
    from_os_error,
)
from ferry.core.fold import MOVED_CODES
from ferry.core.ids import new_claim_token
from ferry.core.model import TERMINAL_STATES, Liveness, State, Task
from ferry.proc._outputs import SignalTrap
from ferry.proc.alivelock import alive_path, held
from ferry.proc.liveness import probe
from ferry.proc.process import boot_clock
from ferry.storage.claiming import dispatching_with_claim
from journal import _json

TYPE_CHECKING = False  # (typing is not imported at run time: start-up)
if TYPE_CHECKING:
    from typing import Any

    from ferry.app.launch import Record
    from ferry.app.session import Session

# How long a turn waits for the plans of the tasks it just gave out (tasks without
# pinned inputs: building an environment, well under a millisecond).
PLAN_WAIT_S = 1.0
PLAN_DEATHS_MAX = 3
# A claim (or a plan's record) written this long before its go: the journal (the
# database) is read again before the go, for a cancel made meanwhile (``_may_go``).
LOOK_AGAIN_S = 0.5
# A supervisor that cannot be made for want of descriptors, processes or memory
# (``SHORT_OF_ERRNOS``): the slot waits for one of the others
# (``Worker._new_supervisor``). A task that cannot be started for want of them goes
# back to the queue; and while no other runs, work stops (``Worker._done``).
# Descriptors a new supervisor must leave free for work's own files (the lease's
# renewal, a new journal segment, /proc reads, a pidfd): its channel takes one for as
# long as it lives.
DESCRIPTORS_KEPT = 8
# Between turns, a compaction is looked at this often (due: more than
# SNAPSHOT_TAIL_RECORDS follow the snapshot); one that failed (the disk full, say) is
# tried again this late.
COMPACT_CHECK_S = 1.0
COMPACT_RETRY_S = 60.0
HALTS = ("soon", "now")
# The ends work told of that it remembers, so as to tell each once: the newest.
REPORTED_KEPT = 100_000


class _Unit:
    """Records of one supervisor's task for the next commit, and what to tell the
    supervisor once they are durable."""

    __slots__ = ("kind", "launch", "records")

    def __init__(self, kind: str, launch: Launch, records: Sequence[Record]) -> None:
        self.kind, self.launch, self.records = kind, launch, list(records)


class Worker:
    RECOVER_EVERY_S = 5.0  # how often the leader checks other runners' tasks

    def __init__(self, session: Session, *, jobs: int, drain: bool, poll_s: float,
                 lease_ttl_s: float, stale_after_s: float | None,
                 kill_stale: bool = False, halt: str | None = None,
                 progress_s: float | None = None) -> None:  # fmt: skip
        """``halt``: None, "soon" or "now" (see the module); ``progress_s``: tell the
        reporter how far the work is at most this often (None: never)."""
        if halt is not None and halt not in HALTS:
            raise ValueError(f"halt must be one of {HALTS}, not {halt!r}")
        self.session = session
        self.store = session.store
        self.jobs, self.drain, self.poll_s = jobs, drain, poll_s
        self.policy = policy_of(stale_after_s, kill_stale)
        self.lead = Leadership(session, lease_ttl_s)
        self.beat_ttl_s = beat_ttl(session, lease_ttl_s)
        self.environ = child_environ()
        self.supervisors: list[Launch] = []  # ours: each holds a task, or waits for one
        self.survivors: dict[int, str] = {}  # pidfd -> task id (an earlier work's)
        self.orphans: dict[str, str] = {}  # task id -> alive-lock (_watch_orphans)
        self._orphans_due = False  # a supervisor died under its task: recover now
        self.started = False  # LEASE_ACQUIRED written, survivors counted (_start)
        self.signals_seen = 0
        self.halted = False  # no more claims: the lease is lost, or the journal failed us
        self.failures: list[FerryError] = []
        self.outage = False  # the database out of reach at the last try (said once)
        self.lease_lost = False  # (then, on a shared database, its tasks were stopped)
        self.trap: SignalTrap | None = None
        self._cancel_before_spawn: set[str] = set()
        self._twin_said = False  # (the lease's holder is of another boot: said once)
        self._plan_deaths: dict[str, int] = {}  # task id -> supervisors that died planning it
        self._queue_ran_dry = False  # the last claims found fewer tasks than asked for
        self._short_of = False  # a supervisor could not be made (EMFILE...): said once
        # Short of supervisors in a write that ended tasks: the next turn comes at once
        # (their supervisors, idle once the write is done, take the claims).
        self._claim_again = False
        # A task could not start for want of resources while others of ours ran: no
        # claim until one of those ends (its end may free them), not the same task
        # claimed and given back again and again meanwhile.
        self._starved = False
        self._compact_at = 0.0  # time.monotonic() before which no compaction is tried
        self.merge_aside = MergeAside(session.home, session.notice)  # (what the loop leaves)
        self.unreaped: list[Launch] = []  # gone, not yet exited (they hold a task alone)
        self.halt, self.progress_s = halt, progress_s
        self.tally = Tally()
        self.halted_after: str | None = None  # the failed task after which --halt stopped us
        # (task, attempt): settled, told; the last REPORTED_KEPT (a work service settles
        # millions of tasks, and each end is seen within moments of its write).
        self._reported: dict[tuple[str, int], None] = {}
        self._next_progress = 0.0

    @property
    def launches(self) -> dict[str, Launch]:
        """The supervisors holding a task, by task id."""
        return {launch.task.id: launch for launch in self.supervisors if not launch.idle}

    @property
    def stopping(self) -> bool:
        if self.trap is None:
            return False
        self.trap.drain()
        return bool(self.trap.received)

    @property
    def closing(self) -> bool:
        """No more claims: the lease is lost, the journal failed us, a signal, --halt."""
        return self.halted or self.stopping or self.halted_after is not None

    # -- the outer life -------------------------------------------------------------------

    def run(self) -> WorkReport:
        with SignalTrap() as trap:
            self.trap = trap
            if self._standby():
                try:
                    self._lead()
                finally:
                    self._let_the_lease_go()
                    for pidfd in self.survivors:
                        os.close(pidfd)
        tally = self.tally
        stopped_by = trap.received[0] if trap.received else None
        left = None
        if stopped_by is not None:
            with contextlib.suppress(FerryError, OSError):
                self.store.refresh()
                left = self.store.count(State.QUEUED)
        return WorkReport(tally.succeeded, tally.failed, tally.cancelled, tally.elapsed_s,
                          self.halted_after, stopped_by, left)  # fmt: skip

    def _standby(self) -> bool:
        while True:
            try:
                self.lead.acquire()
                return True
            except LeaseHeldError as error:
                if error.details.get("another_boot") and not self._twin_said:
                    self._twin_said = True  # (said once: it waits on, as any standby)
                    self.session.notice(f"warning: {error.message}")
                if self.stopping or (self.drain and not self._queue_nonempty()):
                    return False
            except FerryError as error:
                if not _read_again(error, self.session):
                    raise
            self._sleep(self.poll_s)

    def _sleep(self, timeout_s: float) -> list[Any]:
        assert self.trap is not None
        live = [launch for launch in self.supervisors if not launch.gone]
        watched: list[Any] = [*live, *self.survivors]
        if self.trap.wakeup_fd is not None:
            watched.append(self.trap.wakeup_fd)
        writable = [launch for launch in live if launch.channel.pending]
        ready, out, _ = select.select(watched, writable, [], max(0.0, timeout_s))
        for launch in out:
            launch.channel.flush()
        if self.trap.wakeup_fd in ready:
            self.trap.drain()
        return ready

    def _queue_nonempty(self) -> bool:
        """Tasks queued in a group not paused (waiting for their time or a dependency
        too): --drain waits for them; a paused group's are left. (The database out of
        reach: it may hold tasks; not empty.)"""
        try:
            self.store.refresh()
            if self._queued():
                return True
            # Empty: so it is under the lock (a cancel read without it may be taken back
            # by its writer, and the task still queued).
            self.store.sync()
            return self._queued()
        except DatabaseUnavailableError:
            return True
        except FerryError as error:
            if _read_again(error, self.session):
                return True  # (looked at again at the next turn)
            raise

    def _queued(self) -> bool:
        return any(g["queued"] and not g["paused"] for g in self.store.groups())

    def _let_the_lease_go(self) -> None:
        """At the end: the lease released (on a shared database out of reach: it
        expires on its own; a new ``work`` of this host replaces a dead holder at once;
        the local lease's file not written, a full disk: the next one takes it over from
        a holder that is gone, at once). What the tasks earned stays the exit."""
        try:
            self.lead.release()
        except DatabaseUnavailableError as error:
            self.session.notice(f"the lease was not released ({error.message}): it expires")
        except OSError as error:
            self.session.notice(
                f"the lease was not released ({error.strerror or error}): the next worker"
                " takes it over once this one has exited"
            )

    def _start(self) -> bool:
        """Done once before the first claim: LEASE_ACQUIRED (before anything is written
        under this epoch) and the tasks an earlier work's supervisors still run counted.
        The database out of reach: tried again at each turn (the lease's own deadline
        decides when to give up)."""
        if not self.started:
            try:
                if not self.lead.announced:
                    self.lead.commit()
                self._find_survivors()
            except DatabaseUnavailableError as error:
                self._unreachable(error)
                return False
            except FerryError as error:
                if not _read_again(error, self.session):
                    raise
                return False  # (tried again at the next turn, on the journal as it is)
            self.started = True
        return True

    def _lead(self) -> None:
        epoch = self.lead.epoch
        self._start()
        self._recover()
        self._watch_orphans(look_again=True)
        next_recover = time.monotonic() + self.RECOVER_EVERY_S
        next_poll = time.monotonic() + self.poll_s
        try:
            while True:
                self._on_signals()
                self._renew()
                now = time.monotonic()
                if (now >= next_recover or self._orphans_due) and not self.halted:
                    self._recover()
                    self._watch_orphans(look_again=True)
                    next_recover = now + self.RECOVER_EVERY_S
                elif self.orphans:
                    self._watch_orphans()
                if now >= next_poll:  # (new tasks in the queue, the groups' settings)
                    with contextlib.suppress(FerryError, OSError):
                        self.store.refresh()
                    self._cancel_doomed()
                    next_poll = time.monotonic() + self.poll_s
                # The lease renewed between the steps that write, when due: each call
                # is bounded (a lock wait a quarter of the TTL), but a turn makes
                # several, and a lock held elsewhere (a client paused inside its
                # write) could make them add up past the TTL.
                for step in (self._watch_journal, self._settle_claims, self._write):
                    step()
                    self._renew()
                self._await_plans()
                self._dispatch()
                self._stop_if_halted_now()
                self._let_go()
                self._progress()
                self._compact()
                if self._finished():
                    break
                wake_at = min(next_recover, next_poll, self.lead.renew_at)
                if self._claim_again:  # (supervisors just freed: claim for them now)
                    wake_at, self._claim_again = 0.0, False
                self._take_in(self._sleep(wake_at - time.monotonic()))
        finally:
            for launch in self.supervisors:
                launch.release()  # idle: they exit; holding a task: they carry on alone
            for launch in self.supervisors:
                launch.reap(timeout_s=0 if not launch.idle else 5.0)
        if self.started and not (self.failures and isinstance(self.failures[0], LeaseHeldError)):
            try:
                self.store.commit(ev.LeaseReleased(epoch, self.lead.me.to_json()), epoch=epoch)
            except DatabaseUnavailableError as error:  # (as the lease itself: it expires)
                self.session.notice(f"LEASE_RELEASED was not written ({error.message})")
        if not self.merge_aside.finish():
            self.session.notice("note: a merge of the archives goes on beside, on its own")
        self.session.compact_if_due()
        if self.failures:
            raise self.failures[0]

    def _compact(self) -> None:
        """Compact when due, between turns: every command run beside a long-lived
        ``work`` folds the records after the last snapshot at its start, and work
        compacted only when it ended (beside one that had run 2,000 tasks, ``ls`` took
        205 ms, and 49 once it had exited). Synchronous (work forks its supervisors, and
        a compaction in a thread could hold a lock across a fork), so its merges of the
        archives are bounded: a merge reads and rewrites what it merges, and would hold
        the loop (no renewal of the lease, no answer to a supervisor) for seconds with a
        long history. A bigger one, when due, is started beside (``merge_aside``).
        Looked at once a second at most; a failure warns, and is tried again
        COMPACT_RETRY_S later."""
        now = time.monotonic()
        if now >= self._compact_at:
            self.merge_aside.poll()  # (reaps one that ended)
            done = self.session.compact_if_due(merge=False)
            self._compact_at = now + (COMPACT_CHECK_S if done is not None else COMPACT_RETRY_S)
            if done and done.get("merges_waiting") and self.merge_aside.start():
                self.session.reporter.detail("a merge of the archives started beside")

    def _renew(self) -> None:
        """Renew the lease when due. Lost: claim nothing more; what runs finishes, but
        on a shared database other hosts may take this host's tasks over once its lease
        expired, so they are stopped. A database out of reach is retried until the
        lease's own deadline on this host's clock."""
        try:
            self.lead.renew_if_due()
        except DatabaseUnavailableError as error:
            self._unreachable(error)  # (retried at the next turn; lost past the deadline)
        except LeaseHeldError as error:
            self._lease_lost(error)

    def _lease_lost(self, error: FerryError) -> None:
        if self.lease_lost:
            return
        self.lease_lost = True
        self._halt(error, fail=True)
        if self.session.database is None:
            return
        self.session.notice("the host's lease is lost: stopping its running tasks")
        why = {"stopped_because": "lease_lost", "lease": error.message}  # (its end says so)
        for launch in self.launches.values():
            if launch.went and not launch.stop_sent:
                launch.stop(signal.SIGTERM, evidence=why)

    def _finished(self) -> bool:
        if self.launches:
            return False
        if not self.halted and any(s.claiming for s in self.supervisors):
            return False  # (a claim whose answer was lost: read back first)
        if self._orphans_due and not self.halted:
            return False  # (a supervisor died under its task: decided at the next turn)
        if self.closing:
            return True
        return self.drain and not self.survivors and not self._queue_nonempty()

    # -- signals, recovery, the journal ---------------------------------------------------

    def _on_signals(self) -> None:
        assert self.trap is not None
        self.trap.drain()
        count = len(self.trap.received)
        if count == self.signals_seen:
            return
        if self.signals_seen == 0:
            self.session.notice(
                "stopping: no new tasks; running ones finish (signal again to stop them)"
            )
        if self.signals_seen < 2 <= count:
            self.session.notice("stopping the running tasks")
            for launch in self.launches.values():
                if launch.went and not launch.stop_sent:
                    launch.stop(signal.SIGTERM)
        self.signals_seen = count

    def _recover(self) -> None:
        try:
            report = recover_as(self.lead, self.policy)
        except DatabaseUnavailableError as error:
            self._unreachable(error)
            return
        except FerryError as error:
            if _read_again(error, self.session):
                return  # (the next pass decides)
            raise
        self.session.reporter.recovered(report)
        terminal = {state.value for state in TERMINAL_STATES}
        for decision in report.decisions:
            if decision["state"] in terminal:  # (a task it decided FAILED: a failure)
                self._settled(decision["task"])

    def _cancel_doomed(self) -> None:
        """The queued tasks whose dependency ended other than SUCCEEDED: CANCELLED
        ``DEPENDENCY_FAILED``, as the leader (``queueing.settle_doomed``)."""
        if self.halted:
            return
        try:
            decisions = settle_doomed(self.store, self.lead.commit)
        except LeaseHeldError as error:
            self._lease_lost(error)
            return
        except DatabaseUnavailableError as error:
            self._unreachable(error)
            return
        except (FerryError, OSError):
            return  # (the journal in trouble: the next poll tries again)
        for decision in decisions:
            self._settled(decision["task"])

    # -- what it settled ------------------------------------------------------------------

    def _settled(self, task_id: str, attempt: int | None = None, task: Task | None = None) -> None:
        """A task whose end we (or our supervisor, or our recovery) made durable: tell
        the reporter, count it, and halt after a failure if asked to. ``attempt``: the
        one we ran (None: as the journal says, for a recovery decision); ``task``: as
        the write of its end left it (None: read)."""
        try:
            task = task or self.store.get(task_id)
        except (FerryError, OSError):  # (a database out of reach: not told, not counted)
            return
        if task is None or not task.terminal or attempt not in (None, task.attempt):
            return
        if (task.id, task.attempt) in self._reported:
            return
        self._reported[task.id, task.attempt] = None
        if len(self._reported) > REPORTED_KEPT:
            del self._reported[next(iter(self._reported))]
        self.tally.add(task)
        self.session.reporter.settled(
            with_runner_state(task, self.session.home, self.session.store)
        )
        # (a second signal stopped the running tasks, or the lease's loss did)
        stopped_by_us = self.signals_seen >= 2 or self.lease_lost
        if (
            task.state is State.FAILED
            and self.halt
            and self.halted_after is None
            and not stopped_by_us
        ):
            self.halted_after = task.id
            then = "stopping the running tasks" if self.halt == "now" else "running ones finish"
            self.session.notice(f"halting: task {task.id} failed; no new tasks, {then}")
            self._stop_if_halted_now()

    def _retrying(self, task_id: str, attempt: int, task: Task | None = None) -> None:
        """Say so when the attempt we ran failed and its --retries queued the next
        (``task``: as the write of its end left it)."""
        with contextlib.suppress(FerryError, OSError):
            task = task or self.store.get(task_id)
            if task is None or task.attempt != attempt + 1 or task.retries_used == 0:
                return
            previous = task.evidence.get("previous_attempt") or {}
            if previous.get("attempt") != attempt:
                return
            wait_s = max(0.0, (task.not_before or 0.0) - time.time())
            why = previous.get("reason") or "FAILED"
            self.session.notice(
                f"task {task_id} attempt {attempt} failed ({why}): retry"
                f" {task.retries_used} of {task.spec.retries} in {wait_s:.1f} s"
            )

    def _stop_if_halted_now(self) -> None:
        """``--halt now``: every task we claimed is stopped (SIGTERM, then SIGKILL after
        its grace), as cancelled; a claim written in the same write as the failure's end
        too."""
        if self.halt != "now" or self.halted_after is None:
            return
        for launch in self.launches.values():
            if launch.went and not launch.stop_sent and launch.ended is None:
                launch.stop(signal.SIGTERM, cancel=True,
                            evidence={"halted_after": self.halted_after})  # fmt: skip

    def _progress(self) -> None:
        """Tell the reporter how far we are, if asked to and due."""
        now = time.monotonic()
        if self.progress_s is None or now < self._next_progress:
            return
        self._next_progress = now + self.progress_s
        try:
            queued = self.store.count(State.QUEUED)
        except (FerryError, OSError):
            return
        running = sum(1 for launch in self.launches.values() if launch.claimed)
        tally = self.tally
        self.session.reporter.progress(Progress(tally.succeeded, tally.failed, tally.cancelled,
                                                running, queued, tally.elapsed_s))  # fmt: skip

    def _watch_journal(self) -> None:
        """For each supervisor that beat since: what the journal asks of its task (a
        cancel, a STALE mark), after one catch-up for them all."""
        beating = [launch for launch in self.launches.values() if launch.beat]
        if not beating:
            return
        with contextlib.suppress(FerryError, OSError):
            self.store.refresh()
        for launch in beating:
            if self._lease_gone():
                return  # (its tasks are being stopped)
            watch_journal(self.store, launch, refresh=False)

    def _find_survivors(self) -> None:
        """Tasks of this home in flight whose supervisor (their runner) is alive: an
        earlier work's, killed or stopped. They hold slots until their supervisor exits.
        (Another host's tasks, on a shared database, hold that host's slots: its
        supervisors' pids mean nothing here.)"""
        for task in self.store.in_flight():
            identity = runner_identity(task)
            if identity is None or not self._of_this_home(task):
                continue
            if probe(identity) is not Liveness.ALIVE:
                continue  # (UNKNOWN: recovery leaves it alone, but it is not ours to count)
            try:
                pidfd = os.pidfd_open(identity.pid)
            except OSError:
                continue
            if probe(identity) is Liveness.ALIVE:  # still the same process, now held
                self.survivors[pidfd] = task.id
            else:
                os.close(pidfd)
        if self.survivors:
            self.session.notice(
                f"{len(self.survivors)} task(s) of this home already run (under an earlier"
                " work's supervisors, or run's, claim's): they hold slots until they end"
            )

    def _watch_orphans(self, *, look_again: bool = False) -> None:
        """The tasks of this home in flight without a supervisor (one of ours killed
        under its task): each holds a slot while a process of it holds its alive-lock,
        until recovery decides it (``_let_go`` asks for a pass at once: a quarantined
        orphan is the operator's, and holds none). ``look_again``: find them (after a
        recovery pass); else only see which of those known have ended."""
        home = self.session.home
        if look_again:
            ours = {*self.launches, *self.survivors.values()}
            try:
                found = {
                    task.id: alive_path(home, task.id, task.attempt)
                    for task in self.store.in_flight()
                    if task.id not in ours and self._of_this_home(task) and _runner_dead(task)
                }
            except DatabaseUnavailableError as error:
                self._unreachable(error)  # (those known hold their slots; looked at again)
                return
            self._orphans_due = False
        else:
            found = dict(self.orphans)
        before = set(self.orphans)
        self.orphans = {task_id: path for task_id, path in found.items() if held(path) is True}
        for task_id in sorted(set(self.orphans) - before):
            self.session.notice(
                f"task {task_id} runs on without its supervisor: it holds a slot until"
                " recovery decides it"
            )

    def _of_this_home(self, task: Task) -> bool:
        """Was the task claimed from this state directory? ``work``'s claims say so
        (``runner.home``), whatever host id they name: the same home may restart under a
        new ``FERRY_HOST_ID``, and a task released here may run on another host under
        the same attempt. Other claims: this host's, or its supervisor holds the
        alive-lock of this home."""
        claimed_from = claimed_home(task.runner or {})
        if claimed_from is not None:
            return claimed_from == os.fsencode(self.session.home)
        if self.store.host_lost(task, float("inf")) is None:
            return True
        return held(alive_path(self.session.home, task.id, task.attempt)) is True

    # -- the supervisors ------------------------------------------------------------------

    def _new_supervisor(self) -> Launch | None:
        """A new supervisor; None when this process is short of descriptors (fewer than
        DESCRIPTORS_KEPT would be left) or of processes for one (a low ``ulimit -n``
        for ``-j``) while others of its supervisors live: the next tasks wait for one of
        them (a notice says so, once). With none alive, it is made if it can be; if
        not, nothing could run: the error ends work (exit 125), its queue untouched."""
        alive = any(not s.gone for s in self.supervisors)
        if alive and _descriptors_left() < DESCRIPTORS_KEPT:
            self._short_of_supervisors(os.strerror(errno.EMFILE))
            return None
        try:
            return Launch(self.session.home, self.environ, beat_ttl_s=self.beat_ttl_s)
        except OSError as error:
            if error.errno not in SHORT_OF_ERRNOS or not alive:
                raise
            self._short_of_supervisors(error.strerror or os.strerror(error.errno))
            return None

    def _short_of_supervisors(self, why: str) -> None:
        """Said once per work: the next tasks wait for a free supervisor."""
        if not self._short_of:
            self._short_of = True
            self.session.notice(
                f"warning: cannot start another supervisor ({why}): the next tasks wait"
                " for a free one"
            )

    def _claimants(self, units: Sequence[_Unit]) -> list[Launch]:
        """An idle supervisor (a new one if none: up to two per slot) for each free
        slot, each told a claim naming it is being written (should we die before it
        hears the outcome, it finds the claim and releases it). A slot whose task ended
        is free: its end is in the same write (``units``), and the place it frees in its
        group may go to a claim of that write. After a write that found nothing more to
        claim, no new supervisor is made for the next (an idle queue costs no forks)."""
        if self.closing:
            return []
        if any(_short_of_resources(u.launch.end_error) for u in units if u.kind == "end"):
            return []  # (a task could not start: not in this write; _done decides)
        if self._starved and any(map(_started, self.supervisors)):
            return []
        self._starved = False
        held = self.launches
        if self.halt and any(_ends_failed(launch) for launch in held.values()):
            return []  # (--halt: the next claim waits until the failure's end is written)
        unknown = sum(1 for s in self.supervisors if s.claiming is not None and not s.gone)
        busy = sum(1 for launch in held.values() if launch.ended is None) + unknown
        free = self.jobs - busy - len(self.survivors) - len(self.orphans)
        idle = [s for s in self.supervisors if s.idle and not s.gone and s.claiming is None]
        ending = sum(1 for unit in units if unit.kind == "end")  # (idle once written)
        forks = min(free - len(idle), 2 * self.jobs - len(self.supervisors))
        if self._queue_ran_dry:
            forks = min(forks, 0 if idle or ending else 1)
        for _ in range(max(0, forks)):
            launch = self._new_supervisor()
            if launch is None:
                self._claim_again = ending > 0
                break
            self.supervisors.append(launch)
            idle.append(launch)
        chosen = idle[: max(0, free)]
        for launch in chosen:
            launch.expect(new_claim_token(os.urandom(10)), epoch=self.lead.epoch)
        return chosen

    def _claimed(self, launch: Launch, task: Task, token: str) -> None:
        """Our claim of ``task`` is durable: the supervisor it names plans it, and
        spawns it at once if its DISPATCHING was written with the claim (the usual
        case: one message, not a plan awaited and a ``go`` sent back)."""
        dispatched = task.state is State.DISPATCHING
        if task.cancel_requested:  # (a claim read back after a while: asked meanwhile)
            self._cancel_before_spawn.add(task.id)
        go = dispatched and not task.cancel_requested and not self.closing
        if go:
            failpoints.failpoint("before:go")
            go = not _look_due(launch)  # (else _dispatch looks first, then goes)
        launch.assign(task, token, go=go)
        launch.claimed = True
        launch.dispatched = dispatched

    def _settle_claims(self) -> None:
        """Claims whose answer was lost (the database went away during the call): read
        back by their tokens, once that can be known (``claimed_with``: no connection of
        ours may still be writing them). One written goes on as if answered; its
        supervisor gone meanwhile, it goes back to the queue (nothing was started)."""
        for launch in self.supervisors:
            token = launch.claiming
            if token is None:
                continue
            try:
                task = self.store.claimed_with(token, writer_pid=os.getpid())
            except DatabaseUnavailableError as error:
                self._unreachable(error)
                return
            except (FerryError, OSError):
                return
            if launch.gone:
                launch.claiming = None
                if task is not None:
                    self._give_back(task, token, "its supervisor died before the spawn")
            elif task is None:
                launch.unexpect()
            else:
                self._claimed(launch, task, token)

    def _give_back(self, task: Task, token: str, why: str) -> bool:
        """A claim of ours whose task was never started: back to the queue, not counted
        (CANCELLED if a cancel was asked for), decided on the task as it is. False: not
        written (said)."""

        def decide(current: Mapping[str, Task | None]) -> list[ev.Event]:
            end = unstarted_end(current.get(task.id), token, {"worker": why})
            return [] if end is None else [end]

        try:
            self.store.commit_against([task.id], decide)
        except (FerryError, OSError) as error:
            message = getattr(error, "message", str(error))
            self.session.notice(f"task {task.id}: not given back yet ({message})")
            return False
        return True

    def _dispatch(self) -> None:
        """Start each claimed task whose plan is in (``go``), once its DISPATCHING is
        durable: written with its claim, checked against the plan; a task with pinned
        inputs: its plan's record written now (SETTLED FAILED if an input changed:
        nothing to run). Closing (a signal, ``--halt``, the lease lost, the journal
        failing us), a claimed task not started yet is given back instead (a supervisor
        still hashing pinned inputs, which may hang on a dead disk, is ended: it started
        nothing)."""
        for launch in list(self.launches.values()):
            if not launch.claimed or launch.went or launch.gone:
                continue
            if launch.task.id in self._cancel_before_spawn:
                continue  # (written with the next write, then aborted)
            if self.closing:
                if not self._give_back(launch.task, launch.token, "the worker is stopping"):
                    continue  # (next turn; or, let go at the end, its supervisor does it)
                if launch.plan is None:
                    launch.kill()
                else:
                    launch.abort()
                launch.forget()
                continue
            if launch.plan is None:
                continue  # (still planning: next turn)
            record = launch.plan_record
            expected = dispatching_with_claim(launch.task, launch.token)
            wrong = launch.dispatched and (expected is None or record != expected.encode())
            if record is None or wrong:  # (a bug: the plan of a task is made once)
                error = launch.plan_error or InternalError(
                    f"task {launch.task.id}: its plan ({record}) is not what its claim wrote"
                )
                self._halt(error, fail=True)  # (closing: given back, then dropped)
                continue
            if not launch.dispatched and not self._write_plan(launch, record):
                continue
            failpoints.failpoint("before:go")
            if self._may_go(launch):
                launch.go()

    def _may_go(self, launch: Launch) -> bool:
        """The go's last look: a claim (or plan) written long enough ago
        (``LOOK_AGAIN_S``: work was stopped since, by Ctrl-Z or a frozen VM, or the
        disk hung) may have had a cancel made meanwhile, which a table read before
        cannot show: the journal (the database) is read again. Not at every go, which
        on a shared database would cost a round trip each: a cancel made while the claim
        is written is one made as the task starts, and it stops the task as it stops any
        running one. False: not now (a cancel, written with the next write; the claim
        ended meanwhile; or the read failed: the next turn looks again)."""
        if not _look_due(launch):
            return True
        task = launch.task
        try:
            self.store.refresh()
            current = self.store.get(task.id)  # (a shared database: read now)
        except DatabaseUnavailableError as error:
            self._unreachable(error)
            return False
        except FerryError as error:
            self._journal_failed(error)
            return False
        except OSError:  # (out of descriptors, say: as the turn's other reads, next turn)
            return False
        if current is None or (current.attempt, current.claim_token) != (
            task.attempt,
            launch.token,
        ):
            self.session.notice(f"task {task.id}: its claim ended before its go; not started")
            launch.abort()
            launch.forget()
            return False
        if current.cancel_requested:
            self._cancel_before_spawn.add(task.id)
            return False
        return True

    def _write_plan(self, launch: Launch, record: Record) -> bool:
        """A task with pinned inputs: its plan's record (DISPATCHING, or SETTLED FAILED:
        forgotten then), under the lease. True: go."""
        launch.heard_sent = boot_clock()
        try:
            self.store.commit(record, epoch=self.lead.epoch)
        except LeaseHeldError as error:
            self._halt(error, fail=True)
            return False  # (given back at the next turn: closing)
        except RefusedError as error:  # decided meanwhile (recovery, a cancel)
            if error.code == "task.cancel_requested":  # settled CANCELLED at the next write
                self._cancel_before_spawn.add(launch.task.id)
                return False
            self.session.notice(error.message)
            launch.abort()
            launch.forget()
            return False
        except DatabaseUnavailableError as error:
            self._unreachable(error)  # (tried again at the next turn)
            return False
        except FerryError as error:
            self._journal_failed(error)
            return False
        self.outage = False
        if record[0] == ev.EventType.SETTLED.value:
            task_id, attempt = launch.task.id, launch.task.attempt
            launch.forget()  # (a pinned input changed: settled FAILED, nothing to run)
            self._settled(task_id, attempt)
            return False
        launch.dispatched = True
        return True

    def _await_plans(self) -> None:
        """Wait (briefly) for the plans of the tasks just given out, those without
        pinned inputs: planning them is building an environment, and their claims can
        then share this turn's write with the ends that freed their slots. (A task with
        pinned inputs is hashed again first, which may take long: an end does not wait
        for that.)"""
        waiting = [
            launch for launch in self.launches.values()
            if launch.plan is None and not launch.gone and not launch.went
            and not launch.task.spec.pointers
        ]  # fmt: skip
        deadline = time.monotonic() + PLAN_WAIT_S
        while waiting and time.monotonic() < deadline:
            writable = [launch for launch in waiting if launch.channel.pending]
            left = max(0.0, deadline - time.monotonic())
            ready, out, _ = select.select(waiting, writable, [], left)
            for launch in out:
                launch.channel.flush()  # (a large task, sent in frames as it is read)
            for launch in ready:
                launch.poll()
            waiting = [launch for launch in waiting if launch.plan is None and not launch.gone]

    def _take_in(self, ready: list[Any]) -> None:
        for fd in ready:
            if fd in self.survivors:
                os.close(fd)
                del self.survivors[fd]
        for launch in self.supervisors:
            if launch in ready:
                launch.poll()
            if launch.plan is not None:
                for warning in launch.warnings:
                    self.session.notice(warning)
                launch.plan["warnings"] = []
            for warning in launch.warned:
                self.session.notice(warning)
            launch.warned = []

    def _let_go(self) -> None:
        """Forget the supervisors that exited (reaped). One that died holding a claimed
        task before it was told to spawn, or told with its task but before its plan
        arrived (it sends the plan before the spawn), started nothing: the claim goes
        back to the queue (three such deaths for one task: ferry has a bug, stop). One
        that died after leaves its task to recovery (its runner is dead). One whose end waits to
        be written stays until it is; one a claim of unknown outcome named, until that
        is known."""
        for launch in list(self.supervisors):
            if not launch.gone or (launch.ended is not None and not self.halted):
                continue
            if launch.claiming is not None and not self.halted:
                continue  # (_settle_claims reads it back)
            if launch.ended is not None:
                self.session.notice(
                    f"task {launch.task.id}: its end is left to its supervisor's own write"
                )
            elif launch.went and launch.plan is not None:
                self._orphans_due = True  # (it may run on: decided, and its slot held)
            elif launch.claimed and (not launch.went or launch.plan is None):
                # (Told to go with its task, it sends its plan before it spawns: gone
                # without one, it started nothing.)
                task_id = launch.task.id
                self._give_back(launch.task, launch.token, "its supervisor died before the spawn")
                deaths = self._plan_deaths[task_id] = self._plan_deaths.get(task_id, 0) + 1
                if deaths >= PLAN_DEATHS_MAX:
                    self._halt(InternalError(f"task {task_id}: {deaths} supervisors"
                                             " died before starting it"), fail=True)  # fmt: skip
            launch.forget()
            launch.reap(timeout_s=0)
            self.supervisors.remove(launch)
            if not launch.reaped:
                self.unreaped.append(launch)
        for launch in list(self.unreaped):
            launch.reap(timeout_s=0)
            if launch.reaped:
                self.unreaped.remove(launch)

    def _units(self) -> list[_Unit]:
        """What is waiting to be written, per supervisor."""
        units = []
        for launch in self.launches.values():
            if launch.gone and launch.ended is None:
                continue
            if launch.task.id in self._cancel_before_spawn:
                event = before_spawn_event(launch.task, launch.token, cancelled=True)
                units.append(_Unit("cancelled", launch, [event.encode()]))
                continue
            if launch.ended is not None:  # (its SPAWNED, if unwritten, goes with its end)
                units.append(_Unit("end", launch, []))
                continue
            spawned = launch.due_spawned()
            if spawned is not None:
                units.append(_Unit("spawned", launch, [spawned]))
        return units

    def _write(self) -> None:
        """One write: everything the supervisors said (their ends decided against the
        tasks as they are when written), and a claim for each free slot; then each
        supervisor is told."""
        if not self._start():
            return
        units = self._units()
        claimants = self._claimants(units)
        if not units and not claimants:
            return
        if any(unit.kind == "end" for unit in units):
            with contextlib.suppress(FerryError):
                self.store.refresh()  # a cancel that landed makes an end CANCELLED
        ids = sorted({unit.launch.task.id for unit in units})
        home = home_fields(str(self.session.home))  # (runner.home: see _of_this_home)
        claims = [({**launch.runner(), **home}, str(launch.claiming))
                  for launch in claimants]  # fmt: skip
        try:
            written = self.store.commit_against(
                ids, lambda current: _decided(units, current),
                epoch=self.lead.epoch if not self.halted else 0, claims=claims, by="work",
            )  # fmt: skip
        except LeaseHeldError as error:  # fenced: a newer leader claims now
            self._unclaimed(claimants)
            self._halt(error, fail=True)
            self._write_each(units)
            return
        except RefusedError:  # one unit's record is no longer legal: find which
            self._unclaimed(claimants)  # (claimed at the next turn)
            self._write_each(units)
            return
        except DatabaseUnavailableError as error:  # (each unit is tried again next turn;
            self._unreachable(error)  # the claims, their outcome unknown: _settle_claims)
            return
        except FerryError as error:  # the journal failed us (a full disk, corruption)
            self._unclaimed(claimants)
            self._journal_failed(error)
            return
        self.outage = False
        for unit in units:
            self._done(unit, None, written.tasks.get(unit.launch.task.id))
        for launch, task in zip(claimants, written.claimed, strict=False):
            self._claimed(launch, task, str(launch.claiming))
        self._unclaimed(claimants[len(written.claimed) :])
        if claimants:
            self._queue_ran_dry = len(written.claimed) < len(claimants)

    def _unclaimed(self, claimants: Sequence[Launch]) -> None:
        for launch in claimants:
            launch.unexpect()

    def _unreachable(self, error: FerryError) -> None:
        """The database is out of reach: what waits to be written stays pending and is
        tried again at the next turn (a claim whose commit answer was lost is read back
        then: ``_write_each``); the lease's own deadline decides when to give up
        (``_renew``)."""
        if not self.outage:
            self.session.notice(f"{error.message}; trying again")
        self.outage = True
        self._lease_gone()

    def _lease_gone(self) -> bool:
        """On a shared database, out of reach: each call takes up to its connection's
        bound (a quarter of the lease's TTL on a silent network) and a turn makes
        several, so the lease's deadline is looked at after each, not only at the next
        renewal. Past it: lost (its tasks are stopped)."""
        if self.session.database is None:
            return False
        if not self.lease_lost and self.lead.expired():
            self._lease_lost(self.lead.expired_error())
        return self.lease_lost

    def _journal_failed(self, error: FerryError) -> None:
        """The journal refuses every write now (the handle failed): claim nothing more,
        and let every supervisor go (they write their own records, through handles of
        their own, once they see this one gone). Unless records it had read were taken
        back by their writer (its fdatasync failed): nothing was written, and the store
        reads the journal again (``Store._reopen``); the next turn writes."""
        if _read_again(error, self.session):
            return
        self._halt(error, fail=True)
        for launch in self.supervisors:
            launch.release()

    def _write_each(self, units: list[_Unit]) -> None:
        for unit in units:
            task_id = unit.launch.task.id
            try:
                try:
                    written = self.store.commit_against(
                        [task_id], functools.partial(_decided, [unit])
                    )
                except RefusedError as error:
                    if not _retry_refused(unit, error):
                        raise
                    written = self.store.commit_against(
                        [task_id], functools.partial(_decided, [unit])
                    )
            except RefusedError as error:
                self._done(unit, error, None)
                continue
            except LeaseHeldError as error:
                self._done(unit, error, None)
                continue
            except DatabaseUnavailableError as error:
                self._unreachable(error)
                return
            except FerryError as error:
                self._journal_failed(error)
                return
            self._done(unit, None, written.tasks.get(task_id))

    def _done(self, unit: _Unit, error: FerryError | None, task: Task | None) -> None:
        """``task``: as the write left it."""
        launch = unit.launch
        if unit.kind == "cancelled":
            task_id, attempt = launch.task.id, launch.task.attempt
            self._cancel_before_spawn.discard(task_id)
            launch.abort()
            launch.forget()
            if error is None:
                self._settled(task_id, attempt, task)
        elif unit.kind == "spawned":
            if error is None:
                launch.written("SPAWNED")
            else:
                launch.spawned_written = True  # (refused: decided meanwhile; not again)
        elif unit.kind == "end":
            if error is not None:  # (never its own end, which end_records left out)
                self.session.notice(error.message)
            task_id, attempt = launch.task.id, launch.task.attempt
            short = _short_of_resources(launch.end_error)
            launch.ack()
            # Ours even when end_records found it written already (by the supervisor,
            # its launcher having been silent too long): the attempt we ran, settled.
            self._settled(task_id, attempt, task)
            self._retrying(task_id, attempt, task)
            if short is None:
                self._starved = False  # (one that ran ended: what it held is free)
            elif not any(map(_started, self.supervisors)):
                # Not started for want of descriptors, processes or memory (back in the
                # queue), and no task of ours runs whose end could free some (one only
                # claimed or told to go would fail the same way): stop with the queue
                # as it is (exit 125).
                self._halt(short, fail=True)
            else:
                self._starved = True

    def _halt(self, error: FerryError | None, *, fail: bool = False) -> None:
        if not self.halted and error is not None:
            self.session.notice(f"stopping: {error.message}")
        self.halted = True
        if fail and error is not None:
            self.failures.append(error)


def _read_again(error: FerryError, session: Session) -> bool:
    """Was ``error`` the journal's records taken back (the store has read it again:
    ``journal.taken_back``)? Then it is said, and the loop goes on."""
    if error.code != TAKEN_BACK:
        return False
    session.notice(
        "records this work had read were taken back by their writer (its fdatasync"
        " failed): the journal was read again"
    )
    return True


def home_fields(home: str) -> dict[str, str]:
    """What a ``work`` claim says of the home it was made from, as JSON can hold it and
    losslessly: ``home``, the path, when it is UTF-8; else ``home_bytes``, its bytes in
    hex (a path is bytes: a home whose name is not UTF-8 is a home all the same)."""
    try:
        home.encode("utf-8")
    except UnicodeEncodeError:
        return {"home_bytes": os.fsencode(home).hex()}
    return {"home": home}


def claimed_home(runner: Mapping[str, Any]) -> bytes | None:
    """The home a claim's runner names (:func:`home_fields`), as bytes; None: it names
    none (a claim not by ``work``, or one this could not read)."""
    named, raw = runner.get("home"), runner.get("home_bytes")
    if isinstance(raw, str):
        try:
            return bytes.fromhex(raw)
        except ValueError:
            return None
    return os.fsencode(named) if isinstance(named, str) else None


def _descriptors_left() -> int:
    """How many more descriptors this process may open (a large number if unknown)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        return soft
    return soft - used


def _started(launch: Launch) -> bool:
    """Does ``launch`` run a task that started (its end may free what it holds)?"""
    spawned = launch.spawned is not None or launch.spawned_written
    return bool(launch.task.id) and spawned and not launch.gone and launch.ended is None


def _look_due(launch: Launch) -> bool:
    """Its claim (or plan) was sent long enough ago for a cancel to have landed since."""
    sent = launch.heard_sent
    return sent is None or boot_clock() - sent > LOOK_AGAIN_S


def _short_of_resources(error: FerryError | None) -> FerryError | None:
    """A task's start failed for want of descriptors, processes or memory: the coded
    error that says so (``io.too_many_open_files``...); None for any other end."""
    if error is None or not error.code.startswith("spawn."):
        return None
    number = error.details.get("errno")
    if number not in SHORT_OF_ERRNOS:
        return None
    return from_os_error(OSError(number, f"cannot start tasks: {os.strerror(number)}"))


def _decided(units: Sequence[_Unit], current: Mapping[str, Task | None]) -> list[Record]:
    """The units' records, each end as the task ``current`` needs it now
    (``Launch.end_records_for``)."""
    records: list[Record] = []
    for unit in units:
        if unit.kind == "end":
            unit.records = unit.launch.end_records_for(current.get(unit.launch.task.id))
        records.extend(unit.records)
    return records


def _runner_dead(task: Task) -> bool:
    identity = runner_identity(task)
    return identity is None or probe(identity) is Liveness.DEAD


def _retry_refused(unit: _Unit, error: RefusedError) -> bool:
    """An end refused for its automatic retry (its ``--key`` succeeded meanwhile, say:
    not that the task moved): its launch is told, and its end is written alone next
    (``outbox.end_writes``). True if so."""
    launch = unit.launch
    if unit.kind != "end" or error.code in MOVED_CODES or launch.retry_refused is not None:
        return False
    if not any(kind == "RETRIED" for kind, _ in unit.records):
        return False
    launch.retry_refused = error
    return True


def _ends_failed(launch: Launch) -> bool:
    """Its task's end is known (not yet written) and says FAILED."""
    if launch.ended is None:
        return False
    return any(
        kind == "SETTLED" and data.get("state") == State.FAILED.value
        for kind, data in launch.ended["records"]
    )


def work(session: Session, **options: Any) -> WorkReport:
    # A loop that may commit for hours: orjson's import (15 ms) is paid back within a
    # few hundred records; the supervisors forked from here share it.
    outbox.patience_s()  # (its supervisors': a bad value refused before it leads)
    _json.bulk()
    return Worker(session, **options).run()
