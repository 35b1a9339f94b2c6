"""The hand-written frozen values (``ferry.core._value``) behave as the frozen
dataclasses they replaced: keyword and positional construction with the same
defaults, equality, hashing and ``repr`` over the fields in order, no assignment, and
``replace``."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from ferry.core._value import FrozenInstanceError, Value, as_dict, replace
from ferry.core.model import Reason, State, Task
from ferry.core.spec import PatchRef, TaskSpec
from ferry.proc._supervise_types import Outcome, SuperviseSpec

SPEC = TaskSpec(argv=("true",), cwd="/")
EXAMPLES: list[Value] = [
    SPEC,
    TaskSpec(
        ("sh", "-c", "x"), "/tmp", "n", "k", {"A": "1"}, True, 5, 1.5, patch=PatchRef("p", "0" * 64)
    ),
    PatchRef("p", "0" * 64),
    Task(id="01m8t1qmfxw2b61d", spec=SPEC),
    Task("01m8t1qmfxw2b61d", SPEC, State.FAILED, Reason.TIMEOUT, 2, evidence={"a": [1]}),
    SuperviseSpec(["true"], "/", {}, None, 1.0, 5.0, Path("o"), Path("e"), Path("h")),
    Outcome(0, None, False, None, False, 1.0, 2.0, 10, 10, False, log_dropped=(1, 2)),
]
CLASSES = sorted({type(value) for value in EXAMPLES}, key=lambda cls: cls.__name__)


def _as_dataclass(value: Value) -> Any:
    """The same fields, in a frozen dataclass of the same name."""
    cls = dataclasses.make_dataclass(
        type(value).__name__, [(name, object) for name in value._FIELDS], frozen=True
    )
    return cls(**as_dict(value))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_init_takes_the_fields_in_order_and_each_is_declared(cls: type[Value]) -> None:
    assert list(inspect.signature(cls).parameters) == list(cls._FIELDS)
    declared = {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}
    assert set(cls._FIELDS) <= declared


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda value: type(value).__name__)
def test_repr_equality_and_hash_are_a_frozen_dataclass_s(value: Value) -> None:
    twin = _as_dataclass(value)
    assert repr(value) == repr(twin)
    same = type(value)(**as_dict(value))
    assert same == value
    assert not same != value  # noqa: SIM202 (the __ne__ Python derives)
    assert value != twin  # (another class: never equal, as between dataclasses)
    try:
        expected = hash(twin)
    except TypeError:
        with pytest.raises(TypeError):
            hash(value)  # (a dict field: unhashable, as the dataclass)
    else:
        assert hash(value) == expected == hash(same)


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda value: type(value).__name__)
def test_fields_cannot_be_assigned_or_deleted(value: Value) -> None:
    name = value._FIELDS[0]
    with pytest.raises(FrozenInstanceError):
        setattr(value, name, None)
    with pytest.raises(AttributeError):  # (FrozenInstanceError is one, as dataclasses')
        delattr(value, name)
    with pytest.raises(AttributeError):
        value.not_a_field = 1  # type: ignore[attr-defined]


def test_replace_changes_the_fields_named_and_refuses_others() -> None:
    task = Task(id="01m8t1qmfxw2b61d", spec=SPEC, attempt=3)
    moved = replace(task, state=State.CLAIMED, claim_token="t")
    assert (moved.state, moved.claim_token, moved.attempt) == (State.CLAIMED, "t", 3)
    assert task.state is State.QUEUED  # (a copy: the original is unchanged)
    assert as_dict(moved) == {**as_dict(task), "state": State.CLAIMED, "claim_token": "t"}
    with pytest.raises(TypeError):
        replace(task, no_such_field=1)
    assert replace(SPEC, name="n") == TaskSpec(argv=("true",), cwd="/", name="n")


def test_a_mutable_default_is_new_for_each_value() -> None:
    first, second = Task(id="a", spec=SPEC), Task(id="b", spec=SPEC)
    assert first.evidence == {} and type(first.evidence) is dict
    assert first.evidence is not second.evidence
    assert SPEC.env == {} and type(SPEC.env) is dict
    assert TaskSpec(argv=("x",), cwd="/").env is not SPEC.env
