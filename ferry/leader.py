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
from ferry.errors import FerryError, JournalIntegrityError, LeaseHeldError
from ferry.ids import new_claim_token
from ferry.lease import Lease, LeaseStore
from ferry.model import State, Task
from ferry.process import ProcessIdentity, self_identity
from ferry.recoverer import Recoverer, RecoverReport
from ferry.recovery import Policy
from ferry.runner import Plan, Runner

if TYPE_CHECKING:
    from ferry.service import Service


def _policy(stale_after_s: float | None) -> Policy:
    return Policy(stale_after_s=stale_after_s)


class Leadership:
    """Holding the lease: acquire (CAS), renew, release; the epoch for every write."""

    def __init__(self, service: Service, ttl_s: float) -> None:
        self.service = service
        self.leases = LeaseStore(service.home / "lease.json", ttl_s)
        self.me: ProcessIdentity = self_identity()
        self.lease: Lease | None = None
        self.renew_every_s = ttl_s / 3

    @property
    def epoch(self) -> int:
        assert self.lease is not None
        return self.lease.epoch

    def acquire(self) -> Lease:
        store = self.service.store
        store.refresh()
        self.lease = self.leases.acquire(self.me, min_epoch=store.wal.max_epoch)
        return self.lease

    def renew(self) -> None:
        assert self.lease is not None
        self.lease = self.leases.renew(self.lease)

    def release(self) -> None:
        if self.lease is not None:
            self.leases.release(self.lease)
            self.lease = None


def recover(
    service: Service, *, dry_run: bool, stale_after_s: float | None, lease_ttl_s: float
) -> RecoverReport:
    """``ferry recover``: exit 75 (LeaseHeldError) if a live leader is responsible."""
    if dry_run:  # decide and print, journal nothing, take nothing
        return Recoverer(service).recover_all(epoch=0, policy=_policy(stale_after_s), dry_run=True)
    lead = Leadership(service, lease_ttl_s)
    lead.acquire()
    try:
        report = Recoverer(service).recover_all(
            epoch=lead.epoch, policy=_policy(stale_after_s), dry_run=False
        )
        service.store.maybe_compact()
        return report
    finally:
        lead.release()


def _claim_next(
    service: Service, by: str, me: ProcessIdentity
) -> tuple[Task, str, ev.Claimed] | None:
    """The oldest QUEUED task and a CLAIMED event for it (not yet committed)."""
    task = service.store.table.oldest_queued()
    if task is None:
        return None
    token = new_claim_token(os.urandom(10))
    claimed = ev.Claimed(
        task=task.id, attempt=task.attempt, token=token, runner=me.to_json(), by=by
    )
    return task, token, claimed


def claim(service: Service, *, lease_ttl_s: float, as_json: bool) -> int:
    """``ferry claim``: lead briefly, recover, claim the oldest queued task, release the
    lease, then run the task in the foreground like ``run``."""
    lead = Leadership(service, lease_ttl_s)
    lead.acquire()
    try:
        report = Recoverer(service).recover_all(epoch=lead.epoch, policy=Policy(), dry_run=False)
        for line in (render.recover_text(report, service.verbosity) or "").splitlines():
            service.notice(line)
        picked = _claim_next(service, "claim", lead.me)
        if picked is None:
            if as_json:
                render.write_json({"task": None})
            elif service.verbosity > 0:
                service.notice("the queue is empty")
            return 0
        task, token, claimed = picked
        service.store.commit(claimed, epoch=lead.epoch)
    finally:
        lead.release()
    task = replace(service.store.get(task.id) or task, state=State.CLAIMED, claim_token=token)
    return service.run_in_foreground(task, token, as_json=as_json)


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
    tasks at once (one thread each; the journal group-commits their records)."""

    RECOVER_EVERY_S = 5.0  # how often the leader checks other runners' tasks

    def __init__(self, service: Service, *, jobs: int, drain: bool, poll_s: float,
                 lease_ttl_s: float, stale_after_s: float | None) -> None:  # fmt: skip
        self.service = service
        self.store = service.store
        self.jobs, self.drain, self.poll_s = jobs, drain, poll_s
        self.policy = _policy(stale_after_s)
        self.lead = Leadership(service, lease_ttl_s)
        self.wake = threading.Event()
        self.stop = _Stop(self.wake)
        self.running: dict[str, threading.Thread] = {}
        self.failures: list[FerryError] = []
        self.runner = Runner(self.store, passthrough=False, warn=service.notice)

    def run(self) -> int:
        self.stop.install()
        try:
            if not self._standby():
                return 0
            try:
                return self._lead()
            finally:
                self._join_all()
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
        self.store.commit(ev.LeaseAcquired(epoch, self.lead.me.to_json()), epoch=epoch)
        self._recover(epoch)
        renew_at = time.monotonic() + self.lead.renew_every_s
        recover_at = time.monotonic() + self.RECOVER_EVERY_S
        while True:
            now = time.monotonic()
            if now >= renew_at:
                self.lead.renew()  # lease.lost propagates: we must stop leading
                renew_at = now + self.lead.renew_every_s
            if now >= recover_at:
                self._recover(epoch)
                recover_at = now + self.RECOVER_EVERY_S
            self._reap()
            if not self.stop.count:
                self._fill(epoch)
            if not self.running and (
                self.stop.count or (self.drain and not self._queue_nonempty())
            ):
                break
            self.wake.wait(self.poll_s if self.running or not self.drain else 0.0)
            self.wake.clear()
            self.store.refresh()
        self.store.commit(ev.LeaseReleased(epoch, self.lead.me.to_json()), epoch=epoch)
        self.store.maybe_compact()
        if self.failures:
            raise self.failures[0]
        return 0

    def _recover(self, epoch: int) -> None:
        report = Recoverer(self.service).recover_all(epoch=epoch, policy=self.policy, dry_run=False)
        for line in (render.recover_text(report, self.service.verbosity) or "").splitlines():
            self.service.notice(line)

    def _fill(self, epoch: int) -> None:
        """Claim as many queued tasks as there are free slots and write CLAIMED and
        DISPATCHING for all of them in one durable write fenced by our epoch; then
        start one runner thread per task."""
        free = self.jobs - len(self.running)
        queued = self.store.table.oldest_queued_n(free) if free > 0 else []
        if not queued:
            return
        me = self.lead.me.to_json()
        plans: list[Plan] = []
        events: list[ev.Event] = []
        for task in queued:
            token = new_claim_token(os.urandom(10))
            events.append(
                ev.Claimed(task=task.id, attempt=task.attempt, token=token, runner=me, by="work")
            )
            plan = self.runner.plan(replace(task, state=State.CLAIMED, claim_token=token), token)
            events.append(plan.event)
            plans.append(plan)
        self.store.commit(*events, epoch=epoch)
        for plan in plans:
            if plan.env is None:
                continue  # settled FAILED in the same write (a pinned input changed)
            thread = threading.Thread(
                target=self._run_one, args=(plan,), name=f"ferry-task-{plan.task.id}", daemon=True
            )
            self.running[plan.task.id] = thread
            thread.start()

    def _run_one(self, plan: Plan) -> None:
        task = plan.task
        try:
            self.runner.launch(plan, stop=self.stop.task_signal)
        except JournalIntegrityError as error:
            self.failures.append(error)
            self.stop.count = max(self.stop.count, 1)  # the journal failed us: stop
            self.service.notice(f"stopping: {error.message}")
        except FerryError as error:
            self.service.notice(f"task {task.id}: {error.message}")
        finally:
            self.wake.set()

    def _reap(self) -> None:
        for task_id, thread in list(self.running.items()):
            if not thread.is_alive():
                thread.join()
                del self.running[task_id]

    def _join_all(self) -> None:
        for thread in list(self.running.values()):
            thread.join()
        self.running.clear()


def work(service: Service, **options: Any) -> int:
    return Worker(service, **options).run()
