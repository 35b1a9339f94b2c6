"""The seam's claim operations for the stores that decide under one writer's lock
(``ferry.storage.claiming``), over the memory store: what a claim writes, the places a
write's ends free going to its claims, a candidate that moved skipped for the next."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from ferry.app.runner import plan_task
from ferry.core import events as ev
from ferry.core.errors import LeaseHeldError
from ferry.core.model import Reason, State, Task
from ferry.core.spec import TaskSpec
from ferry.storage.claiming import claim_events, dispatching_with_claim
from ferry.storage.memory import MemoryStore

RUNNER = {"pid": 1, "start_time": 1, "boot_id": "b", "host": "h"}


def submitted(store: MemoryStore, name: str, **spec: Any) -> str:
    store.commit(ev.Submitted(name, TaskSpec(argv=("true",), cwd="/", **spec), time.time()))
    return name


def end_of(task: Task) -> list[ev.Event]:
    token = str(task.claim_token)
    return [
        ev.Spawned(task.id, task.attempt, token, 42, 42, 1),
        ev.Settled(task.id, task.attempt, token, State.SUCCEEDED, None, 0),
    ]


def test_a_claim_writes_claimed_and_the_dispatching_its_plan_makes() -> None:
    """The DISPATCHING a claim writes is the one the supervisor's plan makes (the
    launcher checks them equal before the spawn); a task with pinned inputs has none."""
    plain = Task(id="t1", spec=TaskSpec(argv=("true",), cwd="/"), attempt=2)
    dispatching = dispatching_with_claim(plain, "tok")
    assert dispatching is not None
    assert dispatching.encode() == plan_task(plain, "tok", {}).event.encode()
    events = claim_events(plain, RUNNER, "tok", "work")
    assert [e.encode()[0] for e in events] == ["CLAIMED", "DISPATCHING"]
    pinned = Task(id="t2", spec=TaskSpec(argv=("true",), cwd="/", pointers=(("f", "0" * 64),)))
    assert dispatching_with_claim(pinned, "tok") is None
    assert [e.encode()[0] for e in claim_events(pinned, RUNNER, "tok", "work")] == ["CLAIMED"]


def test_claim_next_takes_the_first_candidate_and_fences_an_old_epoch() -> None:
    store = MemoryStore()
    low, high = submitted(store, "a"), submitted(store, "b", priority=1)
    store.commit(ev.LeaseAcquired(2, RUNNER), epoch=2)
    claimed = store.claim_next(RUNNER, "tok", by="work", epoch=2)
    assert claimed is not None and (claimed.id, claimed.state) == (high, State.DISPATCHING)
    assert claimed.marker == f"{high}:1:tok"
    with pytest.raises(LeaseHeldError):
        store.claim_next(RUNNER, "tok2", by="work", epoch=1)
    assert store.get(low) is not None and store.get(low).state is State.QUEUED  # type: ignore[union-attr]
    assert store.claimed_with("tok") == store.get(high)
    assert store.claimed_with("nope") is None


def test_the_place_an_end_frees_goes_to_a_claim_of_the_same_write() -> None:
    store = MemoryStore()
    first, second, other = (submitted(store, n, group="g") for n in ("a", "b", "c"))
    store.commit(ev.GroupSet("g", 1))
    running = store.claim_next(RUNNER, "t1", by="work", epoch=0)
    assert running is not None and running.id == first
    assert store.claim_next(RUNNER, "t0", by="work", epoch=0) is None  # (g is full)
    written_before = len(store.records)

    def end(current: Mapping[str, Task | None]) -> list[ev.Event]:
        task = current[first]
        assert task is not None
        return end_of(task)

    written = store.commit_against([first], end, claims=[(RUNNER, "t2"), (RUNNER, "t3")])
    assert written.tasks[first] is not None and written.tasks[first].state is State.SUCCEEDED  # type: ignore[union-attr]
    assert [(t.id, t.claim_token) for t in written.claimed] == [(second, "t2")]
    types = [kind for _, _, kind, _ in store.records[written_before:]]
    assert types == ["SPAWNED", "SETTLED", "CLAIMED", "DISPATCHING"]  # (one commit)
    assert store.get(other) is not None and store.get(other).state is State.QUEUED  # type: ignore[union-attr]


class CancelledBehind(MemoryStore):
    """The first candidate is cancelled by someone else just before the claim's commit
    (after the pick): as a write another process lands between a read and a write."""

    def __init__(self) -> None:
        super().__init__()
        self.victim: str | None = None

    def commit(self, *events: Any, epoch: int = 0) -> list[Any]:
        victim, self.victim = self.victim, None
        if victim is not None:
            super().commit(ev.Settled(victim, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
        return super().commit(*events, epoch=epoch)


def test_a_candidate_that_moved_is_skipped_for_the_next() -> None:
    store = CancelledBehind()
    first, second = submitted(store, "a"), submitted(store, "b")
    store.victim = first
    written = store.commit_against([], lambda current: [], claims=[(RUNNER, "tok")])
    assert [t.id for t in written.claimed] == [second]
    assert store.get(first) is not None and store.get(first).state is State.CANCELLED  # type: ignore[union-attr]
