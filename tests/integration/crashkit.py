"""Driving the real ``ferry`` command in crash and recovery tests.

Every test gets its own state directory (a :class:`Ferry`); every ferry process it
starts runs as ``python -m ferry.cli`` with ``FERRY_HOME`` in its environment, so the
tasks it spawns inherit it too. That is how :meth:`Ferry.close` finds and ends whatever
a crash left behind (orphaned tasks, a stopped leader): by scanning ``/proc`` for that
``FERRY_HOME`` and signalling each process only after checking its identity.

Tasks count their real executions by appending one line (their ``FERRY_TASK`` marker) to
a marker file *before* anything else, then print ``ran`` with SIGPIPE ignored (after a
crash the pipe has no reader).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from ferry.model import IN_FLIGHT_STATES
from ferry.process import (
    ProcessIdentity,
    find_by_marker,
    identity_of,
    marker_prefix,
    read_stat,
    signal_verified,
)
from ferry.runner import SPAWNED_AFTER_S

FERRY = (sys.executable, "-m", "ferry.cli")
CLI_TIMEOUT_S = 60.0
WAIT_S = 30.0
POLL_S = 0.02
IN_FLIGHT = frozenset(s.value for s in IN_FLIGHT_STATES)
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def wait_until(condition: Callable[[], Any], *, what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``condition`` until it returns something truthy (returned), or fail."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(POLL_S)


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


class Ferry:
    """One private state directory and the ferry processes started on it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.started: list[subprocess.Popen[bytes]] = []
        self.strays: list[ProcessIdentity] = []  # task processes without FERRY_HOME

    def end_at_close(self, pid: int) -> None:
        """End this process at :meth:`close` (identity taken now): for task processes
        that replaced their environment, which the FERRY_HOME scan cannot find."""
        identity = identity_of(pid)
        if identity is not None:
            self.strays.append(identity)

    def env(self, failpoints: str | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "FERRY_FAILPOINTS"}
        env["FERRY_HOME"] = str(self.home)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if failpoints:
            env["FERRY_FAILPOINTS"] = failpoints
        env.update(extra)
        return env

    def cli(
        self,
        *args: str,
        failpoints: str | None = None,
        input: bytes | None = None,
        timeout_s: float = CLI_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run one ferry command to its end (reaped by subprocess.run, even on timeout)."""
        result = subprocess.run(
            [*FERRY, *args],
            env=self.env(failpoints),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        return subprocess.CompletedProcess(
            result.args,
            result.returncode,
            result.stdout.decode("utf-8", "replace"),
            result.stderr.decode("utf-8", "replace"),
        )

    def ok(
        self, *args: str, codes: Iterable[int] = (0,), **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        result = self.cli(*args, **kw)
        assert result.returncode in set(codes), describe(result)
        return result

    def start(self, *args: str, failpoints: str | None = None) -> subprocess.Popen[bytes]:
        """A ferry process in the background; reaped by :meth:`close` at the latest."""
        proc = subprocess.Popen(
            [*FERRY, *args],
            env=self.env(failpoints),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.started.append(proc)
        return proc

    # ---- looking -------------------------------------------------------------------

    def tasks(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = orjson.loads(self.ok("--json", "ls", "--limit", "0").stdout)
        return result

    def task(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = orjson.loads(self.ok("--json", "show", task_id).stdout)
        return result

    def only_task(self) -> dict[str, Any] | None:
        tasks = self.tasks()
        assert len(tasks) <= 1, tasks
        return tasks[0] if tasks else None

    def records(self) -> list[dict[str, Any]]:
        out = self.ok("journal", "dump").stdout
        return [orjson.loads(line) for line in out.splitlines() if line.strip()]

    def verify(self) -> None:
        result = self.cli("journal", "verify")
        assert result.returncode == 0, describe(result)
        assert "torn" not in result.stdout + result.stderr, describe(result)

    def recover(self, *args: str) -> tuple[int, dict[str, Any]]:
        result = self.cli("--json", "recover", *args)
        assert result.returncode in (0, 3, 75), describe(result)
        report: dict[str, Any] = orjson.loads(result.stdout) if result.stdout.strip() else {}
        return result.returncode, report

    # ---- cleaning up ---------------------------------------------------------------

    def close(self) -> None:
        """End and reap every ferry process started here, then end every process still
        carrying this FERRY_HOME (orphaned tasks, their daemons), identity-checked."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=CLI_TIMEOUT_S)
        for stray in self.strays:
            with contextlib.suppress(OSError):
                signal_verified(stray, signal.SIGKILL, group=False)
        needle = f"FERRY_HOME={self.home}".encode()
        for _ in range(3):
            left = processes_with_env(needle)
            if not left:
                return
            for ident in left:
                with contextlib.suppress(OSError):  # not ours to signal after all
                    signal_verified(ident, signal.SIGKILL, group=False)
            wait_until(
                lambda: not processes_with_env(needle), what="leftover task processes to die"
            )


def processes_with_env(needle: bytes) -> list[ProcessIdentity]:
    """Live processes (never this one) whose environment holds the ``KEY=VALUE`` needle."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb", buffering=0) as f:
                env = f.read().split(b"\0")
            st = read_stat(int(name))
        except (OSError, ValueError):
            continue
        if st is None or st.exited or needle not in env:
            continue
        ident = identity_of(int(name))
        if ident is not None:
            found.append(ident)
    return found


def describe(result: subprocess.CompletedProcess[Any]) -> str:
    return (
        f"{' '.join(map(str, result.args[2:]))} -> exit {result.returncode}\n"
        f"stdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    )


def decision_records(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per task, the records recovery journaled about it (token null, leader epoch)."""
    decided: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        data = record["data"]
        by_leader = record["epoch"] > 0 and data.get("token") is None
        if record["type"] in ("SETTLED", "RELEASED", "STALE") and by_leader:
            decided.setdefault(data["task"], []).append(record)
    return decided
