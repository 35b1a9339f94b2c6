"""The recovery matrix as a pure function: ``decide(task, observation, policy, now)``.

The service gathers the observation (probes of the runner and of the task's processes,
the heartbeat's age, a scan for the environment marker, salvage such as the last lines
of output), calls :func:`decide` for each in-flight task, journals ``decision.event``
(if any) and then applies the side effect it implies (only ``kill_task``). The rows,
with the action each maps to, are in ``docs/recovery.md``; a test parses that table and
checks every row against this function.

Liveness: ALIVE and DEAD are proofs; UNKNOWN is the absence of proof and is treated as
ALIVE everywhere (a runner we cannot prove dead is left alone; a task process we cannot
prove dead is quarantined). Nothing is ever decided dead on a guess.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ferry.core import events as ev
from ferry.core.model import IN_FLIGHT_STATES, Liveness, Reason, State, Task, rfc3339

TYPE_CHECKING = False  # (typing is not imported at run time: start-up)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Action", "Decision", "Liveness", "Observation", "Policy", "decide"]

STALE_HEARTBEATS_DEFAULT = 3  # without --stale-after: stale after 3 missed beats


class Action(enum.StrEnum):
    LEAVE = "LEAVE"  # journal nothing
    MARK_STALE = "MARK_STALE"  # RUNNING -> STALE (HEARTBEAT_STALE)
    RESUME = "RESUME"  # STALE -> RUNNING
    QUARANTINE = "QUARANTINE"  # FAILED, QUARANTINED_ORPHAN_ALIVE
    FAIL_UNSAFE = "FAIL_UNSAFE"  # FAILED, MARKED_FAILED_MUTATION_UNSAFE
    RELEASE = "RELEASE"  # QUEUED, RELEASED_TO_QUEUE, releases + 1
    RELEASE_UNCOUNTED = "RELEASE_UNCOUNTED"  # QUEUED, RELEASED_TO_QUEUE, not counted
    FAIL_LIMIT = "FAIL_LIMIT"  # FAILED, RELEASE_LIMIT_EXCEEDED
    CANCEL = "CANCEL"  # CANCELLED, CANCELLED_BY_USER (a cancel was asked, nothing runs)
    FAIL_HOST_LOST = "FAIL_HOST_LOST"  # FAILED, HOST_LOST (its host's lease expired)


OPERATOR_ACTIONS = frozenset(
    {Action.QUARANTINE, Action.FAIL_UNSAFE, Action.FAIL_LIMIT, Action.FAIL_HOST_LOST}
)


@dataclass(frozen=True)
class Observation:
    """What the probes proved, for one in-flight task.

    ``runner``: the ferry process that claimed it (pid + start time + boot).
    ``task_process``: any process of the task's session or carrying its marker (a
    zombie is not alive); for DISPATCHING tasks this comes from the marker scan.
    ``heartbeat_age_s``: now minus the runner's last beat; None when unknown.
    ``orphan``: identity (pid, pgid, start_time) of a task process found, if any.
    ``salvage``: what else is known (last lines of output, ...), kept in the evidence.
    ``host_lost``: a shared database only: the task ran on another host, whose lease
    expired long enough ago that its workers have stopped their tasks; no probe of this
    host can see that host's processes (``runner`` and ``task_process`` are then
    UNKNOWN and mean nothing). ``host_ttl_s``: the lease time it was judged lost by,
    kept in the evidence: the store judges again with it as it writes the decision
    (the host may be back, its task heard again, since).
    """

    runner: Liveness
    task_process: Liveness
    heartbeat_age_s: float | None = None
    found_by_marker: bool = False
    exit_code: int | None = None
    exit_signal: int | None = None
    orphan: Mapping[str, Any] | None = None
    salvage: Mapping[str, Any] = field(default_factory=dict)
    host_lost: bool = False
    host_ttl_s: float | None = None


@dataclass(frozen=True)
class Policy:
    """``stale_after_s``: heartbeat age that makes a live runner's task STALE (None:
    3 x the task's own ``--heartbeat``). ``kill_stale``: also kill a STALE task's group."""

    stale_after_s: float | None = None
    kill_stale: bool = False

    def __post_init__(self) -> None:
        limit = self.stale_after_s
        if limit is not None and (math.isnan(limit) or limit <= 0 or math.isinf(limit)):
            raise ValueError(f"stale_after_s must be a positive number, not {limit!r}")

    def stale_limit_s(self, task: Task) -> float:
        if self.stale_after_s is not None:
            return self.stale_after_s
        return STALE_HEARTBEATS_DEFAULT * task.spec.heartbeat_s


@dataclass(frozen=True)
class Decision:
    """``event`` is the (type, data) to journal (None for LEAVE); ``kill_task`` asks the
    service to kill the task's group after journaling (MARK_STALE with kill_stale)."""

    action: Action
    event: tuple[str, dict[str, Any]] | None
    evidence: Mapping[str, Any]
    kill_task: bool = False

    @property
    def needs_operator(self) -> bool:
        """True for the outcomes that make ``ferry recover`` exit 3."""
        return self.action in OPERATOR_ACTIONS


def _is_fresh(age_s: float | None, limit_s: float) -> bool:
    # No heartbeat seen is no proof of staleness; a negative age is clock skew: fresh.
    return age_s is None or age_s <= limit_s


def _choose(task: Task, seen: Observation, policy: Policy) -> tuple[Action, str]:
    """The matrix. Returns the action and one sentence saying why."""
    if task.state not in IN_FLIGHT_STATES:
        return Action.LEAVE, f"task is {task.state}, not in flight"
    if seen.host_lost:
        return _choose_host_lost(task)
    if seen.runner is not Liveness.DEAD:  # ALIVE, or UNKNOWN treated as alive
        runner = "runner alive" if seen.runner is Liveness.ALIVE else "runner liveness unknown"
        if task.state in (State.CLAIMED, State.DISPATCHING):
            return Action.LEAVE, f"{runner}: it is still starting the task"
        fresh = _is_fresh(seen.heartbeat_age_s, policy.stale_limit_s(task))
        if task.state is State.RUNNING:
            if fresh:
                return Action.LEAVE, f"{runner}, heartbeat fresh"
            return Action.MARK_STALE, f"{runner}, heartbeat older than the stale limit"
        if fresh:
            return Action.RESUME, f"{runner} and beating again"
        return Action.LEAVE, f"{runner}, heartbeat still stale: already STALE"
    if task.state is State.CLAIMED:
        # DISPATCHING is durable before any spawn, so a CLAIMED task never started: no
        # process of it can exist, whatever a probe says.
        if task.cancel_requested:
            return Action.CANCEL, "runner dead before dispatch; a cancel was requested"
        return Action.RELEASE_UNCOUNTED, "runner dead before dispatch: nothing was started"
    if seen.task_process is not Liveness.DEAD:
        known = "alive" if seen.task_process is Liveness.ALIVE else "not provably dead"
        return Action.QUARANTINE, f"runner dead, task process {known}: never requeued or killed"
    if task.cancel_requested:
        return Action.CANCEL, "runner and task dead; a cancel was requested"
    if not task.spec.idempotent:
        return Action.FAIL_UNSAFE, "runner and task dead; the task may have mutated state"
    if task.releases < task.spec.max_releases:
        return Action.RELEASE, "runner and task dead; idempotent: back to the queue"
    return Action.FAIL_LIMIT, f"runner and task dead; released {task.releases} times already"


def _choose_host_lost(task: Task) -> tuple[Action, str]:
    """Another host's task, that host's lease expired: its workers stopped their tasks
    when they could not renew (or the host is gone). Nothing here can probe it. A
    cancel asked for meanwhile is what the user wanted of it (a release would be
    refused: the fold's rule)."""
    if task.cancel_requested:
        return Action.CANCEL, "its host was lost; a cancel was requested"
    if task.state is State.CLAIMED:
        return Action.RELEASE_UNCOUNTED, "its host was lost before dispatch: nothing was started"
    if not task.spec.idempotent:
        return Action.FAIL_HOST_LOST, "its host was lost; the task may have mutated state"
    if task.releases < task.spec.max_releases:
        return Action.RELEASE, "its host was lost; idempotent: back to the queue"
    return Action.FAIL_LIMIT, f"its host was lost; released {task.releases} times already"


def _orphan(task: Task, seen: Observation) -> dict[str, Any] | None:
    if seen.orphan is not None:
        return dict(seen.orphan)
    if task.pid is None:
        return None
    return {"pid": task.pid, "pgid": task.pgid, "start_time": task.start_time}


def decide(task: Task, observation: Observation, policy: Policy, now: float) -> Decision:
    """Decide one in-flight task (``now``: Unix seconds, for the evidence only)."""
    seen = observation
    action, why = _choose(task, seen, policy)
    recovery = {
        "decision": action.value,
        "why": why,
        "decided_at": rfc3339(now),
        "previous_state": task.state.value,
        "attempt": task.attempt,
        "runner": seen.runner.value,
        "runner_identity": None if task.runner is None else dict(task.runner),
        "task_process": seen.task_process.value,
        "heartbeat_age_s": seen.heartbeat_age_s,
        "stale_limit_s": policy.stale_limit_s(task),
        "found_by_marker": seen.found_by_marker,
        "orphan": _orphan(task, seen),
    }
    if seen.host_lost:
        recovery["host_lost"] = True
        if seen.host_ttl_s is not None:
            recovery["host_ttl_s"] = seen.host_ttl_s
    if action is Action.MARK_STALE:
        recovery["kill_requested"] = policy.kill_stale
    salvage = {
        "pid": task.pid,
        "pgid": task.pgid,
        "start_time": task.start_time,
        "started_at": rfc3339(task.started_at),
        "heartbeat_at": rfc3339(task.heartbeat_at),
        "exit_code": seen.exit_code,
        "signal": seen.exit_signal,
        **seen.salvage,
    }
    evidence = {"recovery": recovery, "salvage": salvage}
    event = _event(task, action, seen, evidence)
    kill = action is Action.MARK_STALE and policy.kill_stale
    return Decision(action, None if event is None else event.encode(), evidence, kill)


_SETTLE: Mapping[Action, tuple[State, Reason]] = {
    Action.QUARANTINE: (State.FAILED, Reason.QUARANTINED_ORPHAN_ALIVE),
    Action.FAIL_UNSAFE: (State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE),
    Action.FAIL_LIMIT: (State.FAILED, Reason.RELEASE_LIMIT_EXCEEDED),
    Action.CANCEL: (State.CANCELLED, Reason.CANCELLED_BY_USER),
    Action.FAIL_HOST_LOST: (State.FAILED, Reason.HOST_LOST),
}


def _event(
    task: Task, action: Action, seen: Observation, evidence: dict[str, Any]
) -> ev.TaskEvent | None:
    # Recovery decides a claim it does not own: its events name that claim's token, so
    # a decision made from what the probes saw is refused if the claim changed since
    # (the rule at the top of ferry.core.fold); the leader's epoch fences it too.
    token = task.claim_token
    if action in _SETTLE:
        state, reason = _SETTLE[action]
        return ev.Settled(task.id, task.attempt, token, state, reason,
                          seen.exit_code, seen.exit_signal, evidence)  # fmt: skip
    if action in (Action.RELEASE, Action.RELEASE_UNCOUNTED):
        counted = action is Action.RELEASE
        return ev.Released(
            task.id, task.attempt, token, Reason.RELEASED_TO_QUEUE, counted, evidence
        )
    if action is Action.MARK_STALE:
        return ev.Stale(task.id, task.attempt, token, evidence)
    if action is Action.RESUME:
        return ev.Resumed(task.id, task.attempt, token, evidence)
    return None


@dataclass
class RecoverReport:
    """What one recovery pass decided, under which epoch, and whether an operator is
    needed (``exit_code``)."""

    epoch: int
    dry_run: bool
    decisions: list[dict[str, Any]] = field(default_factory=list)
    orphans_alive: list[str] = field(default_factory=list)
    # Ends kept on this host by supervisors that could not write them, now written:
    # {task, outcome} (outcome: settled, late, already, refused; ferry.app.outbox).
    delivered: list[dict[str, str]] = field(default_factory=list)
    needs_operator: bool = False

    @property
    def exit_code(self) -> int:
        return 3 if self.needs_operator or self.orphans_alive else 0
