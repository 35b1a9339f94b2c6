"""ferry's stdout or stderr read by nobody any more (``2>&1 | head -1``, a CI log pipe
closed early, a terminal gone): what ferry says goes nowhere, and nothing else changes.
A command that acts (``run``, ``work``) acts in full and exits with its own status; the
task of a foreground ``run`` runs in the foreground. (A command whose output is its
purpose, ``ls | head``, still stops early and exits 0: tests/integration/test_cli_exit.py.)

Found by a review (sixteenth session): a BrokenPipeError from a notice ended the command
with status 0, whatever its task did; under ``run -v`` it came between the durable
intent and the go, so the task was given back to the queue and run later by whichever
``work`` came next."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clikit import Ferry


@contextmanager
def gone_reader() -> Iterator[int]:
    """The write end of a pipe whose read end is closed: every write gets EPIPE."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        yield write_fd
    finally:
        os.close(write_fd)


def ferry_into(
    ferry: Ferry, *args: str, stdout: int | None = None, stderr: int | None = None
) -> int:
    """Run ferry with stdout and/or stderr going to ``stdout``/``stderr`` (None:
    /dev/null); its exit status."""
    proc = subprocess.run(
        [*ferry.command, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if stdout is None else stdout,
        stderr=subprocess.DEVNULL if stderr is None else stderr,
        env=ferry.env,
        timeout=ferry.timeout_s,
        check=False,
    )
    return proc.returncode


def test_run_with_stderr_read_by_nobody_exits_with_its_task_s_status(ferry: Ferry) -> None:
    with gone_reader() as fd:  # ("failed: EXIT_NONZERO (exit 3)" goes to stderr)
        assert ferry_into(ferry, "run", "--", "sh", "-c", "exit 3", stderr=fd) == 3
    assert ferry.only_task()["state"] == "FAILED"


def test_run_verbose_with_stderr_read_by_nobody_runs_its_task_in_the_foreground(
    ferry: Ferry, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    with gone_reader() as fd:  # ("started ..." under -v comes between intent and spawn)
        status = ferry_into(ferry, "-v", "run", "--", "sh", "-c", f"echo x >> {ran}; exit 3",
                            stderr=fd)  # fmt: skip
    assert status == 3
    assert ran.read_text() == "x\n"
    task = ferry.only_task()
    assert (task["state"], task["attempt"]) == ("FAILED", 1)


def test_run_json_with_stdout_read_by_nobody_exits_with_its_task_s_status(ferry: Ferry) -> None:
    with gone_reader() as fd:
        assert ferry_into(ferry, "--json", "run", "--", "sh", "-c", "exit 3", stdout=fd) == 3
    assert ferry.only_task()["state"] == "FAILED"


def test_work_with_both_read_by_nobody_drains_the_queue_and_says_a_task_failed(
    ferry: Ferry,
) -> None:
    lines = b"".join(
        json.dumps({"argv": ["sh", "-c", f"exit {n % 2}"]}).encode() + b"\n" for n in range(6)
    )
    ferry.ok("submit", "--from", "-", stdin=lines)
    with gone_reader() as fd:
        assert ferry_into(ferry, "work", "-j", "2", "--drain", stdout=fd, stderr=fd) == 1
    with gone_reader() as fd:  # (--json: each task settled is a line on stdout)
        ferry.ok("retry", "--state", "FAILED")
        assert ferry_into(ferry, "--json", "work", "--drain", stdout=fd, stderr=fd) == 1
    states = sorted(task["state"] for task in ferry.tasks())
    assert states == ["FAILED"] * 3 + ["SUCCEEDED"] * 3


def test_run_s_task_gets_sigpipe_once_the_reader_of_its_output_went(ferry: Ferry) -> None:
    # `ferry run -- yes | head -1` ends as `yes | head -1` does: the task's next write
    # after the reader went fails (SIGPIPE). (Was: ferry kept reading and logging for
    # ever, gigabytes a second, the task RUNNING.)
    proc = subprocess.Popen([*ferry.command, "run", "--", "yes"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ferry.env)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"y\n"
        proc.stdout.close()  # (head -1 exits)
        assert proc.wait(timeout=ferry.timeout_s) == 128 + 13
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    task = ferry.only_task()
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", 13)
    log = ferry.ok("logs", task["id"], "--stream", "stdout").out
    assert log.startswith(b"y\ny\n") and set(log) == set(b"y\n")  # (what it wrote until then)
