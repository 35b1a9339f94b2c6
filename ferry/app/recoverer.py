"""Recovery's I/O half: gather what the probes prove about each in-flight task, call the
pure :func:`ferry.core.recovery.decide`, journal each decision (fenced by the leader's epoch,
validated under the journal lock so concurrent recoverers decide each task once), then
apply the only side effect a decision may carry (killing a STALE task when configured).

Also the verified-signal actions on one task: cancelling an in-flight task and
``ferry kill`` of a quarantined orphan. Nothing here signals a bare pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

from ferry.app import outbox
from ferry.app.queueing import settle_doomed
from ferry.app.runner import heartbeat_path, log_paths
from ferry.app.runner_state import of_another_home, other_host, runner_identity, with_runner_state
from ferry.core import events as ev
from ferry.core.errors import FerryError, OperatorNeededError, RefusedError
from ferry.core.model import Liveness, Reason, State, Task
from ferry.core.recovery import Observation, Policy, RecoverReport, decide
from ferry.proc import alivelock
from ferry.proc.alivelock import alive_path
from ferry.proc.liveness import heartbeat_age, probe, probe_task, wall_clock
from ferry.proc.process import (
    ProcessIdentity,
    ProcessScan,
    marker_prefix,
    read_stat,
    same_clock,
    scan_processes,
    signal_task,
)
from ferry.storage import LEASE_TTL_S

TYPE_CHECKING = False  # (typing is not imported at run time: start-up)
if TYPE_CHECKING:
    from typing import Any

    from ferry.app.session import Session

SALVAGE_TAIL_BYTES = 4096
CANCEL_WAIT_MARGIN_S = 5.0
_POLL_S = 0.05
KILL_CONFIRM_S = 2.0  # cancel without a runner: how long SIGKILL may take to empty the task


def leader_identity(task: Task) -> ProcessIdentity | None:
    """The task's first process as SPAWNED recorded it: the runner's child, so of the
    same boot and host, its pid one of the runner's PID namespace and its start time
    read in the runner's time namespace."""
    runner = runner_identity(task)
    if task.pid is None or task.start_time is None or runner is None:
        return None
    return ProcessIdentity(
        task.pid, int(task.start_time), runner.boot_id, runner.host, runner.pid_ns, runner.time_ns
    )


def task_marker(task: Task) -> str:
    return task.marker or marker_prefix(task.id, task.attempt)


def task_liveness(task: Task, home: str | os.PathLike[str]) -> Liveness:
    """Alive if its inherited alive-lock is still held (pid-free: sees children that
    called setsid and cleared their environment), or if any process of its session or
    group, or carrying its marker, is alive (``probe_task``)."""
    if alivelock.held(alive_path(home, task.id, task.attempt)):
        return Liveness.ALIVE
    runner = runner_identity(task)
    # (A start time read in another time namespace is offset: no bound at all then.)
    not_before = runner.start_time if runner is not None and same_clock(runner) else None
    return probe_task(task_marker(task), leader_identity(task), not_before_ticks=not_before)


# A task claimed from another state directory (``of_another_home``): this one is a copy
# of it, or was moved to it from another file system. Its processes may be alive, and
# the other home's: they are never signalled from here, nor decided dead.
_OTHER_HOME = (
    "it was claimed from another state directory (this one is a copy of it, or was moved"
    " from another file system): its processes are not signalled from here"
)


def signal_all(task: Task, home: str | os.PathLike[str], sig: int) -> int:
    """Signal every process of the task ``task_liveness`` can see (``signal_task``);
    none of a task claimed from another home (``of_another_home``)."""
    if of_another_home(task, home):
        return 0
    holding = alive_path(home, task.id, task.attempt)
    return signal_task(leader_identity(task), task_marker(task), sig, holding=holding)


def unreachable(task: Task, lock: str) -> ProcessScan | None:
    """None if a signal can reach a process of the task: its leader is running, or a
    scan finds one by marker, session, group or the alive-lock it holds; else that scan.
    (A task alive by its lock alone, held on a descriptor marked close-on-exec, is
    unreachable; so is one alive only by the session or group id of its leader gone:
    ``ProcessScan.unproven``, perhaps another program's.)"""
    leader = leader_identity(task)
    if leader is not None and probe(leader) is not Liveness.DEAD:  # (UNKNOWN: try)
        return None
    scan = scan_processes(task_marker(task), session_of=leader, holding=lock)
    return None if scan.alive or scan.unreadable else scan


def _tail(path: str) -> str | None:
    try:
        with open(path, "rb") as stream:
            size = stream.seek(0, os.SEEK_END)
            stream.seek(max(0, size - SALVAGE_TAIL_BYTES))
            return stream.read().decode("utf-8", "backslashreplace")
    except OSError:
        return None


class Recoverer:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.store = session.store
        self.home = session.home

    def _show(self, task_id: str) -> Task:
        return with_runner_state(self.store.resolve(task_id), self.home, self.store)

    def observe(self, task: Task, now: float) -> Observation:
        runner = runner_identity(task)
        runner_seen = probe(runner) if runner is not None else Liveness.DEAD
        process_seen = Liveness.DEAD
        if task.state is not State.CLAIMED:  # a CLAIMED task never started anything
            process_seen = task_liveness(task, self.home)
        try:
            beat = heartbeat_age(heartbeat_path(self.home, task.id, task.attempt), now)
        except OSError:
            beat = None
        age: float | None
        if beat is None:  # no heartbeat file (or none readable): since the start, if known
            age, clock = (None if task.started_at is None else now - task.started_at), "wall"
        else:
            age, clock = beat
        stdout_log, stderr_log = log_paths(self.home, task.id, task.attempt)
        salvage = {
            "stdout_tail": _tail(stdout_log),
            "stderr_tail": _tail(stderr_log),
            "heartbeat_age_s": age,
            "heartbeat_clock": clock,
        }
        return Observation(
            runner=runner_seen,
            task_process=process_seen,
            heartbeat_age_s=age,
            found_by_marker=task.pid is None and process_seen is not Liveness.DEAD,
            salvage=salvage,
        )

    def recover_all(
        self,
        *,
        epoch: int,
        policy: Policy,
        commit: Callable[..., object] | None = None,
        tick: Callable[[], None] | None = None,
        host_ttl_s: float = LEASE_TTL_S,
    ) -> RecoverReport:
        """Decide every in-flight task. ``commit`` journals a decision as the leader (its
        epoch; None: a dry run, nothing journaled); ``tick`` is called before each task
        (the leader renews its lease there). ``host_ttl_s``: on a shared database,
        how long after its lease expired another host's silent task is decided as
        lost (the hosts' lease time). A decision is made from probes taken
        outside the journal's lock: it names the claim it judged, and the store refuses
        it if that claim moved meanwhile (then it is not ours to make)."""
        dry_run = commit is None
        report = RecoverReport(epoch=epoch, dry_run=dry_run)
        if not dry_run:  # first: a kept end is the truth, better than any probe
            report.delivered = [
                {"task": task_id, "outcome": outcome}
                for task_id, outcome in outbox.deliver_pending(self.store, self.home)
            ]
        self.store.refresh()
        for task in self.store.in_flight():
            if tick is not None:
                tick()
            lost = self.store.host_lost(task, host_ttl_s)
            if lost is False:
                continue  # another host's, alive: its own workers decide it
            now = wall_clock()
            if lost is None:
                seen = self.observe(task, now)
            else:
                seen = lost_host_observation(task, now, host_ttl_s)
            decision = decide(task, seen, policy, now)
            if decision.event is None:
                continue
            if commit is not None:
                try:
                    commit(decision.event)
                except RefusedError:
                    continue  # the task moved meanwhile (its runner settled it): not ours
                if decision.kill_task:
                    signal_all(task, self.home, signal.SIGKILL)
            data = decision.event[1]
            report.decisions.append(
                {
                    "task": task.id,
                    "decision": decision.action.value,
                    "state": data.get("state") or _state_of(decision.event[0]),
                    # A STALE record carries no reason field; the task's reason is set by it.
                    "reason": data.get("reason") or _reason_of(decision.event[0]),
                }
            )
            report.needs_operator |= decision.needs_operator
        # The queue's part of recovery: tasks whose dependency failed are cancelled.
        report.decisions += settle_doomed(self.store, commit)
        report.orphans_alive = self.quarantined_alive()
        return report

    def quarantined_alive(self) -> list[str]:
        """Ids of quarantined tasks whose orphan still runs: its alive-lock is held, or
        one scan of /proc for FERRY_TASK markers and for the sessions and groups in use
        finds it may concern the task, and a probe says so. The session matters: an orphan
        that replaced its environment (``env -i``, sudo) carries no marker."""
        marked, groups = _marks_and_groups()
        found = []
        for task in self.store.quarantined():
            if other_host(self.store, task) is not None:
                continue  # another host's: only its own probes can see its orphan
            # The alive-lock first: an orphan that left the session and cleared its
            # environment is in neither index, and shows by nothing else.
            held = alivelock.held(alive_path(self.home, task.id, task.attempt))
            maybe = task.id in marked or (task.pid is not None and task.pid in groups)
            if held or (maybe and task_liveness(task, self.home) is not Liveness.DEAD):
                found.append(task.id)
        return found

    def cancel_in_flight(self, task: Task) -> Task:
        """After CANCEL_REQUESTED is durable: stop the task's processes and see it
        settle CANCELLED (by its runner if alive, else by us). Another host's task is
        its host's to stop: no probe here can see its processes (they answer DEAD), so
        it is only waited for."""
        owner = other_host(self.store, task)
        if owner is not None:
            return self._await_owner(task, owner)
        if of_another_home(task, self.home):
            self.session.notice(f"task {task.id}: cancel requested; {_OTHER_HOME}")
            return self._show(task.id)
        runner = runner_identity(task)
        runner_alive = runner is not None and probe(runner) is not Liveness.DEAD
        if task.state is not State.CLAIMED:
            signal_all(task, self.home, signal.SIGTERM)
        deadline = time.monotonic() + task.spec.kill_grace_s + CANCEL_WAIT_MARGIN_S
        while runner_alive and time.monotonic() < deadline:
            self.store.refresh()
            current = self.store.get(task.id)
            if current is None or current.terminal or current.attempt != task.attempt:
                return self._show(task.id)
            runner_alive = probe(runner) is not Liveness.DEAD if runner else False
            time.sleep(_POLL_S)
        if runner_alive:
            self.session.notice(
                f"task {task.id}: cancel requested; its runner has not settled it yet"
            )
            return self._show(task.id)
        # No runner: make sure nothing of the task is left, then settle it ourselves.
        grace_end = time.monotonic() + task.spec.kill_grace_s
        while task_liveness(task, self.home) is not Liveness.DEAD and time.monotonic() < grace_end:
            time.sleep(_POLL_S)
        # SIGKILL, again each poll until nothing is left (a process forking successors
        # escapes one round), for a while; then only proof of death settles it.
        kill_end = time.monotonic() + KILL_CONFIRM_S
        while task_liveness(task, self.home) is not Liveness.DEAD:
            if time.monotonic() > kill_end:
                raise OperatorNeededError(
                    f"task {task.id}: cancel requested and SIGKILL sent, but a process of it"
                    " still runs; 'ferry recover' quarantines it, then 'ferry kill' it",
                    code="task.orphan_alive",
                    details={"task": task.id},
                )
            signal_all(task, self.home, signal.SIGKILL)
            time.sleep(_POLL_S)
        with contextlib.suppress(RefusedError):  # settled meanwhile: fine
            self.store.commit(ev.Settled(task.id, task.attempt, task.claim_token,
                                         State.CANCELLED, Reason.CANCELLED_BY_USER))  # fmt: skip
        return self._show(task.id)

    def _await_owner(self, task: Task, owner: str) -> Task:
        """Another host's task, its cancel requested: that host's runner sees the
        request at its next beat, stops the task (its grace) and settles it; a lost
        host's is decided by ``recover`` (CANCELLED, its cancel having been asked)."""
        spec = task.spec
        deadline = time.monotonic() + spec.heartbeat_s + spec.kill_grace_s + CANCEL_WAIT_MARGIN_S
        while time.monotonic() < deadline:
            current = self.store.get(task.id)
            if current is None or current.terminal or current.attempt != task.attempt:
                return self._show(task.id)
            time.sleep(_POLL_S)
        self.session.notice(
            f"task {task.id}: cancel requested; it runs on host {owner}, whose ferry"
            " stops it (or, that host lost, 'ferry recover' settles it)"
        )
        return self._show(task.id)


def lost_host_observation(task: Task, now: float, ttl_s: float) -> Observation:
    """What is known of a task whose host was lost (``host_lost(task, ttl_s)``):
    nothing a probe here could see."""
    age = None if task.heartbeat_at is None else now - task.heartbeat_at
    return Observation(
        runner=Liveness.UNKNOWN, task_process=Liveness.UNKNOWN, heartbeat_age_s=age,
        host_lost=True, host_ttl_s=ttl_s,
    )  # fmt: skip


def _state_of(event_type: str) -> str:
    return {"RELEASED": "QUEUED", "STALE": "STALE", "RESUMED": "RUNNING"}.get(event_type, "?")


def _reason_of(event_type: str) -> str | None:
    return Reason.HEARTBEAT_STALE.value if event_type == "STALE" else None


def _marks_and_groups() -> tuple[set[str], set[int]]:
    """Task ids named by the FERRY_TASK marker of any live (non-zombie) process, and
    the session and process-group ids of every live process."""
    ids: set[str] = set()
    groups: set[int] = set()
    needle = b"FERRY_TASK="
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            st = read_stat(int(name))
            if st is None or st.exited:
                continue
            groups.update((st.session, st.pgrp))
            with open(f"/proc/{name}/environ", "rb", buffering=0) as f:
                env = f.read()
        except (OSError, ValueError):
            continue
        if needle not in env:
            continue
        for var in env.split(b"\0"):
            if var.startswith(needle):
                ids.add(var[len(needle) :].split(b":", 1)[0].decode("ascii", "replace"))
    return ids, groups


def kill_orphan(session: Session, task: Task, sig: int) -> dict[str, Any]:
    """``ferry kill``: journal the intent, then a verified signal to the orphan's group
    and to every process still carrying the task's marker. Never a bare pid."""
    owner = other_host(session.store, task)
    if owner is not None:
        raise RefusedError(
            f"task {task.id} runs on host {owner}: only a ferry on that host can signal"
            " its processes",
            code="task.other_host",
            details={"task": task.id, "host": owner},
        )
    if task.state is State.QUEUED:
        raise RefusedError(
            f"task {task.id} is QUEUED: no process of it has started; use 'ferry cancel'",
            code="task.not_started",
            details={"task": task.id},
        )
    if of_another_home(task, session.home):
        raise RefusedError(
            f"task {task.id}: {_OTHER_HOME}", code="task.other_home", details={"task": task.id}
        )
    runner = runner_identity(task)
    if task.in_flight and runner is not None and probe(runner) is not Liveness.DEAD:
        raise RefusedError(
            f"task {task.id} has a live runner (pid {runner.pid}); use 'ferry cancel'",
            code="task.runner_alive",
            details={"task": task.id},
        )
    if task_liveness(task, session.home) is Liveness.DEAD:
        return {"task": task.id, "signal": sig, "signalled": 0,
                "message": f"{task.id}: no process of the task is alive"}  # fmt: skip
    lock = alive_path(session.home, task.id, task.attempt)
    missed = unreachable(task, lock)
    if missed is not None and missed.unproven:
        pids = ", ".join(str(ident.pid) for ident in missed.unproven)
        raise OperatorNeededError(
            f"task {task.id}: its leader (pid {task.pid}) is gone, and processes {pids} are"
            f" in the session or group numbered {task.pid} with neither the task's marker"
            " nor its alive-lock: the number may be another program's now, so they are"
            f" not signalled; look ('ps -o pid,sid,pgid,args -s {task.pid}') and stop them"
            " yourself if they are the task's",
            code="task.orphan_unproven",
            details={"task": task.id, "pids": [ident.pid for ident in missed.unproven]},
        )
    if missed is not None:
        raise OperatorNeededError(
            f"task {task.id}: a process of it still holds its alive-lock {lock}, but none"
            " can be found to signal; find it ('fuser -v FILE' or 'lsof FILE') and stop it",
            code="task.orphan_unreachable",
            details={"task": task.id},
        )
    session.store.commit(
        ev.OrphanSignalled(
            task=task.id,
            attempt=task.attempt,
            pid=task.pid or 0,
            pgid=task.pgid or 0,
            start_time=task.start_time or 0,
            signal=sig,
            token=task.claim_token,  # (a task in flight: the claim this kill is about)
        )
    )
    try:
        sent = signal_all(task, session.home, sig)
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT):
            signal_all(task, session.home, signal.SIGCONT)  # (a stopped orphan gets it too)
    except OSError as error:
        raise FerryError(f"cannot signal task {task.id}: {error}", code="signal.failed") from error
    name = signal.Signals(sig).name
    return {"task": task.id, "signal": sig, "signalled": sent,
            "message": f"{task.id}: sent {name} to {sent} process group(s)/process(es)"}  # fmt: skip
