"""A command that touches a few tasks decodes only those of a long queue (``ferry.core.live``).

A home's snapshot holds every task not settled. ``submit``, ``run``, ``show`` and
``cancel`` of one task used to decode each of them at open (a Task and its TaskSpec:
17 ms of every ``submit`` with 1,000 tasks queued here); now a snapshot's record is
decoded when it is asked for. Counted by wrapping the decoder, in one process, against
real files: the same home, the same commands, answers unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry.cli import main
from ferry.core import live
from ferry.storage.local.store import Store

QUEUED = 300


def _ferry(home: Path, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ferry.cli", "--home", str(home), *args],
        input=stdin, capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.decode()


@pytest.fixture(scope="module")
def queued_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """QUEUED tasks in the snapshot (one group with a limit: the queue has settings)."""
    home = tmp_path_factory.mktemp("lazy") / "home"
    lines = b"".join(b'{"argv": ["true"], "name": "t%d"}\n' % i for i in range(QUEUED))
    _ferry(home, "submit", "--from", "-", stdin=lines)
    _ferry(home, "group", "set", "default", "--jobs", "2")
    _ferry(home, "journal", "compact")
    return home


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The ids of the snapshot records decoded from now on."""
    seen: list[str] = []
    real = live.task_from_record

    def counted(record: Any) -> Any:
        seen.append(record["id"])
        return real(record)

    monkeypatch.setattr(live, "task_from_record", counted)
    yield seen


def test_opening_a_home_decodes_none_of_its_queue(queued_home: Path, decodes: list[str]) -> None:
    store = Store.open(queued_home, read_only=True)
    try:
        assert store.table.count_live() == QUEUED
        assert store.table.count("QUEUED") == QUEUED
        assert decodes == []
        newest = store.table.newest(5)
        assert [t.spec.name for t in newest] == [f"t{i}" for i in range(QUEUED - 5, QUEUED)]
        assert sorted(decodes) == sorted(t.id for t in newest)
    finally:
        store.close()


def test_a_submit_into_a_long_queue_decodes_none_of_it(
    tmp_path: Path, queued_home: Path, decodes: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    home = tmp_path / "home"
    shutil.copytree(queued_home, home)
    assert main(["--home", str(home), "-q", "submit", "--", "true"]) == 0
    assert decodes == []
    assert main(["--home", str(home), "--json", "show", "7"]) == 0  # (by its number)
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["name"] == "t6"
    assert len(decodes) == 1
    # What needs the queue's order decodes it all, once, and answers as before.
    store = Store.open(home, read_only=True)
    try:
        picked = store.table.candidates(3, now=float("inf"))
        assert [t.spec.name for t in picked] == ["t0", "t1"]  # (its group's --jobs 2)
        assert store.table.groups()[0]["queued"] == QUEUED + 1
        assert len(decodes) == 1 + QUEUED  # (show's, then the snapshot's: the new one was folded)
    finally:
        store.close()


def test_a_forgotten_dependency_folded_before_the_queue_is_ordered() -> None:
    """A FORGOTTEN folded (``apply`` checks no dependants: only a write's validation
    does) before a lazily loaded table orders its queue: the queue is ordered as one
    ordered at load, and as a replay of the whole journal (from an adversarial review:
    the dependency's state was None then, and its waiter doomed)."""
    from ferry.core import events as ev
    from ferry.core.model import State
    from ferry.core.spec import TaskSpec
    from ferry.core.state import Table

    runner = {"pid": 7, "start_time": 100.0, "boot_id": "boot", "host": "h"}
    dep, waiter = "01hx6zefg1000000", "01hx6zefg2000000"
    events = [
        ev.Submitted(dep, TaskSpec(argv=("true",), cwd="/"), 1.0),
        ev.Submitted(waiter, TaskSpec(argv=("true",), cwd="/", after=(dep,)), 1.0),
        ev.Claimed(dep, 1, "tok", runner, "work"),
        ev.Dispatching(dep, 1, "tok", "m"),
        ev.Spawned(dep, 1, "tok", 9, 9, 1.0),
        # (the snapshot: dep RUNNING, waiter QUEUED after it)
        ev.Settled(dep, 1, "tok", State.SUCCEEDED, None, 0),
        ev.Forgotten(dep, 1),
    ]
    records = [(*event.encode(), seq, 10.0) for seq, event in enumerate(events, 1)]
    replayed, head = Table(), Table()
    for record in records:
        replayed.apply(*record)
    for record in records[:5]:
        head.apply(*record)
    eager, lazy = Table.from_snapshot(head.to_snapshot()), Table.from_snapshot(head.to_snapshot())
    eager.queue  # noqa: B018 (ordered at load)
    for record in records[5:]:
        eager.apply(*record)
        lazy.apply(*record)

    def answers(table: Table) -> tuple[list[str], list[str]]:
        return [t.id for t in table.candidates(5, now=100.0)], [t.id for t, _ in table.doomed()]

    assert answers(lazy) == answers(eager) == answers(replayed) == ([waiter], [])
