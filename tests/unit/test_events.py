"""Event payloads: every builder round-trips through orjson and decode; malformed known
types raise event.malformed; unknown types decode to None."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from ferry.core import decoding
from ferry.core import events as ev
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec

T = "01hf7yat00c5h66s"
SPEC = TaskSpec(argv=("true",), cwd="/", key="k")
RUNNER = {"pid": 10, "start_time": 1.5, "boot_id": "b", "host": "h"}

SAMPLES: list[ev.Event] = [
    ev.Submitted(T, SPEC, 1.25),
    ev.Claimed(T, 1, "tok", RUNNER, "work"),
    ev.Dispatching(T, 1, "tok", f"{T}:1:tok", {"patch_mode": "NONE"}),
    ev.Spawned(T, 1, "tok", 100, 100, 12345.5),
    ev.Settled(T, 1, "tok", State.SUCCEEDED, None, 0, None, {}),
    ev.Settled(T, 1, None, State.FAILED, Reason.SIGNALLED, None, 9, {"x": 1}),
    ev.Released(T, 1, None, Reason.RELEASED_TO_QUEUE, True, {"recovery": {}}),
    ev.Stale(T, 1, "tok", {"recovery": {"decision": "MARK_STALE"}}),
    ev.Stale(T, 1, None, {}),  # written before recovery named the claim it judged
    ev.Resumed(T, 1, "tok", {}),
    ev.CancelRequested(T, 1, "tok"),
    ev.CancelRequested(T, 1),
    ev.Retried(T, 2),
    ev.Retried(T, 3, 1_800_000_000.5, True),  # by --retries, with its delay
    ev.Resolved(T, 1, "succeeded"),
    ev.Resolved(T, 2, "failed"),
    ev.OrphanSignalled(T, 1, 100, 100, 12345.5, 15),
    ev.OrphanSignalled(T, 1, 100, 100, 12345.5, 15, "tok"),
    ev.OrphanSignalled(T, 1, None, None, None, 9),  # known only by its marker
    ev.LateResult(T, 1, {"token": "tok", "state": "SUCCEEDED", "exit_code": 0, "host": "h1"}),
    ev.Forgotten(T, 2),
    ev.LeaseAcquired(3, RUNNER),
    ev.LeaseReleased(3, RUNNER),
    ev.GroupSet("builds", 4),
    ev.GroupSet("builds", 0),
    ev.GroupPaused("builds"),
    ev.GroupPaused(None),
    ev.GroupResumed("arm64.big_1"),
    ev.GroupResumed(None),
]


def test_every_type_has_a_sample() -> None:
    assert {sample.TYPE for sample in SAMPLES} == set(ev.EventType)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.TYPE.value)
def test_round_trip(event: ev.Event) -> None:
    record_type, data = event.encode()
    assert record_type == event.TYPE.value
    wire = orjson.loads(orjson.dumps(data))
    assert decoding.decode(record_type, wire) == event
    if not isinstance(event, ev.LeaseAcquired | ev.LeaseReleased | ev.QueueEvent):
        assert wire["task"] == T


def test_unknown_type_decodes_to_none() -> None:
    assert decoding.decode("FROM_THE_FUTURE", {"task": T}) is None


def _payload(event: ev.Event) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(event.encode()[1]))  # type: ignore[no-any-return]


def _malformed(event: ev.Event, **change: Any) -> None:
    data = _payload(event)
    for name, value in change.items():
        if value is _DROP:
            data.pop(name)
        else:
            data[name] = value
    with pytest.raises(ev.MalformedEventError) as caught:
        decoding.decode(event.TYPE.value, data)
    assert caught.value.code == "event.malformed"
    assert caught.value.details["type"] == event.TYPE.value


_DROP = object()
CLAIMED, SETTLED, SPAWNED = SAMPLES[1], SAMPLES[4], SAMPLES[3]


def _first(kind: type) -> ev.Event:
    return next(sample for sample in SAMPLES if isinstance(sample, kind))


RELEASED, LEASE, ORPHAN = _first(ev.Released), _first(ev.LeaseAcquired), _first(ev.OrphanSignalled)
RESOLVED, STALE = _first(ev.Resolved), _first(ev.Stale)
RETRIED, GROUP_SET, PAUSED = _first(ev.Retried), _first(ev.GroupSet), _first(ev.GroupPaused)


@pytest.mark.parametrize(
    ("event", "change"),
    [
        (SAMPLES[0], {"task": _DROP}),
        (SAMPLES[0], {"task": ""}),
        (SAMPLES[0], {"spec": {"argv": [], "cwd": "/"}}),
        (SAMPLES[0], {"created_at": "yesterday"}),
        (CLAIMED, {"attempt": 0}),
        (CLAIMED, {"attempt": _DROP}),
        (CLAIMED, {"attempt": True}),
        (CLAIMED, {"by": "cron"}),
        (CLAIMED, {"token": None}),
        (CLAIMED, {"runner": "me"}),
        (SPAWNED, {"pid": 0}),
        (SPAWNED, {"pid": 1.5}),
        (SPAWNED, {"start_time": None}),
        (SETTLED, {"state": "RUNNING"}),
        (SETTLED, {"state": "BOGUS"}),
        (SETTLED, {"reason": "EXIT_NONZERO"}),  # SUCCEEDED with a reason
        (SETTLED, {"state": "FAILED"}),  # FAILED without a reason
        (SETTLED, {"reason": "NOPE", "state": "FAILED"}),
        (SETTLED, {"exit_code": "0"}),
        (SETTLED, {"evidence": []}),
        (RELEASED, {"counted": 1}),
        (RELEASED, {"reason": None}),
        (LEASE, {"epoch": -1}),
        (LEASE, {"holder": None}),
        (ORPHAN, {"signal": 0}),
        (ORPHAN, {"pid": -1}),
        (ORPHAN, {"token": 5}),
        (RESOLVED, {"verdict": "maybe"}),
        (RESOLVED, {"verdict": _DROP}),
        (STALE, {"token": ""}),
        (SAMPLES[0], {"spec": {"argv": ["x"], "cwd": "/", "group": "a b"}}),
        (SAMPLES[0], {"spec": {"argv": ["x"], "cwd": "/", "after": ["nope"]}}),
        (SAMPLES[0], {"spec": {"argv": ["x"], "cwd": "/", "retries": -1}}),
        (SAMPLES[0], {"spec": {"argv": ["x"], "cwd": "/", "priority": 1.5}}),
        (SAMPLES[0], {"spec": {"argv": ["x"], "cwd": "/", "not_before": "soon"}}),
        (RETRIED, {"automatic": 1}),
        (RETRIED, {"not_before": "later"}),
        (GROUP_SET, {"jobs": -1}),
        (GROUP_SET, {"jobs": _DROP}),
        (GROUP_SET, {"group": None}),
        (GROUP_SET, {"group": "-x"}),
        (PAUSED, {"group": ""}),
    ],
)
def test_malformed_known_types_raise(event: ev.Event, change: dict[str, Any]) -> None:
    _malformed(event, **change)


def test_non_object_payload_is_malformed() -> None:
    with pytest.raises(ev.MalformedEventError):
        decoding.decode("SUBMITTED", ["not", "an", "object"])


def test_optional_fields_may_be_missing() -> None:
    data = _payload(SAMPLES[5])
    for name in ("token", "exit_code", "signal", "evidence"):
        data.pop(name)
    decoded = decoding.decode("SETTLED", data)
    assert isinstance(decoded, ev.Settled)
    assert decoded.token is None and decoded.evidence == {}


def test_a_retried_record_written_before_retries_existed_reads_as_a_manual_retry() -> None:
    decoded = decoding.decode("RETRIED", {"task": T, "attempt": 2})
    assert decoded == ev.Retried(T, 2) and not decoded.automatic and decoded.not_before is None


def test_a_spec_without_queue_options_is_written_as_before_them() -> None:
    plain = TaskSpec(argv=("true",), cwd="/")
    assert not {"group", "priority", "after", "not_before", "retries", "retry_delay_s"} & set(
        plain.to_json()
    )
    queued = TaskSpec(argv=("true",), cwd="/", group="g", priority=-2, after=(T,), retries=1)
    assert TaskSpec.from_json(queued.to_json()) == queued


def test_cancel_of_a_queued_task_is_settled_cancelled_with_null_token() -> None:
    record_type, data = ev.Settled(T, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER).encode()
    assert record_type == "SETTLED"
    assert data["token"] is None and data["state"] == "CANCELLED"


def test_a_wait_is_resolved_by_the_writing_stores_clock_and_never_kept() -> None:
    """``wait_s`` (a relative --not-before, a retry's delay) travels with the record to
    the store; a shared database makes ``not_before`` its own time plus it, the local
    journal keeps the time its host computed; no record keeps the key, and a record
    without one is encoded as before."""
    spec = TaskSpec(argv=("true",), cwd="/", not_before=1000.0 + 600)
    submitted = ev.Submitted(T, spec, 1000.0, wait_s=600.0).encode()
    retried = ev.Retried(T, 2, not_before=1000.0 + 30, automatic=True, wait_s=30.0).encode()
    assert submitted[1]["wait_s"] == 600.0 and retried[1]["wait_s"] == 30.0
    assert "wait_s" not in ev.Submitted(T, spec, 1000.0).encode()[1]
    assert "wait_s" not in ev.Retried(T, 2, 5.0).encode()[1]
    batch = [submitted, retried, ev.Claimed(T, 1, "tok", RUNNER, "work").encode()]
    on_db = ev.resolve_waits(batch, 5000.0)
    assert on_db[0][1]["spec"]["not_before"] == 5600.0 and on_db[1][1]["not_before"] == 5030.0
    local = ev.resolve_waits(batch, None)
    assert local[0][1]["spec"]["not_before"] == 1600.0 and local[1][1]["not_before"] == 1030.0
    for kind, data in [*on_db, *local]:
        assert "wait_s" not in data
        assert decoding.decode(kind, data) is not None
    assert batch[0][1]["spec"]["not_before"] == 1600.0  # (the caller's records unchanged)
