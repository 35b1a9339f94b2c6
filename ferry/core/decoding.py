"""Records to typed events (pure): :func:`decode`, with fast decoders for the five
event types every task writes.

Opening the store folds every record after the snapshot; ``ferry run`` on a journal
that no leader has compacted yet pays that per record. :func:`decode` tries these
first: each checks exactly what the checked decoder checks, inline, and returns
None at the first doubt (a missing key, another type, a value out of range), so that
the checked decoder then decides and raises its precise error. They never return an
event the checked decoder would refuse or build differently
(``tests/unit/test_decode_fast.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ferry.core import events as ev
from ferry.core.errors import UsageError
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_STATES = {state.value: state for state in State}
_REASONS = {reason.value: reason for reason in Reason}
_FINAL = {State.SUCCEEDED, State.FAILED, State.CANCELLED}


def _text(value: Any) -> bool:
    return type(value) is str and value != ""


def _int_at_least(value: Any, minimum: int) -> bool:
    return type(value) is int and value >= minimum


def _number(value: Any) -> float | None:
    if (type(value) is float or type(value) is int) and math.isfinite(value):
        return float(value)
    return None


def _evidence(data: Mapping[str, Any]) -> dict[str, Any] | None:
    value = data.get("evidence")
    if value is None:
        return {}
    return dict(value) if type(value) is dict else None


def _task_and_attempt(data: Mapping[str, Any]) -> tuple[str, int] | None:
    task, attempt = data["task"], data["attempt"]
    if _text(task) and _int_at_least(attempt, 1):
        return task, attempt
    return None


def _submitted(data: Mapping[str, Any]) -> ev.Event | None:
    task, spec = data["task"], data["spec"]
    attempt = data.get("attempt")
    created_at = _number(data["created_at"])
    if not _text(task) or created_at is None or type(spec) is not dict:
        return None
    if attempt is not None and not _int_at_least(attempt, 1):
        return None
    try:
        return ev.Submitted(task, TaskSpec.from_json(spec), created_at)
    except UsageError:
        return None


def _claimed(data: Mapping[str, Any]) -> ev.Event | None:
    head = _task_and_attempt(data)
    token, runner, by = data["token"], data["runner"], data["by"]
    if head is None or not _text(token) or type(runner) is not dict:
        return None
    if type(by) is not str or by not in ev.CLAIMED_BY:
        return None
    return ev.Claimed(head[0], head[1], token, dict(runner), by)


def _dispatching(data: Mapping[str, Any]) -> ev.Event | None:
    head = _task_and_attempt(data)
    token, marker, evidence = data["token"], data["marker"], _evidence(data)
    if head is None or not _text(token) or not _text(marker) or evidence is None:
        return None
    return ev.Dispatching(head[0], head[1], token, marker, evidence)


def _spawned(data: Mapping[str, Any]) -> ev.Event | None:
    head = _task_and_attempt(data)
    token, pid, pgid = data["token"], data["pid"], data["pgid"]
    start_time = _number(data["start_time"])
    if head is None or not _text(token) or start_time is None:
        return None
    if not (_int_at_least(pid, 1) and _int_at_least(pgid, 1)):
        return None
    started_at = data.get("started_at")
    if started_at is not None and (started_at := _number(started_at)) is None:
        return None
    return ev.Spawned(head[0], head[1], token, pid, pgid, start_time, started_at)


def _settled(data: Mapping[str, Any]) -> ev.Event | None:
    head = _task_and_attempt(data)
    token, exit_code, signal = data.get("token"), data.get("exit_code"), data.get("signal")
    state = _STATES.get(data["state"]) if type(data["state"]) is str else None
    reason_value = data.get("reason")
    reason = None
    if reason_value is not None:
        reason = _REASONS.get(reason_value) if type(reason_value) is str else None
        if reason is None:
            return None
    evidence = _evidence(data)
    if head is None or state not in _FINAL or evidence is None:
        return None
    if (state is State.SUCCEEDED) != (reason is None):
        return None
    if token is not None and not _text(token):
        return None
    if exit_code is not None and type(exit_code) is not int:
        return None
    if signal is not None and not _int_at_least(signal, 1):
        return None
    ended_at = data.get("ended_at")
    if ended_at is not None and (ended_at := _number(ended_at)) is None:
        return None
    assert state is not None
    return ev.Settled(head[0], head[1], token, state, reason, exit_code, signal, evidence, ended_at)


FAST: Mapping[str, Callable[[Mapping[str, Any]], ev.Event | None]] = {
    "SUBMITTED": _submitted,
    "CLAIMED": _claimed,
    "DISPATCHING": _dispatching,
    "SPAWNED": _spawned,
    "SETTLED": _settled,
}


def decode_fast(record_type: str, data: object) -> ev.Event | None:
    """The event, or None: not one of these types, or in doubt (ask the checked path)."""
    fast = FAST.get(record_type)
    if fast is None or type(data) is not dict:
        return None
    try:
        return fast(data)
    except (KeyError, TypeError, ValueError):
        return None


def decode(record_type: str, data: object) -> ev.Event | None:
    """The typed event, or None for a type this version does not know: the fast path
    for the hot five, else the checked decoder (``events.decode_checked``), which also
    gives the precise error for a malformed record."""
    fast = decode_fast(record_type, data)
    return fast if fast is not None else ev.decode_checked(record_type, data)
