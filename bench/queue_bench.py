"""Queue control benchmarks.

claim-order: the cost of choosing the next task to claim (``Table.candidates``, what
``work``, ``claim`` and the local store's ``queued`` call) must not grow with the queue.
A table is folded from a journal's events as ferry folds them: QUEUED tasks in 10
groups (three of them limited), priorities -3..3, a fifth of the tasks ``--after`` an
earlier one, a twentieth with a ``--not-before`` in the past. Then, over and over:
choose the next task (timed), claim it, run it to SUCCEEDED and submit a new one in its
place (not timed), so the queue keeps its length, with 12 in flight. ``ours`` is µs per choice with
10,000 queued, ``base`` with 1,000; ratio = ours / base (target <= 1.5). ``scan_10k``:
the same choice made by sorting the queue (what a scan costs, for scale).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from benchkit import Figure, Options, side_by_side

from ferry.core import events as ev
from ferry.core.ids import new_task_id
from ferry.core.model import State, Task
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

GROUPS = [f"g{n}" for n in range(10)]
LIMITED = {"g0": 4, "g1": 2, "g2": 8}
RUNNER = {"pid": 7, "start_time": 1.0, "boot_id": "b", "host": "h"}
CHOICES = 2_000  # timed choices per measurement
RUNNING_MAX = 12  # tasks in flight at once


class Farm:
    """A table with ``size`` tasks queued, kept at that length."""

    def __init__(self, size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.table = Table()
        self.seq = 0
        self.ids: list[str] = []
        self.running: list[tuple[str, int, str]] = []
        self.now = time.time()
        for group, jobs in LIMITED.items():
            self._apply(ev.GroupSet(group, jobs))
        for _ in range(size):
            self.submit()

    def _apply(self, *events: ev.Event) -> None:
        for event in events:
            self.seq += 1
            record_type, data = event.encode()
            self.table.apply(record_type, data, self.seq, self.now)

    def submit(self) -> None:
        rng = self.rng
        after: tuple[str, ...] = ()
        if self.ids and rng.random() < 0.2:
            after = (self.ids[rng.randrange(max(0, len(self.ids) - 2_000), len(self.ids))],)
        not_before = self.now - 1.0 if rng.random() < 0.05 else None
        spec = TaskSpec(argv=("true",), cwd="/", group=rng.choice(GROUPS),
                        priority=rng.randint(-3, 3), after=after, not_before=not_before)  # fmt: skip
        task_id = new_task_id(1_700_000_000_000_000_000 + self.seq * 1_000_000, rng.randbytes(4))
        self.ids.append(task_id)
        self._apply(ev.Submitted(task_id, spec, self.now))

    def choose(self) -> Task:
        found = self.table.candidates(1, now=self.now)
        assert found, "nothing claimable"
        return found[0]

    def run(self, task: Task) -> None:
        """Claim it and queue another in its place; the oldest of the RUNNING ones
        (RUNNING_MAX: the limited groups fill up now and then) ends SUCCEEDED."""
        token = f"t{self.seq}"
        self._apply(
            ev.Claimed(task.id, task.attempt, token, RUNNER, "work"),
            ev.Dispatching(task.id, task.attempt, token, f"m:{token}"),
            ev.Spawned(task.id, task.attempt, token, 9, 9, 1.0),
        )
        self.running.append((task.id, task.attempt, token))
        if len(self.running) > RUNNING_MAX:
            task_id, attempt, token = self.running.pop(0)
            self._apply(ev.Settled(task_id, attempt, token, State.SUCCEEDED, None, 0))
        self.submit()

    def scan(self) -> Task:
        """The choice by sorting the queue (no index): for scale only."""
        queued = [t for t in self.table.live() if t.state is State.QUEUED]
        queued.sort(key=lambda t: (-t.spec.priority, t.queue_seq))
        return queued[0]


def _per_choice_us(farm: Farm, choose: Callable[[Farm], Any], count: int) -> float:
    spent = 0.0
    for _ in range(count):
        start = time.perf_counter()
        task = choose(farm)
        spent += time.perf_counter() - start
        farm.run(farm.choose() if task is None else task)
    return spent / count * 1e6


def claim_order(options: Options) -> Figure:
    big, small = int(10_000 * options.scale), int(1_000 * options.scale)
    farms = {size: Farm(size, seed=size) for size in (big, small)}
    count = max(100, int(CHOICES * options.scale))
    ours, base = side_by_side(
        lambda: _per_choice_us(farms[big], Farm.choose, count),
        lambda: _per_choice_us(farms[small], Farm.choose, count),
        options.runs,
    )
    scan = _per_choice_us(farms[big], Farm.scan, max(20, count // 20))
    queued = sum(1 for t in farms[big].table.live() if t.state is State.QUEUED)
    return Figure(
        "claim-order",
        ours / base,
        f"{ours:.1f}us",
        f"{base:.1f}us",
        {
            "queued": f"{queued}",
            "groups": str(len(GROUPS)),
            "choices": str(count),
            "scan_10k": f"{scan:.0f}us",
            "target": "<=1.5",
        },
    )


BENCHMARKS = {"claim-order": claim_order}
