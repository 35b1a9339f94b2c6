"""docs/recovery.md's matrix is the code: parse the table, check every row against
decide(), and check that every combination of inputs matches exactly one row."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

from ferry.core.model import Liveness, State, Task, TaskSpec
from ferry.core.recovery import Action, Observation, Policy, decide

DOC = Path(__file__).resolve().parents[2] / "docs" / "recovery.md"
LIMIT_S = 30.0

DIMENSIONS: dict[str, tuple[str, ...]] = {
    "state": ("CLAIMED", "DISPATCHING", "RUNNING", "STALE"),
    "runner": ("ALIVE", "DEAD", "UNKNOWN"),
    "task process": ("ALIVE", "DEAD", "UNKNOWN"),
    "heartbeat": ("fresh", "stale", "none"),
    "idempotent": ("yes", "no"),
    "releases": ("below max", "at max"),
    "cancel requested": ("yes", "no"),
}


@dataclass(frozen=True)
class Row:
    number: str
    matches: dict[str, frozenset[str]]
    action: str
    event: str
    outcome: str


def parse_rows() -> list[Row]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| # |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        matches = {}
        for name, values in DIMENSIONS.items():
            cell = cells[name]
            chosen = values if cell == "any" else tuple(v.strip() for v in cell.split(","))
            unknown = set(chosen) - set(values)
            assert not unknown, f"row {cells['#']}: {name} has unknown values {unknown}"
            matches[name] = frozenset(chosen)
        rows.append(
            Row(cells["#"], matches, cells["action"], cells["event"], cells["new state / reason"])
        )
    return rows


ROWS = parse_rows()


def build(case: dict[str, str]) -> tuple[Task, Observation]:
    max_releases = 2
    spec = TaskSpec(
        argv=("true",), cwd="/", idempotent=case["idempotent"] == "yes", max_releases=max_releases
    )
    task = Task(
        id="01hf7yat00c5h66s",
        spec=spec,
        state=State(case["state"]),
        attempt=1,
        releases=max_releases - 1 if case["releases"] == "below max" else max_releases,
        cancel_requested=case["cancel requested"] == "yes",
        claim_token="t" if case["state"] != "QUEUED" else None,
    )
    age = {"fresh": LIMIT_S / 2, "stale": LIMIT_S * 2, "none": None}[case["heartbeat"]]
    seen = Observation(Liveness(case["runner"]), Liveness(case["task process"]), age)
    return task, seen


def test_doc_table_was_found_and_every_action_appears() -> None:
    assert len(ROWS) >= 12
    # The matrix is one host's; a lost host's tasks (a shared database) have their own
    # table in the same page, checked by test_recovery_decide.py.
    one_host = {action.value for action in Action} - {Action.FAIL_HOST_LOST.value}
    assert {row.action for row in ROWS} == one_host
    assert "FAIL_HOST_LOST" in DOC.read_text(encoding="utf-8")


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"row{row.number}-{row.action}")
def test_each_doc_row_matches_decide(row: Row) -> None:
    names = list(DIMENSIONS)
    for values in itertools.product(*(sorted(row.matches[name]) for name in names)):
        case = dict(zip(names, values, strict=True))
        task, seen = build(case)
        decision = decide(task, seen, Policy(stale_after_s=LIMIT_S), now=0.0)
        assert decision.action.value == row.action, f"row {row.number}: {case}"
        if row.event == "none":
            assert decision.event is None
            continue
        assert decision.event is not None
        record_type, data = decision.event
        assert record_type == row.event, f"row {row.number}: {case}"
        new_state, _, reason = row.outcome.partition(" / ")
        if record_type == "SETTLED":
            assert (data["state"], data["reason"]) == (new_state, reason)
        elif record_type == "RELEASED":
            assert (new_state, data["reason"]) == ("QUEUED", reason)
        elif record_type == "STALE":
            assert (new_state, reason) == ("STALE", "HEARTBEAT_STALE")
        else:
            assert (record_type, new_state) == ("RESUMED", "RUNNING")


def test_every_combination_matches_exactly_one_doc_row() -> None:
    names = list(DIMENSIONS)
    for values in itertools.product(*(DIMENSIONS[name] for name in names)):
        case = dict(zip(names, values, strict=True))
        hits = [row.number for row in ROWS if all(case[n] in row.matches[n] for n in names)]
        assert len(hits) == 1, f"{case} matches rows {hits}"
