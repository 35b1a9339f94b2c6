"""How the ``ferry`` process ends (``ferry.cli.console``): a command that leaves no
thread and no ``atexit`` handler ends with ``os._exit`` once stdout and stderr are
flushed, so what it printed must all be there, and its exit status unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from clikit import Ferry, wait_until


def test_a_long_listing_arrives_whole_through_a_pipe(ferry: Ferry) -> None:
    lines = b"".join(b'{"argv": ["echo", "%d"]}\n' % n for n in range(300))
    ferry.ok("submit", "--from", "-", stdin=lines)
    listing = ferry.ok("ls", "--json", "--limit", "0").out
    assert len(listing) > 8192  # (more than one buffer of sys.stdout)
    assert [task["argv"][1] for task in json.loads(listing)] == [str(n) for n in range(300)]


def test_exit_statuses_and_the_task_s_output_are_kept(ferry: Ferry) -> None:
    run = ferry("run", "--", "sh", "-c", "printf 'out'; printf 'err' >&2; exit 3")
    assert (run.code, run.out) == (3, b"out")
    assert run.err.startswith("err") and run.err.endswith("failed: EXIT_NONZERO (exit 3)\n")
    refused = ferry("show", "no-such-task")
    assert refused.code != 0 and refused.err.startswith("ferry: error[")


@pytest.mark.parametrize("closed", [1, 2])
def test_a_descriptor_closed_at_the_start_changes_no_exit_status(ferry: Ferry, closed: int) -> None:
    # (Was: started with stdout or stderr closed, Python makes sys.stdout or sys.stderr
    # None: the early exit's flush raised after the work was done (a traceback, exit 1:
    # `ferry submit ... || retry` submitted twice), and most commands failed before
    # with error[internal].)
    def close() -> None:
        os.close(closed)

    ferry.ok("submit", "--", "true")
    for command in (("-q", "submit", "--", "true"), ("--version",), ("ls",), ("show", "1"),
                    ("wait", "--timeout", "0.1", "1"), ("show", "no-such-task")):  # fmt: skip
        closed_run, open_run = ferry(*command, preexec=close), ferry(*command)
        assert closed_run.code == open_run.code, (command, closed_run, open_run)
    assert len(ferry.tasks()) == 3  # (one submit each way)


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_standard_descriptor_closed_at_the_start_is_as_dev_null(
    ferry: Ferry, closed: int
) -> None:
    # (Was: `ferry run` started with stdout or stderr closed ended in error[internal]
    # (exit 125 or 1, nothing run), and the first file ferry opened took the free
    # descriptor: one that ferry and the task write their output to.)
    def close() -> None:
        os.close(closed)

    run = ferry("run", "--", "sh", "-c", "echo out; echo err >&2", preexec=close)
    assert run.code == 0, run
    assert run.out == (b"" if closed == 1 else b"out\n")
    assert ("err" in run.err) is (closed != 2)
    assert ferry.only_task()["state"] == "SUCCEEDED"
    assert ferry.ok("logs", "--merged", "1").out == b"out\nerr\n"  # (the log holds both)
    ferry.ok("journal", "verify")


def test_a_reader_that_went_changes_no_exit_status(ferry: Ferry) -> None:
    # (Was: `ferry ls | head -0` exited 0, but the commands click parses (`group`,
    # `lease`, `journal dump`, and `ls` spelled another way) exited 1, the code of a
    # refusal, with nothing said: click's own answer to EPIPE.)
    ferry.ok("submit", "--", "true")
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # nobody will ever read ferry's stdout: EPIPE on the first write
    try:
        for command in (("ls",), ("-v", "-q", "ls"), ("group",), ("lease",),
                        ("journal", "dump"), ("journal", "verify"), ("show", "1")):  # fmt: skip
            gone, read = ferry(*command, stdout=write_fd), ferry(*command)
            assert gone.code == read.code == 0, (command, gone, read)
    finally:
        os.close(write_fd)
    ferry.ok("journal", "verify")


@pytest.mark.parametrize("threads", [1, 2], ids=["at once", "the usual exit"])
def test_output_left_in_the_buffer_for_a_reader_that_went_changes_no_exit_status(
    threads: int,
) -> None:
    """What the command left in stdout's buffer meets the gone reader at the console's
    last flush. Before, that flush's EPIPE sent the console to the interpreter's own
    exit, whose flush failed again: "Exception ignored ... BrokenPipeError", exit 120:
    ``ferry ls`` into a pipe whose reader went, in CI (tox passes no PYTHONUNBUFFERED,
    which the development shell had set). Now the rest goes nowhere and the command's
    status stands, whether the console ends at once or the usual way (a thread left)."""
    probe = (
        "import sys, threading, time\n"
        "import ferry.cli as cli\n"
        "def main():\n"
        "    print('left in the buffer')\n"
        f"    if {threads} > 1:\n"
        "        threading.Thread(target=time.sleep, args=(0.5,)).start()\n"
        "    return 3\n"
        "cli.main = main\n"
        "cli.console()\n"
    )
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        done = subprocess.run([sys.executable, "-c", probe], stdout=write_fd, env=buffered,
                              stderr=subprocess.PIPE, timeout=60)  # fmt: skip
    finally:
        os.close(write_fd)
    assert (done.returncode, done.stderr) == (3, b"")


def test_a_json_error_names_the_id_as_given(ferry: Ferry) -> None:
    """``details.prefix`` is the id as typed, in every not-found error (was Python's
    repr of it, quotes and escapes added, for an id or a number; found by a review)."""
    ferry.ok("submit", "--", "true")
    for given in ("it's", "99", "zz"):
        result = ferry("--json", "show", given)
        assert result.code == 5, result
        assert json.loads(result.out)["error"]["details"]["prefix"] == given


def test_json_error_details_name_ids_as_given_and_times_in_rfc3339(ferry: Ferry) -> None:
    """(A review: ``task.unknown_dependency`` gave Python's repr of the id, and
    ``lease.held`` the lease's expiry as a number.)"""
    result = ferry("--json", "submit", "--after", "it's", "--", "true")
    assert result.code == 5 and json.loads(result.out)["error"]["details"]["task"] == "it's"
    worker = ferry.start("work", "--lease-ttl", "30")
    try:
        wait_until(lambda: ferry("recover").code == 75, what="work to lead")
        held = json.loads(ferry("--json", "recover").out)["error"]
        assert held["code"] == "lease.held" and held["details"]["expires_at"].endswith("Z")
    finally:
        worker.terminate()
        worker.communicate(timeout=60)
