"""fdatasync errors (EIO, injected with strace) in one ferry process: what the others,
and that process's own caller, see.

A record another process wrote and could not make durable is taken back by its writer,
which exits 125: "ferry failed before the task could start". A ``work`` leader that
read it in between (a lock-free catch-up reads what is written, synced or not) must
never run that task, nor write at its stale end: it finds the record gone and stops,
``journal.taken_back`` (75: a new ``work`` reads the journal as it is). Found by a
review: the leader claimed and ran the task, writing its records at the stale offset
behind the next submit's record and a run of zeros; every command then exited 4 ("a
whole line that no torn write leaves") until a salvage. The journal-level tests are
``tests/unit/test_journal_taken_back.py``.

A ``run`` whose own write of its task's end fails: the task ran; its status passes
through, and its supervisor, let go, writes the end (was: 125, which tells a script
that retries to run the task again)."""

from __future__ import annotations

import os
import shutil
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
    if then_another_submit:  # (a short record where the phantom's began, then zeros)
        ferry.ok("submit", "--name", "real", "--", "true")
    code, err = finish(work)
    assert code == 75 and "error[journal.taken_back]" in err, err
    assert not ran.exists()
    assert ferry.ok("journal", "verify").code == 0
    names = [t["name"] for t in ferry.tasks()]
    assert names == (["first", "real"] if then_another_submit else ["first"])
    ferry.ok("work", "--drain")
    assert {t["state"] for t in ferry.tasks()} == {"SUCCEEDED"} and not ran.exists()


def test_run_whose_write_of_its_task_end_fails_passes_the_task_status_through(
    ferry: Ferry,
) -> None:
    ferry.ok("submit", "--", "true")  # (a segment exists: run's first fdatasync is its intent)
    # (run's own second fdatasync, its end's: not its supervisor's, which is not traced)
    end_fails = (
        "strace", "-qq", "-o", os.devnull, "-e", "trace=fdatasync",
        "-e", "inject=fdatasync:error=EIO:when=2",
    )  # fmt: skip
    result = ferry(
        "run", "--", "sh", "-c", "echo task-ran; exit 3", command=(*end_fails, *ferry.command)
    )
    assert result.code == 3, result
    assert result.text == "task-ran\n"
    assert (
        "its supervisor keeps it and writes it" in result.err and "Input/output error" in result.err
    )
    ran = wait_until(
        lambda: next((t for t in ferry.tasks() if t["state"] == "FAILED"), None),
        what="the supervisor to write the end",
    )
    assert (ran["reason"], ran["exit_code"]) == ("EXIT_NONZERO", 3)
    assert ferry.ok("journal", "verify").code == 0
