"""A state directory written by ferry before queue control (groups, priorities,
dependencies, retries) must read back unchanged, forever: tests/golden/ferry-v1/ holds
its journal (a snapshot, its archive and records after it) as ferry wrote them, and
tasks.json the task objects that ferry read from it then. Never regenerate these files
to make this test pass: a failure means old journals no longer read as they were."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from ferry.core.model import task_to_json
from ferry.storage.local.store import Store, check_table

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "ferry-v1"


def test_an_old_state_directory_reads_back_as_it_was(tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(GOLDEN, home, ignore=shutil.ignore_patterns("tasks.json"))
    expected = orjson.loads((GOLDEN / "tasks.json").read_bytes())
    store = Store.open(home)
    try:
        check_table(store.table)
        tasks = [task_to_json(task) for task in store.table.tasks()]
        assert store.table.anomalies == []
    finally:
        store.close()
    assert [task["id"] for task in tasks] == [task["id"] for task in expected]
    for got, want in zip(tasks, expected, strict=True):
        assert {key: got[key] for key in want} == want
