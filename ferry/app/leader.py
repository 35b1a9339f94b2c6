"""The leader's use cases: ``recover`` and ``claim`` (``work``'s loop: ``ferry.app.worker``).

One leader at a time, by the CAS lease (``ferry.storage.local.lease``). Every leader write (CLAIMED,
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

import time

from ferry.app import outbox
from ferry.app.foreground import claim_task
from ferry.app.recoverer import Recoverer
from ferry.app.runner import RunResult
from ferry.core import events as ev
from ferry.core.errors import FerryError, Interrupted
from ferry.core.model import Task
from ferry.core.recovery import Policy, RecoverReport
from ferry.proc._outputs import SignalTrap
from ferry.proc.process import ProcessIdentity, boot_clock, self_identity

TYPE_CHECKING = False  # (typing is not imported at run time: start-up)
if TYPE_CHECKING:
    from typing import Any

    from ferry.app.session import Session
    from ferry.storage.local.lease import Lease


def policy_of(stale_after_s: float | None, kill_stale: bool) -> Policy:
    return Policy(stale_after_s=stale_after_s, kill_stale=kill_stale)


class Leadership:
    """Holding the lease: acquire (CAS), renew, release; the epoch for every write.

    A leader's first write also journals LEASE_ACQUIRED, in the same batch: the store
    accepts it only for an epoch no record has used yet, so an epoch handed out twice
    (``lease.json`` lost or restored while its holder was paused) is written by one
    holder at most. A leader that writes nothing (a ``recover`` with nothing to
    decide) journals nothing."""

    def __init__(self, session: Session, ttl_s: float) -> None:
        self.session = session
        self.ttl_s = ttl_s
        self.leases = session.leases(ttl_s)
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
        store = self.session.store
        store.refresh()
        self.lease = self.leases.acquire(self.me, min_epoch=store.highest_epoch)
        self.announced = False
        self.renew_at = time.monotonic() + self.renew_every_s
        return self.lease

    def announcement(self) -> tuple[ev.Event, ...]:
        """LEASE_ACQUIRED, for the leader's first write (then nothing)."""
        return () if self.announced else (ev.LeaseAcquired(self.epoch, self.me.to_json()),)

    def commit(self, *events: ev.Event | tuple[str, dict[str, Any]]) -> None:
        """A leader's write, under its epoch (the journal fences older ones)."""
        self.session.store.commit(*self.announcement(), *events, epoch=self.epoch)
        self.announced = True

    def renew(self) -> None:
        assert self.lease is not None
        self.lease = self.leases.renew(self.lease)
        self.renew_at = time.monotonic() + self.renew_every_s

    def expired(self) -> bool:
        """Past the lease's deadline on this host's clock (CLOCK_BOOTTIME)."""
        return self.lease is None or boot_clock() >= self.lease.expires_boot_s

    def expired_error(self) -> FerryError:
        """What ``expired`` means, as an error (``lease.lost``)."""
        from ferry.storage.local.lease import LeaseLostError

        return LeaseLostError(
            f"the lease (epoch {self.epoch}) expired on this host's clock, unrenewed",
            details={"epoch": self.epoch},
        )

    def renew_if_due(self) -> None:
        """Renew when due: called between the steps of long work (a recovery pass over
        many tasks), so that the lease does not lapse under a leader still working."""
        if time.monotonic() >= self.renew_at:
            self.renew()

    def release(self) -> None:
        if self.lease is not None:
            self.leases.release(self.lease)
            self.lease = None


def recover_as(lead: Leadership, policy: Policy) -> RecoverReport:
    """One recovery pass as the leader: decisions under its epoch, the lease renewed
    as the pass goes."""
    return Recoverer(lead.session).recover_all(
        epoch=lead.epoch,
        policy=policy,
        commit=lead.commit,
        tick=lead.renew_if_due,
        host_ttl_s=lead.ttl_s,
    )


def recover(
    session: Session,
    *,
    dry_run: bool,
    stale_after_s: float | None,
    lease_ttl_s: float,
    kill_stale: bool = False,
) -> RecoverReport:
    """``ferry recover``: exit 75 (LeaseHeldError) if a live leader is responsible."""
    if dry_run:  # decide and print, journal nothing, take nothing
        policy = policy_of(stale_after_s, kill_stale)
        return Recoverer(session).recover_all(epoch=0, policy=policy, host_ttl_s=lease_ttl_s)
    lead = Leadership(session, lease_ttl_s)
    lead.acquire()
    try:
        report = recover_as(lead, policy_of(stale_after_s, kill_stale))
        session.store.maybe_compact()
        return report
    finally:
        lead.release()


def claim(session: Session, *, lease_ttl_s: float, stdout_echo_fd: int = 1) -> RunResult | None:
    """``ferry claim``: lead briefly, recover, claim the first task of the queue (the
    store chooses it and writes the claim, naming the task's supervisor as its runner,
    with its intent, in one write, with LEASE_ACQUIRED if this epoch wrote nothing yet),
    release the lease, then run the task in the foreground like ``run``. None: the queue
    is empty."""
    outbox.patience_s()  # (its supervisor's: a bad value refused before it leads)
    lead = Leadership(session, lease_ttl_s)
    with SignalTrap() as trap:  # (the lease's write is not cut short)
        lead.acquire()
        trap.drain()
    try:
        if trap.received:
            signum = trap.received[0]
            raise Interrupted(
                f"interrupted by signal {signum} as it took the lease: nothing was claimed",
                exit_code=128 + signum,
            )
        session.reporter.recovered(recover_as(lead, Policy()))

        def claim_one(runner: dict[str, Any], token: str) -> Task | None:
            task = session.store.claim_next(
                runner, token, by="claim", epoch=lead.epoch,
                announce=lead.announcement(),
            )  # fmt: skip
            if task is not None:
                lead.announced = True
            return task

        def on_claimed() -> None:
            lead.release()  # the task runs under its claim token, not the lease

        return claim_task(
            session, claim_one, epoch=lead.epoch, lease_ttl_s=lease_ttl_s,
            on_claimed=on_claimed, stdout_echo_fd=stdout_echo_fd,
            renew=lead.renew_if_due, renew_every_s=lead.renew_every_s,
        )  # fmt: skip
    finally:
        lead.release()
