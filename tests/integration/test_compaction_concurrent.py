"""Compactions due every 60 records (SNAPSHOT_TAIL_RECORDS) while runs, submits, `ls` and
`show` go on at once: history stays whole, ids unique, the journal clean (a review)."""

from __future__ import annotations

import threading

import pytest
from clikit import Ferry

pytestmark = pytest.mark.timeout(600)
RUNS = 40


def test_concurrent_runs_and_submits_compacting_often_keep_history_whole(
    ferry: Ferry,
) -> None:
    ferry.ok("run", "--", "true")
    first_id = ferry.tasks()[0]["id"]
    results: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def loop(args: tuple[str, ...], n: int) -> None:
        for _ in range(n):
            r = ferry(*args)
            with lock:
                results.append((args[0], r.code, r.err))

    def reader(n: int) -> None:
        for _ in range(n):
            r = ferry("--json", "show", first_id)
            with lock:
                results.append(("show", r.code, r.err))
            r = ferry("--json", "ls", "--limit", "5")
            with lock:
                results.append(("ls", r.code, r.err))

    threads = [threading.Thread(target=loop, args=(("run", "--", "true"), RUNS)) for _ in range(5)]
    threads += [
        threading.Thread(target=loop, args=(("submit", "--", "true"), 25)) for _ in range(2)
    ]
    threads += [threading.Thread(target=reader, args=(12,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=500)
    bad = [r for r in results if r[1] != 0 or (r[2].strip() and "shown; --limit 0" not in r[2])]
    assert not bad, bad[:5]
    tasks = ferry.tasks()
    assert len(tasks) == 1 + 5 * RUNS + 2 * 25
    assert len({t["id"] for t in tasks}) == len(tasks)
    states = {t["state"] for t in tasks}
    assert states <= {"SUCCEEDED", "QUEUED"}, states
    assert ferry.task(first_id)["state"] == "SUCCEEDED"
    ferry.verify_clean()
    archives = list((ferry.home / "archive").glob("settled-*.jsonl"))
    assert 0 < len(archives) < 30, len(archives)
    # A fresh `ferry work --drain` runs the 50 queued tasks; history still whole.
    ferry.ok("work", "--drain", "-j", "2", "--poll", "0.05")
    tasks = ferry.tasks()
    assert {t["state"] for t in tasks} == {"SUCCEEDED"}
    assert len(tasks) == 1 + 5 * RUNS + 2 * 25
    ferry.verify_clean()
