"""A wall clock stepped back (NTP, a VM restored) between the pick of a task whose
``--not-before`` had come and the write of its claim. The write refuses the claim
(``task.not_before``: by the writer's clock its time has not come); the task must not be
picked again until it has, nor keep the other queued tasks from being claimed. (Found
by a review: it was picked and refused at every turn, and eight refusals in a row
stopped every claim of the queue: ``claiming.RACE_TRIES``.)"""

from __future__ import annotations

import pytest

from ferry.core import events as ev
from ferry.core.errors import RefusedError
from ferry.core.ids import new_task_id
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

RUNNER = {"pid": 7, "start_time": 100.0, "boot_id": "boot", "host": "h"}


def submitted(table: Table, n: int, not_before: float | None) -> str:
    task_id = new_task_id(1_715_000_000_000_000_000 + n * 10**6, b"\0" * 4)
    spec = TaskSpec(argv=("true",), cwd="/", not_before=not_before)
    event = ev.Submitted(task_id, spec, 1.0)
    table.apply(*event.encode(), n + 1, 1.0)
    return task_id


def test_a_task_refused_for_its_time_waits_for_it_and_lets_the_others_be_claimed() -> None:
    table = Table()
    timed = [submitted(table, n, not_before=1000.0) for n in range(9)]
    ready = submitted(table, 9, not_before=None)
    # Its time came by the clock of the pick: the timed tasks are first in line.
    assert [t.id for t in table.candidates(10, now=2000.0)][:9] == timed
    # The clock steps back an hour before the claim is written.
    for task_id in timed:
        claim = ev.Claimed(task_id, 1, f"t{task_id}", RUNNER, "work")
        with pytest.raises(RefusedError) as refused:
            table.validate_batch([claim.encode()], now=1000.0 - 3600)
        assert refused.value.code == "task.not_before"
    assert [t.id for t in table.candidates(10, now=1000.0 - 3600)] == [ready]
    assert [t.id for t in table.candidates(10, now=1000.0)] == [*timed, ready]
