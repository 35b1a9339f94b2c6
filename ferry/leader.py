"""The leader's use cases: ``recover``, ``claim`` and the ``work`` loop.

One leader at a time, by the CAS lease (``ferry.lease``). Every leader write (CLAIMED,
recovery decisions, LEASE_ACQUIRED) carries the lease's epoch; the journal refuses a
record whose epoch is older than one it already holds, so a leader that was paused
(SIGSTOP, a VM freeze) and wakes after another took over cannot claim or decide
anything: it gets ``journal.fenced``, stops claiming and says so. A runner's own records
about its task (DISPATCHING, SPAWNED, SETTLED) are fenced by the claim token instead:
they stay valid while the task is still that claim's, so a slow leader's finished task
is not thrown away, and a task recovery has already decided cannot be settled again.

A new leader finishes recovery before it claims anything.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from ferry import events as ev
from ferry import render
from ferry.errors import (
    FerryError,
    InternalError,
    JournalIntegrityError,
    LeaseHeldError,
    RefusedError,
)
from ferry.fold import MOVED_CODES, RACE_TRIES
from ferry.ids import new_claim_token
from ferry.lease import Lease, LeaseStore
from ferry.model import State, Task
from ferry.process import ProcessIdentity, self_identity
from ferry.recoverer import Recoverer, RecoverReport
from ferry.recovery import Policy
from ferry.runner import Plan, Runner

if TYPE_CHECKING:
    from ferry.service import Service


def _policy(stale_after_s: float | None, kill_stale: bool) -> Policy:
    return Policy(stale_after_s=stale_after_s, kill_stale=kill_stale)


class Leadership:
    """Holding the lease: acquire (CAS), renew, release; the epoch for every write.

    A leader's first write also journals LEASE_ACQUIRED, in the same batch: the store
    accepts it only for an epoch no record has used yet, so an epoch handed out twice
    (``lease.json`` lost or restored while its holder was paused) is written by one
    holder at most. A leader that writes nothing (a ``recover`` with nothing to
    decide) journals nothing."""

    def __init__(self, service: Service, ttl_s: float) -> None:
        self.service = service
        self.leases = LeaseStore(service.home / "lease.json", ttl_s)
        self.me: ProcessIdentity = self_identity()
        self.lease: Lease | None = None
        self.renew_every_s = ttl_s / 3
        self.renew_at = 0.0  # time.monotonic() of the next renewal
        self.announced = False  # LEASE_ACQUIRED for this epoch is in the journal

    @property
    def epoch(self) -> int:
        assert self.lease is not None
        return self.lease.epoch

    def acquire(self) -> Lease:
        store = self.service.store
        store.refresh()
        self.lease = self.leases.acquire(self.me, min_epoch=store.wal.max_epoch)
        self.announced = False
        self.renew_at = time.monotonic() + self.renew_every_s
        return self.lease

    def announcement(self) -> tuple[ev.Event, ...]:
        """LEASE_ACQUIRED, for the leader's first write (then nothing)."""
        return () if self.announced else (ev.LeaseAcquired(self.epoch, self.me.to_json()),)

    def commit(self, *events: ev.Event | tuple[str, dict[str, Any]]) -> None:
        """A leader's write, under its epoch (the journal fences older ones)."""
        self.service.store.commit(*self.announcement(), *events, epoch=self.epoch)
        self.announced = True

    def renew(self) -> None:
        assert self.lease is not None
        self.lease = self.leases.renew(self.lease)
        self.renew_at = time.monotonic() + self.renew_every_s

    def renew_if_due(self) -> None:
        """Renew when due: called between the steps of long work (a recovery pass over
        many tasks), so that the lease does not lapse under a leader still working."""
        if time.monotonic() >= self.renew_at:
            self.renew()

    def release(self) -> None:
        if self.lease is not None:
            self.leases.release(self.lease)
            self.lease = None


def _recover_as(lead: Leadership, policy: Policy) -> RecoverReport:
    """One recovery pass as the leader: decisions under its epoch, the lease renewed
    as the pass goes."""
    return Recoverer(lead.service).recover_all(
        epoch=lead.epoch, policy=policy, commit=lead.commit, tick=lead.renew_if_due
    )


def recover(
    service: Service,
    *,
    dry_run: bool,
    stale_after_s: float | None,
    lease_ttl_s: float,
    kill_stale: bool = False,
) -> RecoverReport:
    """``ferry recover``: exit 75 (LeaseHeldError) if a live leader is responsible."""
    if dry_run:  # decide and print, journal nothing, take nothing
        return Recoverer(service).recover_all(epoch=0, policy=_policy(stale_after_s, kill_stale))
    lead = Leadership(service, lease_ttl_s)
    lead.acquire()
    try:
        report = _recover_as(lead, _policy(stale_after_s, kill_stale))
        service.store.maybe_compact()
        return report
    finally:
        lead.release()


def claim(service: Service, *, lease_ttl_s: float, as_json: bool) -> int:
    """``ferry claim``: lead briefly, recover, claim the oldest queued task (the claim
    names the task's supervisor as its runner, and goes with the intent in one write),
    release the lease, then run the task in the foreground like ``run``."""
    lead = Leadership(service, lease_ttl_s)
    lead.acquire()
    try:
        report = _recover_as(lead, Policy())
        for line in (render.recover_text(report, service.verbosity) or "").splitlines():
            service.notice(line)
        for _ in range(RACE_TRIES):
            task = service.store.table.oldest_queued()
            if task is None:
                if as_json:
                    render.write_json({"task": None})
                elif service.verbosity > 0:
                    service.notice("the queue is empty")
                return 0
            token = new_claim_token(os.urandom(10))
            claimed: list[bool] = []

            def lead_events(runner: ProcessIdentity, task: Task = task) -> list[ev.Event]:
                event = ev.Claimed(task.id, task.attempt, token, runner.to_json(), "claim")
                return [*lead.announcement(), event]

            def on_claimed(claimed: list[bool] = claimed) -> None:
                claimed.append(True)
                lead.announced = True
                lead.release()  # the task runs under its claim token, not the lease

            ours = replace(task, state=State.CLAIMED, claim_token=token)
            try:
                return service.run_in_foreground(
                    ours, token, lead=lead_events, epoch=lead.epoch, on_claimed=on_claimed,
                    as_json=as_json,
                )  # fmt: skip
            except RefusedError as error:  # cancelled (or claimed) since we read it
                if claimed or error.code not in MOVED_CODES:
                    raise
        raise InternalError("the queue kept changing under 'ferry claim'")
    finally:
        lead.release()


class _Stop:
    """SIGTERM/SIGINT/SIGHUP in ``work``: the first stops claiming, the second stops
    the running tasks (each gets SIGTERM, then SIGKILL after its --kill-grace)."""

    def __init__(self, wake: threading.Event) -> None:
        self.count = 0
        self.wake = wake
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self.wake.set()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def task_signal(self) -> int | None:
        return signal.SIGTERM if self.count >= 2 else None


class Worker:
    """``ferry work``: standby until it can lead, recover, then run up to ``jobs``
    tasks at once.

    Each of the ``jobs`` slots is a thread that loops: claim the oldest queued task,
    run it, claim the next. The end of one task and the claim of the next go in ONE
    durable write (SETTLED, CLAIMED, DISPATCHING: one fsync where writing them as they
    happen takes two), and the slots' writes share fsyncs through the journal's group
    commit. The main thread keeps the lease, re-runs recovery for other runners'
    tasks, and waits for the slots.
    """

    RECOVER_EVERY_S = 5.0  # how often the leader checks other runners' tasks

    def __init__(self, service: Service, *, jobs: int, drain: bool, poll_s: float,
                 lease_ttl_s: float, stale_after_s: float | None,
                 kill_stale: bool = False) -> None:  # fmt: skip
        self.service = service
        self.store = service.store
        self.jobs, self.drain, self.poll_s = jobs, drain, poll_s
        self.policy = _policy(stale_after_s, kill_stale)
        self.lead = Leadership(service, lease_ttl_s)
        self.wake = threading.Event()  # set on a stop signal and when a slot ends
        self.stop = _Stop(self.wake)
        self.halted = False  # stop claiming: the lease is lost or the journal failed us
        self.failures: list[FerryError] = []
        self.runner = Runner(self.store, passthrough=False, warn=service.notice)
        self._claims = threading.Lock()  # guards taken, slots_left
        self._changed = threading.Condition(self._claims)  # a slot's task ended; a stop
        self.taken: set[str] = set()  # tasks a slot picked and is claiming or running
        self.slots_left = 0
        self._refused: str | None = None  # the last task whose claim was refused
        self._stop_r = self._stop_w = -1  # a pipe while leading: readable = tasks stop

    def run(self) -> int:
        self.stop.install()
        try:
            if not self._standby():
                return 0
            try:
                return self._lead()
            finally:
                self.lead.release()
        finally:
            self.stop.restore()

    def _standby(self) -> bool:
        while True:
            try:
                self.lead.acquire()
                return True
            except LeaseHeldError:
                if self.stop.count or (self.drain and not self._queue_nonempty()):
                    return False
            self.wake.wait(self.poll_s)
            self.wake.clear()

    def _queue_nonempty(self) -> bool:
        self.store.refresh()
        return self.store.table.oldest_queued() is not None

    def _lead(self) -> int:
        epoch = self.lead.epoch
        self.lead.commit()  # LEASE_ACQUIRED: before any slot writes with this epoch
        self._recover()
        slots = [
            threading.Thread(target=self._slot, args=(epoch,), name=f"ferry-slot-{n}", daemon=True)
            for n in range(self.jobs)
        ]
        self.slots_left = len(slots)
        self._stop_r, self._stop_w = os.pipe()
        for slot in slots:
            slot.start()
        try:
            self._keep_lease()
        finally:
            self.halted = True  # (a lost lease raised: the slots finish their tasks)
            with self._claims:
                self._changed.notify_all()
            for slot in slots:
                slot.join()
            os.close(self._stop_r)
            os.close(self._stop_w)
        self.store.commit(ev.LeaseReleased(epoch, self.lead.me.to_json()), epoch=epoch)
        self.store.maybe_compact()
        if self.failures:
            raise self.failures[0]
        return 0

    def _keep_lease(self) -> None:
        """Renew the lease and recover other runners' tasks until every slot ended."""
        recover_at = time.monotonic() + self.RECOVER_EVERY_S
        stops_seen = 0
        while self.slots_left:
            count = self.stop.count
            if count > stops_seen:
                self._on_stop(stops_seen, count)
                stops_seen = count
            self.lead.renew_if_due()  # lease.lost propagates: we must stop leading
            if time.monotonic() >= recover_at:
                self._recover()
                recover_at = time.monotonic() + self.RECOVER_EVERY_S
            self.wake.wait(max(0.0, min(self.lead.renew_at, recover_at) - time.monotonic()))
            self.wake.clear()

    def _on_stop(self, seen: int, count: int) -> None:
        """Stop signals arrived (the handler only counts them: it cannot take locks)."""
        if seen == 0:
            self.service.notice(
                "stopping: no new tasks; running ones finish (signal again to stop them)"
            )
            with self._claims:  # idle slots end now
                self._changed.notify_all()
        if seen < 2 <= count:
            self.service.notice("stopping the running tasks")
            # They run in the slots' threads, where no signal arrives: make their loops
            # ask stop.task_signal now, not at their next heartbeat.
            os.write(self._stop_w, b"!")

    def _recover(self) -> None:
        report = _recover_as(self.lead, self.policy)
        for line in (render.recover_text(report, self.service.verbosity) or "").splitlines():
            self.service.notice(line)

    # -- a slot --------------------------------------------------------------------------

    def _slot(self, epoch: int) -> None:
        ending: tuple[ev.Event, ...] = ()  # the end of this slot's last task, unwritten
        try:
            while True:
                task = None if self.stop.count or self.halted else self._choose()
                if ending and task is not None and task.spec.pointers:
                    # Its pinned inputs are hashed again before it may run, which can
                    # take long: the end already known does not wait for that.
                    self._write(ending, None, epoch)
                    ending = ()
                plan = None if task is None else self._plan(task)
                claimed = self._write(ending, plan, epoch)
                ending = ()
                if claimed is not None:
                    ending = self._run(claimed)
                elif plan is None and self._idle_ends():
                    return
                # (a picked task that did not start: refused, or settled in its claim
                # write because a pinned input changed: pick again at once)
        except FerryError as error:  # (history that could not be loaded): its own code
            self._fail(error)
        except Exception as exc:  # a bug: say so, stop claiming, let the others end
            self._fail(InternalError(f"a work slot failed: {exc!r}"))
        finally:
            try:
                if ending:
                    self._write(ending, None, epoch)
            finally:
                with self._claims:
                    self.slots_left -= 1
                self.wake.set()

    def _choose(self) -> Task | None:
        """The oldest queued task no other slot is claiming (now taken by this slot)."""
        with self._claims:
            with self.store.lock:
                candidates = self.store.table.oldest_queued_n(len(self.taken) + 1)
            task = next((t for t in candidates if t.id not in self.taken), None)
            if task is not None:
                self.taken.add(task.id)
            return task

    def _plan(self, task: Task) -> Plan:
        """A chosen task, planned (not written); its pinned inputs checked."""
        try:
            token = new_claim_token(os.urandom(10))
            return self.runner.plan(replace(task, state=State.CLAIMED, claim_token=token), token)
        except BaseException:
            self._unpick(task.id)
            raise

    def _unpick(self, task_id: str) -> None:
        with self._claims:
            self.taken.discard(task_id)
            self._changed.notify_all()

    def _write(self, ending: tuple[ev.Event, ...], plan: Plan | None, epoch: int) -> Plan | None:
        """Commit the last task's end and the next claim in one write. Returns the plan
        if its claim is durable and its task must run."""
        try:
            if plan is None:
                if ending:
                    self._commit_ending(ending)
                return None
            task = plan.task
            claim = (
                ev.Claimed(task=task.id, attempt=task.attempt, token=plan.token,
                           runner=self.lead.me.to_json(), by="work"),
                plan.event,
            )  # fmt: skip
            try:
                self.store.commit(*ending, *claim, epoch=epoch)
            except (RefusedError, LeaseHeldError):
                if not ending:
                    raise
                # Refused or fenced as a whole: the end on its own (a runner's record,
                # valid by its claim token whatever the epoch), then the claim alone.
                self._commit_ending(ending)
                self.store.commit(*claim, epoch=epoch)
        except LeaseHeldError as error:
            self.halted = True
            self.service.notice(f"stopping: {error.message}")
        except RefusedError as error:  # cancelled or claimed elsewhere meanwhile
            task_id = plan.task.id if plan else None
            if task_id is not None and task_id == self._refused:
                # Refused twice though the table (caught up by the failed write) still
                # offers it: a bug somewhere; stop rather than spin on it.
                self._fail(error)
            else:
                self.service.notice(f"task {task_id}: {error.message}")
                self._refused = task_id
        except FerryError as error:  # the journal failed us (a full disk, corruption)
            self._fail(error)
        else:
            if plan.env is not None:
                return plan
            # else: a pinned input changed, and that write settled it FAILED
        if plan is not None:
            self._unpick(plan.task.id)
        return None

    def _commit_ending(self, ending: tuple[ev.Event, ...]) -> None:
        try:
            self.store.commit(*ending)
        except RefusedError as error:  # recovery decided the task meanwhile
            self.service.notice(f"task {getattr(ending[-1], 'task', '?')}: {error.message}")

    def _run(self, plan: Plan) -> tuple[ev.Event, ...]:
        try:
            return self.runner.finish(plan, self.stop.task_signal, self._stop_r).events
        except JournalIntegrityError as error:
            self._fail(error)
        except (FerryError, OSError) as error:
            # Left in flight (recovery decides it once this runner is gone).
            self.service.notice(f"task {plan.task.id}: {getattr(error, 'message', error)}")
        finally:
            self._unpick(plan.task.id)
        return ()

    def _fail(self, error: FerryError) -> None:
        self.failures.append(error)
        self.halted = True
        self.service.notice(f"stopping: {error.message}")

    def _idle_ends(self) -> bool:
        """Nothing to claim: True if this slot should end, else wait for work."""
        if self.stop.count or self.halted:
            return True
        if self.drain:
            with self._claims:
                others_busy = bool(self.taken)
            if not others_busy and not self._queue_nonempty():
                return True
        with self._claims:  # woken early when another slot's task ends, or on a stop
            self._changed.wait(self.poll_s)
        self.store.refresh()
        return False


def work(service: Service, **options: Any) -> int:
    return Worker(service, **options).run()
