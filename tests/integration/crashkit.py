"""Helpers of the crash and recovery tests, which drive ferry with :class:`clikit.Ferry`
(the shared ``ferry`` fixture of conftest.py): tasks that count their executions, and
ways to find and wait for a task's processes.

Tasks count their real executions by appending one line (their ``FERRY_TASK`` marker) to
a marker file *before* anything else, then print ``ran`` with SIGPIPE ignored (after a
crash the pipe has no reader).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from clikit import WAIT_S, Ferry, wait_until

from ferry.app.runner import SPAWNED_AFTER_S
from ferry.proc.process import ProcessIdentity, find_by_marker, marker_prefix, read_stat

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


# Shell text for a task that outlives SPAWNED_AFTER_S: its SPAWNED gets a write of its
# own, before SETTLED's (a shorter task's SPAWNED goes in SETTLED's write).
OUTLIVES_SPAWNED = f"; sleep {SPAWNED_AFTER_S * 6}"


def counting_task(mark: Path, *, linger: str = "") -> list[str]:
    """argv of a task that records one real execution in ``mark``, then ``linger``
    (shell text: e.g. ``"; exec sleep 300"`` for one that stays alive)."""
    # SIGPIPE ignored: after a crash the pipe has no reader, and a lingering task must
    # not die of its own "ran" (a real one might: that is a row of the table too).
    script = 'echo "$FERRY_TASK" >> "$0"; trap "" PIPE; echo ran' + linger
    return ["/bin/sh", "-c", script, str(mark)]


def runs(mark: Path) -> int:
    """How many times the task of ``mark`` really started."""
    try:
        return len(mark.read_text().splitlines())
    except FileNotFoundError:
        return 0


def task_processes(task_id: str) -> tuple[ProcessIdentity, ...]:
    """Live (non-zombie) processes carrying any attempt's marker of ``task_id``."""
    return find_by_marker(marker_prefix(task_id)).alive


def wait_task_gone(task_id: str, timeout_s: float = WAIT_S) -> None:
    wait_until(
        lambda: not task_processes(task_id), what=f"task {task_id} to end", timeout_s=timeout_s
    )


def pid_gone(pid: int) -> bool:
    """No process (not even a zombie) has ``pid``: the number is free for reuse."""
    return read_stat(pid) is None


def decision_records(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per task, the records recovery journaled about it (a leader's epoch, and the
    recovery evidence that ``recovery.decide`` puts in each)."""
    decided: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        data = record["data"]
        by_leader = record["epoch"] > 0 and "recovery" in (data.get("evidence") or {})
        if record["type"] in ("SETTLED", "RELEASED", "STALE") and by_leader:
            decided.setdefault(data["task"], []).append(record)
    return decided


def stamping_task(stamps: Path, n: int, sleep_s: float, mark: Path | None = None) -> list[str]:
    """A task that appends ``start <n> <time>`` and ``end <n> <time>`` to ``stamps`` (and
    first counts its execution in ``mark``, as counting_task does)."""
    now = "date +%s.%N"
    count = 'echo "$FERRY_TASK" >> "$1"; ' if mark is not None else ""
    script = (f'{count}echo "start {n} $({now})" >> "$0"; sleep {sleep_s}; '
              f'echo "end {n} $({now})" >> "$0"')  # fmt: skip
    return ["/bin/sh", "-c", script, str(stamps), *([str(mark)] if mark else [])]


def most_at_once(stamps: Path) -> int:
    """The most tasks running at one time, by their own stamps."""
    events = []
    for line in stamps.read_text().splitlines():
        kind, _, at = line.split()
        events.append((float(at), 1 if kind == "start" else -1))
    running = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start
        running += step
        peak = max(peak, running)
    return peak


def restart_worker_midway(
    ferry: Ferry, stamps: Path, *, tasks: int, jobs: int, before_restart: Callable[[], None]
) -> None:
    """``tasks`` stamping tasks of 1.5 s; a ``work -j jobs`` killed with SIGKILL once
    ``jobs`` of them started; ``before_restart()``; a ``work -j jobs --drain``; then
    until every task's processes are gone."""
    for n in range(tasks):
        ferry.ok("submit", "--", *stamping_task(stamps, n, 1.5))
    first = ferry.start("work", "-j", str(jobs), "--poll", "0.05")
    wait_until(lambda: stamps.exists() and stamps.read_text().count("start") == jobs,
               what=f"{jobs} task(s) to start")  # fmt: skip
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    before_restart()
    ferry.ok("work", "-j", str(jobs), "--drain", "--poll", "0.05")
    for task in ferry.tasks():
        wait_task_gone(str(task["id"]))


def survivor_keeps_its_slot_under_a_new_host_id(a: Ferry, stamps: Path) -> None:
    """On a shared database: ``work -j 1`` on ``a`` (its host id ``a``) claims x and is
    killed while x's supervisor is stopped before the alive-lock exists; a ``work``
    restarted in the same home under a new host id must count that survivor (only the
    claim's ``runner.home`` tells it is this home's) and run y only after x."""
    import os

    x = a.ok("submit", "--", *stamping_task(stamps, 0, 0.2)).out.decode().strip()
    a.ok("submit", "--", *stamping_task(stamps, 1, 0.2))
    first = a.start("work", "-j", "1", "--poll", "0.05", failpoints="supervisor:before:spawn=stop")
    supervisor = wait_until(lambda: (t := a.task(x))["state"] == "DISPATCHING" and t["runner"]["pid"],
                            what="x's claim")  # fmt: skip
    wait_until(lambda: read_stat(supervisor).state == "T", what="x's supervisor to stop")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert not (a.home / "heartbeats" / f"{x}.1").exists()
    a.env["FERRY_HOST_ID"] = "a-renamed"
    second = a.start("work", "-j", "1", "--drain", "--poll", "0.05")
    try:
        assert second.stderr is not None
        notice = second.stderr.readline()  # (once it counted the survivors)
        assert (
            b"1 task(s) of this home already run (under an earlier work's supervisors" in notice
        ), notice
    finally:
        os.kill(supervisor, signal.SIGCONT)
    assert second.wait(timeout=60) == 0
    wait_task_gone(x)
    assert [t["state"] for t in a.tasks()] == ["SUCCEEDED"] * 2
    assert most_at_once(stamps) == 1 and stamps.read_text().startswith("start 0")


def kill_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool], deadline_s: float) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` (polled without a pause: the moment is the
    point, a write under way), then reap it; it must still run until then."""
    try:
        deadline = time.monotonic() + deadline_s
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the moment to kill never came"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=deadline_s)  # (reaped)
    assert proc.returncode == -signal.SIGKILL
