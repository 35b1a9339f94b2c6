"""The transition table, exhaustively: every (old, new) pair is legal exactly when the
contract's table lists it, and check_transition refuses every other pair."""

from __future__ import annotations

import itertools

import pytest

from ferry.core.errors import IllegalTransitionError, RefusedError
from ferry.core.model import (
    IN_FLIGHT_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    Reason,
    State,
    check_transition,
    is_legal,
)

# The contract, written out independently of the code.
CONTRACT = {
    ("QUEUED", "CLAIMED"), ("QUEUED", "CANCELLED"), ("QUEUED", "FAILED"),
    ("CLAIMED", "DISPATCHING"), ("CLAIMED", "QUEUED"), ("CLAIMED", "FAILED"),
    ("CLAIMED", "CANCELLED"),
    ("DISPATCHING", "RUNNING"), ("DISPATCHING", "QUEUED"), ("DISPATCHING", "FAILED"),
    ("DISPATCHING", "CANCELLED"),
    ("RUNNING", "STALE"), ("RUNNING", "SUCCEEDED"), ("RUNNING", "FAILED"),
    ("RUNNING", "CANCELLED"), ("RUNNING", "QUEUED"),
    ("STALE", "RUNNING"), ("STALE", "SUCCEEDED"), ("STALE", "FAILED"),
    ("STALE", "CANCELLED"), ("STALE", "QUEUED"),
    ("FAILED", "QUEUED"), ("CANCELLED", "QUEUED"),
}  # fmt: skip
PAIRS = list(itertools.product(State, State))


def test_state_and_reason_names_are_the_contracts() -> None:
    assert [s.value for s in State] == [
        "QUEUED", "CLAIMED", "DISPATCHING", "RUNNING", "STALE", "SUCCEEDED", "FAILED",
        "CANCELLED",
    ]  # fmt: skip
    assert {r.value for r in Reason} == {
        "EXIT_NONZERO", "TIMEOUT", "SIGNALLED", "SPAWN_FAILED", "CANCELLED_BY_USER",
        "QUARANTINED_ORPHAN_ALIVE", "MARKED_FAILED_MUTATION_UNSAFE", "RELEASED_TO_QUEUE",
        "RELEASE_LIMIT_EXCEEDED", "HEARTBEAT_STALE", "POINTER_STALE", "NOT_A_UNIFIED_DIFF",
        "PATCH_DOES_NOT_COVER_POINTERS", "EMPTY_PATCH_HUNKS",
        "HOST_LOST",  # (contract.md, "Many machines: PostgreSQL")
        "DEPENDENCY_FAILED",  # (contract.md, "Queue control and housekeeping")
    }  # fmt: skip
    assert all(s == s.value and str(s) == s.value for s in State)


def test_state_groups() -> None:
    assert {s.value for s in TERMINAL_STATES} == {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert {s.value for s in IN_FLIGHT_STATES} == {"CLAIMED", "DISPATCHING", "RUNNING", "STALE"}
    assert set(TRANSITIONS) == set(State)


@pytest.mark.parametrize(("old", "new"), PAIRS, ids=lambda s: str(s))
def test_transition_is_legal_exactly_when_the_contract_lists_it(old: State, new: State) -> None:
    legal = (old.value, new.value) in CONTRACT
    assert is_legal(old, new) is legal
    assert (new in TRANSITIONS[old]) is legal
    if legal:
        check_transition(old, new, task="t1")
    else:
        with pytest.raises(IllegalTransitionError) as caught:
            check_transition(old, new, task="t1")
        error = caught.value
        assert isinstance(error, RefusedError)
        assert error.code == "task.illegal_transition"
        assert error.exit_code == 1
        assert error.details == {"old": old.value, "new": new.value, "task": "t1"}
        assert f"{old} -> {new}" in error.message


def test_succeeded_is_final_and_nothing_returns_to_claimed_states_except_by_table() -> None:
    assert TRANSITIONS[State.SUCCEEDED] == frozenset()
    assert all(State.DISPATCHING not in TRANSITIONS[s] for s in State if s is not State.CLAIMED)


def test_transitions_cannot_be_mutated() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[State.SUCCEEDED] = frozenset({State.QUEUED})  # type: ignore[index]
