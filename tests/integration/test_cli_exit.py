"""How the ``ferry`` process ends (``ferry.cli.console``): a command that leaves no
thread and no ``atexit`` handler ends with ``os._exit`` once stdout and stderr are
flushed, so what it printed must all be there, and its exit status unchanged."""

from __future__ import annotations

import json

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
