"""``ferry run`` in daily use (contract.md, "Daily use"): one line on stderr when its task
did not succeed (and with -v when it starts and ends), and ``--pty``: a pseudo-terminal
held by the task's supervisor, so that tools keep their colours, and that outlives a
killed ``ferry run`` like the pipes do."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest
from clikit import Ferry, wait_until

pytestmark = pytest.mark.timeout(120)

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
ISATTY = "import sys; print(sys.stdout.isatty(), sys.stderr.isatty())"


def last_task(ferry: Ferry) -> dict[str, object]:
    task: dict[str, object] = ferry.tasks()[-1]
    return task


def test_run_says_in_one_line_when_its_task_did_not_succeed(ferry: Ferry) -> None:
    """Before: nothing but the task's own output and the exit status."""
    result = ferry("run", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    task = last_task(ferry)
    assert (result.code, result.out) == (3, b"out\n")  # passed through as before
    assert result.err == f"err\nferry: task #1 {task['id']} failed: EXIT_NONZERO (exit 3)\n"
    killed = ferry("run", "--", "sh", "-c", "kill -9 $$")
    task = last_task(ferry)
    line = f"ferry: task #2 {task['id']} failed: SIGNALLED (signal 9, exit 137)\n"
    assert (killed.code, killed.err) == (137, line)
    timed_out = ferry("run", "--timeout", "0.2", "--", "sleep", "30")
    task = last_task(ferry)
    assert timed_out.code == 124
    assert re.fullmatch(rf"ferry: task #3 {task['id']} failed: TIMEOUT \((signal 15, )?exit 124\)\n",
                        timed_out.err), timed_out.err  # fmt: skip
    # Success says nothing; -q says nothing either way; the exit status is unchanged.
    assert ferry("run", "--", "true").err == ""
    assert (ferry("-q", "run", "--", "false").code, ferry("-q", "run", "--", "false").err) == (
        1,
        "",
    )
    # --json: the task object on stdout, the line on stderr.
    as_json = ferry("--json", "run", "--", "false")
    assert as_json.json()["state"] == "FAILED" and "failed: EXIT_NONZERO (exit 1)" in as_json.err


def test_run_verbose_says_when_its_task_starts_and_ends(ferry: Ferry) -> None:
    result = ferry.ok("-v", "run", "--name", "greet", "--", "echo", "hi")
    task = last_task(ferry)
    lines = result.err.splitlines()
    assert lines[0] == f"ferry: task #1 {task['id']} started: greet"
    assert re.fullmatch(rf"ferry: task #1 {task['id']} succeeded \(exit 0\) in \S+s", lines[1])
    assert len(lines) == 2 and result.out == b"hi\n"
    failed = ferry("-v", "run", "--", "sh", "-c", "exit 4")
    task = last_task(ferry)
    assert failed.code == 4
    assert failed.err.splitlines()[0] == f"ferry: task #2 {task['id']} started: sh -c exit 4"
    assert re.fullmatch(rf"ferry: task #2 {task['id']} failed: EXIT_NONZERO \(exit 4\) in \S+s",
                        failed.err.splitlines()[1])  # fmt: skip
    # Control characters of the command are shown escaped, never sent to the terminal.
    escaped = ferry.ok("-v", "run", "--", "printf", "\x1b[2J")
    assert "started: printf \\x1b[2J" in escaped.err and "\x1b" not in escaped.err
    # A task skipped for its --key did not start: only the notice that says so.
    ferry.ok("run", "--key", "k", "--", "true")
    skipped = ferry.ok("-v", "run", "--key", "k", "--", "true")
    assert "started" not in skipped.err and "succeeded (exit" not in skipped.err


def test_run_pty_gives_the_task_a_terminal(ferry: Ferry) -> None:
    """Before: no --pty (usage error); without it the task sees pipes (False False)."""
    assert ferry.ok("run", "--", sys.executable, "-c", ISATTY).out == b"False False\n"
    result = ferry.ok("run", "--pty", "--", sys.executable, "-c", ISATTY)
    assert result.out == b"True True\n"  # (no "\r": the log and the echo as written)
    task = last_task(ferry)
    assert task["pty"] is True and ferry.tasks()[0]["pty"] is False
    # Its stdout and stderr are one stream, logged as stdout.
    both = ferry("run", "--pty", "--", "sh", "-c", "echo out; echo err >&2; exit 2")
    assert (both.code, both.out) == (2, b"out\nerr\n")
    task_id = str(last_task(ferry)["id"])
    assert ferry.ok("logs", task_id, "--stream", "stdout").out == b"out\nerr\n"
    assert ferry.ok("logs", task_id, "--stream", "stderr").out == b""
    # The terminal is not its controlling terminal: nothing types into it.
    no_tty = ferry.ok("run", "--pty", "--", "sh", "-c", "test -t 1 && ! (: < /dev/tty) 2>/dev/null")
    assert no_tty.code == 0
    # A queued task too.
    ferry.ok("submit", "--pty", "--", sys.executable, "-c", ISATTY)
    ferry.ok("work", "--drain")
    assert ferry.ok("logs", str(last_task(ferry)["id"])).out == b"True True\n"


def test_kill_9_of_run_pty_leaves_its_task_running_to_its_end(ferry: Ferry, tmp_path: Path) -> None:
    """The supervisor holds the terminal's master: the task neither gets SIGHUP nor
    loses a line when ``ferry run`` dies."""
    gate = tmp_path / "gate"
    script = f'echo first; while [ ! -e "{gate}" ]; do sleep 0.02; done; echo second'
    runner = ferry.start("run", "--pty", "--", "sh", "-c", script)
    task_id = wait_until(lambda: ferry.tasks() and ferry.tasks()[-1]["id"], what="the task")
    log = ferry.home / "logs" / task_id / "1.stdout"
    wait_until(lambda: log.exists() and log.read_bytes() == b"first\n", what="the first line")
    runner.send_signal(signal.SIGKILL)
    assert runner.wait(timeout=30) == -signal.SIGKILL
    gate.touch()

    def settled() -> dict[str, object] | None:
        task = ferry.task(task_id)
        return task if task["state"] in TERMINAL else None

    task = wait_until(settled, what="the task to settle")
    assert (task["state"], task["exit_code"]) == ("SUCCEEDED", 0), task
    assert ferry.ok("logs", task_id).out == b"first\nsecond\n"
    code, report = ferry.recover()
    assert (code, report.get("decisions", [])) == (0, []), report
