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

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

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
