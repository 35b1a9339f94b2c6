"""Table.oldest_queued_n (the leader's slot filling, from the heap) lists exactly what
Table.queued()[:n] lists, whatever claims, releases, settles and retries came before."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.core import events as ev
from ferry.core.ids import new_task_id
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

RUNNER = {"pid": 7, "start_time": 100.0, "boot_id": "boot", "host": "h"}
SPEC = TaskSpec(argv=("true",), cwd="/", max_releases=1000)


class Journal:
    def __init__(self) -> None:
        self.table = Table()
        self.seq = 0
        self.ids: list[str] = []
        self.tokens: dict[str, str] = {}

    def write(self, *events: Any) -> None:
        batch = [event.encode() for event in events]
        self.table.validate_batch(batch)
        for record_type, data in batch:
            self.seq += 1
            self.table.apply(record_type, data, self.seq, float(self.seq))

    def act(self, action: str, pick: int) -> None:
        if action == "submit" or not self.ids:
            task_id = new_task_id(1_715_000_000_000_000_000 + len(self.ids) * 10**6, b"\0" * 4)
            self.ids.append(task_id)
            self.write(ev.Submitted(task_id, SPEC, 1.0))
            return
        task = self.table.get(self.ids[pick % len(self.ids)])
        assert task is not None
        token = f"t{self.seq}"
        if action == "claim" and task.state is State.QUEUED:
            self.write(ev.Claimed(task.id, task.attempt, token, RUNNER, "work"))
        elif action == "release" and task.in_flight and task.claim_token is not None:
            self.write(
                ev.Released(
                    task.id, task.attempt, task.claim_token, Reason.RELEASED_TO_QUEUE, False
                )
            )
        elif action == "fail" and (task.in_flight or task.state is State.QUEUED):
            token = task.claim_token  # (None for a queued task)
            self.write(ev.Settled(task.id, task.attempt, token, State.FAILED, Reason.TIMEOUT))
        elif action == "retry" and task.state is State.FAILED:
            self.write(ev.Retried(task.id, task.attempt + 1))


ACTIONS = st.sampled_from(["submit", "claim", "release", "fail", "retry"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ACTIONS, st.integers(0, 50)), max_size=60), st.integers(1, 8))
def test_oldest_queued_n_is_the_head_of_queued(steps: list[tuple[str, int]], n: int) -> None:
    journal = Journal()
    for action, pick in steps:
        journal.act(action, pick)
        expected = [task.id for task in journal.table.queued()[:n]]
        assert [task.id for task in journal.table.oldest_queued_n(n)] == expected
        assert [task.id for task in journal.table.oldest_queued_n(n)] == expected  # again
        oldest = journal.table.oldest_queued()
        assert (oldest.id if oldest else None) == (expected[0] if expected else None)


def test_a_task_released_back_before_its_old_entry_surfaced_is_listed_once() -> None:
    journal = Journal()
    for _ in range(3):
        journal.act("submit", 0)
    first, second = journal.ids[0], journal.ids[1]
    journal.act("claim", 1)  # the second leaves QUEUED while not at the heap's top
    journal.act("release", 1)  # and comes back with the same queue position
    listed = [task.id for task in journal.table.oldest_queued_n(3)]
    assert listed == [first, second, journal.ids[2]]
