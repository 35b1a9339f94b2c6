"""Writes decided under the lock (the rule at the top of ``ferry/fold.py``): each test
pauses one real ``ferry`` command at a failpoint (``=stop``) after it read the table
and before its write, lets another command change the task, continues the first, and
checks that the first one's write is refused or decided again, never applied to a
state it did not see. Each failed on the code before the rule (said per test).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from clikit import Ferry, finish, wait_until
from crashkit import OUTLIVES_SPAWNED, counting_task, runs, task_processes, wait_task_gone

pytestmark = pytest.mark.timeout(120)

LINGERS = "; exec sleep 300"


def test_a_cancel_that_read_queued_never_overwrites_a_running_claim(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Bug 2. ``cancel`` read the task QUEUED and paused before its SETTLED CANCELLED;
    ``claim`` then claimed and started it. Before: the token-less SETTLED was accepted,
    the journal said CANCELLED while the task ran on, the runner's own end was refused
    (exit 125) and a ``retry`` could start a second copy. Now the cancel is refused
    under the lock, reads again and cancels the running task through its runner."""
    mark = tmp_path / "runs"
    task_id = ferry.ok("submit", "--", *counting_task(mark, linger=LINGERS)).text.strip()
    cancel = ferry.start_stopped("cancel", task_id, at="before:SETTLED")
    claim = ferry.start("claim")
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="the task to run")

    code, err = finish(cancel)
    state = ferry.task(task_id)["state"]
    assert not (state == "CANCELLED" and task_processes(task_id)), "CANCELLED, yet it runs"
    assert code == 0, err
    claim_code, claim_err = finish(claim)
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["signal"]) == (
        "CANCELLED", "CANCELLED_BY_USER", signal.SIGTERM,
    ), task  # fmt: skip
    assert claim_code == 128 + signal.SIGTERM, claim_err  # the runner's end, as journaled
    assert runs(mark) == 1
    ferry.verify_clean()


def test_cancel_state_queued_leaves_a_task_claimed_after_it_listed_the_queue(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Found by a review: ``cancel --state QUEUED`` ("empty the queue") listed the
    queue, then a worker claimed and started a listed task before the cancel's write.
    Its token-less SETTLED was refused (right), but it then decided again as ``cancel
    ID`` does and cancelled the running task through its runner: SIGTERM. A task
    selected by its state that is no longer in it is left alone and reported."""
    gate, mark = tmp_path / "gate", tmp_path / "runs"
    script = f"echo x >> '{mark}'; while [ ! -e '{gate}' ]; do sleep 0.05; done"
    task_id = ferry.ok("submit", "--", "sh", "-c", script).text.strip()
    cancel = ferry.start_stopped("cancel", "--state", "QUEUED", at="before:SETTLED")
    claim = ferry.start("claim")
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="the task to run")
    code, err = finish(cancel)
    assert code == 1 and "task.moved" in err, err
    task = ferry.task(task_id)
    assert (task["state"], task["cancel_requested"]) == ("RUNNING", False), task
    gate.touch()
    claim_code, claim_err = finish(claim)
    assert claim_code == 0, claim_err
    assert ferry.task(task_id)["state"] == "SUCCEEDED" and runs(mark) == 1
    ferry.verify_clean()


def test_retry_state_failed_leaves_a_task_that_moved_after_it_was_listed(
    ferry: Ferry,
) -> None:
    """The same rule for ``retry --state FAILED``: of two tasks listed FAILED, the
    second, retried by someone else and cancelled while the first one's retry was
    written, is not retried again (it was, as attempt 3)."""
    first, second = (ferry.ok("submit", "--", "false").text.strip() for _ in range(2))
    ferry.ok("work", "--drain", codes=(1,))
    retry = ferry.start_stopped("retry", "--state", "FAILED", at="before:RETRIED")
    ferry.ok("retry", second)
    ferry.ok("cancel", second)
    code, err = finish(retry)
    assert code == 1 and "task.moved" in err, err
    assert (ferry.task(first)["state"], ferry.task(first)["attempt"]) == ("QUEUED", 2)
    task = ferry.task(second)
    assert (task["state"], task["attempt"]) == ("CANCELLED", 2), task


def test_a_queued_cancel_still_cancels_when_nothing_raced_it(ferry: Ferry) -> None:
    task_id = ferry.ok("submit", "--", "true").text.strip()
    assert ferry.json("cancel", task_id)["state"] == "CANCELLED"


def crash_with_key(ferry: Ferry, key: str) -> dict[str, object]:
    """``run --key`` SIGKILLed after SPAWNED, its task alive (an orphan to come)."""
    argv = ["/bin/sh", "-c", "[ -e /nonexistent ] || exec sleep 300"]
    assert ferry("run", "--key", key, "--", *argv, failpoints="after:SPAWNED").code == -9
    task = ferry.tasks()[-1]
    assert task["state"] == "RUNNING", task
    ferry.end_at_close(int(str(task["pid"])))
    return task


@pytest.mark.parametrize("command", ["run", "submit", "retry"])
def test_a_key_checked_before_recover_quarantined_its_task_is_refused(
    ferry: Ferry, tmp_path: Path, command: str
) -> None:
    """Bug 4. K's task is in flight, its runner dead. ``run --key K`` (or ``submit``, or
    a ``retry`` of an older task with K) reads the key, then pauses before its write;
    ``recover`` quarantines K's task (its orphan alive). Before: the check beside the
    orphan had run outside the lock, so the write was accepted and K's work ran beside
    its orphan. Now the key is checked under the lock: exit 3, ``task.key_unsafe``."""
    mark = tmp_path / "runs"
    older_id = ""
    if command == "retry":
        ferry.ok("run", "--key", "K", "--", "false", codes=(1,))
        older_id = str(ferry.tasks()[-1]["id"])
    first = crash_with_key(ferry, "K")
    args = {
        "run": ("run", "--key", "K", "--", *counting_task(mark)),
        "submit": ("submit", "--key", "K", "--", *counting_task(mark)),
        "retry": ("retry", older_id),
    }[command]
    event = {"run": "SUBMITTED", "submit": "SUBMITTED", "retry": "RETRIED"}[command]
    paused = ferry.start_stopped(*args, at=f"before:{event}")
    assert ferry.recover()[0] == 3
    assert ferry.task(str(first["id"]))["reason"] == "QUARANTINED_ORPHAN_ALIVE"

    code, err = finish(paused)
    assert code == 3 and "error[task.key_unsafe]" in err and str(first["id"]) in err, err
    assert runs(mark) == 0
    if command == "retry":
        assert ferry.task(older_id)["state"] == "FAILED"
    else:
        assert len(ferry.tasks()) == 1, "nothing was queued"
    ferry.verify_clean()


def test_a_release_decided_before_a_cancel_request_is_refused(ferry: Ferry, tmp_path: Path) -> None:
    """A ``recover`` observed an idempotent task (runner and task dead) and decided to
    release it; before it wrote, ``cancel`` journaled CANCEL_REQUESTED. Before: the
    release was accepted, the task went back to the queue and the cancel, finding it
    QUEUED, could not settle it (it said nothing and exited 0). Now the release is
    refused, and the cancel settles the task CANCELLED."""
    argv = counting_task(tmp_path / "runs", linger=OUTLIVES_SPAWNED)
    assert ferry("run", "--idempotent", "--", *argv, failpoints="after:SPAWNED").code == -9
    task_id = str(ferry.tasks()[-1]["id"])
    wait_task_gone(task_id)
    recover = ferry.start_stopped("--json", "recover", at="before:RELEASED")
    cancel = ferry.start_stopped("cancel", task_id, at="after:CANCEL_REQUESTED")
    assert finish(recover)[0] == 0
    assert ferry.task(task_id)["state"] != "QUEUED", "released despite the cancel request"
    code, err = finish(cancel)
    assert code == 0, err
    assert ferry.task(task_id)["state"] == "CANCELLED"
    ferry.verify_clean()


def test_an_epoch_handed_out_twice_is_used_by_one_leader_only(ferry: Ferry, tmp_path: Path) -> None:
    """A ``claim`` took the lease and paused inside its recovery, before writing
    anything; lease.json was then lost, and a second ``claim`` was handed the same epoch
    (the journal had never seen it), recovered and ran the released task. Before: the
    first one, continued, claimed the next task under that epoch: two leaders at once,
    the fence blind to it. Now a leader's first write announces its epoch
    (LEASE_ACQUIRED), which the journal takes once: the paused one is fenced (exit 75)
    and claims nothing."""
    crashed_mark, next_mark = tmp_path / "crashed", tmp_path / "next"
    ferry.ok("submit", "--idempotent", "--", *counting_task(crashed_mark))
    ferry.ok("submit", "--", *counting_task(next_mark))
    # (with its supervisor: nothing started; idempotent, so recovery releases it)
    assert ferry("claim", failpoints="after:CLAIMED").code == -9
    paused = ferry.start_stopped("claim", at="before:RELEASED")
    epoch = ferry.json("lease")["epoch"]
    (ferry.home / "lease.json").unlink()
    ferry.ok("claim")  # releases the crashed claim's task, and runs it
    assert runs(crashed_mark) == 1 and ferry.json("lease")["epoch"] == epoch

    code, err = finish(paused)
    assert code == 75 and "error[journal.fenced]" in err, err
    assert runs(next_mark) == 0
    used = [r["data"]["epoch"] for r in ferry.records() if r["type"] == "LEASE_ACQUIRED"]
    assert used.count(epoch) == 1, used
    ferry.verify_clean()


def test_a_recover_with_nothing_to_decide_journals_nothing(ferry: Ferry) -> None:
    """The announcement rides on the first decision: cron's idle ``recover`` writes no
    record (and no fsync)."""
    ferry.ok("run", "--", "true")
    before = ferry.records()
    assert ferry.recover()[0] == 0
    assert ferry.records() == before


def test_keys_after_an_unsafe_end_wait_for_an_operator(ferry: Ferry, tmp_path: Path) -> None:
    """The contract's "Keys after an unsafe end": run, submit and submit --from refuse
    the key (exit 3, naming the task) until ``retry`` or ``resolve``; resolved as
    succeeded, it is skipped like a succeeded key; as failed, it runs again."""
    mark = tmp_path / "runs"
    crashed = ferry("run", "--key", "deploy", "--", *counting_task(mark, linger=OUTLIVES_SPAWNED),
                    failpoints="after:SPAWNED")  # fmt: skip
    assert crashed.code == -9
    task_id = str(ferry.tasks()[-1]["id"])
    wait_task_gone(task_id)
    assert ferry.recover()[0] == 3
    assert ferry.task(task_id)["reason"] == "MARKED_FAILED_MUTATION_UNSAFE"

    for args in (("run", "--key", "deploy", "--", "true"),
                 ("submit", "--key", "deploy", "--", "true")):  # fmt: skip
        refused = ferry.refused(3, "task.key_unsafe", *args)
        assert task_id in refused.err and "resolve" in refused.err
    refused = ferry.refused(3, "task.key_unsafe", "submit", "--from", "-",
                            stdin=b'{"argv": ["true"], "key": "deploy"}\n')  # fmt: skip
    assert len(ferry.tasks()) == 1 and runs(mark) == 1

    resolved = ferry.json("resolve", task_id, "--as", "succeeded")
    assert resolved["state"] == "FAILED"
    assert resolved["evidence"]["resolution"]["verdict"] == "succeeded"
    skipped = ferry.ok("run", "--key", "deploy", "--", *counting_task(mark))
    assert "already succeeded" in skipped.err and task_id in skipped.err
    assert runs(mark) == 1 and len(ferry.tasks()) == 1
    ferry.refused(1, "task.already_resolved", "resolve", task_id, "--as", "failed")


def test_resolve_as_failed_frees_the_key_and_waits_for_a_live_orphan(ferry: Ferry) -> None:
    first = crash_with_key(ferry, "K")
    assert ferry.recover()[0] == 3
    first_id = str(first["id"])
    ferry.refused(3, "task.orphan_alive", "resolve", first_id, "--as", "failed")
    ferry.ok("kill", first_id)
    wait_until(lambda: not task_processes(first_id), what="the orphan to end")
    ferry.refused(3, "task.key_unsafe", "run", "--key", "K", "--", "true")  # killing is no verdict
    ferry.ok("resolve", first_id, "--as", "failed")
    ferry.ok("run", "--key", "K", "--", "true")
    assert [t["state"] for t in ferry.tasks()] == ["FAILED", "SUCCEEDED"]


@pytest.mark.parametrize("state", ["QUEUED", "SUCCEEDED"])
def test_resolve_refuses_a_task_that_is_not_failed_or_cancelled(ferry: Ferry, state: str) -> None:
    if state == "QUEUED":
        task_id = ferry.ok("submit", "--", "true").text.strip()
    else:
        ferry.ok("run", "--", "true")
        task_id = str(ferry.tasks()[-1]["id"])
    refused = ferry.refused(1, "task.not_resolvable", "resolve", task_id, "--as", "failed")
    assert state in refused.err


def test_a_paused_run_with_a_key_that_succeeded_meanwhile_exits_0(ferry: Ferry) -> None:
    """``run --key K`` read K as not done, paused before its write; another run of K
    succeeded. Refused under the lock (``task.key_succeeded``), it reports the success
    of the other (exit 0, not run), as if it had read it first."""
    paused = ferry.start_stopped("run", "--key", "K", "--", "true", at="before:SUBMITTED")
    ferry.ok("run", "--key", "K", "--", "true")
    code, err = finish(paused)
    assert code == 0 and "already succeeded" in err, err
    assert len(ferry.tasks()) == 1


def test_an_end_decided_before_a_cancel_request_is_decided_again(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``work`` had its task's end (exit 3, ``--retries 1``) and decided its write
    (SETTLED FAILED with its automatic RETRIED), then paused before it; ``cancel``
    journaled CANCEL_REQUESTED meanwhile. Before: the end was written as decided, the
    retry with it: the cancelled task ran again as attempt 2 (and ``cancel`` said it
    was cancelled). Now the end is refused under the lock (``task.cancel_requested``)
    and decided again: CANCELLED with the task's own exit status, no retry."""
    mark = tmp_path / "runs"
    argv = counting_task(mark, linger="; exit 3")
    task_id = ferry.ok("submit", "--retries", "1", "--retry-delay", "0.1", "--", *argv).text.strip()
    work = ferry.start_stopped("work", "-j", "1", "--drain", at="launcher:before:SETTLED")
    cancel = ferry.start_stopped("cancel", task_id, at="after:CANCEL_REQUESTED")
    code, err = finish(work)
    assert code == 1, err
    assert finish(cancel)[0] == 0
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["exit_code"], task["attempt"]) == (
        "CANCELLED", "CANCELLED_BY_USER", 3, 1,
    ), task  # fmt: skip
    assert runs(mark) == 1
    ferry.verify_clean()


def test_a_success_decided_before_a_cancel_request_is_written_cancelled(ferry: Ferry) -> None:
    """The same for ``run`` (its end delivered as the supervisor's are): a task that
    exited 0, its SUCCEEDED decided, then a cancel requested before the write. The
    write after the request is CANCELLED (exit status 0 kept), as an end decided after
    it is; ``run`` passes the task's own status through."""
    run = ferry.start_stopped("run", "--", "true", at="launcher:before:SETTLED")
    task_id = str(ferry.tasks()[-1]["id"])
    cancel = ferry.start_stopped("cancel", task_id, at="after:CANCEL_REQUESTED")
    code, err = finish(run)
    assert code == 0, err
    assert finish(cancel)[0] == 0
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["exit_code"]) == (
        "CANCELLED", "CANCELLED_BY_USER", 0,
    ), task  # fmt: skip
    ferry.verify_clean()


@pytest.mark.parametrize("command", [("work", "-j", "1", "--drain"), ("claim",)])
def test_a_task_cancelled_while_its_pinned_inputs_were_hashed_never_starts(
    ferry: Ferry, tmp_path: Path, command: tuple[str, ...]
) -> None:
    """A task with a pinned input is claimed alone (CLAIMED), hashed by its supervisor,
    then its DISPATCHING written. ``work`` (``claim``) paused before that write while
    ``cancel`` journaled CANCEL_REQUESTED for the CLAIMED task. Before: the DISPATCHING
    was written after the request and the task started and ran to its end. Now the
    DISPATCHING is refused under the lock (``task.cancel_requested``): the task is
    CANCELLED before any spawn."""
    pinned, mark = tmp_path / "input", tmp_path / "runs"
    pinned.write_text("data\n")
    task_id = ferry.ok(
        "submit", "--pointer", str(pinned), "--kill-grace", "1", "--", *counting_task(mark)
    ).text.strip()
    leader = ferry.start_stopped(*command, at="launcher:before:DISPATCHING")
    assert ferry.task(task_id)["state"] == "CLAIMED"
    cancel = ferry.start_stopped("cancel", task_id, at="after:CANCEL_REQUESTED")
    code, err = finish(leader)
    assert code in (0, 1, 128 + signal.SIGTERM), err
    assert finish(cancel)[0] == 0
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["started_at"]) == (
        "CANCELLED", "CANCELLED_BY_USER", None,
    ), task  # fmt: skip
    assert runs(mark) == 0
    assert "DISPATCHING" not in [r["type"] for r in ferry.records()]
    ferry.verify_clean()
