"""States, reasons, the legal transitions, and the Task (pure).

The transition table is the contract's, verbatim::

    QUEUED      -> CLAIMED | CANCELLED | FAILED
    CLAIMED     -> DISPATCHING | QUEUED | FAILED | CANCELLED
    DISPATCHING -> RUNNING | QUEUED | FAILED | CANCELLED
    RUNNING     -> STALE | SUCCEEDED | FAILED | CANCELLED | QUEUED
    STALE       -> RUNNING | SUCCEEDED | FAILED | CANCELLED | QUEUED
    FAILED | CANCELLED -> QUEUED   (only by retry, as a new attempt)

SUCCEEDED is final. Every code path that changes a task's state goes through
:func:`check_transition`; the event fold adds which *event* may cause which transition.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from ferry.core._value import Value, init, replace
from ferry.core.errors import IllegalTransitionError
from ferry.core.ids import new_claim_token, new_task_id, resolve_prefix
from ferry.core.spec import PatchRef, TaskSpec, validate_spec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "IN_FLIGHT_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Liveness",
    "PatchRef",
    "Reason",
    "State",
    "Task",
    "TaskSpec",
    "check_transition",
    "new_claim_token",
    "new_task_id",
    "replace",
    "resolve_prefix",
    "rfc3339",
    "task_to_json",
    "validate_spec",
]


class State(enum.StrEnum):
    QUEUED = "QUEUED"
    CLAIMED = "CLAIMED"
    DISPATCHING = "DISPATCHING"
    RUNNING = "RUNNING"
    STALE = "STALE"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class Reason(enum.StrEnum):
    EXIT_NONZERO = "EXIT_NONZERO"
    TIMEOUT = "TIMEOUT"
    SIGNALLED = "SIGNALLED"
    SPAWN_FAILED = "SPAWN_FAILED"
    CANCELLED_BY_USER = "CANCELLED_BY_USER"
    QUARANTINED_ORPHAN_ALIVE = "QUARANTINED_ORPHAN_ALIVE"
    MARKED_FAILED_MUTATION_UNSAFE = "MARKED_FAILED_MUTATION_UNSAFE"
    RELEASED_TO_QUEUE = "RELEASED_TO_QUEUE"
    RELEASE_LIMIT_EXCEEDED = "RELEASE_LIMIT_EXCEEDED"
    HEARTBEAT_STALE = "HEARTBEAT_STALE"
    HOST_LOST = "HOST_LOST"  # a shared database: the host that ran it lost its lease
    POINTER_STALE = "POINTER_STALE"
    NOT_A_UNIFIED_DIFF = "NOT_A_UNIFIED_DIFF"
    PATCH_DOES_NOT_COVER_POINTERS = "PATCH_DOES_NOT_COVER_POINTERS"
    EMPTY_PATCH_HUNKS = "EMPTY_PATCH_HUNKS"
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"  # a task of its --after ended other than SUCCEEDED


class Liveness(enum.StrEnum):
    """What a probe proved about a process. UNKNOWN must be treated as ALIVE."""

    ALIVE = "ALIVE"
    DEAD = "DEAD"
    UNKNOWN = "UNKNOWN"


TERMINAL_STATES: frozenset[State] = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
# Claimed by some runner: the claim token owns the task until it settles or is released.
IN_FLIGHT_STATES: frozenset[State] = frozenset(
    {State.CLAIMED, State.DISPATCHING, State.RUNNING, State.STALE}
)

_S = State
TRANSITIONS: Mapping[State, frozenset[State]] = MappingProxyType(
    {
        _S.QUEUED: frozenset({_S.CLAIMED, _S.CANCELLED, _S.FAILED}),
        _S.CLAIMED: frozenset({_S.DISPATCHING, _S.QUEUED, _S.FAILED, _S.CANCELLED}),
        _S.DISPATCHING: frozenset({_S.RUNNING, _S.QUEUED, _S.FAILED, _S.CANCELLED}),
        _S.RUNNING: frozenset({_S.STALE, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.QUEUED}),
        _S.STALE: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.QUEUED}),
        _S.SUCCEEDED: frozenset(),
        _S.FAILED: frozenset({_S.QUEUED}),
        _S.CANCELLED: frozenset({_S.QUEUED}),
    }
)


def is_legal(old: State, new: State) -> bool:
    return new in TRANSITIONS[old]


def check_transition(old: State, new: State, *, task: str | None = None) -> None:
    """Refuse (IllegalTransitionError, ``task.illegal_transition``) what the table lacks."""
    if not is_legal(old, new):
        where = f"task {task}: " if task else ""
        raise IllegalTransitionError(
            f"{where}illegal transition {old} -> {new}",
            details={"old": str(old), "new": str(new), "task": task},
        )


# The default of Task.evidence: each task gets a new dict of its own (as a dataclass's
# default_factory=dict); the shared empty mapping itself is never stored.
_NEW_DICT: Mapping[str, Any] = MappingProxyType({})


class Task(Value):
    """One task as the journal says it is now. Update with :func:`replace`.

    Times are Unix seconds (float). ``runner`` is the identity of the ferry process
    that claimed the current attempt (pid, start_time, boot_id, host); ``claim_token``
    is that claim's fencing token (None when no claim owns the task).

    (A hand-written frozen value, not a dataclass: see ``ferry.core._value``.)
    """

    _FIELDS = (
        "id",
        "spec",
        "state",
        "reason",
        "attempt",
        "releases",
        "exit_code",
        "signal",
        "created_at",
        "started_at",
        "ended_at",
        "heartbeat_at",
        "pid",
        "pgid",
        "start_time",
        "runner",
        "claimed_by",
        "claim_token",
        "marker",
        "cancel_requested",
        "evidence",
        "submit_seq",
        "queue_seq",
        "updated_seq",
        "number",
        "not_before",
        "retries_used",
    )
    id: str
    spec: TaskSpec
    state: State
    reason: Reason | None
    attempt: int
    releases: int
    exit_code: int | None
    signal: int | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    heartbeat_at: float | None
    pid: int | None
    pgid: int | None
    start_time: float | None  # the task process's start time (identity)
    runner: Mapping[str, Any] | None
    claimed_by: str | None  # "run" | "claim" | "work"
    claim_token: str | None
    marker: str | None  # the environment marker of the current dispatch
    cancel_requested: bool
    evidence: Mapping[str, Any]
    submit_seq: int  # journal seq of SUBMITTED
    queue_seq: int  # queue position: SUBMITTED's seq, or RETRIED's (a release keeps it)
    updated_seq: int  # journal seq of the last event that changed this task
    number: int  # 1, 2, 3, ... in submission order (0: submitted before numbers)
    not_before: float | None  # this attempt is not claimed before (Unix seconds)
    retries_used: int  # automatic retries since submission (or the last manual retry)

    def __init__(
        self,
        id: str,
        spec: TaskSpec,
        state: State = State.QUEUED,
        reason: Reason | None = None,
        attempt: int = 1,
        releases: int = 0,
        exit_code: int | None = None,
        signal: int | None = None,
        created_at: float = 0.0,
        started_at: float | None = None,
        ended_at: float | None = None,
        heartbeat_at: float | None = None,
        pid: int | None = None,
        pgid: int | None = None,
        start_time: float | None = None,
        runner: Mapping[str, Any] | None = None,
        claimed_by: str | None = None,
        claim_token: str | None = None,
        marker: str | None = None,
        cancel_requested: bool = False,
        evidence: Mapping[str, Any] = _NEW_DICT,
        submit_seq: int = 0,
        queue_seq: int = 0,
        updated_seq: int = 0,
        number: int = 0,
        not_before: float | None = None,
        retries_used: int = 0,
    ) -> None:
        init(self, "id", id)
        init(self, "spec", spec)
        init(self, "state", state)
        init(self, "reason", reason)
        init(self, "attempt", attempt)
        init(self, "releases", releases)
        init(self, "exit_code", exit_code)
        init(self, "signal", signal)
        init(self, "created_at", created_at)
        init(self, "started_at", started_at)
        init(self, "ended_at", ended_at)
        init(self, "heartbeat_at", heartbeat_at)
        init(self, "pid", pid)
        init(self, "pgid", pgid)
        init(self, "start_time", start_time)
        init(self, "runner", runner)
        init(self, "claimed_by", claimed_by)
        init(self, "claim_token", claim_token)
        init(self, "marker", marker)
        init(self, "cancel_requested", cancel_requested)
        init(self, "evidence", {} if evidence is _NEW_DICT else evidence)
        init(self, "submit_seq", submit_seq)
        init(self, "queue_seq", queue_seq)
        init(self, "updated_seq", updated_seq)
        init(self, "number", number)
        init(self, "not_before", not_before)
        init(self, "retries_used", retries_used)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def in_flight(self) -> bool:
        return self.state in IN_FLIGHT_STATES


def rfc3339(ts: float | None) -> str | None:
    """Unix seconds -> ``2024-05-01T12:00:00.123Z`` (UTC, milliseconds)."""
    if ts is None:
        return None
    import datetime as _dt  # (lazy: run and submit never need it)

    moment = _dt.datetime.fromtimestamp(ts, tz=_dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def times_as_rfc3339(value: Any) -> Any:
    """``value`` (JSON: evidence, a lease) with every time in it, a number under a key
    ``at`` or ending in ``_at``, made an RFC 3339 string, as the contract has times in
    JSON (the journal keeps Unix seconds)."""
    if isinstance(value, Mapping):
        return {
            key: rfc3339(item)
            if (key == "at" or key.endswith("_at"))
            and isinstance(item, int | float)
            and not isinstance(item, bool)
            else times_as_rfc3339(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [times_as_rfc3339(item) for item in value]
    return value


def _runner_json(runner: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The task's runner (its supervisor): pid, start time, and ``alive`` as last
    proven (set by whoever probed it; null when unknown)."""
    if runner is None:
        return None
    return {"pid": runner.get("pid"), "start_time": runner.get("start_time"),
            "alive": runner.get("alive")}  # fmt: skip


def task_to_json(task: Task, *, show_env_values: bool = False) -> dict[str, Any]:
    """The contract's task object (``show --json``, each entry of ``ls --json``)."""
    spec = task.spec
    env: Any = dict(spec.env) if show_env_values else sorted(spec.env)
    return {
        "id": task.id,
        "number": task.number or None,
        "name": spec.name,
        "key": spec.key,
        "argv": list(spec.argv),
        "cwd": spec.cwd,
        "shell": spec.shell,
        "pty": spec.pty,
        "env": env,
        "idempotent": spec.idempotent,
        "state": str(task.state),
        "reason": None if task.reason is None else str(task.reason),
        "attempt": task.attempt,
        "releases": task.releases,
        "max_releases": spec.max_releases,
        "exit_code": task.exit_code,
        "signal": task.signal,
        "created_at": rfc3339(task.created_at),
        "started_at": rfc3339(task.started_at),
        "ended_at": rfc3339(task.ended_at),
        "heartbeat_at": rfc3339(task.heartbeat_at),
        "pid": task.pid,
        "pgid": task.pgid,
        "timeout_s": spec.timeout_s,
        "kill_grace_s": spec.kill_grace_s,
        "heartbeat_s": spec.heartbeat_s,
        "log_max_bytes": spec.log_max_bytes,
        "pointers": [{"path": path, "sha256": sha} for path, sha in spec.pointers],
        "patch": None
        if spec.patch is None
        else {"path": spec.patch.path, "sha256": spec.patch.sha256},
        "group": spec.group,
        "priority": spec.priority,
        "after": list(spec.after),
        "not_before": rfc3339(task.not_before),
        "retries": spec.retries,
        "retry_delay_s": spec.retry_delay_s,
        "retries_used": task.retries_used,
        "claimed_by": task.claimed_by,
        "host": None if task.runner is None else task.runner.get("host_id"),
        "runner": _runner_json(task.runner),
        "cancel_requested": task.cancel_requested,
        "evidence": times_as_rfc3339(task.evidence),
    }
