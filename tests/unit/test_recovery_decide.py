"""decide() as a decision table: one test per row of the contract's recovery table, each
run over every value of the inputs that row says do not matter; then the records it
produces, the evidence, and the edges (stale limit, release limit, policy)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from ferry.core import events as ev
from ferry.core.fold import task_to_record
from ferry.core.model import Liveness, Reason, State, Task, TaskSpec, replace
from ferry.core.recovery import Action, Decision, Observation, Policy, decide
from ferry.core.state import Table

ALIVE, DEAD, UNKNOWN = Liveness.ALIVE, Liveness.DEAD, Liveness.UNKNOWN
NOT_DEAD = (ALIVE, UNKNOWN)
LIMIT_S = 20.0
POLICY = Policy(stale_after_s=LIMIT_S)
FRESH, STALE_AGE = 1.0, LIMIT_S * 3
IN_FLIGHT = (State.CLAIMED, State.DISPATCHING, State.RUNNING, State.STALE)
STARTED = (State.DISPATCHING, State.RUNNING, State.STALE)  # DISPATCHING journaled
RUNNER = {"pid": 7, "start_time": 1.0, "boot_id": "b", "host": "h"}


def make_task(
    state: State, *, idempotent: bool = False, releases: int = 0, max_releases: int = 3,
    cancel_requested: bool = False,
) -> Task:  # fmt: skip
    spawned = state in (State.RUNNING, State.STALE)
    return Task(
        id="01hf7yat00c5h66s",
        spec=TaskSpec(argv=("x",), cwd="/", idempotent=idempotent, max_releases=max_releases),
        state=state,
        reason=Reason.HEARTBEAT_STALE if state is State.STALE else None,
        attempt=2,
        releases=releases,
        claim_token="tok",
        runner=RUNNER,
        marker="m" if state is not State.CLAIMED else None,
        pid=300 if spawned else None,
        pgid=300 if spawned else None,
        start_time=5.5 if spawned else None,
        started_at=100.0 if spawned else None,
        heartbeat_at=110.0 if spawned else None,
        cancel_requested=cancel_requested,
    )


def cases(
    states: tuple[State, ...] = IN_FLIGHT,
    runners: tuple[Liveness, ...] = tuple(Liveness),
    task_processes: tuple[Liveness, ...] = tuple(Liveness),
    ages: tuple[float | None, ...] = (FRESH, STALE_AGE, None),
    idempotent: tuple[bool, ...] = (False, True),
    releases: tuple[str, ...] = ("below", "at"),
    cancel: tuple[bool, ...] = (False, True),
) -> Iterator[tuple[Task, Observation]]:
    for state, runner, process, age, idem, rel, canc in itertools.product(
        states, runners, task_processes, ages, idempotent, releases, cancel
    ):
        task = make_task(state, idempotent=idem, releases=2 if rel == "below" else 3,
                         cancel_requested=canc)  # fmt: skip
        yield task, Observation(runner, process, age)


def assert_all(expected: Action, **dimensions: Any) -> None:
    count = 0
    for task, seen in cases(**dimensions):
        decision = decide(task, seen, POLICY, now=1000.0)
        assert decision.action is expected, (task.state, seen, task.spec.idempotent)
        count += 1
    assert count > 0


# ---- the contract's rows ---------------------------------------------------------


def test_runner_alive_heartbeat_fresh__leave_alone() -> None:
    assert_all(Action.LEAVE, states=(State.RUNNING,), runners=(ALIVE,), ages=(FRESH, None))


def test_runner_alive_heartbeat_older_than_limit__mark_stale() -> None:
    assert_all(Action.MARK_STALE, states=(State.RUNNING,), runners=(ALIVE,), ages=(STALE_AGE,))


def test_runner_dead_task_alive__quarantine() -> None:
    assert_all(Action.QUARANTINE, states=STARTED, runners=(DEAD,), task_processes=(ALIVE,))


def test_runner_dead_task_dead_may_mutate__fail_unsafe() -> None:
    assert_all(Action.FAIL_UNSAFE, states=STARTED, runners=(DEAD,), task_processes=(DEAD,),
               idempotent=(False,), cancel=(False,))  # fmt: skip


def test_runner_dead_task_dead_idempotent_releases_below_max__release_counted() -> None:
    assert_all(Action.RELEASE, states=STARTED, runners=(DEAD,), task_processes=(DEAD,),
               idempotent=(True,), releases=("below",), cancel=(False,))  # fmt: skip


def test_runner_dead_task_dead_idempotent_releases_at_max__fail_limit() -> None:
    assert_all(Action.FAIL_LIMIT, states=STARTED, runners=(DEAD,), task_processes=(DEAD,),
               idempotent=(True,), releases=("at",), cancel=(False,))  # fmt: skip


def test_claimed_no_dispatching_runner_dead__release_uncounted_whatever_the_probe_says() -> None:
    assert_all(Action.RELEASE_UNCOUNTED, states=(State.CLAIMED,), runners=(DEAD,), cancel=(False,))


def test_dispatching_no_spawned_runner_dead__decided_by_the_marker_scan() -> None:
    dispatching = (State.DISPATCHING,)
    assert_all(Action.QUARANTINE, states=dispatching, runners=(DEAD,), task_processes=NOT_DEAD)
    assert_all(Action.FAIL_UNSAFE, states=dispatching, runners=(DEAD,), task_processes=(DEAD,),
               idempotent=(False,), cancel=(False,))  # fmt: skip
    assert_all(Action.RELEASE, states=dispatching, runners=(DEAD,), task_processes=(DEAD,),
               idempotent=(True,), releases=("below",), cancel=(False,))  # fmt: skip


def test_task_liveness_unknown__treated_as_alive_quarantine() -> None:
    assert_all(Action.QUARANTINE, states=STARTED, runners=(DEAD,), task_processes=(UNKNOWN,))


def test_runner_liveness_unknown__treated_as_alive_never_as_dead() -> None:
    assert_all(Action.LEAVE, states=(State.RUNNING,), runners=(UNKNOWN,), ages=(FRESH, None))
    assert_all(Action.MARK_STALE, states=(State.RUNNING,), runners=(UNKNOWN,), ages=(STALE_AGE,))
    assert_all(Action.LEAVE, states=(State.CLAIMED, State.DISPATCHING), runners=(UNKNOWN,))


# ---- rows beyond the contract's table (documented in docs/recovery.md) -------------


def test_runner_alive_still_starting__leave_alone_even_with_an_old_heartbeat() -> None:
    assert_all(Action.LEAVE, states=(State.CLAIMED, State.DISPATCHING), runners=NOT_DEAD)


def test_stale_runner_beating_again__resume() -> None:
    assert_all(Action.RESUME, states=(State.STALE,), runners=NOT_DEAD, ages=(FRESH, None))


def test_stale_runner_still_silent__leave_stale() -> None:
    assert_all(Action.LEAVE, states=(State.STALE,), runners=NOT_DEAD, ages=(STALE_AGE,))


def test_cancel_requested_runner_dead_nothing_runs__cancel() -> None:
    assert_all(Action.CANCEL, states=STARTED, runners=(DEAD,), task_processes=(DEAD,),
               cancel=(True,))  # fmt: skip
    assert_all(Action.CANCEL, states=(State.CLAIMED,), runners=(DEAD,), cancel=(True,))


def test_cancel_requested_runner_dead_task_alive__still_quarantine() -> None:
    assert_all(Action.QUARANTINE, states=STARTED, runners=(DEAD,), task_processes=NOT_DEAD,
               cancel=(True,))  # fmt: skip


@pytest.mark.parametrize("state", [State.QUEUED, State.SUCCEEDED, State.FAILED, State.CANCELLED])
def test_task_not_in_flight__leave(state: State) -> None:
    decision = decide(make_task(state), Observation(DEAD, DEAD), POLICY, now=0.0)
    assert decision.action is Action.LEAVE and decision.event is None


def test_every_combination_is_decided_and_every_action_is_reachable() -> None:
    seen_actions = {decide(t, o, POLICY, 0.0).action for t, o in cases()}
    lost = {
        decide(t, dataclasses.replace(o, host_lost=True), POLICY, 0.0).action for t, o in cases()
    }
    assert seen_actions | lost == set(Action)


# ---- what gets journaled ---------------------------------------------------------

EXPECTED_RECORD: dict[Action, tuple[str, str | None, str | None]] = {
    Action.MARK_STALE: ("STALE", None, None),
    Action.RESUME: ("RESUMED", None, None),
    Action.QUARANTINE: ("SETTLED", "FAILED", "QUARANTINED_ORPHAN_ALIVE"),
    Action.FAIL_UNSAFE: ("SETTLED", "FAILED", "MARKED_FAILED_MUTATION_UNSAFE"),
    Action.FAIL_LIMIT: ("SETTLED", "FAILED", "RELEASE_LIMIT_EXCEEDED"),
    Action.CANCEL: ("SETTLED", "CANCELLED", "CANCELLED_BY_USER"),
    Action.RELEASE: ("RELEASED", None, "RELEASED_TO_QUEUE"),
    Action.RELEASE_UNCOUNTED: ("RELEASED", None, "RELEASED_TO_QUEUE"),
    Action.FAIL_HOST_LOST: ("SETTLED", "FAILED", "HOST_LOST"),
}


def test_each_decision_journals_the_right_record_naming_the_claim_it_decides() -> None:
    """Recovery's records carry the token of the claim it judged (a token-less write
    about a task in flight is never legal: ferry.core.fold), not a token of its own."""
    for task, seen in cases():
        decision = decide(task, seen, POLICY, 0.0)
        if decision.action is Action.LEAVE:
            assert decision.event is None
            continue
        assert decision.event is not None
        record_type, data = decision.event
        want_type, want_state, want_reason = EXPECTED_RECORD[decision.action]
        assert record_type == want_type
        assert data["task"] == task.id and data["attempt"] == task.attempt
        assert data.get("token") == task.claim_token is not None
        if want_state is not None:
            assert data["state"] == want_state
        if want_reason is not None:
            assert data["reason"] == want_reason
        if record_type == "RELEASED":
            assert data["counted"] is (decision.action is Action.RELEASE)
        assert data["evidence"] == decision.evidence
        assert orjson.loads(orjson.dumps(data)) == data  # JSON-ready, no NaN
        assert decision.needs_operator is (
            decision.action in (Action.QUARANTINE, Action.FAIL_UNSAFE, Action.FAIL_LIMIT)
        )


def test_decisions_are_accepted_by_the_fold_and_give_the_promised_state() -> None:
    """Run each decision through a real Table: recovery's records are legal events."""
    for task, seen in cases():
        decision = decide(task, seen, POLICY, 0.0)
        if decision.event is None:
            continue
        snapshot = {"format": 1, "last_seq": 0, "live": [task_to_record(task)], "settled": []}
        table = Table.from_snapshot(snapshot)  # a table holding exactly this task
        table.validate(*decision.event)
        table.apply(*decision.event, 1, 2000.0)
        after = table.get(task.id)
        assert after is not None and not table.anomalies
        if decision.action is Action.RELEASE:
            assert (after.state, after.releases) == (State.QUEUED, task.releases + 1)
        if decision.action is Action.RELEASE_UNCOUNTED:
            assert (after.state, after.releases) == (State.QUEUED, task.releases)
        if decision.action is Action.RESUME:
            assert after.state is State.RUNNING
        # a late runner with the old token is refused afterwards
        late = ev.Settled(task.id, task.attempt, "tok", State.SUCCEEDED, None, 0).encode()
        if after.state is not State.RUNNING and after.state is not State.STALE:
            with pytest.raises(Exception) as caught:
                table.validate(*late)
            assert getattr(caught.value, "code", "") in {
                "task.stale_claim", "task.illegal_transition",
            }  # fmt: skip


# ---- evidence and salvage --------------------------------------------------------


def test_unsafe_evidence_carries_what_recovery_saw_and_the_salvage() -> None:
    task = make_task(State.RUNNING)
    seen = Observation(DEAD, DEAD, 42.0, exit_code=3, exit_signal=None,
                       salvage={"last_lines": ["boom"]})  # fmt: skip
    decision = decide(task, seen, POLICY, now=1_715_000_000.5)
    recovery, salvage = decision.evidence["recovery"], decision.evidence["salvage"]
    assert recovery["decision"] == "FAIL_UNSAFE" and recovery["why"]
    assert recovery["decided_at"] == "2024-05-06T12:53:20.500Z"
    assert (recovery["runner"], recovery["task_process"]) == ("DEAD", "DEAD")
    assert recovery["previous_state"] == "RUNNING" and recovery["attempt"] == 2
    assert recovery["heartbeat_age_s"] == 42.0 and recovery["stale_limit_s"] == LIMIT_S
    assert recovery["runner_identity"] == RUNNER
    assert recovery["orphan"] == {"pid": 300, "pgid": 300, "start_time": 5.5}
    assert salvage["pid"] == 300 and salvage["start_time"] == 5.5
    assert salvage["started_at"] == "1970-01-01T00:01:40.000Z"
    assert salvage["heartbeat_at"] == "1970-01-01T00:01:50.000Z"
    assert salvage["exit_code"] == 3 and salvage["last_lines"] == ["boom"]
    assert decision.event is not None and decision.event[1]["exit_code"] == 3


def test_orphan_found_by_marker_is_recorded_for_kill_and_retry() -> None:
    task = make_task(State.DISPATCHING)
    orphan = {"pid": 900, "pgid": 900, "start_time": 77.0}
    seen = Observation(DEAD, ALIVE, None, found_by_marker=True, orphan=orphan)
    decision = decide(task, seen, POLICY, 0.0)
    assert decision.action is Action.QUARANTINE
    assert decision.evidence["recovery"]["orphan"] == orphan
    assert decision.evidence["recovery"]["found_by_marker"] is True


def test_dispatching_without_a_found_child_has_no_orphan() -> None:
    decision = decide(make_task(State.DISPATCHING), Observation(DEAD, DEAD), POLICY, 0.0)
    assert decision.evidence["recovery"]["orphan"] is None


# ---- edges -----------------------------------------------------------------------


def test_heartbeat_exactly_at_the_limit_is_fresh_just_over_is_stale() -> None:
    task = make_task(State.RUNNING)
    assert decide(task, Observation(ALIVE, ALIVE, LIMIT_S), POLICY, 0).action is Action.LEAVE
    over = Observation(ALIVE, ALIVE, LIMIT_S + 1e-9)
    assert decide(task, over, POLICY, 0).action is Action.MARK_STALE


def test_negative_heartbeat_age_is_clock_skew_and_fresh() -> None:
    task = make_task(State.RUNNING)
    assert decide(task, Observation(ALIVE, ALIVE, -5.0), POLICY, 0).action is Action.LEAVE


def test_default_stale_limit_is_three_heartbeats_of_the_task() -> None:
    task = make_task(State.RUNNING)
    task = replace(task, spec=replace(task.spec, heartbeat_s=2.0))
    assert Policy().stale_limit_s(task) == 6.0
    assert decide(task, Observation(ALIVE, ALIVE, 5.9), Policy(), 0).action is Action.LEAVE
    assert decide(task, Observation(ALIVE, ALIVE, 6.1), Policy(), 0).action is Action.MARK_STALE


def test_kill_stale_only_when_configured_and_recorded_before_the_kill() -> None:
    task, seen = make_task(State.RUNNING), Observation(ALIVE, ALIVE, STALE_AGE)
    quiet = decide(task, seen, POLICY, 0)
    assert not quiet.kill_task and quiet.evidence["recovery"]["kill_requested"] is False
    killing = decide(task, seen, Policy(stale_after_s=LIMIT_S, kill_stale=True), 0)
    assert killing.kill_task and killing.event is not None
    assert killing.event[1]["evidence"]["recovery"]["kill_requested"] is True
    for action_case in cases():
        decision = decide(*action_case, Policy(stale_after_s=LIMIT_S, kill_stale=True), 0)
        assert decision.kill_task is (decision.action is Action.MARK_STALE)


def test_max_releases_zero_fails_at_once() -> None:
    task = make_task(State.RUNNING, idempotent=True, releases=0, max_releases=0)
    assert decide(task, Observation(DEAD, DEAD), POLICY, 0).action is Action.FAIL_LIMIT


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_policy_refuses_a_nonsense_stale_limit(bad: float) -> None:
    with pytest.raises(ValueError):
        Policy(stale_after_s=bad)


def test_decision_is_a_value() -> None:
    task, seen = make_task(State.RUNNING), Observation(DEAD, DEAD)
    assert decide(task, seen, POLICY, 5.0) == decide(task, seen, POLICY, 5.0)
    assert isinstance(decide(task, seen, POLICY, 5.0), Decision)


# ---- a shared database: another host's task, its host lost ---------------------------


@pytest.mark.parametrize(
    ("state", "idempotent", "releases", "action", "reason"),
    [
        (State.CLAIMED, False, 0, Action.RELEASE_UNCOUNTED, Reason.RELEASED_TO_QUEUE),
        (State.DISPATCHING, False, 0, Action.FAIL_HOST_LOST, Reason.HOST_LOST),
        (State.RUNNING, False, 0, Action.FAIL_HOST_LOST, Reason.HOST_LOST),
        (State.STALE, True, 0, Action.RELEASE, Reason.RELEASED_TO_QUEUE),
        (State.RUNNING, True, 3, Action.FAIL_LIMIT, Reason.RELEASE_LIMIT_EXCEEDED),
    ],
)
def test_a_lost_host_s_task_is_decided_by_its_class_never_by_a_probe_here(
    state: State, idempotent: bool, releases: int, action: Action, reason: Reason
) -> None:
    task = make_task(state, idempotent=idempotent, releases=releases)
    # The probes here say ALIVE (the same machine simulating two hosts): ignored.
    seen = Observation(Liveness.ALIVE, Liveness.ALIVE, host_lost=True)
    decision = decide(task, seen, Policy(), 0.0)
    assert decision.action is action
    assert decision.event is not None and decision.event[1].get("reason") == reason.value
    assert decision.evidence["recovery"]["host_lost"] is True
    assert decision.needs_operator is (action in (Action.FAIL_HOST_LOST, Action.FAIL_LIMIT))


@pytest.mark.parametrize("state", IN_FLIGHT)
@pytest.mark.parametrize("idempotent", [True, False])
def test_a_lost_host_s_task_whose_cancel_was_asked_for_is_cancelled(
    state: State, idempotent: bool
) -> None:
    # (A release of it would be refused, its cancel requested: a lost host's task with
    # a cancel asked from another host was decided RELEASE at every pass, for ever.)
    task = make_task(state, idempotent=idempotent, cancel_requested=True)
    seen = Observation(Liveness.ALIVE, Liveness.ALIVE, host_lost=True, host_ttl_s=30.0)
    decision = decide(task, seen, Policy(), 0.0)
    assert decision.action is Action.CANCEL
    assert decision.evidence["recovery"]["host_ttl_s"] == 30.0  # (judged again at its write)
