"""The one driver of the real ``ferry`` command in the integration tests.

A :class:`Ferry` owns a private state directory (its ``FERRY_HOME``) and runs ferry on
it in subprocesses, as a user or a script does: a command to its end (``ferry(...)``,
:meth:`Ferry.ok`, :meth:`Ferry.refused`, each giving a :class:`Result`), or one in the
background (:meth:`Ferry.start`). Each command gets the test runner's environment with
``FERRY_HOME`` set and ``FERRY_FAILPOINTS`` / ``FERRY_DEBUG`` removed (a test arms a
failpoint per command with ``failpoints=``), and must not print a traceback. The tasks
ferry spawns inherit ``FERRY_HOME``: that is how :meth:`Ferry.close` finds and ends what
a test left behind (orphaned tasks, their daemons, a stopped leader), by scanning
``/proc`` and signalling each process only after checking its identity.

No fixed sleeps: waits poll with a deadline (:func:`wait_until`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from ferry.proc.process import ProcessIdentity, identity_of, read_stat, signal_verified

FERRY = (sys.executable, "-m", "ferry.cli")
CLI_TIMEOUT_S = 60.0
WAIT_S = 30.0
POLL_S = 0.02
ERROR_LINE = re.compile(r"^ferry: error\[([a-z_]+(?:\.[A-Za-z_]+)*)\]: \S.*$")

Output = int | IO[bytes]  # subprocess.PIPE or DEVNULL, or an open file


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


def wait_stopped(proc: subprocess.Popen[bytes], *, what: str) -> None:
    """Until ``proc`` is stopped (SIGSTOP: state T); fail if it exits instead."""

    def stopped() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what}: it exited with {proc.returncode} instead")
        st = read_stat(proc.pid)
        return st is not None and st.state == "T"

    wait_until(stopped, what=what)


def finish(proc: subprocess.Popen[bytes], timeout_s: float = WAIT_S) -> tuple[int, str]:
    """Continue ``proc`` if it is stopped, wait for its end: its exit status and stderr."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, err.decode("utf-8", "replace")


Hosts = Callable[[str], "Ferry"]  # the ``hosts`` fixture: simulated hosts on one database

# Not passed on: ferry's own switches, and what shapes output for a terminal (tox sets
# COLUMNS to its own width; a test that wants one sets it).
UNSET = frozenset(
    ("FERRY_FAILPOINTS", "FERRY_DEBUG", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")
)


@dataclass
class Result:
    """A finished ferry command: its arguments, exit status, stdout and stderr."""

    args: tuple[str | bytes, ...]
    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode()

    def json(self) -> Any:
        return orjson.loads(self.out)

    def error_code(self) -> str:
        """The code of the one error line on stderr (the last line: a task's own stderr
        may come before it)."""
        lines = self.err.splitlines()
        assert lines, f"no error line on stderr (exit {self.code})"
        match = ERROR_LINE.match(lines[-1])
        assert match is not None, f"not a coded error line: {lines[-1]!r}"
        assert sum(1 for line in lines if line.startswith("ferry: error[")) == 1, self.err
        return match.group(1)


def _default_signals() -> None:
    # A test runner started from a non-interactive shell may inherit SIGINT ignored;
    # ferry (rightly) keeps an inherited SIG_IGN, which would defeat the signal tests.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


class Ferry:
    """The ferry command on one private state directory, and the processes it left.

    ``workdir`` is the current directory of every command (None: the test runner's);
    ``command`` runs ferry (``python -m ferry.cli`` unless told: a module that tests the
    console script passes it); ``timeout_s`` bounds each command; ``start_stdout`` is
    where :meth:`start`'s processes write their stdout unless a call says otherwise.
    """

    def __init__(
        self,
        home: Path,
        workdir: Path | None = None,
        *,
        command: Sequence[str] = FERRY,
        timeout_s: float = CLI_TIMEOUT_S,
        start_stdout: Output = subprocess.PIPE,
    ) -> None:
        self.home = home
        self.workdir = workdir
        self.command = tuple(command)
        self.timeout_s = timeout_s
        self.start_stdout = start_stdout
        self.env = {k: v for k, v in os.environ.items() if k not in UNSET}
        self.env["FERRY_HOME"] = str(home)
        self.env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.background: list[subprocess.Popen[bytes]] = []
        self.strays: list[ProcessIdentity] = []  # task processes without FERRY_HOME

    def _env(self, failpoints: str | None) -> dict[str, str]:
        return {**self.env, "FERRY_FAILPOINTS": failpoints} if failpoints else self.env

    # ---- running -------------------------------------------------------------------

    def __call__(
        self,
        *args: str | bytes,
        stdin: bytes | int | None = None,
        stdout: Output = subprocess.PIPE,
        failpoints: str | None = None,
        command: Sequence[str] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> Result:
        """Run one ferry command to its end (reaped by subprocess.run, even on timeout).
        ``stdin``: bytes to feed, a file descriptor, or None for /dev/null; ``command``
        replaces the driver's for this call; ``preexec`` runs in the child before exec."""
        feed = stdin if isinstance(stdin, bytes) else None
        source = None if feed is not None else subprocess.DEVNULL if stdin is None else stdin
        proc = subprocess.run(
            [*(command or self.command), *args],
            input=feed,
            stdin=source,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=self._env(failpoints),
            cwd=self.workdir,
            timeout=self.timeout_s,
            check=False,
            preexec_fn=preexec,
        )
        err = proc.stderr.decode("utf-8", "replace")
        result = Result(args, proc.returncode, proc.stdout or b"", err)
        assert "Traceback" not in result.err, result
        assert b"Traceback" not in result.out, result
        return result

    def ok(self, *args: str | bytes, codes: Iterable[int] = (0,), **kw: Any) -> Result:
        """Run a command that must exit with one of ``codes``."""
        result = self(*args, **kw)
        assert result.code in set(codes), result
        return result

    def json(self, *args: str | bytes, **kw: Any) -> Any:
        """The one JSON document a ``--json`` command that must succeed prints."""
        return self.ok("--json", *args, **kw).json()

    def refused(self, exit_code: int, code: str, *args: str | bytes, **kw: Any) -> Result:
        """Run a command that must fail: ``exit_code``, a coded line whose code is
        ``code`` (or starts with it when ``code`` ends in '.'), no traceback."""
        result = self(*args, **kw)
        assert result.code == exit_code, result
        got = result.error_code()
        assert got == code or (code.endswith(".") and got.startswith(code)), (got, result.err)
        return result

    def start(
        self,
        *args: str,
        failpoints: str | None = None,
        stdout: Output | None = None,
        command: Sequence[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A ferry process in the background, in a session of its own with default
        SIGINT/SIGTERM/SIGHUP: stdin /dev/null, stderr a pipe, stdout ``stdout`` (None:
        the driver's ``start_stdout``); ``command`` replaces the driver's. Reaped by
        :meth:`close` at the latest."""
        proc = subprocess.Popen(
            [*(command or self.command), *args],
            stdin=subprocess.DEVNULL,
            stdout=self.start_stdout if stdout is None else stdout,
            stderr=subprocess.PIPE,
            env=self._env(failpoints),
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=_default_signals,
        )
        self.background.append(proc)
        return proc

    def start_stopped(self, *args: str, at: str) -> subprocess.Popen[bytes]:
        """:meth:`start`, with the failpoint ``at`` armed to SIGSTOP the command there;
        returns once it is stopped (continue it with ``os.kill(pid, SIGCONT)``)."""
        proc = self.start(*args, failpoints=f"{at}=stop")
        wait_stopped(proc, what=f"{args[0]} to stop at {at}")
        return proc

    # ---- looking -------------------------------------------------------------------

    def stopped_runner(self, task_id: str) -> int:
        """The pid of the task's supervisor, once stopped (a ``supervisor:...=stop``
        failpoint)."""

        def stopped() -> int | None:
            pid = (self.task(task_id).get("runner") or {}).get("pid")
            st = None if pid is None else read_stat(pid)
            return pid if st is not None and st.state == "T" else None

        found: int = wait_until(stopped, what="the task's supervisor to stop")
        return found

    def tasks(self) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = self.json("ls", "--limit", "0")
        return tasks

    def task(self, task_id: str) -> dict[str, Any]:
        task: dict[str, Any] = self.json("show", task_id)
        return task

    def only_task(self) -> dict[str, Any]:
        """The one task there is (there must be exactly one)."""
        tasks = self.tasks()
        assert len(tasks) == 1, tasks
        return tasks[0]

    def only_task_or_none(self) -> dict[str, Any] | None:
        """The one task there is, or None (there must not be more than one)."""
        tasks = self.tasks()
        assert len(tasks) <= 1, tasks
        return tasks[0] if tasks else None

    def wait_running(self) -> dict[str, Any]:
        """The one task, once it is RUNNING (its SPAWNED is durable)."""

        def running() -> dict[str, Any] | None:
            tasks = self.tasks()
            return tasks[0] if tasks and tasks[0]["state"] == "RUNNING" else None

        task: dict[str, Any] = wait_until(running, what="the task to be RUNNING")
        return task

    def records(self) -> list[dict[str, Any]]:
        """Every journal record (``journal dump`` prints JSON Lines)."""
        return [orjson.loads(line) for line in self.ok("journal", "dump").out.splitlines()]

    def verify_clean(self) -> dict[str, Any]:
        """``journal verify`` exits 0 and reports a clean journal (not torn, not corrupt)."""
        report: dict[str, Any] = self.json("journal", "verify")
        assert report["status"] == "clean", report
        return report

    def recover(self, *args: str) -> tuple[int, dict[str, Any]]:
        """``recover``'s exit status (0, 3 or 75) and its JSON report ({} if none)."""
        result = self("--json", "recover", *args)
        assert result.code in (0, 3, 75), result
        report: dict[str, Any] = result.json() if result.out.strip() else {}
        return result.code, report

    def live_task_processes(self) -> list[ProcessIdentity]:
        """Live processes of any task of this FERRY_HOME (they carry a FERRY_TASK marker)."""
        return processes_with_env(b"FERRY_HOME=" + os.fsencode(self.home), b"FERRY_TASK=")

    # ---- cleaning up ---------------------------------------------------------------

    def end_at_close(self, pid: int) -> None:
        """End this process at :meth:`close` (identity taken now): for task processes
        that replaced their environment, which the FERRY_HOME scan cannot find."""
        identity = identity_of(pid)
        if identity is not None:
            self.strays.append(identity)

    def close(self) -> None:
        """End and reap every ferry process started here, then end every process still
        carrying this FERRY_HOME (orphaned tasks, their daemons), identity-checked."""
        for proc in self.background:
            if proc.poll() is None:
                proc.kill()
        for stray in self.strays:
            with contextlib.suppress(OSError):
                signal_verified(stray, signal.SIGKILL, group=False)
        needle = b"FERRY_HOME=" + os.fsencode(self.home)
        for _ in range(3):
            left = processes_with_env(needle)
            if not left:
                break
            for ident in left:
                with contextlib.suppress(OSError):  # not ours to signal after all
                    signal_verified(ident, signal.SIGKILL, group=False)
            wait_until(
                lambda: not processes_with_env(needle), what="leftover task processes to die"
            )
        # Reaped last: a command's supervisors (which outlive it) hold its stderr open
        # until they end, so reading it to its end had to wait for their tasks.
        for proc in self.background:
            proc.communicate(timeout=self.timeout_s)


def processes_with_env(needle: bytes, *prefixes: bytes) -> list[ProcessIdentity]:
    """Live processes (never this one) whose environment holds the ``KEY=VALUE`` needle
    and, for each of ``prefixes``, a variable that starts with it."""
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
        if not all(any(v.startswith(p) for v in env) for p in prefixes):
            continue
        ident = identity_of(int(name))
        if ident is not None:
            found.append(ident)
    return found


def read_until(proc: subprocess.Popen[bytes], text: str) -> str:
    """Read ``proc``'s stderr until ``text`` appears (or fail at the deadline)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    os.set_blocking(fd, False)
    seen = b""

    def found() -> bool:
        nonlocal seen
        with contextlib.suppress(BlockingIOError):
            seen += os.read(fd, 65536) or b""
        return text.encode() in seen

    try:
        wait_until(found, what=f"{text!r} on the stderr of {proc.args!r}")
    finally:
        os.set_blocking(fd, True)
    return seen.decode()


def says_once_when_no_work_runs(submitter: Ferry, waiter: Ferry) -> None:
    """``waiter``'s ``wait`` on a task ``submitter`` queued says once that no ``work``
    runs to start it (after 5 s with no leader), and not while a ``work`` of
    ``submitter``'s leads (its group paused, so that the task stays queued)."""
    task_id = submitter.ok("submit", "--", "true").text.strip()
    hint = f"task {task_id} is queued and no 'ferry work' is running to start it"
    waited = waiter("wait", "--timeout", "6", task_id)
    assert waited.code == 124 and waited.err.count(hint) == 1, waited
    submitter.ok("pause")
    worker = submitter.start("work")
    try:
        wait_until(lambda: submitter.ok("--json", "lease").json()["holder"], what="work to lead")
        waited = waiter("wait", "--timeout", "6", task_id)
        assert waited.code == 124 and hint not in waited.err, waited
    finally:
        worker.terminate()
        finish(worker)
