"""A table whose history is not loaded asks it a task at a time (``ferry.core.history``):
``ls --limit N`` (``newest``, ``count``), ``show`` (``get``, ``resolve``, ``by_number``)
and the fold's look-ups of an old task read a few records, never the whole history,
and answer exactly what a table with its history loaded answers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from historykit import ListHistory

from ferry.core import events as ev
from ferry.core.errors import AmbiguousIdError, NotFoundError, RefusedError
from ferry.core.ids import new_task_id
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

RUNNER = {"pid": 1, "start_time": 2.0, "boot_id": "b", "host": "h"}


class Home:
    """A table folded from events, and what a compaction leaves of it."""

    def __init__(self) -> None:
        self.table = Table()
        self.seq = 0
        self.ids: list[str] = []

    def write(self, *events: ev.Event) -> None:
        batch = [event.encode() for event in events]
        self.table.validate_batch(batch)
        for record_type, data in batch:
            self.seq += 1
            self.table.apply(record_type, data, self.seq, 100.0 + self.seq)

    def run(self, state: State = State.SUCCEEDED, **spec: Any) -> str:
        task_id = new_task_id((1_715_000_000_000 + len(self.ids)) * 1_000_000, b"\0\0\0\1")
        self.ids.append(task_id)
        token = "t" + task_id[-4:]
        reason = None if state is State.SUCCEEDED else Reason.EXIT_NONZERO
        self.write(
            ev.Submitted(task_id, TaskSpec(argv=("x",), cwd="/", **spec), 1.0),
            ev.Claimed(task_id, 1, token, RUNNER, "run"),
            ev.Dispatching(task_id, 1, token, "marker"),
            ev.Spawned(task_id, 1, token, 10, 10, 3.0),
            ev.Settled(task_id, 1, token, state, reason, ended_at=50.0),
        )
        return task_id

    def submit(self) -> str:
        task_id = new_task_id((1_715_000_000_000 + len(self.ids)) * 1_000_000, b"\0\0\0\1")
        self.ids.append(task_id)
        self.write(ev.Submitted(task_id, TaskSpec(argv=("x",), cwd="/"), 1.0))
        return task_id

    def compacted(self) -> tuple[Table, ListHistory, list[int]]:
        """A table loaded from a snapshot of this one (its settled tasks in an archive),
        its history, and the calls of its full history load."""
        snapshot = self.table.to_snapshot()
        settled = snapshot.pop("settled")
        history = ListHistory([settled])
        loads: list[int] = []

        def load(_seq: int) -> Iterable[Mapping[str, Any]]:
            loads.append(1)
            return settled

        return Table.from_snapshot(snapshot, load_settled=load, history=history), history, loads


def busy(settled: int = 30) -> Home:
    home = Home()
    for i in range(settled):
        home.run(State.FAILED if i % 7 == 3 else State.SUCCEEDED)
    return home


def test_newest_and_count_read_only_the_tasks_shown() -> None:
    home = busy()
    queued = home.submit()
    table, history, loads = home.compacted()
    newest = table.newest(5)
    assert newest == home.table.newest(5)
    assert newest[-1].id == queued
    assert table.count() == home.table.count() == 31
    assert loads == []
    assert history.asked == ["newest", *(f"record {t.id}" for t in reversed(newest[:-1]))]


def test_newest_in_a_state_reads_until_it_has_them_and_no_further() -> None:
    home = busy()
    table, history, loads = home.compacted()
    assert table.newest(2, "FAILED") == home.table.newest(2, "FAILED")
    assert table.count("FAILED") == home.table.count("FAILED") == 4
    assert len([a for a in history.asked if a.startswith("record")]) == 2
    # all four FAILED: the counts say none is left, so the iteration stops at the last
    assert table.newest(10, ["FAILED"]) == home.table.newest(10, ["FAILED"])
    history.asked.clear()
    assert table.newest(3, "QUEUED") == [] and table.count("QUEUED") == 0
    assert history.asked == [] and loads == []  # none settled in that state: not asked


def test_newest_stops_at_the_tasks_the_table_holds_when_they_are_newer() -> None:
    home = busy()
    table, history, _ = home.compacted()
    harness = Home()
    harness.table, harness.seq, harness.ids = table, table.last_seq, list(home.ids)
    for _ in range(3):
        harness.run()  # folded since the snapshot: newer than every archived task
    history.asked.clear()
    assert [t.id for t in table.newest(3)] == harness.ids[-3:]
    assert [a for a in history.asked if a.startswith("record")] == []


def test_get_resolve_and_number_of_an_archived_task_read_that_task() -> None:
    home = busy()
    table, history, loads = home.compacted()
    old = home.ids[4]
    assert table.get(old) == home.table.get(old)
    assert table.resolve(old[:-1]) == home.table.get(old)
    assert table.by_number(6) == home.table.by_number(6)
    assert table.resolve("7") == home.table.resolve("7")
    assert table.get("01hf7yat00zzzzzz") is None
    with pytest.raises(NotFoundError):
        table.resolve("zz")
    assert loads == [] and {a.split()[0] for a in history.asked} == {"find", "number", "prefix"}
    # several match: the full load names them all, as before
    with pytest.raises(AmbiguousIdError) as caught:
        table.resolve(old[:6])
    assert caught.value.details["count"] == 30 and loads == [1]


def test_an_archived_task_taken_in_is_counted_once() -> None:
    home = busy()
    table, _, loads = home.compacted()
    for task_id in home.ids[:10]:
        table.get(task_id)
    table.newest(20)
    assert table.count() == 30 and table.count("FAILED") == 4
    assert table.settled_counts() == home.table.settled_counts() == {"FAILED": 4, "SUCCEEDED": 26}
    assert loads == []


def test_the_fold_reads_the_old_task_a_record_needs() -> None:
    home = busy()
    table, history, loads = home.compacted()
    failed = home.ids[3]
    record_type, data = ev.Retried(failed, 2).encode()
    table.validate(record_type, data)
    table.apply(record_type, data, table.last_seq + 1, 1.0)
    assert table.get(failed).state is State.QUEUED  # type: ignore[union-attr]
    with pytest.raises(RefusedError) as caught:  # a duplicate id of an archived task
        table.validate(*ev.Submitted(home.ids[0], TaskSpec(argv=("x",), cwd="/"), 1.0).encode())
    assert caught.value.code == "task.duplicate_id"
    assert table.count() == 30 and table.count("QUEUED") == 1 and table.count("FAILED") == 3
    assert loads == [] and history.asked[:1] == [f"find {failed}"]


def test_a_forgotten_task_the_table_did_not_hold_makes_the_counts_unknown() -> None:
    home = busy()
    table, _, loads = home.compacted()
    home.write(ev.Forgotten(home.ids[0], 1))
    table.apply(*ev.Forgotten(home.ids[0], 1).encode(), table.last_seq + 1, 1.0)
    assert table.get(home.ids[0]) is None and loads == []
    assert table.newest(3) == home.table.newest(3) and loads == []
    assert table.settled_counts() is None
    assert table.count() == 29 and loads == [1]  # counted by loading the history


def test_a_history_that_cannot_answer_loads_it_whole() -> None:
    home = busy()
    table, history, loads = home.compacted()
    history.missing = True
    assert table.newest(3) == home.table.newest(3)
    assert loads == [1]
    assert table.get(home.ids[2]) == home.table.get(home.ids[2]) and loads == [1]


def uncounted(home: Home, *, with_history: bool) -> tuple[Table, list[int]]:
    """A table loaded from a snapshot of ``home`` that does not say how many settled
    tasks it holds in each state (an older format), and the calls of its history load."""
    snapshot = home.table.to_snapshot()
    settled = snapshot.pop("settled")
    del snapshot["settled_counts"]
    loads: list[int] = []

    def load(_seq: int) -> Iterable[Mapping[str, Any]]:
        loads.append(1)
        return settled

    history = ListHistory([settled]) if with_history else None
    return Table.from_snapshot(snapshot, load_settled=load, history=history), loads


def test_a_snapshot_without_counts_counts_by_loading() -> None:
    home = busy()
    table, loads = uncounted(home, with_history=True)
    assert table.newest(2) == home.table.newest(2) and loads == []
    assert table.settled_counts() is None
    assert table.count() == 30 and loads == [1]


def test_a_later_archive_holds_the_newer_record_of_a_task() -> None:
    home = busy()
    old = home.table.to_snapshot()["settled"]
    failed = home.ids[3]
    home.write(ev.Retried(failed, 2))
    home.write(ev.Settled(failed, 2, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    snapshot = home.table.to_snapshot()
    newer = [r for r in snapshot.pop("settled") if r["id"] == failed]
    table = Table.from_snapshot(
        snapshot, load_settled=lambda _seq: [*old, *newer], history=ListHistory([old, newer])
    )
    assert table.newest(0) == home.table.newest(0)  # (loads)
    table = Table.from_snapshot(
        snapshot, load_settled=lambda _seq: [*old, *newer], history=ListHistory([old, newer])
    )
    assert table.get(failed) == home.table.get(failed)
    assert table.newest(30, "FAILED") == home.table.newest(30, "FAILED")
    assert table.count("CANCELLED") == 1 and table.count("FAILED") == 3


def test_counting_tasks_not_settled_never_loads_the_history() -> None:
    """``work``'s progress line counts the queue at every tick: the queued and the
    in-flight tasks are all held, so no history (of possibly 100,000 tasks) is read,
    even when nothing says how many settled tasks there are."""
    home = busy()
    home.submit(), home.submit()
    table, loads = uncounted(home, with_history=False)
    assert table.count(State.QUEUED) == 2 and table.count(("QUEUED", "RUNNING")) == 2
    assert table.count("RUNNING") == 0 and loads == []
    assert table.count(("QUEUED", "FAILED")) == home.table.count(("QUEUED", "FAILED")) == 6
    assert loads == [1]  # a settled state asks the history
