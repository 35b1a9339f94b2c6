"""Liveness as recovery sees it, through the real ``ferry`` command: pid reuse is death
(and the new owner of the pid is never signalled), a stopped runner with a fresh
heartbeat is left alone, a silent one becomes STALE and RUNNING again when it beats,
a quarantined orphan blocks ``retry`` and keeps ``recover`` at exit 3 until ``ferry
kill`` ends it, and a daemon that left the task's session is still found by its marker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from clikit import Ferry, finish, wait_until
from crashkit import (
    OUTLIVES_SPAWNED,
    counting_task,
    decision_records,
    pid_gone,
    runs,
    task_processes,
    wait_task_gone,
)

from ferry.proc.alivelock import Beat, beat_record, parse_beat
from ferry.proc.liveness import WALL_STEP_ENV
from ferry.proc.process import ProcessIdentity, local_identity, read_stat

pytestmark = pytest.mark.timeout(120)

# Stays alive on its first attempt (the orphan), exits at once on a retry.
FIRST_ATTEMPT_LINGERS = '; [ "$FERRY_ATTEMPT" = 1 ] && exec sleep 300; true'

SIGNAL_RECORDER = """
    import signal, sys
    log = open(sys.argv[1], "a")
    def note(signum, frame):
        log.write(f"{signum}\\n")
        log.flush()
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, note)
            except (OSError, ValueError):
                pass
    print("ready", flush=True)
    while True:
        signal.pause()
"""


@pytest.fixture
def bystanders() -> Iterator[list[subprocess.Popen[str]]]:
    """Unrelated processes a test starts; killed and reaped at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.communicate(timeout=30)


def supervisor_pid(ferry: Ferry, task_id: str) -> int:
    """The task's runner: the supervisor that beats its heartbeat (``ferry run`` only
    waits for it). Stopping it is what stops the beats."""
    return int(ferry.task(task_id)["runner"]["pid"])


def heartbeat_age_s(ferry: Ferry, task_id: str) -> float:
    beat = ferry.task(task_id)["heartbeat_at"]
    return 0.0 if beat is None else time.time() - datetime.fromisoformat(beat).timestamp()


def nothing_to_recover(ferry: Ferry, *args: str) -> None:
    code, report = ferry.recover(*args)
    assert (code, report["decisions"], report["orphans_alive"]) == (0, [], []), report


def crashed_after_spawned(ferry: Ferry, argv: list[str]) -> dict[str, object]:
    """``ferry run`` SIGKILLed right after SPAWNED is durable: the task has a pid."""
    assert ferry("run", "--", *argv, failpoints="after:SPAWNED").code == -9
    task = ferry.tasks()[-1]
    assert task["state"] == "RUNNING" and task["pid"], task
    return task


# ---- pid reuse ------------------------------------------------------------------------


def start_with_pid(
    pid: int, log: Path, procs: list[subprocess.Popen[str]], *code: str
) -> subprocess.Popen[str]:
    """Start an unrelated signal-recording process (``code``: another program, given
    the log's path) that gets exactly ``pid``: the kernel hands out ``ns_last_pid + 1``
    next (root only). Other processes on the machine may take the number first: then
    try again while it is free."""
    if os.geteuid() != 0:
        pytest.skip("making the kernel reuse a chosen pid needs root (ns_last_pid)")
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        wait_until(lambda: pid_gone(pid), what=f"pid {pid} to be free (its zombie reaped)")
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(
            [sys.executable, "-c", *(code or [textwrap.dedent(SIGNAL_RECORDER)]), str(log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        if proc.pid == pid:
            return proc
    raise AssertionError(f"could not get pid {pid} reused within 30 s")


def test_a_reused_pid_is_dead_and_its_new_owner_is_never_signalled(
    ferry: Ferry, tmp_path: Path, bystanders: list[subprocess.Popen[str]]
) -> None:
    tasks = [
        crashed_after_spawned(ferry, counting_task(tmp_path / f"runs{i}", linger=OUTLIVES_SPAWNED))
        for i in (0, 1)
    ]
    for task in tasks:
        wait_task_gone(str(task["id"]))
    logs = [tmp_path / f"signals{i}" for i in (0, 1)]
    owners = [
        start_with_pid(int(str(t["pid"])), log, bystanders)
        for t, log in zip(tasks, logs, strict=True)
    ]
    spawned = {r["data"]["task"]: r["data"] for r in ferry.records() if r["type"] == "SPAWNED"}
    for task, owner in zip(tasks, owners, strict=True):
        now = read_stat(owner.pid)
        assert now is not None and now.start_time != spawned[task["id"]]["start_time"]

    first, second = (str(t["id"]) for t in tasks)
    killed = ferry.ok("kill", first, "--signal", "KILL")
    assert "no process of the task is alive" in killed.text + killed.err
    ferry.ok("cancel", first)
    assert ferry.task(first)["state"] == "CANCELLED"
    code, report = ferry.recover()
    assert code == 3 and [d["task"] for d in report["decisions"]] == [second]
    after = ferry.task(second)
    assert (after["state"], after["reason"]) == ("FAILED", "MARKED_FAILED_MUTATION_UNSAFE")
    assert after["evidence"]["recovery"]["task_process"] == "DEAD"
    ferry.ok("kill", second)
    ferry.verify_clean()

    for owner, log in zip(owners, logs, strict=True):
        assert owner.poll() is None, "the pid's new owner was killed"
        assert not log.exists() or log.read_text() == "", "the pid's new owner got a signal"


# An unrelated program that daemonizes the classic way: setsid, start its daemon (a
# signal recorder, in its session and group), exit. The daemon lives on in a session and
# group numbered as the program's pid, which no process then has as its pid.
SESSION_TAKER = """
import os, subprocess, sys
os.setsid()
daemon = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE)
assert daemon.stdout.readline() == b"ready\\n"
print("ready", daemon.pid, sep="\\n", flush=True)
"""


def test_a_task_s_session_id_reused_by_a_daemon_never_gets_it_signalled(
    ferry: Ferry, tmp_path: Path, bystanders: list[subprocess.Popen[str]]
) -> None:
    """Everything of a task killed at once (a cgroup's OOM, a kill-all), then its
    leader's pid taken by a program that daemonizes (a review): its daemon lives in the
    session and group numbered as the task's leader, which no process has as its pid
    any more. A member of the task's session that survives its leader looks the same:
    by that number alone nothing is proven. ``kill`` and ``cancel`` SIGKILLed the
    daemon, and recovery named it as the task's orphan."""
    task = crashed_after_spawned(ferry, ["sleep", "300"])
    task_id, leader = str(task["id"]), int(str(task["pid"]))
    os.kill(leader, signal.SIGKILL)  # (the runner was killed with it: ferry run's crash)
    wait_task_gone(task_id)
    log = tmp_path / "signals"
    recorder = textwrap.dedent(SIGNAL_RECORDER)
    taker = start_with_pid(leader, log, bystanders, textwrap.dedent(SESSION_TAKER), recorder)
    assert taker.stdout is not None
    daemon = int(taker.stdout.readline())
    ferry.end_at_close(daemon)
    assert taker.wait(timeout=30) == 0
    now = read_stat(daemon)
    assert now is not None and (now.session, now.pgrp) == (leader, leader)

    refused = ferry.refused(3, "task.orphan_unproven", "kill", task_id)
    assert str(daemon) in refused.err, refused.err
    code, report = ferry.recover()
    assert code == 3 and [d["decision"] for d in report["decisions"]] == ["QUARANTINE"]
    assert ferry.task(task_id)["evidence"]["recovery"]["task_process"] == "UNKNOWN"
    ferry.refused(3, "task.orphan_unproven", "kill", task_id)
    assert read_stat(daemon) is not None, "the daemon was killed"
    assert not log.exists() or log.read_text() == "", "the daemon got a signal"


# ---- a stopped runner, heartbeats -----------------------------------------------------


def test_a_stopped_runner_is_left_alone_then_stale_then_running_again(
    ferry: Ferry, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    wait_for_gate = ["/bin/sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done', str(gate)]
    runner = ferry.start("run", "--heartbeat", "0.2", "--", *wait_for_gate)
    task = wait_until(
        lambda: [t for t in ferry.tasks() if t["state"] == "RUNNING"], what="the task to run"
    )[0]
    task_id = task["id"]
    supervisor = supervisor_pid(ferry, task_id)
    os.kill(supervisor, signal.SIGSTOP)
    try:
        # Alive (stopped is alive) with a fresh heartbeat: left alone, nothing journaled.
        code, report = ferry.recover("--stale-after", "3600")
        assert (code, report["decisions"]) == (0, [])
        # The stopped runner cannot beat: once its heartbeat is older than the limit...
        wait_until(lambda: heartbeat_age_s(ferry, task_id) > 1.0, what="a 1 s old heartbeat")
        code, report = ferry.recover("--stale-after", "1")
        assert code == 0 and [d["decision"] for d in report["decisions"]] == ["MARK_STALE"]
        assert (report["decisions"][0]["state"], report["decisions"][0]["reason"]) == (
            "STALE",
            "HEARTBEAT_STALE",
        )
        stale = ferry.task(task_id)
        assert (stale["state"], stale["reason"]) == ("STALE", "HEARTBEAT_STALE")
        assert task_processes(task_id), "a STALE task is not killed unless configured"
        nothing_to_recover(ferry, "--stale-after", "1")  # already STALE: no second mark
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="RUNNING again")
    gate.touch()
    assert runner.wait(timeout=60) == 0
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    assert len(decision_records(ferry.records())[task_id]) == 1  # only the STALE mark
    ferry.verify_clean()


def test_kill_stale_kills_a_stale_task_s_processes_but_not_its_runner(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``--kill-stale`` is the "killed only if configured" of the contract's STALE row:
    the STALE mark (saying ``kill_requested``) first, then the task's processes, never
    its runner, which, once continued, settles the task as killed by a signal."""
    wait_forever = ["/bin/sh", "-c", "while :; do sleep 0.05; done"]
    runner = ferry.start("run", "--heartbeat", "0.2", "--", *wait_forever)
    task_id = wait_until(
        lambda: [t for t in ferry.tasks() if t["state"] == "RUNNING"], what="the task to run"
    )[0]["id"]
    supervisor = supervisor_pid(ferry, task_id)
    os.kill(supervisor, signal.SIGSTOP)
    try:
        wait_until(lambda: heartbeat_age_s(ferry, task_id) > 1.0, what="a 1 s old heartbeat")
        code, report = ferry.recover("--stale-after", "1", "--kill-stale")
        assert code == 0 and [d["decision"] for d in report["decisions"]] == ["MARK_STALE"]
        assert ferry.task(task_id)["evidence"]["recovery"]["kill_requested"] is True
        wait_task_gone(task_id)
        assert (st := read_stat(supervisor)) is not None and st.state == "T", "runner spared"
    finally:
        os.kill(supervisor, signal.SIGCONT)
    assert runner.wait(timeout=60) == 128 + signal.SIGKILL
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", 9)
    ferry.verify_clean()


# ---- a step of the wall clock ---------------------------------------------------------

CLOCK_STEP_S = 120.0  # NTP stepping a clock two minutes


def clock_stepped(ferry: Ferry, step_s: float) -> Ferry:
    """ferry on the same state directory, its wall clock stepped by ``step_s`` seconds
    (``FERRY_TEST_WALL_STEP_S``: the machine's clock is left alone)."""
    stepped = Ferry(ferry.home, ferry.workdir)
    stepped.env[WALL_STEP_ENV] = str(step_s)
    return stepped


def start_gated_task(ferry: Ferry, gate: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A ``ferry run --heartbeat 1`` whose task runs until ``gate`` exists, once RUNNING."""
    wait_for_gate = ["/bin/sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done', str(gate)]
    runner = ferry.start("run", "--heartbeat", "1", "--", *wait_for_gate)
    return runner, ferry.wait_running()["id"]


@pytest.mark.parametrize("step_s", [CLOCK_STEP_S, -CLOCK_STEP_S], ids=["forward", "back"])
def test_a_wall_clock_step_does_not_make_a_beating_task_stale(
    ferry: Ferry, tmp_path: Path, step_s: float
) -> None:
    """The runner beats every second; the clock of ``recover --kill-stale`` is stepped
    two minutes: the task is neither marked STALE nor killed (heartbeat age is measured
    on CLOCK_BOOTTIME, which no wall-clock step moves)."""
    gate = tmp_path / "gate"
    runner, task_id = start_gated_task(ferry, gate)
    stepped = clock_stepped(ferry, step_s)
    for _ in range(2):
        code, report = stepped.recover("--kill-stale", "--stale-after", "30")
        assert (code, report["decisions"]) == (0, []), report
    assert ferry.task(task_id)["state"] == "RUNNING"
    assert task_processes(task_id), "a healthy task was killed"
    gate.touch()
    assert runner.wait(timeout=60) == 0
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    ferry.verify_clean()


@pytest.mark.parametrize("step_s", [CLOCK_STEP_S, -CLOCK_STEP_S], ids=["forward", "back"])
def test_a_stopped_runner_is_stale_whatever_the_wall_clock_says(
    ferry: Ferry, tmp_path: Path, step_s: float
) -> None:
    """A runner SIGSTOPped past the stale limit is marked STALE by a recover whose clock
    was stepped either way (stepped back, the mtime's age was negative: 'fresh')."""
    gate = tmp_path / "gate"
    runner, task_id = start_gated_task(ferry, gate)
    supervisor = supervisor_pid(ferry, task_id)
    os.kill(supervisor, signal.SIGSTOP)
    try:
        wait_until(lambda: heartbeat_age_s(ferry, task_id) > 1.5, what="a 1.5 s old heartbeat")
        code, report = clock_stepped(ferry, step_s).recover("--stale-after", "1")
        assert code == 0 and [d["decision"] for d in report["decisions"]] == ["MARK_STALE"]
        recovery = ferry.task(task_id)["evidence"]["recovery"]
        decided_at = datetime.fromisoformat(recovery["decided_at"]).timestamp()
        assert abs(decided_at - time.time() - step_s) < CLOCK_STEP_S / 2, "the clock was stepped"
        assert 1 < recovery["heartbeat_age_s"] < CLOCK_STEP_S / 2, recovery
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="RUNNING again")
    gate.touch()
    assert runner.wait(timeout=60) == 0
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    ferry.verify_clean()


def test_a_torn_beat_record_gives_no_age_the_mtime_decides(ferry: Ferry, tmp_path: Path) -> None:
    """Garbage where the beat record should be (a crash, a read that met a write half
    done) is never read as a beat: the mtime decides, and a fresh one keeps the task
    RUNNING, whatever the garbage would say. A sound record decides over the mtime."""
    gate = tmp_path / "gate"
    runner, task_id = start_gated_task(ferry, gate)
    heartbeat = ferry.home / "heartbeats" / f"{task_id}.1"
    supervisor = supervisor_pid(ferry, task_id)
    os.kill(supervisor, signal.SIGSTOP)  # no beat rewrites the record meanwhile
    try:
        beat = parse_beat(heartbeat.read_bytes())
        assert beat is not None
        at_boot = beat_record(Beat(beat.boot_id, beat.time_namespace, 0))  # a beat at boot
        assert at_boot is not None
        digit = at_boot.index(b" 0 ") + 1
        flipped = at_boot[:digit] + b"1" + at_boot[digit + 1 :]  # (its CRC fails)
        for garbage in (at_boot[:60], flipped, b"\0" * len(at_boot)):
            heartbeat.write_bytes(garbage)  # (the mtime: now)
            code, report = ferry.recover("--stale-after", "30", "--kill-stale")
            assert (code, report["decisions"]) == (0, []), (garbage, report)
        heartbeat.write_bytes(at_boot)  # sound: aged on the boot clock, whatever the mtime
        code, report = ferry.recover("--stale-after", "1")
        assert code == 0 and [d["decision"] for d in report["decisions"]] == ["MARK_STALE"]
        recovery = ferry.task(task_id)["evidence"]["recovery"]
        uptime_s = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert uptime_s - 60 < recovery["heartbeat_age_s"] <= uptime_s, recovery
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="RUNNING again")
    gate.touch()
    assert runner.wait(timeout=60) == 0
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    ferry.verify_clean()


# ---- a runner in another PID namespace -------------------------------------------------

# A container: ferry as pid 1 of a PID namespace of its own, with its own /proc; the
# state directory is the same (a bind mount, in a real one). --kill-child: the namespace
# ends with the unshare process the test reaps.
IN_A_CONTAINER = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


def pid_namespaces_or_skip() -> None:
    done = subprocess.run([*IN_A_CONTAINER, "true"], capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.skip(f"no PID namespace can be made here: {done.stderr.decode()[-200:]!r}")


def test_a_runner_in_another_pid_namespace_is_not_judged_dead(ferry: Ferry, tmp_path: Path) -> None:
    """``ferry run`` in a container, ``ferry recover`` from the host's cron: the runner's
    recorded pid (1, inside) means another process here. Its identity carries its PID
    namespace, and recovery translates the pid (NSpid) before it judges: the live runner
    is alive, its healthy task left alone, and its real end journaled SUCCEEDED."""
    pid_namespaces_or_skip()
    gate = tmp_path / "gate"
    wait_for_gate = ["/bin/sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done', str(gate)]
    container = Ferry(ferry.home, ferry.workdir, command=(*IN_A_CONTAINER, *ferry.command))
    try:
        runner = container.start("run", "--heartbeat", "1", "--", *wait_for_gate)
        task_id = ferry.wait_running()["id"]
        claimed = [r["data"] for r in ferry.records() if r["type"] == "CLAIMED"]
        # the runner: the task's supervisor, which ferry run (pid 1 in there) forked
        assert [c["runner"]["pid"] for c in claimed] == [2], claimed
        for _ in range(2):
            code, report = ferry.recover("--kill-stale")
            assert (code, report["decisions"], report["orphans_alive"]) == (0, [], []), report
        assert ferry.task(task_id)["state"] == "RUNNING"
        gate.touch()
        assert runner.wait(timeout=60) == 0
    finally:
        container.close()
    task = ferry.task(task_id)
    assert (task["state"], task["exit_code"]) == ("SUCCEEDED", 0)
    ferry.verify_clean()


def test_kill_stale_reaches_a_task_in_another_pid_namespace_but_not_its_runner(
    ferry: Ferry,
) -> None:
    """The runner in the container stopped past the stale limit: the host's ``recover
    --kill-stale`` sees it alive (translated), marks the task STALE, and kills the
    task's processes by the pids they have here, never the runner (nor our pid 1)."""
    pid_namespaces_or_skip()
    container = Ferry(ferry.home, ferry.workdir, command=(*IN_A_CONTAINER, *ferry.command))
    try:
        container.start("run", "--heartbeat", "0.2", "--", "/bin/sh", "-c", "sleep 300")
        task_id = ferry.wait_running()["id"]
        claimed = [r["data"]["runner"] for r in ferry.records() if r["type"] == "CLAIMED"]
        runner = local_identity(ProcessIdentity.from_json(claimed[0]))
        assert runner is not None and runner.pid != 1
        os.kill(runner.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: heartbeat_age_s(ferry, task_id) > 1.5, what="an old heartbeat")
            code, report = ferry.recover("--stale-after", "1", "--kill-stale")
            assert code == 0 and [d["decision"] for d in report["decisions"]] == ["MARK_STALE"]
            assert ferry.task(task_id)["evidence"]["recovery"]["runner"] == "ALIVE"
            wait_task_gone(task_id)
            assert (st := read_stat(runner.pid)) is not None and st.state == "T", "runner spared"
        finally:
            os.kill(runner.pid, signal.SIGCONT)
        wait_until(lambda: ferry.task(task_id)["state"] == "FAILED", what="the runner's end")
        task = ferry.task(task_id)
        assert (task["reason"], task["signal"]) == ("SIGNALLED", 9)
    finally:
        container.close()
    ferry.verify_clean()


# A container with a time namespace of its own (CRIU restores, LXC): CLOCK_BOOTTIME, and
# the start times /proc shows, are offset there by 100000 s.
IN_A_TIME_NAMESPACE = ("unshare", "--time", "--boottime", "100000", "--fork", "--kill-child")


def test_a_runner_in_another_time_namespace_is_not_judged_dead(
    ferry: Ferry, tmp_path: Path
) -> None:
    """The runner's start time, read in its time namespace, is not the one the host
    reads for it: no proof of pid reuse. Recovery on the host must not call the live
    runner DEAD (and quarantine its healthy task, refusing its real end)."""
    done = subprocess.run([*IN_A_TIME_NAMESPACE, "true"], capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"no time namespace can be made here: {done.stderr.decode()[-200:]!r}")
    gate = tmp_path / "gate"
    wait_for_gate = ["/bin/sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done', str(gate)]
    container = Ferry(ferry.home, ferry.workdir, command=(*IN_A_TIME_NAMESPACE, *ferry.command))
    try:
        runner = container.start("run", "--heartbeat", "1", "--", *wait_for_gate)
        task_id = ferry.wait_running()["id"]
        for _ in range(2):
            code, report = ferry.recover("--kill-stale", "--stale-after", "30")
            assert (code, report["decisions"], report["orphans_alive"]) == (0, [], []), report
        assert ferry.task(task_id)["state"] == "RUNNING"
        gate.touch()
        assert runner.wait(timeout=60) == 0
    finally:
        container.close()
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    ferry.verify_clean()


# ---- a quarantined orphan -------------------------------------------------------------


def test_a_live_quarantined_orphan_blocks_retry_until_ferry_kill_ends_it(
    ferry: Ferry, tmp_path: Path
) -> None:
    mark = tmp_path / "runs"
    task = crashed_after_spawned(ferry, counting_task(mark, linger=FIRST_ATTEMPT_LINGERS))
    task_id = str(task["id"])
    wait_until(lambda: runs(mark) == 1 and task_processes(task_id), what="the orphan")

    code, report = ferry.recover()
    assert code == 3 and [d["decision"] for d in report["decisions"]] == ["QUARANTINE"]
    for _ in range(2):  # cron keeps saying "operator needed" while the orphan lives
        code, report = ferry.recover()
        assert (code, report["decisions"], report["orphans_alive"]) == (3, [], [task_id])
    refused = ferry("retry", task_id)
    assert refused.code == 3 and "task.orphan_alive" in refused.err, refused
    assert task_processes(task_id), "nothing may have touched the orphan"

    ferry.ok("kill", task_id)
    signalled = [r for r in ferry.records() if r["type"] == "ORPHAN_SIGNALLED"]
    assert [(r["data"]["pid"], r["data"]["signal"]) for r in signalled] == [
        (task["pid"], signal.SIGTERM)
    ]
    wait_task_gone(task_id)
    nothing_to_recover(ferry)
    ferry.ok("retry", task_id)
    retried = ferry.task(task_id)
    assert (retried["state"], retried["attempt"]) == ("QUEUED", 2)
    ferry.ok("work", "--drain", "--poll", "0.05")
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    assert runs(mark) == 2  # the first attempt and the retry an operator asked for
    ferry.verify_clean()


def test_kill_reaches_a_stopped_orphan(ferry: Ferry, tmp_path: Path) -> None:
    # (Found by a review: `kill` sent SIGTERM alone; a stopped orphan never got it, and
    # retry stayed refused, task.orphan_alive. Forwarding and cancel add SIGCONT.)
    mark = tmp_path / "runs"
    task = crashed_after_spawned(ferry, counting_task(mark, linger=FIRST_ATTEMPT_LINGERS))
    task_id = str(task["id"])
    wait_until(lambda: runs(mark) == 1 and task_processes(task_id), what="the orphan")
    for ident in task_processes(task_id):
        os.kill(ident.pid, signal.SIGSTOP)
    assert ferry.recover()[0] == 3
    ferry.ok("kill", task_id)
    wait_task_gone(task_id)
    nothing_to_recover(ferry)


# ---- a daemon that left the task's session --------------------------------------------

DAEMONISE = 'echo "$FERRY_TASK" >> "$0"; setsid -f sleep 300' + OUTLIVES_SPAWNED


def daemons(task_id: str, leader_pid: int) -> list[int]:
    """Processes of the task in a session other than the one its leader started."""
    out = []
    for ident in task_processes(task_id):
        st = read_stat(ident.pid)
        if st is not None and st.session != leader_pid:
            out.append(ident.pid)
    return out


def test_a_daemon_that_called_setsid_is_found_by_its_marker_on_recovery(
    ferry: Ferry, tmp_path: Path
) -> None:
    task = crashed_after_spawned(ferry, ["/bin/sh", "-c", DAEMONISE, str(tmp_path / "runs")])
    task_id, leader = str(task["id"]), int(str(task["pid"]))
    escaped = wait_until(
        lambda: pid_gone_or_zombie(leader) and daemons(task_id, leader), what="the daemon alone"
    )
    code, report = ferry.recover()
    assert code == 3, report
    after = ferry.task(task_id)
    assert (after["state"], after["reason"]) == ("FAILED", "QUARANTINED_ORPHAN_ALIVE")
    assert daemons(task_id, leader) == escaped, "recovery never kills an orphan"
    ferry.ok("kill", task_id)
    wait_task_gone(task_id)
    assert ferry.recover()[0] == 0


@pytest.mark.parametrize("runner", ["alive", "crashed"])
def test_cancel_reaches_a_daemon_that_called_setsid(
    ferry: Ferry, tmp_path: Path, runner: str
) -> None:
    argv = ["/bin/sh", "-c", DAEMONISE + "; exec sleep 300", str(tmp_path / "runs")]
    proc = None
    if runner == "alive":
        proc = ferry.start("run", "--kill-grace", "5", "--", *argv)
        task = wait_until(lambda: [t for t in ferry.tasks() if t["pid"]], what="SPAWNED")[0]
    else:
        task = crashed_after_spawned(ferry, argv)
    task_id, leader = str(task["id"]), int(str(task["pid"]))
    wait_until(lambda: daemons(task_id, leader), what="the daemon")
    ferry.ok("cancel", task_id)
    if proc is not None:
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    wait_task_gone(task_id)
    after = ferry.task(task_id)
    assert (after["state"], after["reason"]) == ("CANCELLED", "CANCELLED_BY_USER")
    nothing_to_recover(ferry)
    ferry.verify_clean()


def pid_gone_or_zombie(pid: int) -> bool:
    st = read_stat(pid)
    return st is None or st.exited


def test_an_orphan_without_the_marker_keeps_recover_at_3_until_killed(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``env -i`` (like sudo's env_reset) replaces the environment: the orphan carries no
    marker, yet it is the task's own process, in the task's session. Recovery must keep
    reporting it, also after a compaction moved the task out of the journal's tail."""
    task = crashed_after_spawned(ferry, ["env", "-i", "sleep", "300"])
    task_id = str(task["id"])
    ferry.end_at_close(int(str(task["pid"])))  # no FERRY_HOME left to find it by
    assert not task_processes(task_id), "the marker is gone with the environment"
    code, report = ferry.recover()
    assert code == 3 and [d["decision"] for d in report["decisions"]] == ["QUARANTINE"]
    for compacted in (False, True):
        if compacted:
            ferry.ok("journal", "compact")
        code, report = ferry.recover()
        assert (code, report["decisions"], report["orphans_alive"]) == (3, [], [task_id])
        assert ferry("retry", task_id).code == 3
    ferry.ok("kill", task_id)
    wait_until(lambda: pid_gone_or_zombie(int(str(task["pid"]))), what="the orphan to end")
    nothing_to_recover(ferry)
    ferry.ok("retry", task_id)
    ferry.verify_clean()


def crashed_leaving_a_daemon(ferry: Ferry, tmp_path: Path, command: str) -> tuple[str, int]:
    """A task whose runner crashed after SPAWNED, and whose first process started
    ``command`` as a daemon that left its session and cleared its environment, then
    exited: (task id, the daemon's pid). Only the alive-lock it inherited shows it."""
    pid_file = tmp_path / "daemon.pid"
    daemonise = f"setsid -f sh -c 'echo $$ > {pid_file}; exec env -i {command}'" + OUTLIVES_SPAWNED
    task = crashed_after_spawned(ferry, ["/bin/sh", "-c", daemonise])
    daemon = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="pid"))
    ferry.end_at_close(daemon)
    wait_until(lambda: pid_gone_or_zombie(int(str(task["pid"]))), what="the leader to exit")
    return str(task["id"]), daemon


def test_an_orphan_seen_only_by_its_alive_lock_blocks_retry_after_a_compaction(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A daemon that left the task's session and cleared its environment carries no
    marker and is in no group of the task: only the alive-lock it inherited shows it.
    Compaction must not remove a quarantined task's lock file (it prunes those of
    settled tasks), or a retry would run the task beside its live orphan."""
    task_id, _ = crashed_leaving_a_daemon(ferry, tmp_path, "sleep 300")
    code, report = ferry.recover()
    assert code == 3 and [d["decision"] for d in report["decisions"]] == ["QUARANTINE"]
    for compacted in (False, True):
        if compacted:
            ferry.ok("journal", "compact")
            assert (ferry.home / "heartbeats" / f"{task_id}.1").exists(), "its lock is kept"
        code, report = ferry.recover()  # cron keeps saying "operator needed"
        assert (code, report["decisions"], report["orphans_alive"]) == (3, [], [task_id])
        refused = ferry("retry", task_id)
        assert refused.code == 3 and "task.orphan_alive" in refused.err, refused


def test_kill_reaches_an_orphan_seen_only_by_its_alive_lock(ferry: Ferry, tmp_path: Path) -> None:
    """The same daemon: ``ferry kill`` finds it by the lock file it holds open (a
    pid-free trail: no marker, no group, no session), checks its identity, signals it;
    then recover has nothing left and a retry may run."""
    task_id, daemon = crashed_leaving_a_daemon(ferry, tmp_path, "sleep 300")
    assert ferry.recover()[0] == 3
    assert ferry.json("kill", task_id)["signalled"] >= 1  # (the zombie leader's group, too)
    wait_until(lambda: pid_gone_or_zombie(daemon), what="the daemon to end")
    nothing_to_recover(ferry)
    ferry.ok("retry", task_id)
    ferry.verify_clean()


# A daemon that keeps the inherited alive-lock but marks it close-on-exec, as the
# runner's own descriptor is: no scan may take it for a process of the task.
HIDES_ITS_LOCK = (
    "import os, time\n"
    "for fd in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        if '/heartbeats/' in os.readlink(f'/proc/self/fd/{fd}'):\n"
    "            os.set_inheritable(int(fd), False)\n"
    "    except OSError:\n"
    "        pass\n"
    "time.sleep(300)\n"
)


def test_kill_says_so_when_the_orphan_is_alive_but_cannot_be_found(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Its lock shows it alive, and nothing leads to it: kill signals nobody, and must
    not say it did its job (exit 0) while the orphan runs: exit 3, a coded line."""
    hide = tmp_path / "hide.py"
    hide.write_text(HIDES_ITS_LOCK)
    task_id, daemon = crashed_leaving_a_daemon(ferry, tmp_path, f"{sys.executable} {hide}")
    assert ferry.recover()[0] == 3
    refused = ferry.refused(3, "task.orphan_unreachable", "kill", task_id)
    assert str(daemon) not in refused.err and "alive-lock" in refused.err
    assert read_stat(daemon) is not None, "nothing was signalled"


def test_cancel_without_a_runner_never_settles_a_live_orphan_cancelled(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Its runner is dead and its SIGKILL reaches nothing (the daemon above): the task
    must not become CANCELLED (which nothing probes again: a retry would run beside the
    orphan). Exit 3, the task left in flight, and recover quarantines it (row 8)."""
    pid_file = tmp_path / "daemon.pid"
    hide = tmp_path / "hide.py"
    hide.write_text(HIDES_ITS_LOCK)
    daemonise = (
        f"setsid -f sh -c 'echo $$ > {pid_file}; exec env -i {sys.executable} {hide}'"
        + OUTLIVES_SPAWNED
    )
    run = ferry("run", "--kill-grace", "0.2", "--", "/bin/sh", "-c", daemonise,
                failpoints="after:SPAWNED")  # fmt: skip
    assert run.code == -9, run
    task_id = str(ferry.tasks()[-1]["id"])
    daemon = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="pid"))
    ferry.end_at_close(daemon)
    ferry.refused(3, "task.orphan_alive", "cancel", task_id)
    assert ferry.json("show", task_id)["state"] != "CANCELLED"
    code, report = ferry.recover()
    assert code == 3 and [d["decision"] for d in report["decisions"]] == ["QUARANTINE"], report
    assert ferry("retry", task_id).code == 3


def test_a_key_does_not_run_again_beside_its_live_quarantined_orphan(ferry: Ferry) -> None:
    """``run --key K`` (and ``submit --key K``) after K's task was quarantined with its
    orphan alive would run K's work twice at once, which a retry of that task may not
    do either. Exit 3 (keys after an unsafe end: the operator decides); killing the
    orphan is no verdict; once the task is resolved (here: as failed), K runs."""
    lingers = ["/bin/sh", "-c", "[ -e /nonexistent ] || exec sleep 300"]
    assert ferry("run", "--key", "build-abc", "--", *lingers, failpoints="after:SPAWNED").code == -9
    first = ferry.tasks()[-1]
    ferry.end_at_close(int(str(first["pid"])))
    assert ferry.recover()[0] == 3
    for command in ("run", "submit"):
        refused = ferry.refused(3, "task.key_unsafe", command, "--key", "build-abc", "--", "true")
        assert str(first["id"]) in refused.err and "resolve" in refused.err
    assert len(ferry.tasks()) == 1, "nothing was submitted"
    ferry.ok("kill", str(first["id"]))
    wait_until(lambda: pid_gone_or_zombie(int(str(first["pid"]))), what="the orphan to end")
    ferry.refused(3, "task.key_unsafe", "run", "--key", "build-abc", "--", "true")
    ferry.ok("resolve", str(first["id"]), "--as", "failed")
    ferry.ok("run", "--key", "build-abc", "--", "true")


def test_a_copy_of_a_home_never_signals_the_original_s_tasks(ferry: Ferry, tmp_path: Path) -> None:
    """``cp -a`` of a home while ``work`` runs a task in it (a backup, a copy to look
    at): the copy's journal is another journal, and nothing of the copy runs the task.
    ``cancel`` in the copy signalled the original's task (it died there FAILED
    SIGNALLED, nobody having cancelled it there), and ``recover`` in the copy took it
    for alive: found by a review. The runner's record names the home it was claimed
    from (its inode: a copy is another one, a move the same)."""
    gate, mark = tmp_path / "gate", tmp_path / "done"
    script = f"while [ ! -e {gate} ]; do sleep 0.05; done; echo done > {mark}"
    ferry.ok("submit", "--", "sh", "-c", script)
    work = ferry.start("work", "--drain", stdout=subprocess.DEVNULL)
    wait_until(lambda: ferry.tasks()[0]["state"] == "RUNNING", what="the task to run")
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(ferry.home), str(copy)], check=True)
    copied = Ferry(copy)
    try:
        cancel = copied("--json", "cancel", "1")
        assert cancel.code == 0 and cancel.json()["cancel_requested"], cancel
        assert "not signalled from here" in cancel.err
        copied.refused(1, "task.other_home", "kill", "1")
    finally:
        copied.close()
    assert ferry.tasks()[0]["state"] == "RUNNING"
    gate.touch()
    code, err = finish(work)
    assert code == 0, err
    assert ferry.tasks()[0]["state"] == "SUCCEEDED" and mark.read_text() == "done\n"


@pytest.mark.skipif(
    os.stat("/dev/shm").st_dev == os.stat(tempfile.gettempdir()).st_dev,
    reason="needs /dev/shm on another file system than the temporary directory",
)
def test_a_home_moved_across_file_systems_keeps_its_live_task_alive(tmp_path: Path) -> None:
    """``mv`` of a home from tmpfs to another file system (a copy and an unlink: a new
    inode) while an idempotent task runs, then its ``work`` killed with -9: the task's
    supervisor and process live on. A review of the home-id fix found it decided dead
    (its claim names the old inode): released, and run again at the same time. Liveness
    is probed, never assumed from the home's identity: recovery leaves it alone."""
    source = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="ferry-home-"))
    moved = tmp_path / "moved"
    gate, starts = tmp_path / "gate", tmp_path / "starts"
    ferry, there = Ferry(source), Ferry(moved)
    try:
        script = f"echo start >> {starts}; while [ ! -e {gate} ]; do sleep 0.05; done"
        ferry.ok("submit", "--idempotent", "--", "sh", "-c", script)
        work = ferry.start("work", "--drain", "--lease-ttl", "1", stdout=subprocess.DEVNULL)
        wait_until(lambda: starts.exists(), what="the task to start")
        subprocess.run(["mv", str(source), str(moved)], check=True)
        work.kill()
        work.wait(timeout=30)
        wait_until(lambda: there("recover").code != 75, what="the dead work's lease to expire")
        assert there.json("recover")["decisions"] == []
        assert there.tasks()[0]["state"] in ("DISPATCHING", "RUNNING")
    finally:
        gate.touch()
        ferry.close()
        there.close()
        shutil.rmtree(source, ignore_errors=True)
    assert starts.read_text() == "start\n"
