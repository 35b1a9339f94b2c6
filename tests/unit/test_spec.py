"""TaskSpec: JSON round trip and validation with usage.* codes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.core.errors import UsageError
from ferry.core.model import replace
from ferry.core.spec import SECONDS_MAX, PatchRef, TaskSpec, validate_spec

SHA = "ab" * 32
FULL = TaskSpec(
    argv=("make", "test"),
    cwd="/src",
    name="build",
    key="build-123",
    env={"A": "1", "B": ""},
    idempotent=True,
    max_releases=5,
    timeout_s=60.5,
    kill_grace_s=0.0,
    heartbeat_s=0.5,
    shell=True,
    pointers=(("a.txt", SHA),),
    patch=PatchRef("/home/.ferry/patches/x.diff", SHA),
)


def test_defaults_are_the_contracts() -> None:
    spec = TaskSpec(argv=("true",), cwd="/")
    assert (spec.max_releases, spec.kill_grace_s, spec.heartbeat_s) == (3, 10.0, 5.0)
    assert (spec.idempotent, spec.shell, spec.timeout_s, spec.key, spec.patch) == (
        False, False, None, None, None,
    )  # fmt: skip
    validate_spec(spec)


def test_round_trip_through_orjson() -> None:
    data = orjson.loads(orjson.dumps(FULL.to_json()))
    assert TaskSpec.from_json(data) == FULL
    assert TaskSpec.from_json(data).to_json() == FULL.to_json()


def test_minimal_json_gets_defaults() -> None:
    spec = TaskSpec.from_json({"argv": ["echo", "hi"], "cwd": "/tmp"})
    assert spec == TaskSpec(argv=("echo", "hi"), cwd="/tmp")


def test_unknown_keys_ignored_from_the_journal_refused_when_strict() -> None:
    data = {"argv": ["x"], "cwd": "/", "from_the_future": 1}
    assert TaskSpec.from_json(data).argv == ("x",)
    with pytest.raises(UsageError) as caught:
        TaskSpec.from_json(data, strict=True)
    assert caught.value.code == "usage.bad_spec"
    assert caught.value.details == {"unknown": ["from_the_future"]}


def bad(code: str, **change: Any) -> None:
    spec = replace(FULL, **change)
    with pytest.raises(UsageError) as caught:
        validate_spec(spec)
    assert caught.value.code == code, caught.value.message
    assert caught.value.exit_code == 2
    with pytest.raises(UsageError):  # from_json validates too
        TaskSpec.from_json(spec.to_json())


@pytest.mark.parametrize(
    ("code", "change"),
    [
        ("usage.missing_command", {"argv": ()}),
        ("usage.bad_argv", {"argv": ("",)}),
        ("usage.bad_argv", {"argv": ("ls", "a\0b")}),
        ("usage.bad_cwd", {"cwd": ""}),
        ("usage.bad_name", {"name": ""}),
        ("usage.bad_name", {"name": "two\nlines"}),
        ("usage.bad_name", {"name": "x" * 257}),
        ("usage.bad_key", {"key": ""}),
        ("usage.bad_key", {"key": "k\x1b[31m"}),
        ("usage.bad_env", {"env": {"": "x"}}),
        ("usage.bad_env", {"env": {"A=B": "x"}}),
        ("usage.bad_env", {"env": {"A": "x\0"}}),
        ("usage.bad_number", {"max_releases": -1}),
        ("usage.bad_number", {"max_releases": True}),
        ("usage.bad_number", {"max_releases": 10**7}),
        ("usage.bad_number", {"timeout_s": 0}),
        ("usage.bad_number", {"timeout_s": -5}),
        ("usage.bad_number", {"timeout_s": float("nan")}),
        ("usage.bad_number", {"timeout_s": float("inf")}),
        ("usage.bad_number", {"timeout_s": SECONDS_MAX * 2}),
        ("usage.bad_number", {"timeout_s": "10"}),
        ("usage.bad_number", {"kill_grace_s": -0.1}),
        ("usage.bad_number", {"kill_grace_s": float("nan")}),
        ("usage.bad_number", {"heartbeat_s": 0}),
        ("usage.bad_number", {"heartbeat_s": -1}),
        ("usage.bad_number", {"heartbeat_s": 1e-6}),
        ("usage.bad_number", {"heartbeat_s": 1e300}),
        ("usage.bad_pointer", {"pointers": (("a", "nothex"),)}),
        ("usage.bad_pointer", {"pointers": (("", SHA),)}),
        ("usage.bad_pointer", {"pointers": (("a", SHA.upper()),)}),
        ("usage.bad_patch", {"patch": PatchRef("", SHA)}),
        ("usage.bad_patch", {"patch": PatchRef("p", "0" * 63)}),
        ("usage.bad_spec", {"idempotent": 1}),
        ("usage.bad_spec", {"shell": "yes"}),
    ],
)
def test_validation_refuses(code: str, change: dict[str, Any]) -> None:
    bad(code, **change)


def test_boundaries_accepted() -> None:
    for change in (
        {"max_releases": 0},
        {"timeout_s": SECONDS_MAX},
        {"timeout_s": 0.001},
        {"kill_grace_s": 0},
        {"heartbeat_s": 0.01},
        {"env": {}},
        {"pointers": ()},
        {"patch": None},
    ):
        validate_spec(replace(FULL, **change))


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"cwd": "/"},
        {"argv": ["x"]},
        {"argv": "make test", "cwd": "/"},
        {"argv": ["x"], "cwd": "/", "env": ["A=1"]},
        {"argv": ["x"], "cwd": "/", "pointers": [["a", SHA]]},
        {"argv": ["x"], "cwd": "/", "patch": "p.diff"},
        {"argv": [1], "cwd": "/"},
        {"argv": ["x"], "cwd": 5},
    ],
)
def test_from_json_refuses_bad_shapes_with_a_usage_error(data: Any) -> None:
    with pytest.raises(UsageError):
        TaskSpec.from_json(data)


@given(
    st.dictionaries(
        st.sampled_from(sorted(TaskSpec._FIELDS)),
        st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.lists(st.text()),
    )
)
def test_from_json_never_raises_anything_but_a_usage_error(data: dict[str, Any]) -> None:
    try:
        spec = TaskSpec.from_json(data)
    except UsageError:
        return
    validate_spec(spec)
