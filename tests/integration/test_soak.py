"""Soak: hundreds of tasks, ``ferry work -j 2`` killed with SIGKILL at random moments
many times and restarted (sometimes with a standby worker racing it, sometimes with a
``ferry recover`` or a ``ferry journal compact`` in between), then a final recover and
drain. It must end with no task lost, none in flight, no mutating task run twice, and
a clean journal. The figures are printed for the reliability report (``pytest -s``).

``FERRY_SOAK_SEED`` replays a run; ``FERRY_SOAK_KILLS`` / ``FERRY_SOAK_TASKS`` scale it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from clikit import Ferry, processes_with_env, wait_until
from crashkit import TERMINAL, runs

pytestmark = [pytest.mark.soak, pytest.mark.timeout(600)]

KILLS = int(os.environ.get("FERRY_SOAK_KILLS", "50"))
TASKS = int(os.environ.get("FERRY_SOAK_TASKS", "500"))
BATCHES = 10
WORK = ("work", "-j", "2", "--poll", "0.05", "--lease-ttl", "5")
# Some rounds the worker also dies by itself at the Nth pass of a point on the task path.
POINTS = ("after:CLAIMED", "after:spawn", "after:SPAWNED", "before:SETTLED", "after:SETTLED")


def task_line(marks: Path, number: int, rng: random.Random) -> bytes:
    pause = rng.choice(("0", "0.01", "0.05", "0.1", "0.2"))
    script = f'echo "$FERRY_TASK" >> "$0"; sleep {pause}; echo ran'
    spec = {
        "argv": ["/bin/sh", "-c", script, str(marks / str(number))],
        "idempotent": number % 3 == 0,
        "name": f"soak-{number}",
    }
    return orjson.dumps(spec)


def kill_and_reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)


def test_soak_work_killed_and_restarted(ferry: Ferry, tmp_path: Path) -> None:
    seed = int(os.environ.get("FERRY_SOAK_SEED", str(time.time_ns() % 1_000_000)))
    rng = random.Random(seed)
    print(f"\nsoak: seed {seed} (FERRY_SOAK_SEED={seed} replays it)")
    marks = tmp_path / "marks"
    marks.mkdir()
    started = time.monotonic()
    submitted: list[str] = []
    per_batch = -(-TASKS // BATCHES)
    events: Counter[str] = Counter()

    for kill in range(KILLS):
        if kill % max(1, KILLS // BATCHES) == 0 and len(submitted) < TASKS:
            first = len(submitted)
            count = min(per_batch, TASKS - first)
            lines = [task_line(marks, first + i, rng) for i in range(count)]
            out = ferry.ok("submit", "--from", "-", stdin=b"\n".join(lines) + b"\n").text
            submitted += out.split()
        failpoint = None
        if rng.random() < 0.3:
            failpoint = f"{rng.choice(POINTS)}={rng.randint(1, 6)}"
            events["rounds with a failpoint"] += 1
        workers = [ferry.start(*WORK, failpoints=failpoint)]
        if rng.random() < 0.3:  # a standby that takes over from the dead leader at once
            workers.append(ferry.start(*WORK))
            events["with a standby"] += 1
        time.sleep(rng.uniform(0.05, 1.5))  # the random moment of the crash (the stimulus)
        roll = rng.random()
        if roll < 0.15:  # an operator's compaction while the worker appends
            ferry.ok("journal", "compact")
            events["compactions while a worker runs"] += 1
        elif roll < 0.3:  # cron's recover while a worker leads: 75, or it decides
            code, _ = ferry.recover()
            events[f"recover while a worker runs, exit {code}"] += 1
        victims = workers if rng.random() < 0.7 else workers[:1]
        kill_and_reap(victims)
        if len(victims) < len(workers):  # the standby leads on for a moment, then dies too
            time.sleep(rng.uniform(0.05, 0.5))
            kill_and_reap(workers)
        events["kills"] += len(workers)
        roll = rng.random()
        if roll < 0.25:
            code, _ = ferry.recover()
            events[f"recover exit {code}"] += 1
        elif roll < 0.35:
            ferry.ok("journal", "compact")
            events["compactions"] += 1
    # Whatever the submission schedule left out (few kills, many tasks).
    while len(submitted) < TASKS:
        first = len(submitted)
        lines = [task_line(marks, first + i, rng) for i in range(min(per_batch, TASKS - first))]
        out = ferry.ok("submit", "--from", "-", stdin=b"\n".join(lines) + b"\n").text
        submitted += out.split()

    # The end: orphans finish by themselves (their tasks are short), recovery decides
    # them, and a drain runs whatever was requeued.
    home_marker = f"FERRY_HOME={ferry.home}".encode()
    wait_until(lambda: not processes_with_env(home_marker), what="orphans to finish", timeout_s=120)
    code, _ = ferry.recover()
    assert code in (0, 3)
    ferry.ok("work", "--drain", "-j", "2", "--poll", "0.05", codes=(0,))
    elapsed_s = time.monotonic() - started

    tasks = {t["id"]: t for t in ferry.tasks()}
    assert len(submitted) == TASKS and sorted(tasks) == sorted(submitted), "a task was lost"
    outcomes = Counter((t["state"], t["reason"]) for t in tasks.values())
    for task in tasks.values():
        assert task["state"] in TERMINAL, f"left {task['state']}: {task['id']}"
        count = runs(marks / task["name"].removeprefix("soak-"))
        if not task["idempotent"]:
            assert count <= 1, f"mutating task {task['id']} ran {count} times"
        if task["state"] == "SUCCEEDED":
            assert count >= 1
    ferry.verify_clean()
    reruns = sum(max(0, runs(marks / t["name"].removeprefix("soak-")) - 1) for t in tasks.values())
    print(
        f"soak: {TASKS} tasks, {KILLS} crash rounds, {events['kills']} ferry work processes "
        "SIGKILLed or crashed "
        f"({events['with a standby']} rounds with a standby, "
        f"{events['rounds with a failpoint']} with a failpoint armed), "
        f"{sum(v for k, v in events.items() if k.startswith('recover exit'))} recovers and "
        f"{events['compactions']} compactions in between, "
        f"{sum(v for k, v in events.items() if k.startswith('recover while'))} recovers and "
        f"{events['compactions while a worker runs']} compactions concurrent with a worker, "
        f"elapsed {elapsed_s:.1f} s"
    )
    print(f"soak: outcomes {dict(sorted(outcomes.items(), key=str))}")
    print(f"soak: idempotent re-executions {reruns}; mutating tasks run twice: 0")
