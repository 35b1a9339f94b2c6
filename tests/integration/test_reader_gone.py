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
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from clikit import Ferry, wait_until


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


@pytest.mark.parametrize("pty", [False, True])
def test_run_s_task_gets_sigpipe_once_the_reader_of_its_output_went(
    ferry: Ferry, pty: bool
) -> None:
    # `ferry run -- yes | head -1` ends as `yes | head -1` does: the task's next write
    # after the reader went fails (SIGPIPE; on a terminal, EIO). (Was: ferry kept
    # reading and logging for ever, gigabytes a second, the task RUNNING.)
    argv = [*ferry.command, "run", *(["--pty"] if pty else []), "--", "yes"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=ferry.env)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"y\n"
        proc.stdout.close()  # (head -1 exits)
        status = proc.wait(timeout=ferry.timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    task = ferry.only_task()
    if pty:  # (yes: "standard output: Input/output error", exit 1)
        assert (status, task["state"], task["reason"]) == (1, "FAILED", "EXIT_NONZERO")
    else:
        assert (status, task["state"], task["signal"]) == (128 + 13, "FAILED", 13)
    log = ferry.ok("logs", task["id"], "--stream", "stdout").out
    assert log.startswith(b"y\ny\n") and set(log) == set(b"y\n")  # (what it wrote until then)


# Writes 1 KiB lines, one write each, and counts those that returned (in argv[1], kept
# up to date); SIGPIPE ignored: the write that fails says so, and it exits 7.
COUNTED_WRITES = """
import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
n = 0
try:
    while True:
        os.write(1, b"x" * 1023 + b"\\n")
        n += 1
        if n % 100 == 0:
            with open(sys.argv[1] + ".new", "w") as f:
                f.write(str(n))
            os.replace(sys.argv[1] + ".new", sys.argv[1])
except OSError:
    with open(sys.argv[1] + ".new", "w") as f:
        f.write(f"{n} done")
    os.replace(sys.argv[1] + ".new", sys.argv[1])
    sys.exit(7)
"""


def test_what_the_task_wrote_before_the_reader_went_is_all_logged(
    ferry: Ferry, tmp_path: Path
) -> None:
    # The reader never reads: passthrough backs up (ferry's pipe, its 4 MiB backlog),
    # ferry stops reading the task's pipe, which fills. Then the reader goes. (Was: the
    # task's pipe was closed unread: up to 1 MiB it had written, lost from its log.)
    count = tmp_path / "count"
    proc = subprocess.Popen([*ferry.command, "run", "--", sys.executable, "-c", COUNTED_WRITES,
                             str(count)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=ferry.env)  # fmt: skip
    try:
        wait_until(lambda: count.exists() and int(count.read_text().split()[0]) > 5600,
                   what="the task to write past the passthrough's backlog")  # fmt: skip
        assert proc.stdout is not None
        proc.stdout.close()
        assert proc.wait(timeout=ferry.timeout_s) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    written, done = count.read_text().split()
    assert done == "done"
    task = ferry.only_task()
    # What it wrote between the supervisor's last read and its close of the pipe is
    # lost (as a shell pipe loses it): a page at most, the pipe made that small first.
    # (Was up to the pipe's 1 MiB: 376 KiB once on a loaded CI machine.)
    lost = int(written) * 1024 - task["evidence"]["log_bytes"]["stdout"]
    assert 0 <= lost <= resource.getpagesize(), lost
