"""Compactions interrupted amid concurrent commands (a twelfth-session review's probe,
which held, kept as a regression test: compactions are due every 60 records since the
eleventh session, four times as often as before). Made due every few records here
(``small_archives.py`` lowers SNAPSHOT_TAIL_RECORDS and ARCHIVES_MAX in the command's
process) while `run`, `submit`, `ls` and `show` go on at once, and about half the `run`s and `submit`s of each wave armed at a
compaction's crash points: killed (with their supervisors, or alone) or stopped
there, holding ``compact.lock``, while more commands go on, then continued.

After every wave: every task a command said it queued or ran is listed once, numbers
are 1..N without a gap, `show` (by id and by number) agrees with `ls`, no task is in
a state other than SUCCEEDED or QUEUED, and `journal verify` is clean."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from clikit import Ferry, wait_until

from ferry.proc.process import read_stat

pytestmark = pytest.mark.timeout(600)

WAVES = 12
POINTS = ("before:snapshot_write", "after:snapshot_write",
          "before:archive_index", "after:archive_index")  # fmt: skip
# ferry with archives merged past 4 and a compaction due every 6 records after the snapshot.
SMALL = (sys.executable, str(Path(__file__).with_name("small_archives.py")), "4,,6")


@pytest.fixture
def ferry(tmp_path: Path) -> Iterator[Ferry]:
    f = Ferry(tmp_path / "home", command=SMALL)
    try:
        yield f
    finally:
        f.close()


def _stopped_or_gone(proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        return True
    stat = read_stat(proc.pid)
    return stat is None or stat.state == "T"


def _ids_said(kind: str, out: bytes) -> list[str]:
    doc = orjson.loads(out)
    docs = doc if isinstance(doc, list) else [doc]
    return [d["id"] for d in docs]


def test_compactions_killed_or_stopped_amid_concurrent_commands_lose_nothing(
    ferry: Ferry,
) -> None:
    rng = random.Random(12)
    said: set[str] = set()
    fired = 0
    for wave in range(WAVES):
        point, action = rng.choice(POINTS), rng.choice(("kill", "self", "stop"))
        procs: list[tuple[str, str | None, subprocess.Popen[bytes]]] = []
        for _ in range(6):
            kind = rng.choice(("run", "run", "submit", "submit", "ls", "show"))
            armed = (
                f"{point}={action}" if kind in ("run", "submit") and rng.random() < 0.5 else None
            )
            args = {"run": ("--json", "run", "--", "true"),
                    "submit": ("--json", "submit", "--", "true"),
                    "ls": ("--json", "ls", "--limit", "0"),
                    "show": ("--json", "show", "1") if said else ("--json", "ls")}[kind]  # fmt: skip
            procs.append((kind, armed, ferry.start(*args, failpoints=armed)))
        stopped = []
        for _, armed, proc in procs:
            if armed and armed.endswith("=stop"):
                wait_until(lambda p=proc: _stopped_or_gone(p), what="an armed command")
                if proc.poll() is None:
                    stopped.append(proc)
        if stopped:  # more traffic while a compaction is held still
            for args in (("--json", "run", "--", "true"), ("--json", "submit", "--", "true")):
                result = ferry.ok(*args)
                said.update(_ids_said(args[1], result.out))
            ferry.ok("--json", "ls", "--limit", "0")
            for proc in stopped:
                os.kill(proc.pid, signal.SIGCONT)
        for kind, armed, proc in procs:
            out, err = proc.communicate(timeout=120)
            assert b"Traceback" not in err, err
            if proc.returncode == -signal.SIGKILL and armed:
                fired += 1
                continue
            if proc in stopped:
                fired += 1
            assert proc.returncode == 0, (wave, kind, armed, proc.returncode, err)
            if kind in ("run", "submit"):
                said.update(_ids_said(kind, out))
        tasks = ferry.tasks()
        ids = [t["id"] for t in tasks]
        assert len(ids) == len(set(ids)), f"wave {wave}: a task listed twice"
        assert said <= set(ids), f"wave {wave}: lost {sorted(said - set(ids))}"
        assert sorted(t["number"] for t in tasks) == list(range(1, len(tasks) + 1))
        assert {t["state"] for t in tasks} <= {"SUCCEEDED", "QUEUED"}, wave
        ferry.verify_clean()
    shown = ferry.json("show", *ids)
    shown = shown if isinstance(shown, list) else [shown]
    assert [(t["id"], t["state"], t["attempt"]) for t in shown] == [
        (t["id"], t["state"], t["attempt"]) for t in tasks
    ]
    by_number = ferry.json("show", *(str(t["number"]) for t in tasks))
    by_number = by_number if isinstance(by_number, list) else [by_number]
    assert [t["id"] for t in by_number] == ids
    assert fired > 0, "no compaction was interrupted: the probe probed nothing"
