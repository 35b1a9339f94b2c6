"""FORGOTTEN (``ferry gc``) in the table: what may be forgotten, what a forgotten task
leaves behind (its key's success), and that history loaded later leaves it out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from ferry.core import events as ev
from ferry.core.errors import FerryError
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec
from ferry.core.state import Table

A, B, C = "01hf7yat00aaaaaa", "01hf7yat00bbbbbb", "01hf7yat00cccccc"
RUNNER = {"pid": 1, "start_time": 2.0, "boot_id": "b", "host": "h"}


class Journal:
    """A table and the records that made it."""

    def __init__(self) -> None:
        self.table = Table()
        self.records: list[tuple[str, Mapping[str, Any], int]] = []

    def write(self, *events: ev.Event) -> None:
        batch = [event.encode() for event in events]
        self.table.validate_batch(batch)
        for record_type, data in batch:
            seq = len(self.records) + 1
            self.table.apply(record_type, data, seq, 100.0 + seq)
            self.records.append((record_type, data, seq))

    def refused(self, *events: ev.Event) -> str:
        with pytest.raises(FerryError) as caught:
            self.write(*events)
        return caught.value.code

    def run(self, task_id: str, state: State, reason: Reason | None = None, **spec: Any) -> None:
        """Submit, claim and settle ``task_id``."""
        token = "t" + task_id[-4:]
        self.write(
            ev.Submitted(task_id, TaskSpec(argv=("x",), cwd="/", **spec), 1.0),
            ev.Claimed(task_id, 1, token, RUNNER, "run"),
            ev.Dispatching(task_id, 1, token, "marker"),
            ev.Spawned(task_id, 1, token, 10, 10, 3.0),
            ev.Settled(task_id, 1, token, state, reason, ended_at=50.0),
        )


def replay(records: Sequence[tuple[str, Mapping[str, Any], int]], table: Table) -> Table:
    for record_type, data, seq in records:
        table.apply(record_type, data, seq, 100.0 + seq)
    return table


def test_a_forgotten_task_leaves_the_table_and_its_number_is_not_reused() -> None:
    j = Journal()
    j.run(A, State.SUCCEEDED)
    j.run(B, State.FAILED, Reason.EXIT_NONZERO)
    j.write(ev.Forgotten(A, 1))
    assert j.table.get(A) is None
    assert j.table.ids() == [B]
    assert j.table.by_number(1) is None and j.table.by_number(2) is not None
    j.write(ev.Submitted(C, TaskSpec(argv=("x",), cwd="/"), 1.0))
    assert j.table.get(C) is not None and j.table.get(C).number == 3  # type: ignore[union-attr]


def test_only_a_settled_task_at_its_current_attempt_is_forgotten() -> None:
    j = Journal()
    j.write(ev.Submitted(A, TaskSpec(argv=("x",), cwd="/"), 1.0))
    assert j.refused(ev.Forgotten(A, 1)) == "task.illegal_transition"  # queued
    j.write(ev.Claimed(A, 1, "tok", RUNNER, "work"))
    assert j.refused(ev.Forgotten(A, 1)) == "task.illegal_transition"  # in flight
    j.write(ev.Settled(A, 1, "tok", State.FAILED, Reason.EXIT_NONZERO))
    j.write(ev.Retried(A, 2))
    j.write(ev.Settled(A, 2, None, State.CANCELLED, Reason.CANCELLED_BY_USER))
    assert j.refused(ev.Forgotten(A, 1)) == "task.stale_attempt"  # retried since gc read it
    assert j.refused(ev.Forgotten(B, 1)) == "task.not_found"
    assert j.refused(ev.Forgotten(A, 2), ev.Forgotten(A, 2)) == "task.not_found"  # twice in one
    j.write(ev.Forgotten(A, 2))
    assert j.refused(ev.Forgotten(A, 2)) == "task.not_found"


def test_replay_skips_a_forgotten_of_a_live_task_as_an_anomaly() -> None:
    table = Table()
    table.apply(*ev.Submitted(A, TaskSpec(argv=("x",), cwd="/"), 1.0).encode(), 1, 1.0)
    table.apply(*ev.Forgotten(A, 1).encode(), 2, 2.0)
    assert table.get(A) is not None
    assert [a.code for a in table.anomalies] == ["task.illegal_transition"]


def test_a_key_that_succeeded_stays_succeeded_once_its_task_is_forgotten() -> None:
    j = Journal()
    j.run(A, State.SUCCEEDED, key="deploy")
    j.write(ev.Forgotten(A, 1))
    assert j.table.succeeded_with_key("deploy") == A  # a tombstone
    assert j.refused(ev.Submitted(B, TaskSpec(argv=("x",), cwd="/", key="deploy"), 1.0)) == (
        "task.key_succeeded"
    )
    # ... through a snapshot, with or without its history
    snapshot = j.table.to_snapshot()
    assert Table.from_snapshot(snapshot).succeeded_with_key("deploy") == A
    snapshot.pop("settled")
    assert Table.from_snapshot(snapshot).succeeded_with_key("deploy") == A


def test_a_key_whose_latest_task_ended_unsafe_is_not_forgotten_until_resolved() -> None:
    j = Journal()
    j.run(A, State.FAILED, Reason.MARKED_FAILED_MUTATION_UNSAFE, key="k")
    assert j.refused(ev.Forgotten(A, 1)) == "task.key_unsafe"
    j.write(ev.Resolved(A, 1, "failed"))
    j.write(ev.Forgotten(A, 1))
    assert j.table.unsafe_with_key("k") is None
    j.write(ev.Submitted(B, TaskSpec(argv=("x",), cwd="/", key="k"), 1.0))  # the key is free


def test_a_failed_task_of_a_key_is_forgotten_and_the_key_runs_again() -> None:
    j = Journal()
    j.run(A, State.FAILED, Reason.EXIT_NONZERO, key="k")
    j.write(ev.Forgotten(A, 1))
    assert j.table.by_key("k") == []
    j.write(ev.Submitted(B, TaskSpec(argv=("x",), cwd="/", key="k"), 1.0))
    assert j.table.by_key("k") == [B]


def test_a_quarantined_task_forgotten_leaves_the_quarantine_index() -> None:
    j = Journal()
    j.run(A, State.FAILED, Reason.QUARANTINED_ORPHAN_ALIVE)
    assert [t.id for t in j.table.quarantined()] == [A]
    j.write(ev.Forgotten(A, 1))
    assert j.table.quarantined() == []
    lazy = j.table.live_snapshot()
    assert Table.from_snapshot(lazy).quarantined() == []


def test_history_loaded_after_the_forgotten_record_leaves_the_task_out() -> None:
    """A snapshot's archives may hold a task forgotten after it: a table that replays the
    FORGOTTEN without loading history (lazily), then loads it, must not bring it back."""
    j = Journal()
    j.run(A, State.SUCCEEDED)
    j.run(B, State.SUCCEEDED)
    cut = len(j.records)
    before = j.table.to_snapshot()
    archived = before.pop("settled")
    j.write(ev.Forgotten(A, 1))
    loads: list[int] = []

    def load(seq: int) -> list[Mapping[str, Any]]:
        loads.append(seq)
        return archived

    lazy = replay(j.records[cut:], Table.from_snapshot(before, load_settled=load))
    assert loads == []  # replaying a FORGOTTEN loads no history
    assert lazy.get(A) is None and lazy.get(B) is not None and loads == [cut + 1]
    assert lazy.to_snapshot() == j.table.to_snapshot()
    # A snapshot taken now names the forgotten id until the archives are rewritten...
    later = j.table.live_snapshot()
    assert later["forgotten"] == [A]
    assert Table.from_snapshot(later, load_settled=lambda _seq: archived).get(A) is None
    # ... and not after (the store's merge: forget_done once history is loaded)
    j.table.forget_done(j.table.last_seq)
    assert "forgotten" not in j.table.live_snapshot()


def test_forget_done_keeps_what_was_forgotten_after_the_compaction_read_the_table() -> None:
    j = Journal()
    j.run(A, State.SUCCEEDED)
    j.run(B, State.SUCCEEDED)
    j.write(ev.Forgotten(A, 1))
    at = j.table.last_seq
    j.write(ev.Forgotten(B, 1))
    j.table.forget_done(at)
    assert j.table.live_snapshot()["forgotten"] == [B]


def test_settled_before_chooses_by_end_time_and_state() -> None:
    j = Journal()
    j.run(A, State.SUCCEEDED)
    j.run(B, State.FAILED, Reason.EXIT_NONZERO)
    j.write(ev.Submitted(C, TaskSpec(argv=("x",), cwd="/"), 1.0))
    assert [t.id for t in j.table.settled_before(60.0, ["SUCCEEDED", "FAILED"])] == [A, B]
    assert [t.id for t in j.table.settled_before(60.0, ["FAILED", "QUEUED"])] == [B]
    assert j.table.settled_before(50.0, ["SUCCEEDED", "FAILED"]) == []
    # from records of history not decoded yet, too
    snapshot = j.table.to_snapshot()
    settled = snapshot.pop("settled")
    lazy = Table.from_snapshot(snapshot, load_settled=lambda _seq: settled)
    assert [t.id for t in lazy.settled_before(60.0, ["SUCCEEDED"])] == [A]


def test_a_table_from_rows_knows_a_key_resolved_as_succeeded_after_a_quarantine() -> None:
    """Found on the way (bug): a table rebuilt from task records (the PostgreSQL
    backend's, for every key check) indexed a key's success only for a task that was not
    quarantined; a quarantined task resolved as succeeded left its key free, so ``run
    --key K`` ran K again on a shared database (on the journal the fold indexed it)."""
    j = Journal()
    j.run(A, State.FAILED, Reason.QUARANTINED_ORPHAN_ALIVE, key="k")
    j.write(ev.Resolved(A, 1, "succeeded"))
    assert j.table.succeeded_with_key("k") == A
    rows = j.table.to_snapshot()  # (what postgres.store._table makes of the rows:)
    rebuilt = Table.from_snapshot(
        {"format": rows["format"], "last_seq": 0, "live": [], "settled": rows["settled"],
         "unsafe_keys": None}
    )  # fmt: skip
    assert rebuilt.succeeded_with_key("k") == A
    assert rebuilt.unsafe_with_key("k") is None


def test_a_task_another_task_comes_after_is_not_forgotten_while_that_one_may_run() -> None:
    """A task's ``--after`` needs its dependency's SUCCEEDED when it is claimed: while
    it is queued or running, and while it is FAILED or CANCELLED (a retry of it is
    claimed again): forgetting the dependency would doom the dependant. Once the
    dependant is forgotten (earlier in the same batch too), the dependency may go."""
    j = Journal()
    j.run(A, State.SUCCEEDED)
    j.write(ev.Submitted(B, TaskSpec(argv=("x",), cwd="/", after=(A,)), 1.0))
    assert j.refused(ev.Forgotten(A, 1)) == "task.has_dependants"
    j.write(ev.Claimed(B, 1, "tok", RUNNER, "work"))
    assert j.refused(ev.Forgotten(A, 1)) == "task.has_dependants"  # in flight
    j.write(ev.Settled(B, 1, "tok", State.CANCELLED, Reason.CANCELLED_BY_USER))
    assert j.refused(ev.Forgotten(A, 1)) == "task.has_dependants"  # may be retried
    assert j.refused(ev.Forgotten(A, 1), ev.Forgotten(B, 1)) == "task.has_dependants"
    j.write(ev.Forgotten(B, 1), ev.Forgotten(A, 1))
    assert j.table.ids() == []


def test_a_succeeded_dependant_keeps_nothing() -> None:
    j = Journal()
    j.run(A, State.SUCCEEDED)
    j.run(B, State.SUCCEEDED, after=(A,))
    j.write(ev.Forgotten(A, 1))
    assert j.table.ids() == [B]
