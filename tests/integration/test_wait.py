"""``ferry wait [ID ...]`` (issue 17): block until the tasks settle; exit 0 if all
SUCCEEDED, 1 otherwise, 124 when ``--timeout`` passes first; no ids: every task not
settled when it starts. ``--json``: the tasks' objects, one array, at the end."""

from __future__ import annotations

import orjson
import pytest
from clikit import Ferry, finish, read_until, says_once_when_no_work_runs

pytestmark = pytest.mark.timeout(120)


def submit(ferry: Ferry, *argv: str) -> str:
    task: dict[str, str] = orjson.loads(ferry.ok("--json", "submit", "--", *argv).text)
    return task["id"]


def test_wait_for_a_task_that_succeeds_exits_0(ferry: Ferry) -> None:
    task_id = submit(ferry, "true")
    waiter = ferry.start("-v", "--json", "wait", task_id[:12])  # (a prefix, as elsewhere)
    read_until(waiter, "waiting for 1 task")
    assert waiter.poll() is None  # the task is queued: it waits
    ferry.ok("work", "--drain")
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    [obj] = orjson.loads(out)
    assert obj == ferry.task(task_id)


def test_wait_for_a_task_that_fails_exits_1(ferry: Ferry) -> None:
    good, bad = submit(ferry, "true"), submit(ferry, "false")
    waiter = ferry.start("-v", "wait", good, bad)
    read_until(waiter, "waiting for 2 tasks")
    ferry("work", "--drain")
    code, err = finish(waiter)
    assert code == 1, err
    assert any(bad in line.split() and " FAILED " in line for line in err.splitlines()), err
    assert err.splitlines()[-1].startswith("1 succeeded, 1 failed in "), err


def test_wait_for_a_settled_task_answers_at_once(ferry: Ferry) -> None:
    failed = ferry("--json", "run", "--", "false").json()["id"]
    result = ferry("--json", "wait", failed)
    assert result.code == 1, result
    assert [obj["id"] for obj in result.json()] == [failed]


def test_wait_times_out_with_124(ferry: Ferry) -> None:
    queued = submit(ferry, "true")  # no worker: it stays queued
    result = ferry("--json", "wait", "--timeout", "0.3", queued)
    assert result.code == 124, result
    assert [(obj["id"], obj["state"]) for obj in result.json()] == [(queued, "QUEUED")]
    assert "1 of 1 task" in result.err and "not settled" in result.err, result.err


def test_wait_without_ids_waits_for_every_task_not_settled_when_it_starts(
    ferry: Ferry,
) -> None:
    ferry("run", "--", "false")  # settled before: not waited for (else the exit is 1)
    first, second = submit(ferry, "true"), submit(ferry, "true")
    waiter = ferry.start("-v", "--json", "wait")
    read_until(waiter, "waiting for 2 tasks")
    ferry.ok("work", "--drain")
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert [obj["id"] for obj in orjson.loads(out)] == [first, second]


def test_wait_without_ids_and_nothing_unsettled_exits_0(ferry: Ferry) -> None:
    ferry.ok("run", "--", "true")
    assert ferry.json("wait") == []


def test_wait_for_an_unknown_task_is_refused(ferry: Ferry) -> None:
    ferry.refused(5, "task.not_found", "wait", "0123456789abcdef")


def test_wait_and_logs_follow_say_when_a_task_s_runner_is_gone(ferry: Ferry) -> None:
    # (Found by a review: with no `work` running, a task whose runner died stays in flight
    # until `ferry recover`; `wait` and `logs -f` waited for ever without a word.)
    crashed = ferry("run", "--", "sleep", "300", failpoints="after:SPAWNED")
    assert crashed.code == -9  # run and its supervisor killed; the task runs on
    task = ferry.only_task()
    ferry.end_at_close(int(task["pid"]))
    hint = f"task {task['id']}: its runner (pid {task['runner']['pid']}) is gone"
    waited = ferry("wait", "--timeout", "0.5", task["id"])
    assert waited.code == 124 and hint in waited.err, waited
    follower = ferry.start("logs", "-f", task["id"])
    try:
        read_until(follower, hint)
    finally:
        follower.kill()
        finish(follower)


def test_wait_and_logs_follow_say_when_no_work_runs_to_start_a_queued_task(ferry: Ferry) -> None:
    """``ferry wait $(ferry submit -- make test)``, the help's example, with no ``work``
    running (a review): it waited without a word until its timeout. Once, it says
    that nothing runs to start it; not while a ``work`` leads (here its group is
    paused, so that the task stays queued)."""
    task_id = ferry.ok("submit", "--", "true").text.strip()
    follower = ferry.start("logs", "-f", task_id)
    try:
        read_until(follower, f"task {task_id} is queued and no 'ferry work' is running")
    finally:
        follower.kill()
        finish(follower)
    ferry.ok("cancel", task_id)
    says_once_when_no_work_runs(ferry, ferry)


def test_ctrl_c_on_wait_is_one_line_as_on_the_fast_path(ferry: Ferry) -> None:
    """Ctrl-C on a command click parses: click wrote an empty line before ferry's
    ``error[interrupted]`` (contract.md: an error is one line on stderr), which the
    commands ferry parses itself (run, submit, ls, show, work) did not."""
    import signal

    waiter = ferry.start("-v", "wait", submit(ferry, "true"))
    read_until(waiter, "waiting for 1 task")
    waiter.send_signal(signal.SIGINT)
    code, err = finish(waiter)
    assert (code, err) == (130, "ferry: error[interrupted]: interrupted\n")
