"""The task-running commands through the real ``ferry`` console script, as a user runs them.

Every test gets its own FERRY_HOME. Every ferry process a test starts in the background
is reaped at teardown, and any process still carrying the test's FERRY_HOME in its
environment (a task that escaped) is killed then, so one failing test cannot leave
work behind for the next. No fixed sleeps: waits poll a condition with a deadline;
tasks that must outlive a check wait for a "go" file the test creates.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import CLI_TIMEOUT_S, Ferry, wait_stopped, wait_until
from hardkit import holds_open_below, pid_alive, slow_to_hash, wait_for
from taskscripts import TREE_LEAF

from ferry.proc.process import read_stat

PY = sys.executable


def _find_ferry() -> str:
    beside = Path(sys.executable).parent / "ferry"
    if beside.exists():
        return str(beside)
    found = shutil.which("ferry")
    if found is None:  # pragma: no cover - ferry not installed in this interpreter's env
        pytest.skip("the ferry console script is not installed", allow_module_level=True)
    return found


CONSOLE_SCRIPT = _find_ferry()

# A process tree for signal tests: the leader dies of the signal by default action; its
# child (same process group) writes the signal number to argv[1] when one arrives and
# reports ready (its pid) in argv[2] once its handlers are in place.
TREE_LEADER = r"""
import signal, subprocess, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
sys.exit(subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]]).wait())
"""
# Ignores SIGTERM and SIGINT, reports ready in argv[1], then waits forever.
STUBBORN = r"""
import signal, sys, time
def note(signum, frame):  # survive it, and say it came: READY.<signum>
    open(f"{sys.argv[1]}.{signum}", "w").close()
signal.signal(signal.SIGTERM, note)
signal.signal(signal.SIGINT, note)
open(sys.argv[1], "w").close()
while True:
    time.sleep(60)
"""


def wait_go(go: Path) -> str:
    """Shell text that blocks until ``go`` exists (the test decides when a task ends)."""
    return f"while [ ! -e '{go}' ]; do sleep 0.02; done"


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    """Wait for a background ferry; its exit status and stderr (never a traceback)."""
    _, err_bytes = proc.communicate(timeout=CLI_TIMEOUT_S)
    err = err_bytes.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    return proc.returncode, err


@pytest.fixture
def ferry(ferry_home: Path, tmp_path: Path) -> Iterator[Ferry]:
    """As a user runs it: the console script, from a work directory; what a background
    ferry prints goes to /dev/null unless a test says otherwise."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    driver = Ferry(ferry_home, workdir, command=[CONSOLE_SCRIPT], start_stdout=subprocess.DEVNULL)
    try:
        yield driver
    finally:
        driver.close()


# -- exit status -------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 42])
def test_exit_status_passes_through(ferry: Ferry, code: int) -> None:
    result = ferry("run", "--", "sh", "-c", f"exit {code}")
    assert result.code == code
    task = ferry.only_task()
    assert task["exit_code"] == code
    assert (task["state"], task["reason"]) == (
        ("SUCCEEDED", None) if code == 0 else ("FAILED", "EXIT_NONZERO")
    )


def test_json_among_the_task_s_words_is_the_task_s(ferry: Ferry) -> None:
    """(Found by a review: ``--json`` was taken out of CMD given without ``--``, and out
    of an option's value, and ferry answered in JSON.)"""
    assert ferry.ok("run", "echo", "hello", "--json").out == b"hello --json\n"
    ferry.ok("submit", "--name", "--json", "printf", "%s", "--json")
    task = ferry.tasks()[-1]
    assert (task["name"], task["argv"]) == ("--json", ["printf", "%s", "--json"])


def test_timeout_exits_124_and_kills_the_whole_tree(ferry: Ferry, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 300 & echo $! > '{pidfile}'; wait"
    result = ferry("run", "--timeout", "2", "--kill-grace", "5", "--", "sh", "-c", script)
    assert result.code == 124
    task = ferry.only_task()
    assert (task["state"], task["reason"]) == ("FAILED", "TIMEOUT")
    grandchild = int(pidfile.read_text())
    assert not pid_alive(grandchild)
    assert ferry.live_task_processes() == []


def test_timeout_kills_a_tree_that_ignores_sigterm_after_the_grace(
    ferry: Ferry, tmp_path: Path
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = f"trap '' TERM; sleep 300 & echo $! > '{pidfile}'; wait"
    result = ferry("run", "--timeout", "1", "--kill-grace", "0.5", "--", "sh", "-c", script)
    assert result.code == 124
    task = ferry.only_task()
    assert (task["state"], task["reason"]) == ("FAILED", "TIMEOUT")
    assert task["evidence"]["killed_after_grace"] is True
    assert not pid_alive(int(pidfile.read_text()))
    assert ferry.live_task_processes() == []


def test_not_executable_exits_126(ferry: Ferry, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o644)
    result = ferry("run", "--", str(script))
    assert result.code == 126
    assert "ferry: error[spawn.not_executable]" in result.err
    assert result.out == b""
    task = ferry.only_task()
    assert (task["state"], task["reason"]) == ("FAILED", "SPAWN_FAILED")


def test_a_directory_as_command_exits_126(ferry: Ferry, tmp_path: Path) -> None:
    result = ferry("run", "--", str(tmp_path))
    assert result.code == 126
    assert "error[spawn.not_executable]" in result.err


@pytest.mark.parametrize("command", ["ferry-no-such-command-xyz", "/nonexistent/ferry-cmd"])
def test_command_not_found_exits_127(ferry: Ferry, command: str) -> None:
    result = ferry("run", "--", command)
    assert result.code == 127
    assert "error[spawn.not_found]" in result.err
    assert ferry.only_task()["reason"] == "SPAWN_FAILED"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1])
def test_task_killed_by_signal_n_exits_128_plus_n(ferry: Ferry, signum: int) -> None:
    result = ferry("run", "--", "sh", "-c", f"kill -{int(signum)} $$")
    assert result.code == 128 + signum
    task = ferry.only_task()
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", signum)
    assert task["exit_code"] is None


# -- signals sent to ferry ---------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_ferry_reaches_the_grandchild(
    ferry: Ferry, tmp_path: Path, signum: int
) -> None:
    marker, ready = tmp_path / "marker", tmp_path / "ready"
    proc = ferry.start(
        "run", "--kill-grace", "10", "--", PY, "-c", TREE_LEADER, TREE_LEAF, str(marker), str(ready)
    )
    wait_for(ready.exists, "the grandchild's handlers")
    proc.send_signal(signum)
    code, _ = finish(proc)
    assert code == 128 + signum  # 143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP
    assert marker.read_text() == str(int(signum))  # the grandchild got it, not just the leader
    task = ferry.only_task()
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", signum)
    assert task["evidence"]["forwarded_signal"] == signum
    assert ferry.live_task_processes() == []


def test_kill_grace_then_sigkill_for_a_task_that_ignores_sigterm(
    ferry: Ferry, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    proc = ferry.start("run", "--kill-grace", "0.5", "--", PY, "-c", STUBBORN, str(ready))
    wait_for(ready.exists, "the stubborn task to ignore SIGTERM")
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert code == 128 + signal.SIGKILL
    task = ferry.only_task()
    assert task["signal"] == signal.SIGKILL
    assert task["evidence"]["forwarded_signal"] == signal.SIGTERM
    assert task["evidence"]["killed_after_grace"] is True
    assert ferry.live_task_processes() == []


def test_a_second_signal_kills_at_once(ferry: Ferry, tmp_path: Path) -> None:
    # With a grace of 10 minutes, only the escalation can end this within the deadline.
    ready = tmp_path / "ready"
    proc = ferry.start("run", "--kill-grace", "600", "--", PY, "-c", STUBBORN, str(ready))
    wait_for(ready.exists, "the stubborn task to ignore SIGINT and SIGTERM")
    proc.send_signal(signal.SIGINT)
    wait_for((tmp_path / f"ready.{signal.SIGINT}").exists, "the task to be sent SIGINT")
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert code == 128 + signal.SIGKILL
    task = ferry.only_task()
    assert task["evidence"]["forwarded_signal"] == signal.SIGINT
    assert task["evidence"]["killed_after_grace"] is True
    assert ferry.live_task_processes() == []


def test_two_signals_at_once_are_both_counted(ferry: Ferry, tmp_path: Path) -> None:
    # Both pending at once (different signals cannot merge): the kernel runs their C
    # handlers in either order, and the Python handlers later; neither may be lost
    # (the second was, once in ~24 runs, when the trap's list came from the Python
    # handler and its wakeup byte had been drained before that handler ran).
    ready = tmp_path / "ready"
    proc = ferry.start("run", "--kill-grace", "600", "--", PY, "-c", STUBBORN, str(ready))
    wait_for(ready.exists, "the stubborn task to ignore SIGINT and SIGTERM")
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert code == 128 + signal.SIGKILL
    task = ferry.only_task()
    assert task["evidence"]["forwarded_signal"] in (signal.SIGINT, signal.SIGTERM)
    assert task["evidence"]["killed_after_grace"] is True
    assert ferry.live_task_processes() == []


def test_one_sigterm_to_run_and_its_supervisor_is_one_request(ferry: Ferry, tmp_path: Path) -> None:
    # One SIGTERM that reaches every process of the command (systemd stopping a unit,
    # `pkill -f`, a cgroup's kill): the supervisor gets it, and run relays its own copy.
    # (Was: counted as two, "now": SIGKILL at once, the task's clean-up cut short.)
    cleaned = tmp_path / "cleaned"
    clean_up = (
        f"trap 'sleep 0.5; touch {cleaned}; exit 0' TERM; echo ready; {wait_go(tmp_path / 'never')}"
    )
    proc = ferry.start("run", "--kill-grace", "600", "--", "sh", "-c", clean_up,
                       stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    supervisor = int(ferry.only_task()["runner"]["pid"])
    os.kill(supervisor, signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc)
    assert (code, cleaned.exists()) == (0, True)
    task = ferry.only_task()
    assert task["evidence"]["forwarded_signal"] == signal.SIGTERM
    assert "killed_after_grace" not in task["evidence"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_after_the_go_and_before_the_spawn_starts_nothing(
    ferry: Ferry, tmp_path: Path, signum: int
) -> None:
    # (Was: the supervisor, told to go, spawned the task all the same; the signal then
    # stopped it, after its first command had run.)
    ran = tmp_path / "ran"
    proc = ferry.start("run", "--", "sh", "-c", f"touch {ran}",
                       failpoints="supervisor:before:spawn=stop,launcher:after:relay=stop")  # fmt: skip
    task_id = wait_until(lambda: ferry.only_task_or_none(), what="the claim")["id"]
    supervisor = ferry.stopped_runner(task_id)
    proc.send_signal(signum)
    wait_stopped(proc, what="run to relay the signal")
    os.kill(supervisor, signal.SIGCONT)
    os.kill(proc.pid, signal.SIGCONT)
    code, _ = finish(proc)
    assert (code, ran.exists()) == (128 + signum, False)
    task = ferry.only_task()
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", signum)
    assert task["evidence"]["signalled_before_spawn"] is True


# -- output ------------------------------------------------------------------------------


def test_20_mb_of_binary_output_byte_exact_in_stdout_and_logs(ferry: Ferry, tmp_path: Path) -> None:
    payload = os.urandom(20 << 20)
    source = tmp_path / "random.bin"
    source.write_bytes(payload)
    through, logged = tmp_path / "through.bin", tmp_path / "logged.bin"
    with through.open("wb") as sink:
        result = ferry("run", "--name", "binary", "--", "cat", str(source), stdout=sink)
    assert result.code == 0
    assert through.read_bytes() == payload
    task_id = ferry.only_task()["id"]
    with logged.open("wb") as sink:
        assert ferry("logs", task_id, "--stream", "stdout", stdout=sink).code == 0
    assert logged.read_bytes() == payload


def test_100000_lines_are_all_kept(ferry: Ferry) -> None:
    expected = b"".join(b"%d\n" % n for n in range(1, 100_001))
    result = ferry("run", "--", "seq", "1", "100000")
    assert result.code == 0
    assert result.out == expected
    task_id = ferry.only_task()["id"]
    assert ferry("logs", task_id).out == expected
    assert ferry("logs", task_id, "--tail", "3").out == b"99998\n99999\n100000\n"


def test_stdin_reaches_the_task(ferry: Ferry) -> None:
    assert ferry("run", "--", "cat", stdin=b"piped\x00bytes\n").out == b"piped\x00bytes\n"


def test_stdout_and_stderr_are_kept_apart(ferry: Ferry) -> None:
    result = ferry("run", "--", "sh", "-c", "echo to-out; echo to-err >&2; echo more-out")
    assert result.code == 0
    assert result.out == b"to-out\nmore-out\n"
    assert "to-err\n" in result.err and "to-out" not in result.err
    task_id = ferry.only_task()["id"]
    assert ferry("logs", task_id, "--stream", "stdout").out == b"to-out\nmore-out\n"
    assert ferry("logs", task_id, "--stream", "stderr").out == b"to-err\n"
    both = ferry("logs", task_id)
    assert both.out == b"to-out\nmore-out\n"
    assert both.err == "to-err\n"


def test_logs_tail_counts_lines_from_the_end(ferry: Ferry) -> None:
    ferry.ok("run", "--", "seq", "1", "10")
    task_id = ferry.only_task()["id"]
    assert ferry("logs", task_id, "--tail", "3").out == b"8\n9\n10\n"
    assert ferry("logs", task_id, "--tail", "0").out == b""
    assert ferry("logs", task_id, "--tail", "50").out == b"".join(b"%d\n" % n for n in range(1, 11))


def test_logs_follow_until_the_task_settles(ferry: Ferry, tmp_path: Path) -> None:
    go = tmp_path / "go"
    runner = ferry.start("run", "--", "sh", "-c", f"echo start; {wait_go(go)}; echo end")
    task_id = ferry.wait_running()["id"]
    followed = tmp_path / "followed"
    with followed.open("wb") as sink:
        follower = ferry.start("logs", task_id, "-f", stdout=sink)
    wait_for(lambda: followed.read_bytes() == b"start\n", "the follower to print the first line")
    assert follower.poll() is None  # the task cannot have settled: it waits for go
    go.touch()
    assert finish(follower)[0] == 0
    assert followed.read_bytes() == b"start\nend\n"
    assert finish(runner)[0] == 0


def test_a_quiet_task_keeps_its_heartbeat_fresh(ferry: Ferry, tmp_path: Path) -> None:
    go = tmp_path / "go"
    runner = ferry.start("run", "--heartbeat", "0.2", "--", "sh", "-c", wait_go(go))
    task_id = ferry.wait_running()["id"]
    records_before = len(ferry.ok("journal", "dump").out.splitlines())
    beats: list[str] = []

    def advanced_twice() -> bool:
        task = ferry.task(task_id)
        assert task["state"] == "RUNNING"
        beat = task["heartbeat_at"]
        if beat is not None and (not beats or beat != beats[-1]):
            beats.append(beat)
        return len(beats) >= 3

    wait_for(advanced_twice, "heartbeat_at to advance twice while the task prints nothing")
    assert beats == sorted(beats)
    # Beats prove liveness without a journal write each.
    assert len(ferry.ok("journal", "dump").out.splitlines()) == records_before
    go.touch()
    assert finish(runner)[0] == 0
    assert ferry("logs", task_id).out == b""


def test_compaction_prunes_the_heartbeats_of_settled_tasks_only(
    ferry: Ferry, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    runner = ferry.start("run", "--", "sh", "-c", wait_go(go))
    live = ferry.wait_running()["id"]
    for _ in range(2):
        ferry.ok("run", "--", "true")
    beats = ferry.home / "heartbeats"
    assert len(list(beats.iterdir())) == 3
    ferry.ok("journal", "compact")
    assert [p.name for p in beats.iterdir()] == [f"{live}.1"], "the live task keeps its file"
    assert ferry.task(live)["state"] == "RUNNING"
    go.touch()
    assert finish(runner)[0] == 0
    ferry.ok("journal", "compact")
    assert list(beats.iterdir()) == []


# -- keys --------------------------------------------------------------------------------


def test_a_succeeded_key_is_not_run_again(ferry: Ferry, tmp_path: Path) -> None:
    count = tmp_path / "count"
    command = ["sh", "-c", f"echo run >> '{count}'"]
    assert ferry("run", "--key", "build-1", "--", *command).code == 0
    again = ferry("run", "--key", "build-1", "--", *command)
    assert again.code == 0
    assert "build-1" in again.err and "not run again" in again.err
    assert count.read_text() == "run\n"
    assert len(ferry.tasks()) == 1


def test_a_key_resolved_as_succeeded_is_skipped_with_one_line(ferry: Ferry) -> None:
    """A key whose task FAILED and was resolved as succeeded is skipped as one whose task
    SUCCEEDED: one notice. It also said "task #1 ... failed: EXIT_NONZERO (exit 0)",
    of a task this run never started (found by a review)."""
    assert ferry("run", "--key", "K", "--", "false").code == 1
    ferry.ok("resolve", "1", "--as", "succeeded")
    again = ferry("run", "--key", "K", "--", "true")
    assert again.code == 0, again
    assert again.err.splitlines() == [
        f"ferry: key 'K' already succeeded (task {ferry.tasks()[0]['id']}); not run again"
    ]
    assert len(ferry.tasks()) == 1


def test_submit_of_a_succeeded_key_queues_nothing(ferry: Ferry) -> None:
    ferry.ok("run", "--key", "release-7", "--", "true")
    done = ferry.only_task()["id"]
    again = ferry("submit", "--key", "release-7", "--", "true")
    assert again.code == 0
    assert "release-7" in again.err and "not" in again.err
    assert again.text.strip() == done  # the id of the task that already did it
    assert [t["id"] for t in ferry.tasks()] == [done]
    queued = ferry.ok("submit", "--key", "release-8", "--", "true").text.strip()
    in_flight = ferry("submit", "--key", "release-8", "--", "true")
    assert in_flight.code == 75
    assert "error[task.key_in_flight]" in in_flight.err
    assert [t["id"] for t in ferry.tasks()] == [done, queued]


def test_concurrent_runs_of_one_key_run_it_once(ferry: Ferry, tmp_path: Path) -> None:
    go, count = tmp_path / "go", tmp_path / "count"
    script = f"echo run >> '{count}'; {wait_go(go)}"
    racers = [ferry.start("run", "--key", "race", "--", "sh", "-c", script) for _ in range(3)]
    wait_for(lambda: sum(p.poll() is not None for p in racers) == 2, "two racers to be refused")
    go.touch()
    results = [finish(p) for p in racers]
    assert sorted(code for code, _ in results) == [0, 75, 75]
    assert all("error[task.key_in_flight]" in err for code, err in results if code == 75)
    assert count.read_text() == "run\n"
    assert len(ferry.tasks()) == 1


def test_a_failed_key_runs_again(ferry: Ferry, tmp_path: Path) -> None:
    count = tmp_path / "count"
    command = ["sh", "-c", f"echo run >> '{count}'; exit 3"]
    assert ferry("run", "--key", "k", "--", *command).code == 3
    assert ferry("run", "--key", "k", "--", *command).code == 3
    assert count.read_text() == "run\nrun\n"


def test_a_key_in_flight_exits_75(ferry: Ferry, tmp_path: Path) -> None:
    go, count = tmp_path / "go", tmp_path / "count"
    first = ferry.start("run", "--key", "deploy", "--", "sh", "-c", wait_go(go))
    ferry.wait_running()
    second = ferry("run", "--key", "deploy", "--", "sh", "-c", f"echo run >> '{count}'")
    assert second.code == 75
    assert "error[task.key_in_flight]" in second.err
    assert not count.exists()
    go.touch()
    assert finish(first)[0] == 0


# -- task options ------------------------------------------------------------------------


def test_cwd_is_where_the_task_runs(ferry: Ferry, tmp_path: Path) -> None:
    there = tmp_path / "elsewhere"
    there.mkdir()
    assert ferry("run", "--cwd", str(there), "--", "pwd").out == f"{there}\n".encode()
    assert ferry.only_task()["cwd"] == str(there)


def test_a_missing_cwd_is_a_usage_error(ferry: Ferry, tmp_path: Path) -> None:
    result = ferry("run", "--cwd", str(tmp_path / "missing"), "--", "pwd")
    assert result.code == 2
    assert "ferry: error[usage.bad_cwd]" in result.err
    assert ferry.tasks() == []


def test_env_reaches_the_child_and_show_lists_only_the_key(ferry: Ferry) -> None:
    secret = "s3cr3t-value"
    result = ferry("run", "--env", f"DEPLOY_TOKEN={secret}", "--", "sh", "-c", "echo $DEPLOY_TOKEN")
    assert result.out == f"{secret}\n".encode()
    task_id = ferry.only_task()["id"]
    assert ferry.task(task_id)["env"] == ["DEPLOY_TOKEN"]
    assert secret not in ferry("show", task_id).text
    assert secret not in ferry("--json", "ls").text
    assert ferry.json("show", "--show-env", task_id)["env"] == {"DEPLOY_TOKEN": secret}
    assert secret in ferry("show", "--show-env", task_id).text


def test_the_shell_is_used_only_when_asked(ferry: Ferry) -> None:
    home = os.environ.get("HOME", "")
    assert ferry("run", "--", "echo", "$HOME").out == b"$HOME\n"
    # Without --shell the whole string is one program name: nothing expands it.
    assert ferry("run", "--", "echo $HOME").code == 127
    assert ferry("run", "--shell", "--", "echo $HOME").out == f"{home}\n".encode()
    shells = [t["shell"] for t in ferry.tasks()]
    assert shells == [False, False, True]


def test_shell_takes_cmd_as_sh_c_does_and_refuses_loose_words(ferry: Ferry) -> None:
    """CMD's first word is the command line, the others its $0, $1... (data, never
    shell code). ``--shell -- echo hello world`` ran ``echo`` alone, an empty line, exit
    0 (found by a review): refused now, for run and submit, nothing queued. (Joining the
    words, as a first fix did, made data words shell code and changed what a task
    queued before meant: found by a review of that fix.)"""
    out = ferry.ok("run", "--shell", "--", 'printf "<%s>" "$0" "$1"', "a b", "c;d").out
    assert out == b"<a b><c;d>"
    for command in ("run", "submit"):
        result = ferry.refused(2, "usage.shell_words", command, "--shell", "--", "echo", "hi", "x")
        assert "give the command line as one word" in result.err
    assert len(ferry.tasks()) == 1
    # A tab separates words as a space does (found by a review: a command line with a
    # tab was refused as loose words, and one without --shell queued to fail with 127).
    assert ferry.ok("run", "--shell", "--", 'echo\t"$0"', "x").out == b"x\n"
    result = ferry.refused(2, "usage.looks_like_shell", "submit", "--", "echo\thello")
    assert "looks like a shell command" in result.err


def test_name_is_shown(ferry: Ferry) -> None:
    ferry.ok("run", "--name", "nightly-report", "--", "true")
    assert ferry.only_task()["name"] == "nightly-report"
    assert "nightly-report" in ferry.ok("ls").text


# -- submit, ls, show ----------------------------------------------------------------------


def test_submit_then_ls_and_show(ferry: Ferry) -> None:
    result = ferry.ok("submit", "--name", "later", "--", "echo", "hi")
    task_id = result.text.strip()
    assert len(task_id) == 16 and task_id.isalnum()
    task = ferry.task(task_id)
    assert (task["state"], task["name"], task["argv"], task["attempt"]) == (
        "QUEUED", "later", ["echo", "hi"], 1,
    )  # fmt: skip
    assert [t["id"] for t in ferry.tasks()] == [task_id]
    assert task_id in ferry.ok("ls").text
    as_json = ferry.json("submit", "--", "true")
    assert as_json["state"] == "QUEUED" and as_json["argv"] == ["true"]


def test_submit_from_a_file(ferry: Ferry, tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        '{"argv": ["echo", "one"]}\n'
        "\n"
        '{"argv": ["echo", "two"], "name": "second", "idempotent": true}\n'
        '{"argv": ["make", "docs"], "key": "docs-1", "timeout": 60}\n'
    )
    ids = ferry.ok("submit", "--from", str(batch)).text.split()
    assert len(ids) == 3
    tasks = {t["id"]: t for t in ferry.tasks()}
    assert set(tasks) == set(ids)
    assert all(t["state"] == "QUEUED" for t in tasks.values())
    assert tasks[ids[1]]["name"] == "second" and tasks[ids[1]]["idempotent"] is True
    assert tasks[ids[2]]["key"] == "docs-1" and tasks[ids[2]]["timeout_s"] == 60


def test_submit_from_stdin(ferry: Ferry) -> None:
    lines = b'{"argv": ["echo", "a"]}\n{"argv": ["echo", "b"]}\n'
    result = ferry("submit", "--from", "-", stdin=lines)
    assert result.code == 0
    assert len(result.text.split()) == 2
    as_json = ferry("--json", "submit", "--from", "-", stdin=lines)
    assert [t["argv"] for t in as_json.json()] == [["echo", "a"], ["echo", "b"]]
    assert len(ferry.tasks()) == 4


@pytest.mark.parametrize(
    "bad_line",
    [b"not json", b'["echo"]', b'{"argv": "echo x"}', b'{"argv": ["x"], "colour": "red"}',
     b'{"argv": []}', b'{"argv": ["x"], "timeout": "soon"}', b'{"argv": ["x"], "env": ["NOEQ"]}'],
)  # fmt: skip
def test_a_bad_from_line_refuses_the_whole_batch(ferry: Ferry, bad_line: bytes) -> None:
    ferry.ok("submit", "--", "true")  # one queued before: it must stay the only one
    lines = b'{"argv": ["echo", "fine"]}\n' + bad_line + b'\n{"argv": ["echo", "also fine"]}\n'
    result = ferry("--json", "submit", "--from", "-", stdin=lines)
    assert result.code == 2
    assert result.err.startswith("ferry: error[usage.")
    assert "2" in result.json()["error"]["message"]  # names the line (or the task) number
    assert len(ferry.tasks()) == 1


def test_ls_state_and_limit(ferry: Ferry) -> None:
    ferry("run", "--", "true")
    ferry("run", "--", "false")
    ferry.ok("submit", "--", "true")
    ferry.ok("submit", "--", "false")
    everything = ferry.tasks()
    assert [t["state"] for t in everything] == ["SUCCEEDED", "FAILED", "QUEUED", "QUEUED"]
    assert [t["id"] for t in ferry.json("ls", "--state", "QUEUED")] == [
        t["id"] for t in everything[2:]
    ]
    assert [t["state"] for t in ferry.json("ls", "--state", "failed")] == ["FAILED"]
    assert ferry.json("ls", "--state", "CANCELLED") == []
    assert [t["id"] for t in ferry.json("ls", "--limit", "1")] == [everything[-1]["id"]]
    assert len(ferry.json("ls", "--limit", "0")) == 4
    assert ferry.ok("ls", "--state", "RUNNING").out.strip() == b""


def test_show_by_unique_prefix_and_an_ambiguous_one_exits_5(ferry: Ferry) -> None:
    first = ferry.ok("submit", "--", "true").text.strip()
    second = ferry.ok("submit", "--", "true").text.strip()
    common = first[: next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)]
    assert common, "ids of tasks created together share their time prefix"
    unique = first[: len(common) + 1]
    assert ferry.task(unique)["id"] == first
    assert ferry.task(unique.upper())["id"] == first
    ambiguous = ferry("show", common)
    assert ambiguous.code == 5
    assert "error[task.ambiguous]" in ambiguous.err
    assert first in ambiguous.err and second in ambiguous.err
    assert ambiguous.err.count("\n") == 1  # one line
    as_json = ferry("--json", "show", common)
    assert as_json.code == 5
    assert sorted(as_json.json()["error"]["details"]["matches"]) == sorted([first, second])


def test_an_unknown_id_exits_5(ferry: Ferry) -> None:
    ferry.ok("submit", "--", "true")
    for command in (["show"], ["logs"], ["cancel"], ["retry"]):
        result = ferry(*command, "zzzzzz")
        assert result.code == 5, command
        assert "ferry: error[task.not_found]" in result.err


# -- cancel and retry ----------------------------------------------------------------------


def test_cancel_a_queued_task(ferry: Ferry) -> None:
    task_id = ferry.ok("submit", "--", "true").text.strip()
    assert ferry("cancel", task_id).code == 0
    task = ferry.task(task_id)
    assert (task["state"], task["reason"]) == ("CANCELLED", "CANCELLED_BY_USER")
    again = ferry("cancel", task_id)
    assert again.code == 1
    assert again.err.startswith("ferry: error[task.")
    assert ferry.json("retry", task_id)["attempt"] == 2  # a CANCELLED task may be retried


def test_cancel_a_running_task(ferry: Ferry) -> None:
    runner = ferry.start("run", "--", "sleep", "30")
    task = ferry.wait_running()
    assert ferry("cancel", task["id"]).code == 0
    code, _ = finish(runner)
    assert code == 128 + signal.SIGTERM
    settled = ferry.task(task["id"])
    assert (settled["state"], settled["reason"]) == ("CANCELLED", "CANCELLED_BY_USER")
    assert not pid_alive(task["pid"])
    assert ferry.live_task_processes() == []


def test_retry_a_failed_task_is_a_new_attempt_with_the_same_id(ferry: Ferry) -> None:
    assert ferry("run", "--", "false").code == 1
    task_id = ferry.only_task()["id"]
    assert ferry("retry", task_id).code == 0
    task = ferry.task(task_id)
    assert (task["id"], task["state"], task["attempt"]) == (task_id, "QUEUED", 2)
    assert [t["id"] for t in ferry.tasks()] == [task_id]


def test_retry_of_a_succeeded_task_is_refused(ferry: Ferry) -> None:
    ferry.ok("run", "--", "true")
    task_id = ferry.only_task()["id"]
    result = ferry("--json", "retry", task_id)
    assert result.code == 1
    assert result.err.startswith("ferry: error[task.")
    assert result.json()["error"]["details"]["task"] == task_id
    assert ferry.task(task_id)["state"] == "SUCCEEDED"


# -- --json, usage errors, no tracebacks ------------------------------------------------------


def test_kill_of_a_queued_task_is_refused_and_points_to_cancel(ferry: Ferry) -> None:
    """``kill`` signals a task's processes; a QUEUED task has none yet. It said "no
    process of the task is alive" and exited 0, as if it had done what was asked
    (found by a review); the task stays queued."""
    queued = ferry.json("submit", "--", "true")["id"]
    result = ferry.refused(1, "task.not_started", "kill", queued)
    assert "use 'ferry cancel'" in result.err, result.err
    assert ferry.json("show", queued)["state"] == "QUEUED"


def test_json_gives_one_document_per_command(ferry: Ferry) -> None:
    run = ferry("--json", "run", "--name", "quiet", "--", "true")
    assert run.code == 0 and run.json()["state"] == "SUCCEEDED"
    task_id = run.json()["id"]
    queued = ferry.json("submit", "--", "true")
    assert queued["state"] == "QUEUED"
    assert isinstance(ferry.json("ls"), list)
    assert ferry.json("show", task_id)["id"] == task_id
    assert ferry.json("cancel", queued["id"])["state"] == "CANCELLED"
    assert ferry.json("retry", queued["id"])["attempt"] == 2
    claimed = ferry.json("claim")  # runs the retried task (it prints nothing)
    assert (claimed["id"], claimed["state"], claimed["attempt"]) == (queued["id"], "SUCCEEDED", 2)
    assert ferry.json("claim") == {"task": None}
    assert ferry.json("recover")["decisions"] == []
    assert ferry.json("kill", task_id)["signalled"] == 0  # nothing of it is alive
    assert "epoch" in ferry.json("lease")
    assert ferry.json("journal", "verify")["status"] == "clean"
    missing = ferry("--json", "run", "--", "no-such-command-here")  # fails to start: 127
    assert missing.code == 127 and missing.json()["error"]["code"] == "spawn.not_found"
    assert ferry.task(missing.json()["error"]["details"]["task"])["reason"] == "SPAWN_FAILED"
    # Streams are JSON Lines: every line one document.
    for line in ferry.ok("--json", "journal", "dump").out.splitlines():
        assert "type" in json.loads(line)
    ferry.ok("run", "--", "echo", "hello")
    echoed = ferry.tasks()[-1]["id"]
    chunks = [json.loads(line) for line in ferry.ok("--json", "logs", echoed).out.splitlines()]
    assert chunks == [
        {"task": echoed, "attempt": 1, "stream": "stdout", "offset": 0, "text": "hello\n"}
    ]


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["show", "zzzz"], "task.not_found"),
        (["run"], "usage."),
        (["run", "--no-such-option", "--", "true"], "usage."),
        (["ls", "--state", "SLEEPING"], "usage."),
        (["submit"], "usage."),
    ],
)
def test_json_errors_are_one_error_object(ferry: Ferry, args: list[str], code: str) -> None:
    result = ferry("--json", *args)
    assert result.code in (2, 5)
    error = result.json()["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"].startswith(code)
    assert isinstance(error["details"], dict)
    assert result.err == f"ferry: error[{error['code']}]: {error['message']}\n"


@pytest.mark.parametrize(
    "args",
    [
        ["run"],
        ["run", "--bogus", "--", "true"],
        ["run", "--timeout", "-1", "--", "true"],
        ["run", "--timeout", "soon", "--", "true"],
        ["run", "--kill-grace", "-1", "--", "true"],
        ["run", "--heartbeat", "0", "--", "true"],
        ["run", "--env", "NOEQUALS", "--", "true"],
        ["run", "--max-releases", "-2", "--", "true"],
        ["run", "--", ""],
        ["submit"],
        ["submit", "--from", "/nonexistent/batch.jsonl"],
        ["ls", "--state", "SLEEPING"],
        ["ls", "--limit", "-1"],
        ["logs"],
        ["logs", "abc", "--stream", "stdin"],
        ["logs", "abc", "--tail", "-3"],
        ["show"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2_with_one_coded_line(ferry: Ferry, args: list[str]) -> None:
    result = ferry(*args)
    assert result.code == 2, result
    assert result.err.startswith("ferry: error[usage"), result.err
    assert result.err.count("\n") == 1
    assert result.out == b""


@pytest.mark.parametrize(
    "args",
    [
        [b"run", b"--", b"\xff\xfe"],
        [b"run", b"--name", b"\xff", b"--", b"true"],
        [b"show", b"\xff"],
        [b"show", b""],
        [b"show", b"-"],
        [b"logs", b"'; rm -rf /"],
        [b"submit", b"--from", b"/"],
        [b"run", b"--cwd", b"/etc/passwd", b"--", b"true"],
        [b"run", b"--env", b"A=\xff", b"--", b"true"],
        [b"--home", b"/dev/null", b"ls"],
        [b"--home", b"", b"ls"],
        [b"run", b"--timeout", b"nan", b"--", b"true"],
        [b"run", b"--timeout", b"inf", b"--", b"true"],
        [b"retry", b"--force"],
        [b"--json", b"--json", b"ls"],
        [b"journal", b"dump", b"--from", b"0"],
    ],
)
def test_no_traceback_for_any_input(ferry: Ferry, args: list[bytes]) -> None:
    result = ferry(*args)
    assert result.code in (0, 2, 5, 125), result  # checked inside: no "Traceback"
    if result.code:
        assert result.err.startswith("ferry: error["), result.err


@pytest.mark.parametrize("args", [[], ["journal"]])
def test_a_bare_group_prints_its_help_and_exits_2(ferry: Ferry, args: list[str]) -> None:
    result = ferry(*args)
    assert result.code == 2
    assert result.err.startswith("Usage: ferry") and "Example" in result.err
    as_json = ferry("--json", *args)
    assert as_json.code == 2
    assert as_json.json()["error"]["code"].startswith("usage.")


def test_no_traceback_for_a_submit_from_full_of_garbage(ferry: Ferry) -> None:
    garbage = bytes(range(256)) * 8 + b"\n{" + b"[" * 5000 + b"\n"
    result = ferry("submit", "--from", "-", stdin=garbage)
    assert result.code == 2
    assert ferry.tasks() == []


def test_run_before_the_task_starts_exits_125_also_with_home_option(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A corrupt journal stops run with 125 (the error line names journal.*), however
    the home is given; other commands exit 4 for it."""
    ferry.ok("run", "--", "true")
    segment = sorted((ferry.home / "journal").glob("*.jsonl"))[0]
    data = bytearray(segment.read_bytes())
    data[20] ^= 0x01  # a flipped bit inside the first (not the last) record
    segment.write_bytes(bytes(data))
    assert ferry("ls").code == 4
    by_env = ferry("run", "--", "true")
    assert by_env.code == 125
    assert "error[journal." in by_env.err
    by_option = ferry("--home", str(ferry.home), "run", "--", "true")
    assert by_option.code == 125
    assert "error[journal." in by_option.err


def test_a_file_as_the_home_is_refused_alike_by_option_and_by_environment(
    ferry: Ferry, tmp_path: Path
) -> None:
    """exit-codes.md: the state directory behaves the same however it is given. A file
    given with --home was click's usage error (2), while $FERRY_HOME gave 125."""
    a_file = tmp_path / "not-a-home"
    a_file.write_text("")
    for command in (["ls"], ["run", "--", "true"]):
        by_option = ferry("--home", str(a_file), *command)
        assert by_option.code == 125, by_option
        assert by_option.error_code() == "state_dir.not_a_directory"
        assert str(a_file) in by_option.err


# -- the state directory, seen from the user's side ---------------------------------------------


def test_home_is_private_after_a_run(ferry: Ferry) -> None:
    old = os.umask(0o022)
    try:
        ferry.ok("run", "--name", "p", "--", "echo", "private")
        ferry.ok("submit", "--", "true")
        ferry.ok("journal", "compact")
    finally:
        os.umask(old)
    assert stat.S_IMODE(ferry.home.stat().st_mode) == 0o700
    seen = 0
    for root, dirs, files in os.walk(ferry.home):
        for name in dirs:
            mode = stat.S_IMODE(os.lstat(Path(root, name)).st_mode)
            assert mode == 0o700, (Path(root, name), oct(mode))
        for name in files:
            mode = stat.S_IMODE(os.lstat(Path(root, name)).st_mode)
            assert mode == 0o600, (Path(root, name), oct(mode))
            seen += 1
    assert seen >= 4  # journal, logs, heartbeat at least


def test_a_signal_between_the_intent_and_the_spawn_settles_the_task_unstarted(
    ferry: Ferry, tmp_path: Path
) -> None:
    """SIGTERM to ``ferry run`` after DISPATCHING is durable and before the child exists
    (a CI cancel at the wrong moment): ferry must not die of it and leave DISPATCHING
    for recovery to mark unsafe. It starts nothing, settles the task FAILED SIGNALLED,
    and exits 128+15 as if the task had been killed by it."""
    marker = tmp_path / "ran"
    run = ferry.start("run", "--", "touch", str(marker), failpoints="after:DISPATCHING=stop")
    wait_until(lambda: (st := read_stat(run.pid)) is not None and st.state == "T", what="stop")
    run.send_signal(signal.SIGTERM)
    run.send_signal(signal.SIGCONT)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM
    task = ferry.only_task()
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", 15)
    assert task["evidence"]["signalled_before_spawn"] is True
    assert not marker.exists(), "nothing was started"
    ferry.verify_clean()


def test_ctrl_c_while_pinned_inputs_are_hashed_interrupts_before_anything_exists(
    ferry: Ferry, tmp_path: Path
) -> None:
    """The signal trap goes in just before the intent is written, not earlier: a Ctrl-C
    while ``run`` hashes its pinned inputs (here 4 GiB; its supervisor does) ends ferry
    at once (130), and no task was created."""
    big = tmp_path / "big"
    run = ferry.start("run", "--pointer", slow_to_hash(big), "--", "true")
    wait_until(lambda: holds_open_below(run.pid, big), what="ferry to hash the input")
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 130
    assert ferry.tasks() == []


def _sigchld_ignored() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)


@pytest.mark.parametrize("how", ["run", "work"])
def test_ferry_started_with_sigchld_ignored_still_learns_each_exit_status(
    ferry: Ferry, how: str
) -> None:
    """A parent that ignores SIGCHLD passes that on through exec (some daemons and
    shells do): the kernel then reaps every child at once, and ``waitpid`` finds none.
    Before, ``run`` wrote a task that exited 3 as SUCCEEDED with exit 0 (subprocess
    took ECHILD for 0) and exited 125; with the posix_spawn supervisor it died and left
    the task DISPATCHING. ferry puts SIGCHLD back to its default at its start; its
    tasks start with it at the default too."""
    probe = "import signal; print(signal.getsignal(signal.SIGCHLD) is signal.SIG_IGN); exit(3)"
    task = [sys.executable, "-c", probe]
    if how == "run":
        assert ferry("run", "--", *task, preexec=_sigchld_ignored).code == 3
    else:
        ferry.ok("submit", "--", *task)
        assert ferry("work", "--drain", "--poll", "0.05", preexec=_sigchld_ignored).code == 1
    [ended] = ferry.tasks()
    assert (ended["state"], ended["reason"], ended["exit_code"]) == ("FAILED", "EXIT_NONZERO", 3)
    assert ferry.ok("logs", str(ended["id"])).text.split() == ["False"]  # (not ignored)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("command", ["run", "claim"])
def test_a_signal_just_before_the_go_starts_nothing(
    ferry: Ferry, tmp_path: Path, command: str, signum: int
) -> None:
    """A signal that reaches ``run`` or ``claim`` as it is about to send its go: the
    look for signals comes after (``claim`` looked before telling the task started, and
    relayed the signal only after releasing its lease: the task was spawned, 5 times in
    6, and then killed, its first command run: a review). ``run``'s task is FAILED
    SIGNALLED; ``claim``'s goes back to the queue (the signal was for ``claim``)."""
    marker = tmp_path / "ran"
    argv = ["sh", "-c", f"touch {marker}; sleep 2"]
    if command == "claim":
        ferry.ok("submit", "--", *argv)
        proc = ferry.start("claim", failpoints="launcher:before:go=stop")
    else:
        proc = ferry.start("run", "--", *argv, failpoints="launcher:before:go=stop")
    wait_stopped(proc, what=f"{command} to stop before its go")
    proc.send_signal(signum)
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=60) == 128 + signum
    task = ferry.only_task()
    if command == "run":
        assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", signum)
        assert task["evidence"]["signalled_before_spawn"] is True, task["evidence"]
    else:
        assert (task["state"], task["reason"], task["releases"]) == (
            "QUEUED",
            "RELEASED_TO_QUEUE",
            0,
        )
        assert task["evidence"]["launcher"] == f"not started: claim got signal {signum}"
    assert not marker.exists(), "nothing was started"


@pytest.mark.parametrize("command", ["run", "claim", "work"])
def test_a_cancel_while_stopped_just_before_the_go_starts_nothing(
    ferry: Ferry, tmp_path: Path, command: str
) -> None:
    """``run``, ``claim`` or ``work`` stopped just before its go (Ctrl-Z, a frozen VM),
    its task cancelled meanwhile from another terminal (``cancel`` waits for the
    runner, then says the cancel is requested): continued, it looked at the table it
    had read before the stop, and started the task it then killed at its first beat.
    It reads the journal again before the go now (``work``: when its claim took long
    enough for a cancel to land): nothing starts, the task is CANCELLED."""
    marker = tmp_path / "ran"
    argv = ["--kill-grace", "0.2", "--", "sh", "-c", f"touch {marker}; sleep 2"]
    if command == "run":
        proc = ferry.start("run", *argv, failpoints="launcher:before:go=stop")
    else:
        ferry.ok("submit", *argv)
        flags = ["--drain"] if command == "work" else []
        proc = ferry.start(command, *flags, failpoints="launcher:before:go=stop")
    try:
        wait_stopped(proc, what=f"{command} to stop before its go")
        task_id = ferry.only_task()["id"]
        ferry.ok("cancel", task_id)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=60) == (1 if command == "work" else 128 + signal.SIGTERM)
    task = ferry.task(task_id)
    assert (task["state"], task["reason"]) == ("CANCELLED", "CANCELLED_BY_USER"), task
    assert not marker.exists(), "nothing was started"


def test_a_large_task_s_go_is_out_whole_once_work_has_sent_it(ferry: Ferry, tmp_path: Path) -> None:
    """``work`` stopped right after its go (``after:go``: "the supervisor will spawn
    without its launcher"): a large task (1 MB of argv) went in frames as the supervisor
    read them, its go inside, and the supervisor could not spawn it before work went on.
    A cancel made meanwhile then started it, and its command ran (a review). Its go goes
    apart now, after its message, once work has looked again: the supervisor spawns it
    alone; a cancel meanwhile stops it."""
    marker = tmp_path / "ran"
    big = ["a" * 100_000] * 10
    line = json.dumps({"argv": ["sh", "-c", f"touch {marker}; sleep 30", "sh", *big]})
    task_id = ferry.ok("-q", "submit", "--from", "-", stdin=(line + "\n").encode()).text.strip()
    proc = ferry.start("work", "--drain", failpoints="launcher:after:go=stop")
    try:
        wait_stopped(proc, what="work to stop after its go")
        wait_until(marker.exists, what="the task to start, work stopped")
        ferry.ok("cancel", task_id)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=60) == 1
    assert ferry.task(task_id)["state"] == "CANCELLED"


def _claim_signalled_at(ferry: Ferry, marker: Path, point: str, signum: int) -> tuple[str, str]:
    """A task queued, ``claim`` stopped at ``point``, sent ``signum`` and continued: it
    exits 128+N with ``error[interrupted]``. The task's id, and what claim said."""
    task_id = ferry.ok("-q", "submit", "--", "touch", str(marker)).text.strip()
    proc = ferry.start("claim", failpoints=f"{point}=stop")
    wait_stopped(proc, what=f"claim to stop at {point}")
    proc.send_signal(signum)
    proc.send_signal(signal.SIGCONT)
    code, err = finish(proc)
    assert code == 128 + signum and "error[interrupted]" in err, err
    return task_id, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_claim_takes_the_lease_ends_it_saying_so(
    ferry: Ferry, tmp_path: Path, signum: int
) -> None:
    """SIGTERM or SIGHUP while ``claim`` takes the lease (before its recovery pass and its
    claim): it died of the signal's default action, silent, its lease left to a dead
    holder. The lease's write is not cut short; then claim lets the lease go, claims
    nothing and exits 128+N, saying so."""
    marker = tmp_path / "ran"
    task_id, err = _claim_signalled_at(ferry, marker, "after:lease_write", signum)
    assert "nothing was claimed" in err, err
    assert ferry.task(task_id)["state"] == "QUEUED" and not marker.exists()
    assert ferry.json("lease")["holder"] is None, "let go"
    assert ferry("claim").code == 0 and marker.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_while_claim_writes_its_claim_gives_it_back(
    ferry: Ferry, tmp_path: Path, signum: int
) -> None:
    """SIGTERM or SIGHUP while ``claim`` writes its claim (a CI job cancelled): it died
    of the signal's default action, silently, its lease left to a dead holder (a
    review). The write is not cut short; then nothing is started, the claim goes back to
    the queue, and ``claim`` exits 128+N, saying so."""
    marker = tmp_path / "ran"
    task_id, err = _claim_signalled_at(ferry, marker, "launcher:after:DISPATCHING", signum)
    assert task_id in err, err
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["releases"]) == ("QUEUED", "RELEASED_TO_QUEUE", 0)
    assert not marker.exists()
    assert ferry("claim").code == 0 and marker.exists(), "the lease is free again"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_after_the_end_is_durable_leaves_the_task_s_status(
    ferry: Ferry, signum: int
) -> None:
    """A signal that reaches ``run`` once its task's end is durable, while it compacts
    the journal before exiting (a CI job cancelled just as its task ended): it died of
    it, 143 or 129 (130 with an error for SIGINT), of a task that SUCCEEDED (a review).
    The compaction, safe to stop anywhere, is dropped; the status is the task's."""
    lines = "".join('{"argv": ["true"]}\n' for _ in range(70))  # (a compaction due)
    ferry.ok("submit", "--from", "-", stdin=lines.encode())
    proc = ferry.start("run", "--", "true", failpoints="launcher:before:snapshot_write=stop")
    wait_stopped(proc, what="run to compact")
    proc.send_signal(signum)
    proc.send_signal(signal.SIGCONT)
    code, err = finish(proc)
    assert (code, err) == (0, ""), err
    assert ferry.tasks()[-1]["state"] == "SUCCEEDED"
    ferry.verify_clean()
