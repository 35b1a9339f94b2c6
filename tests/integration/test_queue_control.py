"""Queue control through the installed command (contract.md, "Queue control and
housekeeping"): groups and their limits, pause and resume, --after and
DEPENDENCY_FAILED, priorities, retries, --not-before. What ran when is read from the
tasks' own stamps (``queuekit``), what was decided from the journal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from clikit import Ferry, wait_until
from queuekit import Stamps, stamped

pytestmark = pytest.mark.timeout(180)


def submit(ferry: Ferry, *args: str) -> str:
    return str(ferry.json("submit", *args)["id"])


def states(ferry: Ferry) -> dict[str, str]:
    return {t["id"]: t["state"] for t in ferry.tasks()}


def group(ferry: Ferry, name: str) -> dict[str, Any]:
    found = [g for g in ferry.json("group") if g["group"] == name]
    assert len(found) == 1, found
    return found[0]


# ---- groups ------------------------------------------------------------------------------


def test_a_group_limit_holds_under_a_larger_j(ferry: Ferry, tmp_path: Path) -> None:
    """Six tasks of group a (limit 2) and two of b (none), -j 6: while the first ones
    are held at a gate, two of a run and four wait (the limit is reached, not more);
    by their stamps, never more than two of a ran at once."""
    stamps, gate = Stamps(tmp_path / "stamps"), tmp_path / "gate"
    ferry.ok("group", "set", "a", "--jobs", "2")
    a = [submit(ferry, "--group", "a", "--", *stamped(stamps, f"a{n}", gate=gate, sleep_s=0.1))
         for n in range(6)]  # fmt: skip
    b = [submit(ferry, "--group", "b", "--", *stamped(stamps, f"b{n}", gate=gate))
         for n in range(2)]  # fmt: skip
    worker = ferry.start("work", "-j", "6", "--drain", "--poll", "0.1")
    wait_until(lambda: len(stamps.starts()) >= 4, what="two of a and both of b to start")
    # b's were claimed after a's first two, in the same turns: a third of a would be by now.
    assert sorted(stamps.starts()) == ["a0", "a1", "b0", "b1"]
    now = states(ferry)
    assert [now[i] for i in a[2:]] == ["QUEUED"] * 4
    assert (group(ferry, "a")["running"], group(ferry, "a")["queued"]) == (2, 4)
    gate.touch()
    assert worker.wait(timeout=120) == 0
    assert states(ferry) == dict.fromkeys(a + b, "SUCCEEDED")
    assert stamps.most_at_once({f"a{n}" for n in range(6)}) == 2
    ferry.verify_clean()


def test_group_set_is_applied_by_a_running_work_within_its_poll(
    ferry: Ferry, tmp_path: Path
) -> None:
    stamps, gate = Stamps(tmp_path / "stamps"), tmp_path / "gate"
    ferry.ok("group", "set", "a", "--jobs", "1")
    for n in range(4):
        submit(ferry, "--group", "a", "--", *stamped(stamps, f"a{n}", gate=gate))
    worker = ferry.start("work", "-j", "4", "--drain", "--poll", "0.1")
    wait_until(lambda: stamps.starts() == ["a0"], what="the first of a to start")
    listed = ferry.json("group", "set", "a", "--jobs", "3")
    assert listed["jobs"] == 3
    wait_until(lambda: len(stamps.starts()) == 3, what="the new limit to be applied")
    assert group(ferry, "a")["running"] == 3
    gate.touch()
    assert worker.wait(timeout=120) == 0
    assert stamps.most_at_once({f"a{n}" for n in range(4)}) <= 3
    records = [r for r in ferry.records() if r["type"] == "GROUP_SET"]
    assert [r["data"] for r in records] == [{"group": "a", "jobs": 1}, {"group": "a", "jobs": 3}]


def test_group_lists_limits_pauses_and_counts(ferry: Ferry) -> None:
    assert ferry.json("group") == [
        {"group": "default", "jobs": 0, "paused": False, "queued": 0, "running": 0}
    ]
    submit(ferry, "--group", "build.arm64", "--", "true")
    ferry.ok("group", "set", "empty", "--jobs", "0")
    ferry.ok("pause", "build.arm64")
    listed = {g["group"]: g for g in ferry.json("group")}
    assert listed["build.arm64"] == {
        "group": "build.arm64", "jobs": 0, "paused": True, "queued": 1, "running": 0,
    }  # fmt: skip
    assert listed["empty"]["jobs"] == 0 and not listed["default"]["paused"]
    text = ferry.ok("group").text
    assert text.splitlines()[0].split() == ["GROUP", "JOBS", "PAUSED", "QUEUED", "RUNNING"]
    assert "build.arm64" in text


def test_pause_or_resume_of_a_group_with_no_tasks_says_so(ferry: Ferry) -> None:
    """``pause defualt`` (a typo) paused a new group of that name and said nothing, and
    ``resume x`` of no group printed a bare table header, both exit 0 (found by a
    review). A group may be paused before its tasks come: it still is, with a note."""
    result = ferry.ok("pause", "defualt")
    assert (
        "note: group 'defualt' has no tasks: paused for those submitted to it (a typo?)"
        in result.err
    )
    assert {g["group"]: g["paused"] for g in ferry.json("group")}["defualt"] is True
    result = ferry.ok("resume", "nosuch")
    assert "note: group 'nosuch' has no tasks and is not paused (a typo?)" in result.err
    assert result.text == ""
    submit(ferry, "--group", "real", "--", "true")
    for command in ("pause", "resume"):
        assert "note:" not in ferry.ok(command, "real").err
    # After a pause of every group (a review of the notes: nothing said, a bare header).
    ferry.ok("pause")
    result = ferry.ok("pause", "defualt2")
    assert "note: group 'defualt2' has no tasks: paused for those submitted to it" in result.err
    assert result.text == ""


@pytest.mark.parametrize(
    ("args", "exit_code", "code"),
    [
        (("group", "set", "a b", "--jobs", "1"), 2, "usage.bad_group"),
        (("group", "set", "-x", "--jobs", "1"), 2, "usage."),
        (("group", "set", "a", "--jobs", "-1"), 2, "usage.invalid"),
        (("group", "set", "a"), 2, "usage.invalid"),
        (("pause", "no/slash"), 2, "usage.bad_group"),
        (("submit", "--group", "", "--", "true"), 2, "usage.bad_group"),
        (("submit", "--priority", "x", "--", "true"), 2, "usage.invalid"),
        (("submit", "--retries", "101", "--", "true"), 2, "usage.invalid"),
        (("submit", "--not-before", "tomorrow", "--", "true"), 2, "usage.bad_time"),
        (("submit", "--not-before", "2026-05-01T02:00:00", "--", "true"), 2, "usage.bad_time"),
        (("submit", "--not-before", "+x", "--", "true"), 2, "usage.bad_time"),
        (("submit", "--not-before", "9999-01-01T00:00:00Z", "--", "true"), 2, "usage.bad_time"),
        (("submit", "--after", "zzzzzz", "--", "true"), 5, "task.unknown_dependency"),
        (("submit", "--after", "7", "--", "true"), 5, "task.unknown_dependency"),
    ],
)
def test_bad_queue_input_is_one_coded_line(
    ferry: Ferry, args: tuple[str, ...], exit_code: int, code: str
) -> None:
    ferry.refused(exit_code, code, *args)
    assert ferry.tasks() == []


def test_not_before_takes_rfc3339_in_lower_case_and_says_what_is_out_of_range(
    ferry: Ferry,
) -> None:
    """RFC 3339 allows "t" and "z" in lower case (refused before); a time past the year
    2400 was "not_before must be a time (Unix seconds)" (found by a review)."""
    task = ferry.ok("submit", "--not-before", "2031-01-01t00:00:00z", "--", "true").text.strip()
    assert ferry.task(task)["not_before"] == "2031-01-01T00:00:00.000Z"
    result = ferry.refused(
        2, "usage.bad_time", "submit", "--not-before", "9999-01-01T00:00:00Z", "--", "true"
    )
    assert "between 1970 and 2400" in result.err


# ---- pause and resume -----------------------------------------------------------------


def test_a_paused_group_is_not_claimed_until_resumed_across_restarts(
    ferry: Ferry, tmp_path: Path
) -> None:
    stamps = Stamps(tmp_path / "stamps")
    held = submit(ferry, "--group", "held", "--", *stamped(stamps, "held"))
    free = submit(ferry, "--", *stamped(stamps, "free"))
    ferry.ok("pause", "held")
    # --drain leaves a paused group's tasks: the queue it can run is empty.
    ferry.ok("work", "--drain", "-j", "2")
    assert states(ferry) == {held: "QUEUED", free: "SUCCEEDED"}
    ferry.ok("claim")  # claim honours the pause too
    assert states(ferry)[held] == "QUEUED" and stamps.starts() == ["free"]
    ferry.ok("resume", "held")
    ferry.ok("work", "--drain")
    assert states(ferry)[held] == "SUCCEEDED"
    ferry.verify_clean()


def test_pause_without_a_group_pauses_every_group_even_new_ones(ferry: Ferry) -> None:
    ferry.ok("pause")
    first = submit(ferry, "--", "true")
    later = submit(ferry, "--group", "new", "--", "true")
    ferry.ok("resume", "new")  # one group let through while all are paused
    ferry.ok("work", "--drain")
    assert states(ferry) == {first: "QUEUED", later: "SUCCEEDED"}
    assert all(g["paused"] for g in ferry.json("group") if g["group"] != "new")
    ferry.ok("resume")
    ferry.ok("work", "--drain")
    assert states(ferry) == {first: "SUCCEEDED", later: "SUCCEEDED"}


def test_running_tasks_of_a_paused_group_go_on(ferry: Ferry, tmp_path: Path) -> None:
    stamps, gate = Stamps(tmp_path / "stamps"), tmp_path / "gate"
    first = submit(ferry, "--group", "g", "--", *stamped(stamps, "first", gate=gate))
    second = submit(ferry, "--group", "g", "--", *stamped(stamps, "second"))
    ferry.ok("group", "set", "g", "--jobs", "1")
    worker = ferry.start("work", "-j", "2", "--poll", "0.1")
    wait_until(lambda: stamps.starts() == ["first"], what="the first task to start")
    ferry.ok("pause", "g")
    gate.touch()
    wait_until(lambda: states(ferry)[first] == "SUCCEEDED", what="the running task to end")
    # The slot it freed is not given to its paused group's next task.
    assert states(ferry)[second] == "QUEUED"
    ferry.ok("resume", "g")
    wait_until(lambda: states(ferry)[second] == "SUCCEEDED", what="the queue to be resumed")
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 0


# ---- priorities -------------------------------------------------------------------------


def test_higher_priority_first_then_first_in_first_out_across_groups(
    ferry: Ferry, tmp_path: Path
) -> None:
    stamps = Stamps(tmp_path / "stamps")
    plan = [("p0a", 0, "x"), ("p5a", 5, "y"), ("p0b", 0, "y"), ("m1", -1, "x"),
            ("p5b", 5, "x"), ("p2", 2, "z")]  # fmt: skip
    for name, priority, grp in plan:
        submit(ferry, "--priority", str(priority), "--group", grp, "--",
               *stamped(stamps, name))  # fmt: skip
    ferry.ok("work", "--drain", "-j", "1")
    assert stamps.starts() == ["p5a", "p5b", "p2", "p0a", "p0b", "m1"]
    ls = ferry.ok("ls").text.splitlines()
    assert ls[0].split()[5:7] == ["GROUP", "PRI"]


# ---- --after -----------------------------------------------------------------------------


def test_after_runs_dependants_once_their_dependencies_succeeded(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A diamond: b and c after a, d after b and c; by the stamps, each starts after
    every task it comes after ended, though -j 4 would run them all at once."""
    stamps = Stamps(tmp_path / "stamps")
    a = submit(ferry, "--", *stamped(stamps, "a", sleep_s=0.2))
    b = submit(ferry, "--after", a, "--", *stamped(stamps, "b", sleep_s=0.1))
    c = submit(ferry, "--after", "1", "--", *stamped(stamps, "c"))  # by its number
    d = submit(ferry, "--after", b, "--after", c[:10], "--", *stamped(stamps, "d"))  # a prefix
    assert ferry.task(d)["after"] == [b, c]
    ferry.ok("work", "--drain", "-j", "4", "--poll", "0.1")
    assert states(ferry) == dict.fromkeys((a, b, c, d), "SUCCEEDED")
    when = {name: span for (name, _), span in stamps.intervals().items()}
    assert when["b"][0] >= when["a"][1] and when["c"][0] >= when["a"][1]
    assert when["d"][0] >= max(when["b"][1], when["c"][1])


def test_a_failed_dependency_cancels_its_dependants_without_a_running_work(
    ferry: Ferry, tmp_path: Path
) -> None:
    stamps = Stamps(tmp_path / "stamps")
    a = submit(ferry, "--", "sh", "-c", "exit 4")
    b = submit(ferry, "--after", a, "--", *stamped(stamps, "b"))
    c = submit(ferry, "--after", "last", "--", *stamped(stamps, "c"))  # after b
    other = submit(ferry, "--", "true")
    ferry.ok("claim", codes=(4,))  # runs a (the oldest): it fails
    assert states(ferry) == {a: "FAILED", b: "QUEUED", c: "QUEUED", other: "QUEUED"}
    code, report = ferry.recover()  # the next command that reads the queue decides
    assert code == 0
    assert [(d["task"], d["reason"]) for d in report["decisions"]] == [
        (b, "DEPENDENCY_FAILED"), (c, "DEPENDENCY_FAILED"),
    ]  # fmt: skip
    shown = ferry.task(c)
    assert (shown["state"], shown["reason"]) == ("CANCELLED", "DEPENDENCY_FAILED")
    assert shown["evidence"]["dependency"] == {"task": b, "state": "CANCELLED"}
    assert ferry.task(b)["evidence"]["dependency"] == {"task": a, "state": "FAILED"}
    ferry.ok("work", "--drain")
    assert states(ferry)[other] == "SUCCEEDED" and stamps.starts() == []
    code, report = ferry.recover()
    assert code == 0 and report["decisions"] == []
    ferry.verify_clean()


def test_work_cancels_dependants_and_counts_them(ferry: Ferry) -> None:
    a = submit(ferry, "--", "sh", "-c", "exit 1")
    b = submit(ferry, "--after", a, "--", "true")
    result = ferry("work", "--drain", "--poll", "0.1")
    assert result.code == 1, result
    assert states(ferry) == {a: "FAILED", b: "CANCELLED"}
    assert "1 failed, 1 cancelled" in result.err
    assert "DEPENDENCY_FAILED" in result.err


def test_a_dependency_retried_before_anyone_looked_saves_its_dependant(ferry: Ferry) -> None:
    a = submit(ferry, "--", "sh", "-c", 'test "$FERRY_ATTEMPT" = 2')
    b = submit(ferry, "--after", a, "--", "true")
    ferry.ok("claim", codes=(1,))  # a fails; nobody has looked at b yet
    ferry.ok("retry", a)  # the cancel is no longer legal: a may succeed yet
    ferry.ok("work", "--drain")
    assert states(ferry) == {a: "SUCCEEDED", b: "SUCCEEDED"}
    assert ferry.task(a)["attempt"] == 2


def test_a_cycle_in_a_from_file_is_refused_and_nothing_is_queued(ferry: Ferry) -> None:
    lines = (
        b'{"argv": ["true"], "name": "one", "after": ["line:3"]}\n'
        b'{"argv": ["true"], "name": "two"}\n'
        b'{"argv": ["true"], "name": "three", "after": ["line:1"]}\n'
    )
    ferry.refused(2, "task.dependency_cycle", "submit", "--from", "-", stdin=lines)
    ferry.refused(2, "task.dependency_cycle", "submit", "--from", "-",
                  stdin=b'{"argv": ["true"], "after": ["line:1"]}\n')  # fmt: skip
    ferry.refused(2, "usage.bad_from_line", "submit", "--from", "-",
                  stdin=b'{"argv": ["true"], "after": ["line:9"]}\n')  # fmt: skip
    assert ferry.tasks() == []


def test_a_from_file_names_its_own_lines_and_is_queued_dependencies_first(
    ferry: Ferry, tmp_path: Path
) -> None:
    stamps = Stamps(tmp_path / "stamps")
    lines = b"".join(
        orjson.dumps(line) + b"\n"
        for line in [
            {"argv": stamped(stamps, "link"), "after": ["line:2", "line:3"], "priority": 9},
            {"argv": stamped(stamps, "compile-a"), "group": "cc"},
            {"argv": stamped(stamps, "compile-b"), "group": "cc", "retries": 1},
        ]
    )
    ids = ferry.ok("submit", "--from", "-", stdin=lines).text.split()
    assert len(ids) == 3  # in line order
    assert ferry.task(ids[0])["after"] == [ids[1], ids[2]]
    kinds = [r["data"]["task"] for r in ferry.records() if r["type"] == "SUBMITTED"]
    assert kinds.index(ids[0]) > max(kinds.index(ids[1]), kinds.index(ids[2]))
    ferry.ok("work", "--drain", "-j", "3", "--poll", "0.1")
    assert stamps.starts()[-1] == "link"


# ---- retries -----------------------------------------------------------------------------


def test_retries_run_new_attempts_each_with_its_own_log_and_evidence(
    ferry: Ferry, tmp_path: Path
) -> None:
    stamps = Stamps(tmp_path / "stamps")
    argv = stamped(stamps, "flaky", fail_attempts=2)
    argv[-1] = 'echo "attempt $FERRY_ATTEMPT"; ' + argv[-1]
    task_id = submit(ferry, "--retries", "3", "--retry-delay", "0.2", "--", *argv)
    result = ferry("work", "--drain", "--poll", "0.05")
    assert result.code == 0, result
    assert "attempt 1 failed (EXIT_NONZERO): retry 1 of 3" in result.err
    task = ferry.task(task_id)
    assert (task["state"], task["attempt"], task["retries_used"]) == ("SUCCEEDED", 3, 2)
    assert stamps.started("flaky") == 3
    previous = task["evidence"]["previous_attempt"]
    assert (previous["attempt"], previous["reason"], previous["exit_code"]) == (
        2, "EXIT_NONZERO", 3,
    )  # fmt: skip
    assert [e["attempt"] for e in task["evidence"]["earlier_attempts"]] == [1]
    for attempt in (1, 2, 3):  # each attempt's own log
        log = ferry.home / "logs" / task_id / f"{attempt}.stdout"
        assert log.read_text() == f"attempt {attempt}\n"
    # Each retry waited its delay (doubled), never less: by the attempts' stamps.
    spans = stamps.intervals()
    assert spans[("flaky", 2)][0] - spans[("flaky", 1)][1] >= 0.2
    assert spans[("flaky", 3)][0] - spans[("flaky", 2)][1] >= 0.4
    retried = [r["data"] for r in ferry.records() if r["type"] == "RETRIED"]
    assert [(r["attempt"], r["automatic"]) for r in retried] == [(2, True), (3, True)]
    ferry.verify_clean()


def test_retries_run_out_and_only_exit_nonzero_and_timeout_are_retried(
    ferry: Ferry, tmp_path: Path
) -> None:
    always = submit(ferry, "--retries", "2", "--retry-delay", "0", "--", "sh", "-c", "exit 7")
    slow = submit(ferry, "--retries", "1", "--retry-delay", "0", "--timeout", "0.2",
                  "--kill-grace", "0.1", "--", "sleep", "30")  # fmt: skip
    missing = submit(ferry, "--retries", "2", "--", str(tmp_path / "no-such-command"))
    ferry.ok("work", "--drain", "-j", "3", "--poll", "0.05", codes=(1,))
    found = {t["id"]: (t["state"], t["reason"], t["attempt"]) for t in ferry.tasks()}
    assert found == {
        always: ("FAILED", "EXIT_NONZERO", 3),
        slow: ("FAILED", "TIMEOUT", 2),
        missing: ("FAILED", "SPAWN_FAILED", 1),  # a refused spawn is not retried
    }


def test_a_manual_retry_starts_the_count_again(ferry: Ferry) -> None:
    task_id = submit(ferry, "--retries", "1", "--retry-delay", "0", "--", "sh", "-c", "exit 2")
    ferry.ok("work", "--drain", "--poll", "0.05", codes=(1,))
    assert ferry.task(task_id)["attempt"] == 2
    ferry.ok("retry", task_id)
    ferry.ok("work", "--drain", "--poll", "0.05", codes=(1,))
    task = ferry.task(task_id)
    assert (task["attempt"], task["retries_used"], task["state"]) == (4, 1, "FAILED")


def test_run_has_no_queue_options(ferry: Ferry) -> None:
    ferry.refused(2, "usage.invalid", "run", "--retries", "2", "--", "true")


# ---- --not-before ------------------------------------------------------------------------


def test_not_before_holds_a_task_until_its_time(ferry: Ferry, tmp_path: Path) -> None:
    stamps = Stamps(tmp_path / "stamps")
    far = submit(ferry, "--not-before", "+3600", "--", *stamped(stamps, "far"))
    now = submit(ferry, "--", *stamped(stamps, "now"))
    assert ferry.task(far)["not_before"].endswith("Z")
    ferry.ok("claim")  # the task whose time has come, though submitted later
    assert ferry.json("claim") == {"task": None}  # nothing else may be claimed now
    assert states(ferry) == {far: "QUEUED", now: "SUCCEEDED"}
    ferry.ok("cancel", far)
    before = time.time()
    soon = submit(ferry, "--not-before", "+1", "--", *stamped(stamps, "soon"))
    ferry.ok("work", "--drain", "--poll", "0.1")  # --drain waits for it
    assert states(ferry)[soon] == "SUCCEEDED"
    assert stamps.intervals()[("soon", 1)][0] >= before + 1


def test_not_before_takes_an_rfc3339_time(ferry: Ferry) -> None:
    task_id = submit(ferry, "--not-before", "2000-01-01T00:00:00+02:00", "--", "true")
    assert ferry.task(task_id)["not_before"] == "1999-12-31T22:00:00.000Z"
    ferry.ok("claim")
    assert states(ferry)[task_id] == "SUCCEEDED"


# ---- crashes -----------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["before:GROUP_SET", "after:GROUP_SET"])
def test_a_crash_in_a_group_change_leaves_a_true_journal(ferry: Ferry, point: str) -> None:
    ferry.ok("group", "set", "a", "--jobs", "1")
    result = ferry("group", "set", "a", "--jobs", "5", failpoints=point)
    assert result.code == -9, result
    ferry.verify_clean()
    assert group(ferry, "a")["jobs"] == (5 if point.startswith("after") else 1)


@pytest.mark.parametrize("point", ["before:GROUP_PAUSED", "after:GROUP_PAUSED"])
def test_a_crash_in_a_pause_leaves_a_true_journal(ferry: Ferry, point: str) -> None:
    task_id = submit(ferry, "--group", "g", "--", "true")
    result = ferry("pause", "g", failpoints=point)
    assert result.code == -9, result
    ferry.verify_clean()
    paused = point.startswith("after")
    assert group(ferry, "g")["paused"] is paused
    ferry.ok("work", "--drain")
    assert states(ferry)[task_id] == ("QUEUED" if paused else "SUCCEEDED")


def test_a_crash_before_a_retry_s_requeue_loses_neither_the_end_nor_the_retry(
    ferry: Ferry, tmp_path: Path
) -> None:
    """The end and its retry are one write: killed before it, neither is in the journal
    (the attempt is in flight with its runner dead: recovery's, and a crash is never
    retried automatically); killed after it, both are, and the retry runs once."""
    stamps = Stamps(tmp_path / "stamps")
    task_id = submit(ferry, "--idempotent", "--retries", "2", "--retry-delay", "0", "--",
                     *stamped(stamps, "t", fail_attempts=1))  # fmt: skip
    result = ferry("work", "--drain", failpoints="before:RETRIED")
    assert result.code == -9, result
    ferry.verify_clean()
    task = ferry.task(task_id)
    assert task["attempt"] == 1 and task["state"] in ("DISPATCHING", "RUNNING")
    assert not [r for r in ferry.records() if r["type"] in ("SETTLED", "RETRIED")]
    code, report = ferry.recover()  # idempotent: released to the queue, same attempt
    assert code == 0 and [d["state"] for d in report["decisions"]] == ["QUEUED"]
    result = ferry("work", "--drain", failpoints="after:RETRIED")
    assert result.code == -9, result
    ferry.verify_clean()
    task = ferry.task(task_id)
    assert (task["state"], task["attempt"], task["retries_used"]) == ("QUEUED", 2, 1)
    ferry.ok("work", "--drain")
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    assert stamps.started("t") == 3  # attempt 1 twice (released), attempt 2 once
    ferry.verify_clean()


def test_a_supervisor_whose_work_was_killed_writes_its_end_and_the_retry(
    ferry: Ferry, tmp_path: Path
) -> None:
    stamps, gate = Stamps(tmp_path / "stamps"), tmp_path / "gate"
    task_id = submit(ferry, "--retries", "1", "--retry-delay", "0", "--",
                     *stamped(stamps, "t", gate=gate, fail_attempts=1))  # fmt: skip
    worker = ferry.start("work", "--poll", "0.1")
    wait_until(lambda: stamps.starts() == ["t"], what="the first attempt to start")
    worker.kill()  # kill -9 of work: its supervisor goes on alone
    worker.wait(timeout=30)
    gate.touch()
    wait_until(lambda: ferry.task(task_id)["attempt"] == 2, what="the end and its retry")
    task = ferry.task(task_id)
    assert (task["state"], task["retries_used"]) == ("QUEUED", 1)
    ferry.ok("work", "--drain")
    assert ferry.task(task_id)["state"] == "SUCCEEDED" and stamps.started("t") == 2
    ferry.verify_clean()


@pytest.mark.parametrize("runner", ["work", "claim", "supervisor alone"])
def test_an_end_whose_retry_its_key_refuses_is_written_without_the_retry(
    ferry: Ferry, tmp_path: Path, runner: str
) -> None:
    # (Found by a review: the older task of the key resolved SUCCEEDED while this one
    # was queued or ran; its failure's automatic RETRIED was refused, task.key_succeeded,
    # and the whole end with it: work and the supervisor took the refusal for "decided
    # elsewhere" and dropped the end. The task stayed RUNNING; recovery failed it
    # MUTATION_UNSAFE, or, --idempotent, ran it again: 4 runs for --retries 1.)
    older = submit(ferry, "--key", "K", "--", "false")
    ferry.ok("work", "--drain", codes=(1,))
    stamps, gate = Stamps(tmp_path / "stamps"), tmp_path / "gate"
    task_id = submit(ferry, "--key", "K", "--retries", "1", "--retry-delay", "0", "--",
                     *stamped(stamps, "t", gate=gate, fail_attempts=1))  # fmt: skip
    ferry.ok("resolve", older, "--as", "succeeded")
    if runner == "supervisor alone":
        worker = ferry.start("work", "--poll", "0.1")
        wait_until(lambda: stamps.starts() == ["t"], what="the task to start")
        worker.kill()  # kill -9 of work: its supervisor writes the end itself
        worker.wait(timeout=30)
        gate.touch()
        wait_until(lambda: ferry.task(task_id)["state"] == "FAILED", what="the end")
    else:
        gate.touch()
        ferry.ok(*(("work", "--drain") if runner == "work" else ("claim",)), codes=(1, 3))
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["exit_code"]) == ("FAILED", "EXIT_NONZERO", 3)
    assert (task["attempt"], task["retries_used"]) == (1, 0)
    assert task["evidence"]["not_retried"]["code"] == "task.key_succeeded"
    assert stamps.started("t") == 1
    ferry.ok("work", "--drain")  # nothing left to run
    assert stamps.started("t") == 1
    ferry.verify_clean()


def test_a_task_whose_supervisor_died_is_decided_before_its_slot_is_taken_again(
    ferry: Ferry, tmp_path: Path
) -> None:
    # (Found by a review: `work -j 2` freed the slot of a supervisor killed under its
    # running task and claimed the next one at once, three of the home's tasks in
    # flight, until its recovery pass, 5 s later, quarantined the orphan.)
    stamps, gate = Stamps(tmp_path / "stamps"), tmp_path / "gate"
    orphan = submit(ferry, "--", *stamped(stamps, "orphan", gate=gate))
    other = submit(ferry, "--", *stamped(stamps, "other", gate=gate))
    later = submit(ferry, "--", *stamped(stamps, "later"))
    worker = ferry.start("work", "-j", "2", "--poll", "0.05")
    wait_until(lambda: sorted(stamps.starts()) == ["orphan", "other"], what="two tasks to start")
    os.kill(int(ferry.task(orphan)["runner"]["pid"]), signal.SIGKILL)
    wait_until(lambda: ferry.task(later)["state"] == "SUCCEEDED", what="the next task")
    kinds = [(r["type"], r["data"].get("task")) for r in ferry.records()]
    quarantined = kinds.index(("SETTLED", orphan))
    assert ferry.task(orphan)["reason"] == "QUARANTINED_ORPHAN_ALIVE"
    assert kinds.index(("CLAIMED", later)) > quarantined  # never three in flight
    gate.touch()
    wait_until(lambda: ferry.task(other)["state"] == "SUCCEEDED", what="the other task")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
