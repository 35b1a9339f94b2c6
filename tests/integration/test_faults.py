"""Resource faults, reproduced for real through the ``ferry`` command: a full disk
(small tmpfs mounts) during a journal append, a log write and a snapshot; a read-only
filesystem; too few file descriptors; tasks that close their output early, flood it,
or leave a daemon behind that called setsid.

Each: a coded error (or the task's own status where the task was not at fault), the
journal still verifies, no committed record is lost, and ferry works again once the
resource is back. Mount-based tests skip where mounting is not permitted (not root).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from clikit import Ferry
from hardkit import cli_in, fill, mounted_tmpfs, pid_alive, tree, wait_for

from ferry.storage.local.statedir import ensure_home

PY = sys.executable
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Ferry]:
    with cli_in(tmp_path) as driver:
        ensure_home(driver.home)  # the state directory (a reader such as `ls` makes none)
        yield driver


def big_argv(size: int) -> list[str]:
    return ["true", "x" * size]


# ---- disk full --------------------------------------------------------------------------


def test_disk_full_during_a_journal_append(cli: Ferry) -> None:
    with mounted_tmpfs(cli.home / "journal", "size=512k,mode=0700"):
        for _ in range(3):
            cli.ok("run", "--", "true")
        cli.ok("submit", "--", "true")
        filler = fill(cli.home / "journal")
        # A record that fits in the segment's preallocated zero tail (64 KiB at least)
        # needs no new block: a full disk does not stop it.
        cli.ok("submit", "--", "true")
        committed = cli.records()
        # One that does not fit must grow the file: refused, nothing lost.
        failed = cli.refused(125, "io.no_space", "submit", "--", *big_argv(100_000))
        assert "No space left" in failed.err
        cli.refused(125, "io.no_space", "run", "--", *big_argv(100_000))  # refused, not run
        assert cli.json("journal", "verify")["status"] == "clean", "its bytes were taken back"
        assert cli.records()[: len(committed)] == committed
        assert len(cli.tasks()) == 5  # what was committed is all there
        filler.unlink()  # space is back
        cli.ok("submit", "--", *big_argv(100_000))
        cli.ok("run", "--", "true")
        cli.verify_clean()
        assert cli.records()[: len(committed)] == committed
        assert len(cli.tasks()) == 7


def test_disk_full_during_a_log_write(cli: Ferry, tmp_path: Path) -> None:
    flood = "import sys; sys.stdout.buffer.write(b'x' * 300_000); sys.stderr.write('end')"
    with mounted_tmpfs(cli.home / "logs", "size=64k,mode=0700"):
        result = cli("run", "--", PY, "-c", flood)
        assert result.code == 0, result.err  # the task's own status: it did nothing wrong
        assert result.out == b"x" * 300_000, "passthrough keeps every byte"
        task = cli.tasks()[-1]
        assert task["state"] == "SUCCEEDED"
        assert "No space left" in task["evidence"]["log_error"]
        assert "log is incomplete" in result.err, "not lost in silence"
        logs = cli("logs", task["id"])
        assert logs.code == 0 and "log is incomplete" in logs.err
        cli.verify_clean()
        shutil.rmtree(cli.home / "logs" / task["id"])  # space is back
        gone = cli("logs", task["id"])
        assert gone.out == b"" and "log is incomplete" in gone.err
        again = cli("run", "--", PY, "-c", "print('all of it')")
        assert again.code == 0
        second = cli.tasks()[-1]
        assert "log_error" not in second["evidence"]
        assert cli("logs", second["id"]).out == b"all of it\n"
        (cli.home / "logs" / second["id"] / "1.stdout").unlink()  # lost by hand
        missing = cli("logs", second["id"])
        assert missing.out == b"" and "missing" in missing.err


def test_no_inode_left_for_the_log_directory_fails_the_spawn_not_the_journal(cli: Ferry) -> None:
    with mounted_tmpfs(cli.home / "logs", "size=64k,nr_inodes=4,mode=0700") as logs:
        made = 0
        with pytest.raises(OSError):  # use every inode
            while True:
                (logs / f"f{made}").mkdir()
                made += 1
        cli.refused(125, "spawn.other", "run", "--", "true")
        task = cli.tasks()[-1]
        assert (task["state"], task["reason"]) == ("FAILED", "SPAWN_FAILED"), task
        cli.verify_clean()
        for name in range(made):
            (logs / f"f{name}").rmdir()
        cli.ok("run", "--", "true")


def test_a_full_disk_at_the_lease_s_release_is_a_notice_not_a_failure(cli: Ferry) -> None:
    """A home whose tasks' logs fill its file system: every task SUCCEEDED, then work's
    release of its lease (a new lease.json) met ENOSPC, and work exited 125 with a bare
    "No space left on device" and no summary (a review). The lease's holder is gone
    once work exits (the next work takes it over at once): a notice, and the exit the
    tasks earned."""
    with mounted_tmpfs(cli.home, "size=2m,mode=0700"):
        for _ in range(6):
            cli.ok("submit", "--shell", "--", "head -c 400000 /dev/zero | base64 -w 100")
        result = cli("work", "-j", "2", "--drain")
        assert {t["state"] for t in cli.tasks()} == {"SUCCEEDED"}
        assert result.code == 0, result.err
        assert "the lease was not released" in result.err, result.err
        assert "6 succeeded" in result.err, result.err
        cli.ok("run", "--", "true")  # (the next one takes the lease over)


def test_disk_full_during_a_snapshot(cli: Ferry) -> None:
    with mounted_tmpfs(cli.home / "journal", "size=128k,mode=0700") as journal:
        for _ in range(3):
            cli.ok("run", "--", "true")
        committed, tasks = cli.records(), cli.tasks()
        filler = fill(journal)
        cli.refused(125, "io.no_space", "journal", "compact")
        assert not list(journal.glob("snapshot-*")), "no snapshot name for a partial file"
        cli.verify_clean()
        assert (cli.records(), cli.tasks()) == (committed, tasks)
        filler.unlink()
        cli.ok("journal", "compact")
        assert len(list(journal.glob("snapshot-*"))) == 1
        cli.verify_clean()
        assert cli.tasks() == tasks


def test_disk_full_while_writing_the_settled_archive(cli: Ferry) -> None:
    with mounted_tmpfs(cli.home / "archive", "size=64k,mode=0700") as archive:
        for _ in range(3):
            cli.ok("run", "--name", "n" * 200, "--", "true")
        tasks = cli.tasks()
        fill(archive)
        cli.refused(125, "io.no_space", "journal", "compact")
        assert sorted(os.listdir(archive)) == ["filler"], "no partial temp file left"
        cli.verify_clean()
        assert cli.tasks() == tasks
        (archive / "filler").unlink()
        cli.ok("journal", "compact")
        cli.verify_clean()
        assert cli.tasks() == tasks


# ---- a read-only filesystem -------------------------------------------------------------


def test_a_read_only_filesystem_refuses_every_writer_and_changes_nothing(
    tmp_path: Path,
) -> None:
    with mounted_tmpfs(tmp_path / "fs", "size=1m,mode=0700") as fs, cli_in(tmp_path) as cli:
        cli.home = fs / "home"
        cli.env["FERRY_HOME"] = str(cli.home)
        cli.ok("run", "--", "true")
        cli.ok("submit", "--", "true")
        before = tree(cli.home)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True, timeout=30)
        try:
            for args in (["run", "--", "true"], ["submit", "--", "true"], ["work", "--drain"]):
                cli.refused(125, "state_dir.not_writable", *args)
            for args in (["ls"], ["journal", "verify"]):  # readers show it as it is
                assert "read-only" in cli.ok(*args).err
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True, timeout=30)
        assert tree(cli.home) == before
        cli.ok("work", "--drain")
        assert {t["state"] for t in cli.tasks()} == {"SUCCEEDED"}
        cli.verify_clean()


# ---- file descriptors -------------------------------------------------------------------


def fd_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


def test_too_few_file_descriptors_for_run_is_a_coded_spawn_failure(cli: Ferry) -> None:
    for limit in (7, 8, 10, 12, 16, 64):
        result = cli("run", "--", "true", preexec=fd_limit(limit))
        assert result.code in (0, 125), (limit, result)
        if result.code:
            assert result.error_code() in ("spawn.other", "io.too_many_open_files"), result.err
    tasks = cli.tasks()
    assert {t["state"] for t in tasks} <= TERMINAL, "none left DISPATCHING for recovery"
    assert tasks[-1]["state"] == "SUCCEEDED"
    for task in tasks:
        if task["reason"] == "SPAWN_FAILED":
            assert task["evidence"]["error"]["details"]["errno"] == 24  # EMFILE
    cli.verify_clean()


def test_too_few_file_descriptors_for_work_gives_back_tasks_it_cannot_start(cli: Ferry) -> None:
    """A task work could not start for want of descriptors never ran: it goes back to
    the queue (it was FAILED SPAWN_FAILED, for the user to retry by hand)."""
    for _ in range(6):
        cli.ok("submit", "--", "sh", "-c", "echo hi")
    result = cli("work", "--drain", "-j", "4", preexec=fd_limit(16))
    assert result.code in (0, 125), result.err
    if result.code:
        assert result.error_code() == "io.too_many_open_files", result.err
    tasks = cli.tasks()
    assert {t["state"] for t in tasks} <= {"SUCCEEDED", "QUEUED"}, tasks
    assert all(t["attempt"] == 1 for t in tasks)
    cli.verify_clean()
    cli.ok("work", "--drain", "-j", "4")
    assert {t["state"] for t in cli.tasks()} == {"SUCCEEDED"}


def test_work_short_of_descriptors_for_its_slots_runs_fewer_tasks_at_once(cli: Ferry) -> None:
    """With descriptors for some supervisors but not for -j of them (and the ones
    that exited still closing under load), work runs fewer at once: it ended with
    io.too_many_open_files (exit 125) half-way through its queue."""
    for _ in range(6):
        cli.ok("submit", "--", "sh", "-c", "echo hi")
    result = cli("work", "--drain", "-j", "4", preexec=fd_limit(14))
    assert result.code == 0, result.err
    assert "cannot start another supervisor (Too many open files)" in result.err
    assert {t["state"] for t in cli.tasks()} == {"SUCCEEDED"}
    cli.verify_clean()


def test_work_that_can_start_no_task_for_want_of_descriptors_stops_with_its_queue_kept(
    cli: Ferry,
) -> None:
    """A supervisor can be made but cannot start a task (no descriptor for its pipes)
    and nothing else runs: work stops, exit 125, rather than failing its whole queue
    one task a second; the task that met it never ran, and is queued again (it was
    FAILED SPAWN_FAILED: a review)."""
    for _ in range(6):
        cli.ok("submit", "--", "sh", "-c", "echo hi")
    result = cli("work", "--drain", "-j", "4", preexec=fd_limit(11))
    assert result.code == 125, result.err
    assert result.error_code() == "io.too_many_open_files", result.err
    tasks = cli.tasks()
    assert [(t["state"], t["attempt"]) for t in tasks] == [("QUEUED", 1)] * 6, tasks
    released = [r["data"] for r in cli.records() if r["type"] == "RELEASED"]
    assert released and all(r["counted"] is True for r in released), released
    assert released[0]["evidence"]["not_started"]["details"]["errno"] == 24  # EMFILE
    cli.verify_clean()
    cli.ok("work", "--drain", "-j", "4")
    assert {t["state"] for t in cli.tasks()} == {"SUCCEEDED"}


STRACE = ["strace", "-f", "-qq", "-o", os.devnull]
TRUE = shutil.which("true") or "/bin/true"


def no_memory_for(program: str) -> list[str]:
    """strace making every exec of ``program`` (by that path) fail ENOMEM: a start
    that fails for want of memory, the rest of the machine untouched."""
    return [*STRACE, "-P", program, "-e", "trace=execve", "-e", "inject=execve:error=ENOMEM"]


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_work_that_can_start_no_process_keeps_its_whole_queue(cli: Ferry) -> None:
    """The process limit reached (``ulimit -u``: fork and posix_spawn fail EAGAIN; made
    here by strace for every clone3, the supervisors' spawn of their task) under
    ``work -j 2``: every task of the queue was FAILED SPAWN_FAILED (a review), each
    failure seeing the other slot's task, just claimed, as one whose end could free a
    process; then the tasks it met were (a task never started is not a failure). Only a
    task that started counts; those it could not start never ran: all stay QUEUED."""
    for _ in range(6):
        cli.ok("submit", "--", "sh", "-c", "echo hi")
    strace = [*STRACE, "-e", "trace=clone3", "-e", "inject=clone3:error=EAGAIN"]
    result = cli("work", "--drain", "-j", "2", command=[*strace, *cli.command])
    assert result.code == 125, result.err
    assert "cannot start tasks" in result.err, result.err
    tasks = cli.tasks()
    assert [(t["state"], t["attempt"]) for t in tasks] == [("QUEUED", 1)] * 6, tasks
    cli.verify_clean()


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_work_short_of_memory_beside_a_running_task_waits_for_its_end(cli: Ferry) -> None:
    """A task that cannot start for want of memory while another task of the same work
    runs (whose end may free some): given back, and no claim until that task ends,
    rather than claiming the same task again and again while it runs. Then, nothing
    running, the next failure stops work (125) with its queue kept."""
    cli.ok("submit", "--", "sh", "-c", "sleep 3")
    work = cli.start("work", "--drain", "-j", "2", "--poll", "0.1",
                     command=[*no_memory_for(TRUE), *cli.command])  # fmt: skip
    cli.wait_running()
    for _ in range(3):
        cli.ok("submit", "--", TRUE)
    _, err = work.communicate(timeout=60)
    assert work.returncode == 125, err
    assert b"cannot start tasks" in err, err
    tasks = cli.tasks()
    assert [t["state"] for t in tasks] == ["SUCCEEDED", "QUEUED", "QUEUED", "QUEUED"], tasks
    released = [r["data"] for r in cli.records() if r["type"] == "RELEASED"]
    not_started = [r for r in released if "not_started" in r["evidence"]]
    # (One while the sleep ran, one or two after it, in the claim that then stopped
    # work: it was claimed and given back every few milliseconds while the sleep ran.)
    assert 2 <= len(not_started) <= 3 and len(released) <= 4, released
    assert {r["evidence"]["not_started"]["details"]["errno"] for r in not_started} == {12}
    cli.ok("work", "--drain")
    assert {t["state"] for t in cli.tasks()} == {"SUCCEEDED"}


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_a_task_that_never_starts_is_given_back_a_bounded_number_of_times(cli: Ferry) -> None:
    """A task whose own start always fails for want of memory (every exec of it ENOMEM)
    at the head of the queue: each work (from cron, say) gave it back uncounted and
    stopped, and the task behind it never ran (a review). Its give-backs count against
    --max-releases: past them it ends FAILED SPAWN_FAILED, and the queue moves on."""
    stuck = cli.ok("-q", "submit", "--max-releases", "2", "--", TRUE).text.strip()
    behind = cli.ok("-q", "submit", "--", "echo", "behind").text.strip()
    command = [*no_memory_for(TRUE), *cli.command]
    codes = [cli("work", "--drain", "-j", "1", command=command).code for _ in range(4)]
    assert codes == [125, 125, 125, 0], codes  # (each stops at a start that failed so)
    task = cli.task(stuck)
    assert (task["state"], task["reason"], task["releases"]) == ("FAILED", "SPAWN_FAILED", 2)
    assert cli.task(behind)["state"] == "SUCCEEDED"
    released = [r["data"] for r in cli.records() if r["type"] == "RELEASED"]
    assert [r["counted"] for r in released] == [True, True], released


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_claim_short_of_memory_gives_the_task_back_and_run_fails_its_own(cli: Ferry) -> None:
    """``claim`` of a queued task it cannot start for want of memory: exit 125, the task
    queued again (counted against --max-releases). ``run``'s own task, which no one else would run, is
    FAILED SPAWN_FAILED (125 as well)."""
    queued = cli.ok("-q", "submit", "--", TRUE).out.strip()
    command = [*no_memory_for(TRUE), *cli.command]
    result = cli("claim", command=command)
    assert result.code == 125, result.err
    assert "Cannot allocate memory" in result.err and "is back in the queue" in result.err
    task = cli.json("show", queued)
    assert (task["state"], task["attempt"], task["releases"]) == ("QUEUED", 1, 1), task
    ran = cli("run", "--", TRUE, command=command)
    assert ran.code == 125, ran.err
    last = cli.json("show", "last")
    assert (last["state"], last["reason"]) == ("FAILED", "SPAWN_FAILED"), last
    cli.ok("claim")
    assert cli.json("show", queued)["state"] == "SUCCEEDED"


def test_work_keeps_descriptors_for_its_lease_while_its_tasks_hold_the_rest(
    cli: Ferry,
) -> None:
    """Supervisors made up to the limit left none for the lease's renewal: work ended
    io.too_many_open_files (125) while its tasks ran on, the rest of the queue waiting."""
    for _ in range(6):
        cli.ok("submit", "--", "sleep", "1.5")
    result = cli("work", "--drain", "-j", "4", "--lease-ttl", "2", preexec=fd_limit(14))
    assert result.code == 0, result.err
    assert {t["state"] for t in cli.tasks()} == {"SUCCEEDED"}
    cli.verify_clean()


# ---- tasks that misuse their streams ------------------------------------------------------


def test_a_task_that_closes_its_stdout_early_still_ends_on_its_own_exit(
    cli: Ferry, tmp_path: Path
) -> None:
    done = tmp_path / "done"
    script = (
        f"exec 1>&-; echo after-stdout-closed >&2; exec 2>&-; sleep 0.2; touch '{done}'; exit 7"
    )
    result = cli("run", "--", "sh", "-c", script)
    assert result.code == 7
    assert done.exists(), "ferry waited for the exit, not for the pipes to close"
    task = cli.tasks()[-1]
    assert (task["state"], task["exit_code"]) == ("FAILED", 7)
    assert cli("logs", task["id"], "--stream", "stderr").out == b"after-stdout-closed\n"
    assert cli("logs", task["id"], "--stream", "stdout").out == b""


def test_a_task_that_fills_the_pipe_and_never_reads_stdin(cli: Ferry) -> None:
    flood = (
        "import sys\n"
        "for _ in range(64):\n"
        "    sys.stdout.buffer.write(b'o' * 65536); sys.stderr.buffer.write(b'e' * 65536)\n"
    )
    feeder = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        assert feeder.stdout is not None
        result = cli("run", "--", PY, "-c", flood, stdin=feeder.stdout.fileno())
    finally:
        feeder.kill()
        feeder.wait(timeout=30)
        if feeder.stdout is not None:
            feeder.stdout.close()
    assert result.code == 0
    assert result.out == b"o" * (64 << 16)
    task_id = cli.tasks()[-1]["id"]
    assert cli("logs", task_id, "--stream", "stderr").out == b"e" * (64 << 16)


# ---- a daemon that left the task's process group -----------------------------------------

# The task starts a daemon in its own session (setsid) and waits until it has written
# its pid; then it sleeps (or exits). Without the marker sweep a timeout would leave the
# daemon running: it is in no process group ferry signals.
DAEMON = (
    'setsid -f sh -c \'{trap} echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 300 {quiet}\' '
    '"$0"; while [ ! -s "$0" ]; do sleep 0.01; done; {then}'
)


def daemon_script(ignore_term: bool, then: str = "sleep 300", holds_pipes: bool = False) -> str:
    """``holds_pipes``: the daemon keeps the task's stdout/stderr open (ferry reads them
    for at most its drain bound after the group is gone, then sweeps)."""
    return DAEMON.format(
        trap='trap "" TERM;' if ignore_term else "",
        quiet="" if holds_pipes else ">/dev/null 2>&1",
        then=then,
    )


@pytest.mark.parametrize(
    ("ignore_term", "holds_pipes"),
    [(False, True), (True, False)],
    ids=["holding-the-pipes", "ignoring-sigterm"],
)
def test_a_setsid_daemon_is_killed_on_timeout(
    cli: Ferry, tmp_path: Path, ignore_term: bool, holds_pipes: bool
) -> None:
    pidfile = tmp_path / "daemon.pid"
    script = daemon_script(ignore_term, holds_pipes=holds_pipes)
    result = cli("run", "--timeout", "1", "--kill-grace", "0.5", "--",
                 "sh", "-c", script, str(pidfile))  # fmt: skip
    assert result.code == 124
    assert pidfile.exists(), "the daemon started before the timeout"
    assert not pid_alive(int(pidfile.read_text())), "the daemon outlived the timeout"
    task = cli.tasks()[-1]
    assert (task["state"], task["reason"]) == ("FAILED", "TIMEOUT")
    assert task["evidence"]["escapees_stopped"] is True
    assert cli.live_task_processes() == []


def test_a_setsid_daemon_is_killed_when_ferry_is_signalled(cli: Ferry, tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    proc = cli.start(
        "run", "--kill-grace", "0.5", "--", "sh", "-c", daemon_script(True), str(pidfile)
    )
    wait_for(lambda: pidfile.exists(), "the daemon")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not pid_alive(int(pidfile.read_text()))
    assert cli.tasks()[-1]["evidence"]["escapees_stopped"] is True
    assert cli.live_task_processes() == []


def test_a_daemon_left_by_a_task_that_exited_by_itself_is_kept(cli: Ferry, tmp_path: Path) -> None:
    """The other side of the sweep: only a task ferry stops loses its daemons."""
    pidfile = tmp_path / "daemon.pid"
    try:
        assert cli("run", "--", "sh", "-c", daemon_script(False, "exit 0"), str(pidfile)).code == 0
        assert pid_alive(int(pidfile.read_text()))
        assert "escapees_stopped" not in cli.tasks()[-1]["evidence"]
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
