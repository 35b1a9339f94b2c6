"""How the ``ferry`` process ends (``ferry.cli.console``): a command that leaves no
thread and no ``atexit`` handler ends with ``os._exit`` once stdout and stderr are
flushed, so what it printed must all be there, and its exit status unchanged."""

from __future__ import annotations

import json
import os
import sys

import pytest
from clikit import Ferry


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


# The entry before the early exit, to compare with.
TEARDOWN = (sys.executable, "-c", "import sys; from ferry.cli import main; sys.exit(main())")


@pytest.mark.parametrize("closed", [1, 2])
def test_a_descriptor_closed_at_the_start_changes_no_exit_status(ferry: Ferry, closed: int) -> None:
    # (Was: started with stdout or stderr closed, Python makes sys.stdout or sys.stderr
    # None, and the early exit's flush raised: a traceback and exit 1 after the work was
    # done, so `ferry submit ... || retry` submitted twice.)
    def close() -> None:
        os.close(closed)

    ferry.ok("submit", "--", "true")
    for command in (("-q", "submit", "--", "true"), ("--version",), ("ls",), ("show", "1"),
                    ("wait", "--timeout", "0.1", "1"), ("show", "no-such-task")):  # fmt: skip
        ours = ferry(*command, preexec=close)
        before = ferry(*command, preexec=close, command=TEARDOWN)
        assert ours.code == before.code, (command, ours, before)  # (and no traceback)
    assert len(ferry.tasks()) == 3  # (one submit each way)
