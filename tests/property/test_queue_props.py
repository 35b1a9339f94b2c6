"""The claim order and the group limits hold for random queues.

Random histories of submits (groups, priorities, dependencies, not-before times),
claims (of what ``Table.candidates`` offers, in one write, as ``work`` does), ends,
releases, retries, group limits, pauses and the DEPENDENCY_FAILED cancels are folded
into a table; after each step its candidates must be exactly what a plain reference
computes by sorting the whole queue (priority, then queue position; paused groups,
groups without room, unmet dependencies and future tasks left out), its doomed tasks
what the reference finds, and a snapshot of it must answer the same, as must a table
loaded from the snapshot of the step before that folded this step's records before
its queue was first asked for (it orders its queue then: ``Table.queue``). A claim the
queue's rules forbid is refused under the table's check, whatever the caller read.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.core import events as ev
from ferry.core.errors import FerryError
from ferry.core.ids import new_task_id
from ferry.core.model import TERMINAL_STATES, Reason, State, Task
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

RUNNER = {"pid": 7, "start_time": 100.0, "boot_id": "boot", "host": "h"}
GROUPS = ("a", "b", "c")


class Queue:
    def __init__(self) -> None:
        self.table = Table()
        self.seq = 0
        self.now = 1000.0
        self.ids: list[str] = []
        self.tokens = 0
        # The snapshot of the last check and the records written since.
        self.mark: dict[str, Any] = self.table.to_snapshot()
        self.since: list[tuple[str, dict[str, Any], int, float]] = []

    def write(self, *events: Any) -> None:
        batch = [event.encode() for event in events]
        self.table.validate_batch(batch, now=self.now)
        for record_type, data in batch:
            self.seq += 1
            self.table.apply(record_type, data, self.seq, self.now)
            self.since.append((record_type, data, self.seq, self.now))

    def task(self, pick: int) -> Task:
        task = self.table.get(self.ids[pick % len(self.ids)])
        assert task is not None
        return task

    def token(self) -> str:
        self.tokens += 1
        return f"tok{self.tokens}"

    # ---- the reference -------------------------------------------------------------

    def tasks(self) -> list[Task]:
        return [t for t in map(self.table.get, self.ids) if t is not None]

    def paused(self, group: str) -> bool:
        return self.table.queue.paused(group)

    def room(self, group: str) -> float:
        jobs = self.table.queue.jobs.get(group, 0)
        return jobs - self.running(group) if jobs else math.inf

    def state(self, task_id: str) -> State | None:
        """None: no such task (a writer that forgets tasks: test_lazy_table_props)."""
        found = self.table.get(task_id)
        return None if found is None else found.state

    def eligible(self, task: Task) -> bool:
        """Claimable now by every rule but its group's room."""
        return (
            task.state is State.QUEUED
            and not self.paused(task.spec.group)
            and all(self.state(d) is State.SUCCEEDED for d in task.spec.after)
            and (task.not_before is None or task.not_before <= self.now)
        )

    def running(self, group: str) -> int:
        return sum(1 for t in self.tasks() if t.spec.group == group and t.in_flight)

    def expected(self, limit: int) -> list[str]:
        eligible = [t for t in self.tasks() if self.eligible(t)]
        eligible.sort(key=lambda t: (-t.spec.priority, t.queue_seq))
        room = {group: self.room(group) for group in GROUPS}
        chosen = []
        for task in eligible:
            if len(chosen) == limit:
                break
            if room[task.spec.group] > 0:
                chosen.append(task.id)
                room[task.spec.group] -= 1
        return chosen

    def expected_doomed(self) -> set[str]:
        doomed: set[str] = set()
        changed = True
        while changed:
            changed = False
            for task in self.tasks():
                if task.state is not State.QUEUED or task.id in doomed:
                    continue
                for dep in task.spec.after:
                    state = self.state(dep)
                    # (None: forgotten, which the queue counts as failed)
                    failed = state is None or (
                        state in TERMINAL_STATES and state is not State.SUCCEEDED
                    )
                    if failed or dep in doomed:
                        doomed.add(task.id)
                        changed = True
                        break
        return doomed

    # ---- actions -------------------------------------------------------------------

    def act(self, action: tuple[Any, ...]) -> None:
        kind = action[0]
        if kind == "submit" or not self.ids:
            _, group, priority, deps, delay = action if kind == "submit" else ("", "a", 0, (), None)
            after = (
                tuple(dict.fromkeys(self.ids[d % len(self.ids)] for d in deps)) if self.ids else ()
            )
            task_id = new_task_id(1_715_000_000_000_000_000 + len(self.ids) * 10**6, b"\0" * 4)
            spec = TaskSpec(argv=("true",), cwd="/", group=group, priority=priority,
                            after=after, max_releases=1000, retries=1,
                            not_before=None if delay is None else self.now + delay)  # fmt: skip
            self.ids.append(task_id)
            self.write(ev.Submitted(task_id, spec, 1.0))
        elif kind == "claim":
            chosen = self.table.candidates(action[1], now=self.now)
            before = {group: self.running(group) for group in GROUPS}
            events = []
            for task in chosen:
                token = self.token()
                events += [ev.Claimed(task.id, task.attempt, token, RUNNER, "work"),
                           ev.Dispatching(task.id, task.attempt, token, f"m{token}")]  # fmt: skip
            if events:
                self.write(*events)  # (one write: the group counts run through the batch)
            for group in GROUPS:  # never past a limit (one lowered below what ran: no more)
                jobs = self.table.queue.jobs.get(group, 0)
                assert not jobs or self.running(group) <= max(jobs, before[group])
        elif kind == "force":  # a claim of any queued task, whatever the rules: refused?
            task = self.task(action[1])
            if task.state is State.QUEUED:
                allowed = self.eligible(task) and self.room(task.spec.group) > 0
                try:
                    self.write(ev.Claimed(task.id, task.attempt, self.token(), RUNNER, "claim"))
                except FerryError as error:
                    assert not allowed, error
                    assert error.code in {
                        "task.group_paused",
                        "task.group_full",
                        "task.dependencies_pending",
                        "task.not_before",
                    }
                else:
                    assert allowed
        elif kind == "end":
            task = self.task(action[1])
            if task.in_flight:
                state = State.SUCCEEDED if action[2] else State.FAILED
                reason = None if action[2] else Reason.EXIT_NONZERO
                end = ev.Settled(task.id, task.attempt, task.claim_token, state, reason, 0)
                retry = not action[2] and action[3] and task.retries_used < task.spec.retries
                extra = [ev.Retried(task.id, task.attempt + 1, self.now + 5, True)] if retry else []
                token = task.claim_token
                assert token is not None
                spawned: list[Any] = []
                if task.state is State.CLAIMED:
                    spawned.append(ev.Dispatching(task.id, task.attempt, token, f"m{token}"))
                if task.state in (State.CLAIMED, State.DISPATCHING):
                    spawned.append(ev.Spawned(task.id, task.attempt, token, 9, 9, 1.0))
                self.write(*spawned, end, *extra)
        elif kind == "release":
            task = self.task(action[1])
            if task.in_flight:
                self.write(ev.Released(task.id, task.attempt, task.claim_token,
                                       Reason.RELEASED_TO_QUEUE, False))  # fmt: skip
        elif kind == "retry":
            task = self.task(action[1])
            if task.state in (State.FAILED, State.CANCELLED):
                self.write(ev.Retried(task.id, task.attempt + 1))
        elif kind == "jobs":
            self.write(ev.GroupSet(action[1], action[2]))
        elif kind == "pause":
            event = ev.GroupPaused if action[2] else ev.GroupResumed
            self.write(event(action[1]))
        elif kind == "time":
            self.now += action[1]
        elif kind == "doom":
            doomed = self.table.doomed()
            assert {t.id for t, _ in doomed} == self.expected_doomed()
            if doomed:
                self.write(*[ev.Settled(t.id, t.attempt, None, State.CANCELLED,
                                        Reason.DEPENDENCY_FAILED) for t, _ in doomed])  # fmt: skip

    def check(self) -> None:
        for limit in (1, 3, len(self.ids) + 1):
            assert [t.id for t in self.table.candidates(limit, now=self.now)] == self.expected(
                limit
            )
        assert {t.id for t, _ in self.table.doomed()} == self.expected_doomed()
        copy = Table.from_snapshot(self.table.to_snapshot())
        assert [t.id for t in copy.candidates(len(self.ids) + 1, now=self.now)] == self.expected(
            len(self.ids) + 1
        )
        assert {t.id for t, _ in copy.doomed()} == self.expected_doomed()
        assert copy.groups() == self.table.groups()
        lagging = Table.from_snapshot(self.mark)
        for record in self.since:
            lagging.apply(*record)
        assert lagging.to_snapshot() == self.table.to_snapshot()
        assert [t.id for t in lagging.candidates(len(self.ids) + 1, now=self.now)] == (
            self.expected(len(self.ids) + 1)
        )
        assert {t.id for t, _ in lagging.doomed()} == self.expected_doomed()
        assert lagging.groups() == self.table.groups()
        self.mark, self.since = self.table.to_snapshot(), []


_pick = st.integers(0, 50)
ACTIONS = st.one_of(
    st.tuples(
        st.just("submit"),
        st.sampled_from(GROUPS),
        st.integers(-2, 2),
        st.lists(_pick, max_size=2),
        st.one_of(st.none(), st.floats(0, 20)),
    ),
    st.tuples(st.just("claim"), st.integers(1, 4)),
    st.tuples(st.just("force"), _pick),
    st.tuples(st.just("end"), _pick, st.booleans(), st.booleans()),
    st.tuples(st.just("release"), _pick),
    st.tuples(st.just("retry"), _pick),
    st.tuples(st.just("jobs"), st.sampled_from(GROUPS), st.integers(0, 3)),
    st.tuples(st.just("pause"), st.sampled_from((*GROUPS, None)), st.booleans()),
    st.tuples(st.just("time"), st.floats(0, 10)),
    st.tuples(st.just("doom")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ACTIONS, min_size=1, max_size=60))
def test_claim_order_and_group_limits_hold_for_random_queues(actions: list[Any]) -> None:
    queue = Queue()
    for action in actions:
        queue.act(action)
        queue.check()


def test_a_claim_in_one_write_with_an_end_may_take_the_place_the_end_frees() -> None:
    queue = Queue()
    for _ in range(2):
        queue.act(("submit", "a", 0, (), None))
    queue.act(("jobs", "a", 1))
    queue.act(("claim", 2))
    first, second = (queue.table.get(i) for i in queue.ids)
    assert first is not None and second is not None
    assert (first.state, second.state) == (State.DISPATCHING, State.QUEUED)
    with pytest.raises(FerryError) as refused:  # the group is full
        queue.write(ev.Claimed(second.id, 1, "x", RUNNER, "work"))
    assert refused.value.code == "task.group_full"
    token = first.claim_token
    assert token is not None
    queue.write(ev.Spawned(first.id, 1, token, 9, 9, 1.0),
                ev.Settled(first.id, 1, token, State.SUCCEEDED, None, 0),
                ev.Claimed(second.id, 1, "x", RUNNER, "work"))  # fmt: skip
    assert queue.state(second.id) is State.CLAIMED
