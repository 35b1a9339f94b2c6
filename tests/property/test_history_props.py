"""Properties of history read a task at a time (hypothesis):

* a table loaded from a snapshot whose history it asks a task at a time answers what
  ``ls`` and ``show`` ask (``newest``, ``count``, ``resolve``, ``get``) as the table
  that loaded it all does, before, while and after it folds the records that follow,
  and ends as the same table;
* the archives with their indexes on disk (``ferry.storage.local.history``) answer as
  the same records held in memory do: each task's newest record, newest first, by id,
  by number, by prefix.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from historykit import ListHistory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.core import events as ev
from ferry.core.errors import FerryError
from ferry.core.ids import new_task_id
from ferry.core.model import TERMINAL_STATES, Reason, State
from ferry.core.spec import TaskSpec
from ferry.core.state import Table
from ferry.storage.local.history import ArchiveHistory
from ferry.storage.local.store import _write_archive

RUNNER = {"pid": 1, "start_time": 2.0, "boot_id": "b", "host": "h"}
STATES = [state.value for state in State]
Journal = list[tuple[str, Mapping[str, Any], int]]


@st.composite
def histories(draw: st.DrawFn) -> tuple[Journal, list[str]]:
    """A journal of tasks run, retried, cancelled, forgotten, in a random order."""
    table, journal, ids = Table(), [], []

    def write(*events: ev.Event) -> None:
        batch = [event.encode() for event in events]
        table.validate_batch(batch)
        for record_type, data in batch:
            journal.append((record_type, data, len(journal) + 1))
            table.apply(record_type, data, len(journal), float(len(journal)))

    for _ in range(draw(st.integers(1, 30))):
        settled = [t for t in map(table.get, ids) if t is not None and t.terminal]
        choice = draw(st.sampled_from(["run", "run", "submit", "again", "forget"]))
        if choice in ("run", "submit") or not settled:
            # ids of one millisecond sort at random: some share one
            ms = 1_715_000_000_000 + draw(st.integers(0, 3)) * len(ids)
            task_id = new_task_id(ms * 1_000_000, draw(st.binary(min_size=4, max_size=4)))
            if task_id in ids:
                continue
            ids.append(task_id)
            write(ev.Submitted(task_id, TaskSpec(argv=("x",), cwd="/"), 1.0))
            if choice == "submit":
                continue
            task = table.get(task_id)
        else:
            task = draw(st.sampled_from(settled))
            if choice == "forget" and task.state in TERMINAL_STATES:
                write(ev.Forgotten(task.id, task.attempt))
                continue
            if task.state is State.SUCCEEDED:
                continue
            write(ev.Retried(task.id, task.attempt + 1))
        assert task is not None
        attempt = table.get(task.id).attempt  # type: ignore[union-attr]
        state = draw(st.sampled_from([State.SUCCEEDED, State.FAILED, State.CANCELLED]))
        if state is State.CANCELLED:
            write(ev.Settled(task.id, attempt, None, state, Reason.CANCELLED_BY_USER))
            continue
        token = f"t{len(journal)}"
        reason = None if state is State.SUCCEEDED else Reason.EXIT_NONZERO
        write(
            ev.Claimed(task.id, attempt, token, RUNNER, "run"),
            ev.Dispatching(task.id, attempt, token, "marker"),
            ev.Spawned(task.id, attempt, token, 10, 10, 3.0),
            ev.Settled(task.id, attempt, token, state, reason, 0),
        )
    return journal, ids


def replay(journal: Journal, table: Table | None = None) -> Table:
    table = table or Table()
    for record_type, data, seq in journal:
        table.apply(record_type, data, seq, float(seq))
    return table


def ask_alike(data: st.DataObject, partial: Table, full: Table, ids: list[str]) -> None:
    limit = data.draw(st.integers(0, 6))
    state = data.draw(st.none() | st.sampled_from(STATES) | st.lists(st.sampled_from(STATES)))
    assert partial.newest(limit, state) == full.newest(limit, state)
    assert partial.count(state) == full.count(state)
    some = data.draw(st.sampled_from(ids))
    reference = data.draw(
        st.sampled_from([some, some[:-2], some[:9], str(data.draw(st.integers(1, 45)))])
    )
    answers = []
    for table in (partial, full):
        try:
            answers.append(table.resolve(reference))
        except FerryError as error:
            answers.append(error.code)  # type: ignore[arg-type]
    assert answers[0] == answers[1]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.data())
def test_history_asked_a_task_at_a_time_answers_as_when_loaded(
    made: tuple[Journal, list[str]], data: st.DataObject
) -> None:
    journal, ids = made
    whole = replay(journal)
    cut = data.draw(st.integers(0, len(journal)))
    early = data.draw(st.integers(0, cut))
    archives = [replay(journal[:early]).to_snapshot()["settled"]]
    archives.append(replay(journal[:cut]).settled_since(early))
    snapshot = replay(journal[:cut]).to_snapshot()
    settled = snapshot.pop("settled")
    partial = Table.from_snapshot(
        snapshot, load_settled=lambda _seq: settled, history=ListHistory(archives)
    )
    full = Table.from_snapshot(snapshot, load_settled=lambda _seq: settled)
    full.ids()
    for record_type, payload, seq in journal[cut:]:
        if data.draw(st.integers(0, 3)) == 0:
            ask_alike(data, partial, full, ids)
        partial.apply(record_type, payload, seq, float(seq))
        full.apply(record_type, payload, seq, float(seq))
    ask_alike(data, partial, full, ids)
    counts = partial.settled_counts()
    assert counts is None or counts == whole.settled_counts()
    assert partial.to_snapshot() == whole.to_snapshot()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.data())
def test_archives_on_disk_answer_as_their_records(
    made: tuple[Journal, list[str]], data: st.DataObject
) -> None:
    journal, ids = made
    cuts = sorted(data.draw(st.lists(st.integers(0, len(journal)), max_size=3)))
    archives, before = [], 0
    for cut in [*cuts, len(journal)]:
        archives.append(replay(journal[:cut]).settled_since(before))
        before = cut
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        refs = [_write_archive(directory, seq, records) for seq, records in enumerate(archives)]
        on_disk = ArchiveHistory.of(directory, refs)
        assert on_disk is not None
        held = ListHistory(archives)
        skip = set(data.draw(st.lists(st.sampled_from(ids))))
        got = [(p.task_id, p.state, p.record()) for p in on_disk.newest(skip.__contains__)]
        assert got == [(e.task_id, e.state, e.record()) for e in held.newest(skip.__contains__)]
        for task_id in ids:
            assert on_disk.find(task_id) == held.find(task_id)
            for width in (1, 9, 15):
                every = held.with_prefix(task_id[:width], len(ids))[0]
                found, more = on_disk.with_prefix(task_id[:width], 3)
                assert found == sorted(set(found)) and set(found) <= set(every)
                assert (found == every) if not more else len(every) > 3
        for number in range(1, len(ids) + 2):
            assert on_disk.find_number(number) == held.find_number(number)
        assert on_disk.find("zzzzzzzzzzzzzzzz") is None
