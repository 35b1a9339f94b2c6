"""Journal event types: one frozen value class per type, ``encode()`` -> (type, data) for
``journal.append``, :func:`decode` back (pure).

Every payload about a task names it in ``task`` and carries the ``attempt`` it is
about. Events written by the claim that owns a task carry its ``token``; events written
by recovery or by a user action on a task nobody owns carry ``token: null``.

Unknown types are not errors: :func:`decode` returns None and the fold ignores them, so
an older ferry can read a journal that a newer one extended. A *known* type with a
malformed payload raises :class:`MalformedEventError` (``event.malformed``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from ferry.core._value import Value
from ferry.core.errors import InternalError, UsageError
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec, check_group

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, overload

CLAIMED_BY = frozenset({"run", "claim", "work"})
_SETTLED_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})


class EventType(enum.StrEnum):
    SUBMITTED = "SUBMITTED"
    CLAIMED = "CLAIMED"
    DISPATCHING = "DISPATCHING"
    SPAWNED = "SPAWNED"
    SETTLED = "SETTLED"
    RELEASED = "RELEASED"
    STALE = "STALE"
    RESUMED = "RESUMED"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    RETRIED = "RETRIED"
    RESOLVED = "RESOLVED"
    ORPHAN_SIGNALLED = "ORPHAN_SIGNALLED"
    LATE_RESULT = "LATE_RESULT"
    FORGOTTEN = "FORGOTTEN"
    LEASE_ACQUIRED = "LEASE_ACQUIRED"
    LEASE_RELEASED = "LEASE_RELEASED"
    GROUP_SET = "GROUP_SET"
    GROUP_PAUSED = "GROUP_PAUSED"
    GROUP_RESUMED = "GROUP_RESUMED"


class MalformedEventError(InternalError):
    code = "event.malformed"


if TYPE_CHECKING:
    Payload = dict[str, Any]


_PLAIN = frozenset({str, int, float, bool, type(None)})  # (most fields: as they are)


def _to_json(value: Any) -> Any:
    if value.__class__ in _PLAIN:
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, TaskSpec):
        return value.to_json()
    if isinstance(value, Mapping):
        return dict(value)
    return value


class _Event(Value):
    """Base of the event types: frozen value objects (``ferry.core._value.Value``: no
    dataclass code generation at import, which every ``ferry`` command would pay for
    these types) with ``encode()``. Equality, hashing and ``repr`` follow
    ``_FIELDS``, in payload order."""

    __slots__ = ()
    TYPE: ClassVar[EventType]

    def encode(self) -> tuple[str, Payload]:
        """(type, payload): every field by name, in ``_FIELDS`` order."""
        return self.TYPE.value, {name: _to_json(getattr(self, name)) for name in self._FIELDS}


_set = object.__setattr__
_NO_EVIDENCE: Mapping[str, Any] = MappingProxyType({})
WAIT = "wait_s"  # (a record's wait: resolve_waits)


def _without_wait(record: tuple[str, Payload]) -> tuple[str, Payload]:
    """A record without its ``wait_s`` when it has none: as journaled before it existed."""
    if record[1].get(WAIT) is None:
        del record[1][WAIT]
    return record


def resolve_waits(
    batch: Sequence[tuple[str, Payload]], now: float | None
) -> list[tuple[str, Payload]]:
    """The batch as written: a SUBMITTED's or RETRIED's ``wait_s`` (a relative
    ``--not-before`` or retry delay) made its ``not_before`` by the clock of the store
    that writes it, ``now``, at the write (None: the time its writer computed on its own
    clock stays: the local journal, whose clock is its host's). No record keeps the key.
    A shared database passes its own clock: the hosts' clocks do not decide."""
    resolved = []
    for kind, data in batch:
        wait = data.get(WAIT)
        if WAIT in data:
            data = {name: value for name, value in data.items() if name != WAIT}
            if wait is not None and now is not None:
                if kind == EventType.SUBMITTED.value:
                    data["spec"] = {**data["spec"], "not_before": now + float(wait)}
                else:
                    data["not_before"] = now + float(wait)
        resolved.append((kind, data))
    return resolved


class Submitted(_Event):
    """A new task. ``wait_s``: its ``--not-before +SECONDS`` (its spec's ``not_before``
    is the submitting host's time plus that), for the store that writes it to decide
    by its own clock (:func:`resolve_waits`); never journaled."""

    __slots__ = ("created_at", "spec", "task", "wait_s")
    TYPE: ClassVar[EventType] = EventType.SUBMITTED
    _FIELDS = ("task", "spec", "created_at", "wait_s")
    task: str
    spec: TaskSpec
    created_at: float
    wait_s: float | None

    def __init__(
        self, task: str, spec: TaskSpec, created_at: float, wait_s: float | None = None
    ) -> None:
        _set(self, "task", task)
        _set(self, "spec", spec)
        _set(self, "created_at", created_at)
        _set(self, "wait_s", wait_s)

    def encode(self) -> tuple[str, Payload]:
        return _without_wait(super().encode())


class Claimed(_Event):
    """QUEUED -> CLAIMED. ``runner``: identity of the claiming ferry process."""

    __slots__ = ("attempt", "by", "runner", "task", "token")
    TYPE: ClassVar[EventType] = EventType.CLAIMED
    _FIELDS = ("task", "attempt", "token", "runner", "by")
    task: str
    attempt: int
    token: str
    runner: Mapping[str, Any]
    by: str

    def __init__(
        self, task: str, attempt: int, token: str, runner: Mapping[str, Any], by: str
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)
        _set(self, "runner", runner)
        _set(self, "by", by)


class Dispatching(_Event):
    """CLAIMED -> DISPATCHING: durable before the child is spawned. ``marker`` is the
    environment marker the child will carry, so recovery can find it without a pid."""

    __slots__ = ("attempt", "evidence", "marker", "task", "token")
    TYPE: ClassVar[EventType] = EventType.DISPATCHING
    _FIELDS = ("task", "attempt", "token", "marker", "evidence")
    task: str
    attempt: int
    token: str
    marker: str
    evidence: Mapping[str, Any]  # e.g. patch mode

    def __init__(
        self,
        task: str,
        attempt: int,
        token: str,
        marker: str,
        evidence: Mapping[str, Any] = _NO_EVIDENCE,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)
        _set(self, "marker", marker)
        _set(self, "evidence", evidence)


class Spawned(_Event):
    """DISPATCHING -> RUNNING, with the child's identity (pid + start time).
    ``started_at``: the wall-clock time of the spawn (the task's ``started_at``; the
    record is written a moment later; null in journals written before it was kept)."""

    __slots__ = ("attempt", "pgid", "pid", "start_time", "started_at", "task", "token")
    TYPE: ClassVar[EventType] = EventType.SPAWNED
    _FIELDS = ("task", "attempt", "token", "pid", "pgid", "start_time", "started_at")
    task: str
    attempt: int
    token: str
    pid: int
    pgid: int
    start_time: float
    started_at: float | None

    def __init__(
        self,
        task: str,
        attempt: int,
        token: str,
        pid: int,
        pgid: int,
        start_time: float,
        started_at: float | None = None,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)
        _set(self, "pid", pid)
        _set(self, "pgid", pgid)
        _set(self, "start_time", start_time)
        _set(self, "started_at", started_at)


class Settled(_Event):
    """-> SUCCEEDED | FAILED | CANCELLED. ``token`` is null only for a task nobody
    claimed (a cancel of a queued task). ``ended_at``: when the task's process ended
    (the task's ``ended_at``; null when no process ran, or in older journals: then the
    record's time)."""

    __slots__ = (
        "attempt", "ended_at", "evidence", "exit_code", "reason", "signal", "state", "task",
        "token",
    )  # fmt: skip
    TYPE: ClassVar[EventType] = EventType.SETTLED
    _FIELDS = (
        "task", "attempt", "token", "state", "reason", "exit_code", "signal", "evidence",
        "ended_at",
    )  # fmt: skip
    task: str
    attempt: int
    token: str | None
    state: State
    reason: Reason | None
    exit_code: int | None
    signal: int | None
    evidence: Mapping[str, Any]
    ended_at: float | None

    def __init__(
        self,
        task: str,
        attempt: int,
        token: str | None,
        state: State,
        reason: Reason | None,
        exit_code: int | None = None,
        signal: int | None = None,
        evidence: Mapping[str, Any] = _NO_EVIDENCE,
        ended_at: float | None = None,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)
        _set(self, "state", state)
        _set(self, "reason", reason)
        _set(self, "exit_code", exit_code)
        _set(self, "signal", signal)
        _set(self, "evidence", evidence)
        _set(self, "ended_at", ended_at)


class Released(_Event):
    """In flight -> QUEUED. ``counted``: counts toward ``max_releases``."""

    __slots__ = ("attempt", "counted", "evidence", "reason", "task", "token")
    TYPE: ClassVar[EventType] = EventType.RELEASED
    _FIELDS = ("task", "attempt", "token", "reason", "counted", "evidence")
    task: str
    attempt: int
    token: str | None
    reason: Reason
    counted: bool
    evidence: Mapping[str, Any]

    def __init__(
        self,
        task: str,
        attempt: int,
        token: str | None,
        reason: Reason,
        counted: bool,
        evidence: Mapping[str, Any] = _NO_EVIDENCE,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)
        _set(self, "reason", reason)
        _set(self, "counted", counted)
        _set(self, "evidence", evidence)


class Stale(_Event):
    """RUNNING -> STALE (runner alive, heartbeat older than the stale limit). ``token``:
    the claim recovery judged (null in journals written before it was required)."""

    __slots__ = ("attempt", "evidence", "task", "token")
    TYPE: ClassVar[EventType] = EventType.STALE
    _FIELDS = ("task", "attempt", "token", "evidence")
    task: str
    attempt: int
    token: str | None
    evidence: Mapping[str, Any]

    def __init__(
        self,
        task: str,
        attempt: int,
        token: str | None = None,
        evidence: Mapping[str, Any] = _NO_EVIDENCE,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)
        _set(self, "evidence", evidence)


class Resumed(_Event):
    """STALE -> RUNNING: the runner beats again (written by it, with its token, or by
    recovery, token null)."""

    __slots__ = ("attempt", "evidence", "task", "token")
    TYPE: ClassVar[EventType] = EventType.RESUMED
    _FIELDS = ("task", "attempt", "token", "evidence")
    task: str
    attempt: int
    token: str | None
    evidence: Mapping[str, Any]

    def __init__(
        self,
        task: str,
        attempt: int,
        token: str | None = None,
        evidence: Mapping[str, Any] = _NO_EVIDENCE,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)
        _set(self, "evidence", evidence)


class CancelRequested(_Event):
    """A user asked to cancel an in-flight task; its runner signals the group and
    settles CANCELLED. No state change by itself. ``token``: the claim to cancel."""

    __slots__ = ("attempt", "task", "token")
    TYPE: ClassVar[EventType] = EventType.CANCEL_REQUESTED
    _FIELDS = ("task", "attempt", "token")
    task: str
    attempt: int
    token: str | None

    def __init__(self, task: str, attempt: int, token: str | None = None) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "token", token)


class Retried(_Event):
    """FAILED | CANCELLED -> QUEUED as a new attempt (``attempt`` is the new one).
    ``automatic``: by the task's own ``--retries``, written with the SETTLED of the
    attempt that failed (``ferry retry``: false); ``not_before``: the new attempt is not
    claimed before then (Unix seconds; the retry's delay), or null. ``wait_s``: that
    delay, for the store that writes it to decide by its own clock (``not_before`` is
    the writing host's time plus it: :func:`resolve_waits`); never journaled."""

    __slots__ = ("attempt", "automatic", "not_before", "task", "wait_s")
    TYPE: ClassVar[EventType] = EventType.RETRIED
    _FIELDS = ("task", "attempt", "not_before", "automatic", "wait_s")
    task: str
    attempt: int
    not_before: float | None
    automatic: bool
    wait_s: float | None

    def __init__(
        self,
        task: str,
        attempt: int,
        not_before: float | None = None,
        automatic: bool = False,
        wait_s: float | None = None,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "not_before", not_before)
        _set(self, "automatic", automatic)
        _set(self, "wait_s", wait_s)

    def encode(self) -> tuple[str, Payload]:
        return _without_wait(super().encode())


RESOLVED_AS = ("succeeded", "failed")


class Resolved(_Event):
    """An operator's verdict on a FAILED or CANCELLED task (``ferry resolve``): what it
    really did, as far as the operator knows. No state change; kept in the evidence,
    and the task's key follows it (``succeeded``: skipped like a succeeded key)."""

    __slots__ = ("attempt", "task", "verdict")
    TYPE: ClassVar[EventType] = EventType.RESOLVED
    _FIELDS = ("task", "attempt", "verdict")
    task: str
    attempt: int
    verdict: str

    def __init__(self, task: str, attempt: int, verdict: str) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "verdict", verdict)


class OrphanSignalled(_Event):
    """Intent of ``ferry kill``: journaled before a verified signal to an orphan's group
    (no side effect before its intent record). No state change. ``pid``, ``pgid`` and
    ``start_time`` are null when the orphan is known only by its environment marker
    (found for a DISPATCHING task); 0 is accepted as "unknown" too. ``token``: the claim
    of a task still in flight (its runner dead, recovery not yet run), else null."""

    __slots__ = ("attempt", "pgid", "pid", "signal", "start_time", "task", "token")
    TYPE: ClassVar[EventType] = EventType.ORPHAN_SIGNALLED
    _FIELDS = ("task", "attempt", "pid", "pgid", "start_time", "signal", "token")
    task: str
    attempt: int
    pid: int | None
    pgid: int | None
    start_time: float | None
    signal: int
    token: str | None

    def __init__(
        self,
        task: str,
        attempt: int,
        pid: int | None,
        pgid: int | None,
        start_time: float | None,
        signal: int,
        token: str | None = None,
    ) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "pid", pid)
        _set(self, "pgid", pgid)
        _set(self, "start_time", start_time)
        _set(self, "signal", signal)
        _set(self, "token", token)


class LateResult(_Event):
    """The end a supervisor saw, delivered after its claim had moved (recovery or
    another host decided the task, or a retry ran it again): kept as evidence
    (``evidence.late_results``), never a state change. ``attempt`` is the attempt the
    result is about (the task's current one or an earlier one); ``result`` is the
    SETTLED it would have written: ``token``, ``state``, ``reason``, ``exit_code``,
    ``signal``, ``ended_at``, and ``host`` where known."""

    __slots__ = ("attempt", "result", "task")
    TYPE: ClassVar[EventType] = EventType.LATE_RESULT
    _FIELDS = ("task", "attempt", "result")
    task: str
    attempt: int
    result: Mapping[str, Any]

    def __init__(self, task: str, attempt: int, result: Mapping[str, Any]) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)
        _set(self, "result", result)


class Forgotten(_Event):
    """``ferry gc``: a settled task leaves the table, its history and its logs
    (``attempt``: the one it was settled at, as gc read it). A key the task SUCCEEDED
    with stays succeeded (the key index keeps it); see ``ferry.core.fold``."""

    __slots__ = ("attempt", "task")
    TYPE: ClassVar[EventType] = EventType.FORGOTTEN
    _FIELDS = ("task", "attempt")
    task: str
    attempt: int

    def __init__(self, task: str, attempt: int) -> None:
        _set(self, "task", task)
        _set(self, "attempt", attempt)


class LeaseAcquired(_Event):
    __slots__ = ("epoch", "holder")
    TYPE: ClassVar[EventType] = EventType.LEASE_ACQUIRED
    _FIELDS = ("epoch", "holder")
    epoch: int
    holder: Mapping[str, Any]

    def __init__(self, epoch: int, holder: Mapping[str, Any]) -> None:
        _set(self, "epoch", epoch)
        _set(self, "holder", holder)


class LeaseReleased(_Event):
    __slots__ = ("epoch", "holder")
    TYPE: ClassVar[EventType] = EventType.LEASE_RELEASED
    _FIELDS = ("epoch", "holder")
    epoch: int
    holder: Mapping[str, Any]

    def __init__(self, epoch: int, holder: Mapping[str, Any]) -> None:
        _set(self, "epoch", epoch)
        _set(self, "holder", holder)


class GroupSet(_Event):
    """A group's settings (``ferry group set``): ``jobs``, how many of its tasks may be
    in flight at once (0: no limit of its own). Not about a task: no state change;
    the claim choice and the claim rule follow it (``ferry.core.queue``)."""

    __slots__ = ("group", "jobs")
    TYPE: ClassVar[EventType] = EventType.GROUP_SET
    _FIELDS = ("group", "jobs")
    group: str
    jobs: int

    def __init__(self, group: str, jobs: int) -> None:
        _set(self, "group", group)
        _set(self, "jobs", jobs)


class GroupPaused(_Event):
    """``ferry pause``: the group's queued tasks are not claimed (``group`` null: every
    group, those that do not exist yet too)."""

    __slots__ = ("group",)
    TYPE: ClassVar[EventType] = EventType.GROUP_PAUSED
    _FIELDS = ("group",)
    group: str | None

    def __init__(self, group: str | None) -> None:
        _set(self, "group", group)


class GroupResumed(_Event):
    """``ferry resume``: the group is claimed from again (``group`` null: every group,
    and each group's own pause is forgotten)."""

    __slots__ = ("group",)
    TYPE: ClassVar[EventType] = EventType.GROUP_RESUMED
    _FIELDS = ("group",)
    group: str | None

    def __init__(self, group: str | None) -> None:
        _set(self, "group", group)


GROUP_JOBS_MAX = 100_000
QueueEvent = GroupSet | GroupPaused | GroupResumed

Event = (
    Submitted
    | Claimed
    | Dispatching
    | Spawned
    | Settled
    | Released
    | Stale
    | Resumed
    | CancelRequested
    | Retried
    | Resolved
    | OrphanSignalled
    | LateResult
    | Forgotten
    | LeaseAcquired
    | LeaseReleased
    | GroupSet
    | GroupPaused
    | GroupResumed
)
TaskEvent = (
    Submitted
    | Claimed
    | Dispatching
    | Spawned
    | Settled
    | Released
    | Stale
    | Resumed
    | CancelRequested
    | Retried
    | Resolved
    | OrphanSignalled
    | LateResult
    | Forgotten
)


class _Fields:
    """Typed access to one payload; any mismatch is a MalformedEventError."""

    def __init__(self, record_type: str, data: object) -> None:
        if not isinstance(data, Mapping):
            raise self._error(record_type, "payload is not an object")
        self.record_type = record_type
        self.data: Mapping[str, Any] = data

    @staticmethod
    def _error(record_type: str, problem: str) -> MalformedEventError:
        return MalformedEventError(
            f"malformed {record_type} event: {problem}",
            details={"type": record_type, "problem": problem},
        )

    def _get(self, name: str, optional: bool) -> Any:
        if name not in self.data:
            if optional:
                return None
            raise self._error(self.record_type, f"missing {name!r}")
        return self.data[name]

    def text(self, name: str, *, optional: bool = False) -> Any:
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise self._error(self.record_type, f"{name!r} is not a non-empty string")
        return value

    def integer(self, name: str, *, minimum: int | None = None, optional: bool = False) -> Any:
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(self.record_type, f"{name!r} is not an integer")
        if minimum is not None and value < minimum:
            raise self._error(self.record_type, f"{name!r} is below {minimum}")
        return value

    if TYPE_CHECKING:

        @overload
        def number(self, name: str) -> float: ...
        @overload
        def number(self, name: str, *, optional: bool) -> float | None: ...

    def number(self, name: str, *, optional: bool = False) -> float | None:
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._error(self.record_type, f"{name!r} is not a number")
        if not math.isfinite(value):
            raise self._error(self.record_type, f"{name!r} is not finite")
        return float(value)

    def flag(self, name: str) -> bool:
        value = self._get(name, False)
        if not isinstance(value, bool):
            raise self._error(self.record_type, f"{name!r} is not a boolean")
        return value

    def mapping(self, name: str, *, optional: bool = False) -> dict[str, Any]:
        value = self._get(name, optional)
        if value is None and optional:
            return {}
        if not isinstance(value, Mapping):
            raise self._error(self.record_type, f"{name!r} is not an object")
        return dict(value)

    def state(self, name: str) -> State:
        value = self._get(name, False)
        try:
            return State(value)
        except ValueError:
            raise self._error(self.record_type, f"{name!r}: unknown state {value!r}") from None

    def reason(self, name: str, *, optional: bool) -> Reason | None:
        value = self._get(name, optional)
        if value is None and optional:
            return None
        try:
            return Reason(value)
        except ValueError:
            raise self._error(self.record_type, f"{name!r}: unknown reason {value!r}") from None

    def spec(self, name: str) -> TaskSpec:
        try:
            return TaskSpec.from_json(self.mapping(name))
        except UsageError as error:
            raise self._error(self.record_type, f"bad spec: {error.message}") from None


def decode_checked(record_type: str, data: object) -> Event | None:
    """The typed event, or None for a type this version does not know: every check
    spelled out, with a precise MalformedEventError (:func:`ferry.core.decoding.decode`
    tries a faster path first)."""
    try:
        kind = EventType(record_type)
    except ValueError:
        return None
    f = _Fields(record_type, data)
    if kind is EventType.LEASE_ACQUIRED or kind is EventType.LEASE_RELEASED:
        lease_class = LeaseAcquired if kind is EventType.LEASE_ACQUIRED else LeaseReleased
        return lease_class(epoch=f.integer("epoch", minimum=0), holder=f.mapping("holder"))
    if kind is EventType.GROUP_SET:
        jobs = f.integer("jobs", minimum=0)
        if jobs > GROUP_JOBS_MAX:
            raise _Fields._error(record_type, f"'jobs' is above {GROUP_JOBS_MAX}")
        return GroupSet(_group(f, optional=False), jobs)
    if kind is EventType.GROUP_PAUSED or kind is EventType.GROUP_RESUMED:
        group_class = GroupPaused if kind is EventType.GROUP_PAUSED else GroupResumed
        return group_class(_group(f, optional=True))
    task, attempt = f.text("task"), f.integer("attempt", minimum=1, optional=True)
    if kind is EventType.SUBMITTED:
        return Submitted(task=task, spec=f.spec("spec"), created_at=f.number("created_at"))
    if attempt is None:
        raise _Fields._error(record_type, "missing 'attempt'")
    if kind is EventType.CLAIMED:
        by = f.text("by")
        if by not in CLAIMED_BY:
            raise _Fields._error(record_type, f"'by' is {by!r}, not one of {sorted(CLAIMED_BY)}")
        runner = f.mapping("runner")
        return Claimed(task, attempt, f.text("token"), runner, by)
    if kind is EventType.DISPATCHING:
        evidence = f.mapping("evidence", optional=True)
        return Dispatching(task, attempt, f.text("token"), f.text("marker"), evidence)
    if kind is EventType.SPAWNED:
        pid, pgid = f.integer("pid", minimum=1), f.integer("pgid", minimum=1)
        started_at = f.number("started_at", optional=True)
        return Spawned(
            task, attempt, f.text("token"), pid, pgid, f.number("start_time"), started_at
        )
    if kind is EventType.SETTLED:
        state, reason = f.state("state"), f.reason("reason", optional=True)
        if state not in _SETTLED_STATES:
            raise _Fields._error(record_type, f"'state' {state} is not a final state")
        if (state is State.SUCCEEDED) != (reason is None):
            raise _Fields._error(record_type, "SUCCEEDED has no reason; FAILED/CANCELLED have one")
        return Settled(
            task,
            attempt,
            f.text("token", optional=True),
            state,
            reason,
            f.integer("exit_code", optional=True),
            f.integer("signal", minimum=1, optional=True),
            f.mapping("evidence", optional=True),
            f.number("ended_at", optional=True),
        )
    if kind is EventType.RELEASED:
        reason = f.reason("reason", optional=False)
        assert reason is not None
        evidence = f.mapping("evidence", optional=True)
        return Released(
            task, attempt, f.text("token", optional=True), reason, f.flag("counted"), evidence
        )
    if kind is EventType.STALE:
        token = f.text("token", optional=True)
        return Stale(task, attempt, token, f.mapping("evidence", optional=True))
    if kind is EventType.RESUMED:
        token = f.text("token", optional=True)
        return Resumed(task, attempt, token, f.mapping("evidence", optional=True))
    if kind is EventType.CANCEL_REQUESTED:
        return CancelRequested(task, attempt, f.text("token", optional=True))
    if kind is EventType.RETRIED:
        automatic = f.data.get("automatic", False)
        if not isinstance(automatic, bool):
            raise _Fields._error(record_type, "'automatic' is not a boolean")
        return Retried(task, attempt, f.number("not_before", optional=True), automatic)
    if kind is EventType.RESOLVED:
        verdict = f.text("verdict")
        if verdict not in RESOLVED_AS:
            raise _Fields._error(record_type, f"'verdict' is {verdict!r}, not one of {RESOLVED_AS}")
        return Resolved(task, attempt, verdict)
    if kind is EventType.LATE_RESULT:
        return LateResult(task, attempt, f.mapping("result"))
    if kind is EventType.FORGOTTEN:
        return Forgotten(task, attempt)
    assert kind is EventType.ORPHAN_SIGNALLED
    pid = f.integer("pid", minimum=0, optional=True)
    pgid = f.integer("pgid", minimum=0, optional=True)
    start_time = None if f.data.get("start_time") is None else f.number("start_time")
    signal = f.integer("signal", minimum=1)
    return OrphanSignalled(
        task, attempt, pid, pgid, start_time, signal, f.text("token", optional=True)
    )


def _group(f: _Fields, *, optional: bool) -> Any:
    name = f.text("group", optional=optional)
    if name is None:
        return None
    try:
        return check_group(name)
    except UsageError as error:
        raise f._error(f.record_type, error.message) from None
