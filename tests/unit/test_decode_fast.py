"""ferry.core.decoding agrees with the checked decoder: it decodes well-formed records of
the five per-task types to equal events, and on any payload, however broken, it either
steps aside (None) or returns exactly what the checked decoder returns."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.core import decoding
from ferry.core import events as ev
from ferry.core.model import Reason, State
from ferry.core.spec import PatchRef, TaskSpec

T = "01hf7yat00c5h66s"
RUNNER = {"pid": 10, "start_time": 1.5, "boot_id": "b", "host": "h"}
SPEC = TaskSpec(
    argv=("make", "test"), cwd="/src", name="n", key="k", env={"A": "1"}, idempotent=True,
    timeout_s=30.0, pointers=(("a.txt", "0" * 64),), patch=PatchRef("/p", "f" * 64),
)  # fmt: skip
SAMPLES: list[ev.Event] = [
    ev.Submitted(T, TaskSpec(argv=("true",), cwd="/"), 1.25),
    ev.Submitted(T, SPEC, 7),
    ev.Claimed(T, 1, "tok", RUNNER, "work"),
    ev.Claimed(T, 3, "tok", {}, "run"),
    ev.Dispatching(T, 1, "tok", f"{T}:1:tok"),
    ev.Dispatching(T, 2, "tok", "m", {"patch_mode": "NONE"}),
    ev.Spawned(T, 1, "tok", 100, 100, 12345.5),
    ev.Spawned(T, 1, "tok", 1, 2, 3),
    ev.Settled(T, 1, "tok", State.SUCCEEDED, None, 0),
    ev.Settled(T, 1, None, State.FAILED, Reason.SIGNALLED, None, 9, {"x": 1}),
    ev.Settled(T, 2, None, State.CANCELLED, Reason.CANCELLED_BY_USER),
]


def wire(event: ev.Event) -> tuple[str, dict[str, Any]]:
    record_type, data = event.encode()
    return record_type, orjson.loads(orjson.dumps(data))


@pytest.mark.parametrize("event", SAMPLES, ids=repr)
def test_well_formed_records_take_the_fast_path(event: ev.Event) -> None:
    record_type, data = wire(event)
    fast = decoding.decode_fast(record_type, data)
    assert fast is not None
    assert fast == ev.decode_checked(record_type, data) == event
    assert decoding.decode(record_type, data) == event


ODD = [None, True, False, 0, -1, 1, 2, 1.5, float("nan"), float("inf"), "", "x", "SUCCEEDED",
       "FAILED", "TIMEOUT", "run", [], {}, {"a": 1}, ["true"]]  # fmt: skip
SAMPLE = st.sampled_from(SAMPLES)


@st.composite
def broken(draw: st.DrawFn) -> tuple[str, Any]:
    record_type, data = wire(draw(SAMPLE))
    for _ in range(draw(st.integers(1, 3))):
        keys = [*sorted(data), "attempt", "evidence", "token", "reason", "extra"]
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()):
            data.pop(key, None)
        else:
            data[key] = draw(st.sampled_from(ODD))
        if "spec" in data and isinstance(data["spec"], dict) and draw(st.booleans()):
            spec_key = draw(st.sampled_from(["argv", "cwd", "env", "max_releases", "shell"]))
            data["spec"][spec_key] = draw(st.sampled_from(ODD))
    if draw(st.integers(0, 9)) == 0:
        return record_type, draw(st.sampled_from(ODD))  # not even an object
    return record_type, data


@settings(max_examples=1500, deadline=None)
@given(broken())
def test_the_fast_path_steps_aside_or_agrees(case: tuple[str, Any]) -> None:
    record_type, data = case
    fast = decoding.decode_fast(record_type, data)
    if fast is None:
        return
    assert ev.decode_checked(record_type, data) == fast


def test_other_types_always_take_the_checked_path() -> None:
    for event in [ev.Retried(T, 2), ev.LeaseAcquired(1, RUNNER), ev.Stale(T, 1)]:
        assert decoding.decode_fast(*wire(event)) is None
