"""What a supervisor's end becomes, decided on the task as it is when written
(``outbox.end_writes``), in the two cases where it is not the end as ended:

- a task whose command never started for want of descriptors, processes or memory:
  the claim given back to the queue (counted: up to ``--max-releases``, then FAILED
  as it ended), for a task of the queue; ``run``'s own
  task FAILED as before; and a child that was made, then killed at once, is not
  "never started";
- an ``--idempotent`` task its worker stopped when it could not renew its host's
  lease: queued again as another host's recovery would (bounded by
  ``--max-releases``); one that may mutate keeps its FAILED end.
"""

from __future__ import annotations

import errno
from typing import Any

import pytest

from ferry.app import outbox
from ferry.app.runner import before_spawn_event, not_started, spawn_failed_event
from ferry.core import events as ev
from ferry.core.fold import fold_event
from ferry.core.model import Reason, State, Task
from ferry.core.spec import TaskSpec
from ferry.proc._spawn import SpawnFailed

TOKEN = "tok0000000000000"


def dispatched(by: str, *, cancel: bool = False, **spec: Any) -> Task:
    submitted = ev.Submitted("t1", TaskSpec(argv=("true",), cwd="/", **spec), 1.0)
    task = fold_event(None, submitted, 1, 1.0)
    task = fold_event(task, ev.Claimed("t1", 1, TOKEN, {"pid": 1}, by), 2, 2.0)
    task = fold_event(task, ev.Dispatching("t1", 1, TOKEN, f"t1:1:{TOKEN}", {}), 3, 3.0)
    if cancel:
        task = fold_event(task, ev.CancelRequested("t1", 1, TOKEN), 4, 4.0)
    return task


def end(error: SpawnFailed, task: Task) -> list[ev.Event]:
    return [spawn_failed_event(task, TOKEN, error)]


SHORT = SpawnFailed("other", "cannot start 'true': no memory", errno_=errno.ENOMEM)


@pytest.mark.parametrize("by", ["work", "claim"])
def test_a_queued_task_never_started_for_want_of_memory_goes_back_counted(by: str) -> None:
    task = dispatched(by)
    found, writes = outbox.end_writes(task, end(SHORT, task))
    assert found == outbox.RELEASED
    [released] = writes
    assert isinstance(released, ev.Released) and released.counted is True
    assert released.evidence["not_started"]["details"]["errno"] == errno.ENOMEM
    assert fold_event(task, released, 5, 5.0).state is State.QUEUED


def test_past_its_max_releases_it_ends_as_it_ended() -> None:
    """A task whose own start always fails so must not hold the head of the queue."""
    task = dispatched("work", max_releases=0)
    found, [written] = outbox.end_writes(task, end(SHORT, task))
    assert found == outbox.SETTLED
    assert isinstance(written, ev.Settled) and written.reason is Reason.SPAWN_FAILED


def test_one_whose_cancel_was_asked_for_ends_cancelled() -> None:
    task = dispatched("work", cancel=True)
    _, [written] = outbox.end_writes(task, end(SHORT, task))
    assert isinstance(written, ev.Settled) and written.state is State.CANCELLED


def test_run_s_own_task_fails_as_before() -> None:
    task = dispatched("run")
    found, [written] = outbox.end_writes(task, end(SHORT, task))
    assert found == outbox.SETTLED
    assert isinstance(written, ev.Settled) and written.reason is Reason.SPAWN_FAILED


@pytest.mark.parametrize(
    "error",
    [
        SpawnFailed("other", "cannot supervise 'true'; killed", errno_=errno.EMFILE, spawned=True),
        SpawnFailed("not_found", "true: command not found", errno_=errno.ENOENT),
        SpawnFailed("other", "cannot enter '/x': Permission denied", errno_=errno.EACCES),
        SpawnFailed("other", "not started: unheard"),
    ],
    ids=["spawned-then-killed", "not-found", "bad-cwd", "no-errno"],
)
def test_other_spawn_failures_still_fail(error: SpawnFailed) -> None:
    task = dispatched("work")
    assert not_started(spawn_failed_event(task, TOKEN, error)) is None
    _, [written] = outbox.end_writes(task, end(error, task))
    assert isinstance(written, ev.Settled) and written.reason is Reason.SPAWN_FAILED


def test_once_the_claim_moved_nothing_is_kept_of_it() -> None:
    """Never started: no late result to keep (the claim was decided meanwhile)."""
    task = dispatched("work")
    moved = fold_event(
        task, ev.Released("t1", 1, TOKEN, Reason.RELEASED_TO_QUEUE, True, {}), 5, 5.0
    )
    assert outbox.end_writes(moved, end(SHORT, task)) == (outbox.ALREADY, [])


# ---- stopped for a lost lease ---------------------------------------------------------


def stopped(task: Task, state: State = State.FAILED) -> list[ev.Event]:
    evidence = {"stopped_because": "lease_lost", "lease": "lost"}
    reason = Reason.SIGNALLED if state is State.FAILED else None
    signum = 15 if state is State.FAILED else None
    exit_code = None if state is State.FAILED else 0
    return [ev.Settled(task.id, 1, TOKEN, state, reason, exit_code, signum, evidence, 9.0)]


def test_an_idempotent_task_stopped_for_a_lost_lease_is_queued_again_counted() -> None:
    task = dispatched("work", idempotent=True)
    found, [released] = outbox.end_writes(task, stopped(task))
    assert found == outbox.RELEASED
    assert isinstance(released, ev.Released) and released.counted is True
    assert released.evidence["stopped_because"] == "lease_lost"
    assert released.evidence["signal"] == 15
    assert fold_event(task, released, 5, 5.0).releases == 1


def test_past_its_max_releases_it_fails_as_recovery_would() -> None:
    task = dispatched("work", idempotent=True, max_releases=0)
    found, [settled] = outbox.end_writes(task, stopped(task))
    assert found == outbox.SETTLED
    assert isinstance(settled, ev.Settled)
    assert (settled.state, settled.reason) == (State.FAILED, Reason.RELEASE_LIMIT_EXCEEDED)


@pytest.mark.parametrize(
    ("spec", "cancel", "state", "outcome"),
    [
        ({}, False, State.FAILED, (State.FAILED, Reason.SIGNALLED)),  # may mutate
        ({"idempotent": True}, True, State.FAILED, (State.CANCELLED, Reason.CANCELLED_BY_USER)),
        ({"idempotent": True}, False, State.SUCCEEDED, (State.SUCCEEDED, None)),
    ],
    ids=["may-mutate", "cancel-asked", "succeeded-anyway"],
)
def test_other_ends_of_a_lost_lease_stand(
    spec: dict[str, Any], cancel: bool, state: State, outcome: tuple[State, Reason | None]
) -> None:
    task = dispatched("work", cancel=cancel, **spec)
    _, [settled] = outbox.end_writes(task, stopped(task, state))
    assert isinstance(settled, ev.Settled) and (settled.state, settled.reason) == outcome


@pytest.mark.parametrize("by", ["work", "claim", "run"])
def test_a_signal_before_the_spawn_gives_a_queued_task_back(by: str) -> None:
    """A signal to its supervisor (or launcher) before the spawn was not the task's:
    a task of the queue goes back to it; ``run``'s own is FAILED SIGNALLED."""
    task = dispatched(by)
    end = [before_spawn_event(task, TOKEN, cancelled=False, signum=15)]
    found, [written] = outbox.end_writes(task, end)
    if by == "run":
        assert isinstance(written, ev.Settled) and written.reason is Reason.SIGNALLED
    else:
        assert found == outbox.RELEASED and isinstance(written, ev.Released)
        assert written.evidence == {"supervisor": "not started: signal 15 before the spawn"}
