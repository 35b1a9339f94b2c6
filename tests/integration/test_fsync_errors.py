"""fdatasync errors (EIO, injected with strace) in one ferry process: what the others,
and that process's own caller, see.

A record another process wrote and could not make durable is taken back by its writer,
which exits 125: "ferry failed before the task could start". A ``work`` leader that
read it in between (a lock-free catch-up reads what is written, synced or not) must
never run that task, nor write at its stale end: it finds the record gone, reads the
journal again (``Store._reopen``) and goes on. Found by a
review: the leader claimed and ran the task, writing its records at the stale offset
behind the next submit's record and a run of zeros; every command then exited 4 ("a
whole line that no torn write leaves") until a salvage. The journal-level tests are
``tests/unit/test_journal_taken_back.py``.

A ``run`` whose own write of its task's end fails: the task ran; its status passes
through, and its supervisor, let go, writes the end (was: 125, which tells a script
that retries to run the task again)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from clikit import Ferry, finish, wait_until

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shutil.which("strace"), reason="needs strace"),
]

# The submit's first fdatasync (its record's) waits 2 s, then fails: the leader polls
# every 0.1 s meanwhile, and reads the record.
FAILING_FSYNC = (
    "strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=fdatasync",
    "-e", "inject=fdatasync:delay_enter=2000000:error=EIO:when=1",
)  # fmt: skip


@pytest.mark.parametrize("then_another_submit", [True, False])
def test_a_task_whose_submit_failed_its_fsync_is_never_run(
    ferry: Ferry, tmp_path: Path, then_another_submit: bool
) -> None:
    ferry.ok("submit", "--name", "first", "--", "true")
    work = ferry.start("work", "-j", "1", "--poll", "0.1", stdout=subprocess.DEVNULL)
    wait_until(lambda: ferry.tasks()[0]["state"] == "SUCCEEDED", what="the first task to run")
    ran = tmp_path / "ran"
    failed = ferry(
        "submit", "--name", "phantom", "--not-before", "+3",
        "--", "sh", "-c", f"echo ran >> {ran}", "x" * 600,
        command=(*FAILING_FSYNC, *ferry.command),
    )  # fmt: skip
    assert failed.code == 125 and failed.error_code() == "io.device_error", failed
    # (a short record where the phantom's began, then zeros; or none)
    real = ferry.ok("submit", "--name", "real", "--", "true") if then_another_submit else None
    assert ferry.ok("submit", "--name", "after", "--", "true").code == 0
    wait_until(
        lambda: [t["state"] for t in ferry.tasks() if t["name"] == "after"] == ["SUCCEEDED"],
        what="work to go on, the journal read again",
    )
    work.send_signal(signal.SIGTERM)
    code, err = finish(work)
    assert code == 0 and "error[" not in err, err
    assert not ran.exists()
    assert ferry.ok("journal", "verify").code == 0
    tasks = ferry.tasks()
    assert [t["name"] for t in tasks] == ["first", *(["real"] if real else []), "after"]
    assert {t["state"] for t in tasks} == {"SUCCEEDED"}


@pytest.mark.parametrize(
    ("script", "fails"),
    [
        ("echo task-ran; exit 3", "when=2"),  # the end's write (SPAWNED goes with it)
        ("echo task-ran; sleep 0.3; exit 3", "when=2+"),  # SPAWNED's, and the end's
    ],
)
def test_run_whose_write_of_its_task_end_fails_passes_the_task_status_through(
    ferry: Ferry, script: str, fails: str
) -> None:
    """(A review of this fix: a failed SPAWNED write was told to the supervisor as
    durable, so nobody wrote it, the task left without a start; and ``run --json``
    printed a task object of 1970, without its number, times or evidence.)"""
    ferry.ok("submit", "--", "true")  # (a segment exists: run's first fdatasync is its intent)
    # (run's own fdatasyncs after its intent's: not its supervisor's, which is not traced)
    end_fails = (
        "strace", "-qq", "-o", os.devnull, "-e", "trace=fdatasync",
        "-e", f"inject=fdatasync:error=EIO:{fails}",
    )  # fmt: skip
    result = ferry("--json", "run", "--", "sh", "-c", script, command=(*end_fails, *ferry.command))
    assert result.code == 3, result
    assert "its supervisor keeps it and writes it" in result.err, result.err
    assert "Input/output error" in result.err
    said = json.loads(result.out)
    ran = wait_until(
        lambda: next((t for t in ferry.tasks() if t["state"] == "FAILED"), None),
        what="the supervisor to write the end",
    )
    assert (ran["reason"], ran["exit_code"], ran["pid"]) == ("EXIT_NONZERO", 3, said["pid"])
    assert ran["started_at"] is not None
    for field in ("id", "number", "created_at", "state", "reason", "exit_code", "claimed_by"):
        assert said[field] == ran[field], field
    assert said["started_at"] is not None and said["ended_at"] is not None
    assert ferry.ok("journal", "verify").code == 0


@pytest.mark.parametrize("launcher", ["run", "work"])
def test_a_cancel_whose_fsync_failed_never_stops_the_task(
    ferry: Ferry, tmp_path: Path, launcher: str
) -> None:
    """``cancel``'s fdatasync fails (EIO, after 2 s): it exits 125 and takes its record
    back. Meanwhile the task's launcher, at each beat, read the request (a catch-up
    without the lock reads it, synced or not). It must not stop the task for it: the
    request is confirmed under the lock first (``cancel_stands``). (Found by a review
    of the taken-back fix: the task was SIGTERMed, CANCELLED, though no request was
    ever committed.)"""
    gate = tmp_path / "gate"
    script = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    if launcher == "run":
        proc = ferry.start("run", "--heartbeat", "0.2", "--", "sh", "-c", script)
    else:
        ferry.ok("submit", "--heartbeat", "0.2", "--", "sh", "-c", script)
        proc = ferry.start("work", "--drain", "--poll", "0.1")
    task = wait_until(
        lambda: next((t for t in ferry.tasks() if t["state"] == "RUNNING"), None),
        what="the task to run",
    )
    failed = ferry("cancel", task["id"], command=(*FAILING_FSYNC, *ferry.command))
    assert failed.code == 125 and failed.error_code() == "io.device_error", failed
    beats = Path(ferry.home) / "heartbeats" / f"{task['id']}.1"
    seen = beats.stat().st_mtime_ns
    for _ in range(3):  # (three beats after it: each one a look at the journal)
        seen = wait_until(lambda s=seen: (m := beats.stat().st_mtime_ns) > s and m, what="a beat")
    gate.touch()
    code, err = finish(proc)
    assert code == 0, err
    ended = ferry.task(task["id"])
    assert (ended["state"], ended["cancel_requested"]) == ("SUCCEEDED", False)
    assert ferry.ok("journal", "verify").code == 0


def _in_background(ferry: Ferry, *args: str) -> concurrent.futures.Future[Any]:
    """``ferry(*args)`` whose first fdatasync waits 2 s then fails, in a thread."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(ferry, *args, command=(*FAILING_FSYNC, *ferry.command))
    pool.shutdown(wait=False)
    return future


def _written(ferry: Ferry, record_type: str) -> None:
    """Until a lock-free read shows a ``record_type`` record (written, not yet synced)."""
    wait_until(
        lambda: record_type in ferry.ok("journal", "dump").out.decode(),
        what=f"the {record_type} record to be written",
    )


def test_a_compaction_never_removes_the_files_of_a_gc_taken_back(ferry: Ferry) -> None:
    """``gc``'s fdatasync fails (it exits 125 and takes its FORGOTTEN back: nothing is
    forgotten). A ``journal compact`` that read the record meanwhile (lock-free) merged
    the history and removed the task's log before its snapshot's locked catch-up found
    the record gone: the task stayed, its log was lost (found by a review). A
    compaction now reads under the lock (``sync``) before it decides anything."""
    ferry.ok("run", "--", "sh", "-c", "echo precious output")
    task_id = ferry.tasks()[0]["id"]
    gc = _in_background(ferry, "gc", "--older-than", "0s")
    _written(ferry, "FORGOTTEN")
    compact = ferry("journal", "compact")
    assert compact.code in (0, 75), compact
    failed = gc.result(timeout=60)
    assert failed.code == 125 and failed.error_code() == "io.device_error", failed
    assert [t["id"] for t in ferry.tasks()] == [task_id]
    logs = ferry("logs", task_id)
    assert (logs.code, logs.out, logs.err) == (0, b"precious output\n", ""), logs
    assert ferry.ok("journal", "verify").code == 0


def test_a_supervisor_alone_never_ends_its_task_cancelled_for_a_cancel_taken_back(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``run`` killed with -9: its supervisor goes on alone, and at its task's end looks
    for a cancel request. A ``cancel`` whose fdatasync failed (taken back, 125) was read
    there without the lock, and the end was written CANCELLED though no request was
    ever committed (found by a review). It is confirmed under the lock now."""
    gate = tmp_path / "gate"
    run = ferry.start(
        "run", "--heartbeat", "30", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    task = wait_until(lambda: next((t for t in ferry.tasks() if t["pid"]), None), what="a pid")
    run.kill()
    run.wait(timeout=30)
    cancel = _in_background(ferry, "cancel", task["id"])
    _written(ferry, "CANCEL_REQUESTED")
    gate.touch()
    failed = cancel.result(timeout=60)
    assert failed.code == 125 and failed.error_code() == "io.device_error", failed
    ended = wait_until(
        lambda: (t := ferry.task(task["id"]))["state"] != "RUNNING" and t, what="the task's end"
    )
    assert (ended["state"], ended["cancel_requested"]) == ("SUCCEEDED", False), ended
    assert ferry.ok("journal", "verify").code == 0


def test_a_drain_never_ends_on_a_cancel_taken_back(ferry: Ferry, tmp_path: Path) -> None:
    """``work --drain`` read (lock-free) a cancel of its only queued task that its
    writer then took back (125): the queue looked empty, the drain ended with the task
    still QUEUED, and its release of the lease met the taken-back record: exit 75
    (found by a review). An empty queue is confirmed under the lock before a drain
    ends, and a read taken back is read again."""
    ran = tmp_path / "ran"
    task_id = ferry.ok("submit", "--not-before", "+4", "--", "sh", "-c", f"echo ran > {ran}")
    work = ferry.start("work", "--drain", "--poll", "0.1", stdout=subprocess.DEVNULL)
    cancel = _in_background(ferry, "cancel", task_id.out.decode().strip())
    failed = cancel.result(timeout=60)
    assert failed.code == 125 and failed.error_code() == "io.device_error", failed
    code, err = finish(work)
    assert code == 0 and "error[" not in err, err
    assert ran.read_text() == "ran\n"
    assert [t["state"] for t in ferry.tasks()] == ["SUCCEEDED"]


def test_a_standby_work_goes_on_when_records_it_read_are_taken_back(ferry: Ferry) -> None:
    """A ``work`` waiting for the lease (another one leads) read a submit's record
    that its writer then took back: it exited 75 (``journal.taken_back``) where
    ``work`` goes on (found by a review)."""
    leader = ferry.start("work", "--poll", "0.1", stdout=subprocess.DEVNULL)
    wait_until(lambda: ferry.json("lease")["holder"], what="the leader")
    standby = ferry.start("work", "--poll", "0.1", stdout=subprocess.DEVNULL)
    failed = _in_background(ferry, "submit", "--not-before", "+60", "--", "true").result(timeout=60)
    assert failed.code == 125 and failed.error_code() == "io.device_error", failed
    done = ferry.ok("submit", "--", "true")  # (both have read the journal again meanwhile)
    wait_until(lambda: ferry.tasks()[-1]["state"] == "SUCCEEDED", what=f"{done} to run")
    assert standby.poll() is None, finish(standby)
    for proc in (standby, leader):
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
        assert code == 0 and "error[" not in err, err


@pytest.mark.parametrize("command", ["wait", "logs -f"])
def test_an_end_read_then_taken_back_is_never_said(ferry: Ferry, command: str) -> None:
    """``wait ID`` and ``logs -f ID`` read (lock-free) a cancel of the queued task that
    its writer then took back (125): ``wait`` said CANCELLED and exited 1, though the
    task stayed QUEUED and later SUCCEEDED (found by a review). An end is confirmed
    under the lock before it is said; a read taken back is read again."""
    task_id = ferry.ok("submit", "--not-before", "+3", "--", "echo", "hello").out.decode().strip()
    looking = ferry.start(*command.split(), task_id)
    wait_until(lambda: ferry.task(task_id), what="the task")  # (looking has read it by now)
    failed = _in_background(ferry, "cancel", task_id).result(timeout=60)
    assert failed.code == 125 and failed.error_code() == "io.device_error", failed
    assert looking.poll() is None, finish(looking)
    ferry.ok("work", "--drain", "--poll", "0.1")
    code, err = finish(looking)
    assert code == 0 and "error[" not in err, err
    assert ferry.task(task_id)["state"] == "SUCCEEDED"


def test_a_write_that_fails_for_one_task_of_many_leaves_the_others_to_go_on(ferry: Ferry) -> None:
    """``cancel A B C`` whose first write fails (EIO): A's error, then B and C cancelled,
    as each task on its own did before they shared one store (found by a review: the
    failed journal handle failed B and C too, no write tried)."""
    ids = [ferry.ok("submit", "--", "true").text.strip() for _ in range(3)]
    result = ferry("cancel", *ids, command=(*FAILING_FSYNC, *ferry.command))
    assert result.code == 125 and result.err.count("error[") == 1, result
    assert [t["state"] for t in ferry.tasks()] == ["QUEUED", "CANCELLED", "CANCELLED"]
    assert ferry.ok("journal", "verify").code == 0
