"""Tasks outlive the ferry process that started them: one small supervisor per task.

``run``, ``claim`` and ``work`` launch a supervisor per task and wait for it; the
supervisor holds the child, its output and its heartbeat, and journals its end. Each
test kills a launcher (``kill -9``, or a failpoint armed with ``=self``: that process
only) at a phase of a task's life and checks that the task is not disturbed: it runs
to its end, its output is whole, and its true end is journaled by its supervisor with
no other ferry command run. Killing the supervisor itself leaves the task to recovery,
as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clikit import Ferry, finish, wait_stopped, wait_until
from crashkit import (
    counting_task,
    most_at_once,
    restart_worker_midway,
    runs,
    stamping_task,
    task_processes,
    wait_task_gone,
)

from ferry.proc.process import read_stat

pytestmark = pytest.mark.timeout(120)

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def lines_task(count: int, every_s: float = 0.1, gate: Path | None = None) -> list[str]:
    """A task that writes one line every ``every_s`` (and never dies of SIGPIPE: if it
    did, the test would show it by a short log); with ``gate``, it waits after line 2
    until that file exists."""
    wait = "" if gate is None else f'[ $i -ne 2 ] || while [ ! -e "{gate}" ]; do sleep 0.02; done; '
    return [
        "/bin/sh",
        "-c",
        f"for i in $(seq 1 {count}); do echo line $i; {wait}sleep {every_s}; done",
    ]


def settled(ferry: Ferry, task_id: str) -> dict[str, object]:
    """The task, once it is settled (its supervisor wrote its end)."""

    def done() -> dict[str, object] | None:
        task = ferry.task(task_id)
        return task if task["state"] in TERMINAL else None

    task: dict[str, object] = wait_until(done, what=f"task {task_id} to settle")
    return task


def wait_for_output(ferry: Ferry, task_id: str, text: str) -> None:
    """Until the task's stdout log holds ``text`` (read from the file: cheap, so that a
    loaded machine does not make the wait miss a short task's running)."""
    log = ferry.home / "logs" / task_id / "1.stdout"
    wait_until(lambda: log.exists() and text in log.read_text(), what=f"{text!r} in the log")


def only_id(ferry: Ferry) -> str:
    return str(wait_until(lambda: ferry.tasks() and ferry.tasks()[-1]["id"], what="a task"))


def nothing_left_for_recovery(ferry: Ferry) -> None:
    code, report = ferry.recover()
    assert (code, report.get("decisions", [])) == (0, []), report


# ---- kill -9 of the launcher -----------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "claim"])
def test_kill_9_of_the_launcher_while_its_task_writes_loses_no_line(
    ferry: Ferry, command: str
) -> None:
    """Before: the task died of SIGPIPE at its next write (its stdout was a pipe to the
    killed ferry), and recovery then marked it unsafe."""
    gate = ferry.home.parent / "gate"  # (the task waits after line 2: it outlives run)
    if command == "claim":
        ferry.ok("submit", "--", *lines_task(30, gate=gate))
        launcher = ferry.start("claim")
    else:
        launcher = ferry.start("run", "--", *lines_task(30, gate=gate))
    task_id = only_id(ferry)
    wait_for_output(ferry, task_id, "line 2\n")
    launcher.send_signal(signal.SIGKILL)
    assert launcher.wait(timeout=30) == -signal.SIGKILL
    assert launcher.stdout is not None
    launcher.stdout.close()  # and its reader goes away too (a closed terminal)
    gate.touch()
    task = settled(ferry, task_id)
    assert (task["state"], task["exit_code"]) == ("SUCCEEDED", 0), task
    log = ferry.ok("logs", task_id).out.decode().splitlines()
    assert log == [f"line {i}" for i in range(1, 31)]
    nothing_left_for_recovery(ferry)
    ferry.verify_clean()


# The launcher killed at each phase of a task's life: the failpoint (armed in the
# launcher only, killing it alone), and what the task's journal must end up saying.
PHASES = {
    # the intent is durable, the supervisor not yet told to spawn: nothing starts; the
    # supervisor gives the claim back (uncounted), and the next worker runs the task
    "before the spawn": "launcher:after:DISPATCHING=self",
    # the same, a moment later: about to tell the supervisor to spawn (work: about to
    # hand it the task with its go)
    "before the go": "launcher:before:go=self",
    # told to spawn (work: the task came with its go): the supervisor runs it alone
    "after the go": "launcher:after:go=self",
    # spawned, running past 50 ms, SPAWNED not yet written: the supervisor writes it
    "between the spawn and SPAWNED": "launcher:before:SPAWNED=self",
    # the end known, not yet written: the supervisor writes it
    "while settling": "launcher:before:SETTLED=self",
}


@pytest.mark.parametrize("command", ["run", "claim", "work"])
@pytest.mark.parametrize("phase", [*PHASES, "while running"])
def test_the_launcher_killed_at_each_phase_leaves_the_task_undisturbed(
    ferry: Ferry, tmp_path: Path, command: str, phase: str
) -> None:
    mark = tmp_path / "runs"
    armed = PHASES.get(phase)
    gate = tmp_path / "gate"  # (unarmed: the task lasts until the launcher is killed)
    wait_gate = f'; while [ ! -e "{gate}" ]; do sleep 0.02; done'
    argv = counting_task(mark, linger="; sleep 0.5" if armed else wait_gate)
    if command == "run":
        launcher = ferry.start("run", "--", *argv, failpoints=armed)
    else:
        ferry.ok("submit", "--", *argv)
        args = ("claim",) if command == "claim" else ("work", "-j", "1", "--poll", "0.05")
        launcher = ferry.start(*args, failpoints=armed)
    task_id = only_id(ferry)
    if armed is None:  # (its marker file says it runs: no ferry command in the wait)
        wait_until(lambda: runs(mark) == 1, what="the task to run")
        launcher.send_signal(signal.SIGKILL)
    assert launcher.wait(timeout=60) == -signal.SIGKILL, finish(launcher)
    gate.touch()
    if phase in ("before the spawn", "before the go") and command == "run":
        # Nothing was started, and no one queued it: FAILED, not run later by a work
        # the user never asked to run it (it was queued: a review).
        task = wait_until(lambda: (t := ferry.task(task_id))["state"] == "FAILED" and t,
                          what="the task to be ended")  # fmt: skip
        assert (task["reason"], runs(mark)) == ("SPAWN_FAILED", 0), task
        ferry.ok("work", "--drain")
        assert runs(mark) == 0
        nothing_left_for_recovery(ferry)
        return
    if phase in ("before the spawn", "before the go"):
        # Nothing was started: the claim is back in the queue, not counted.
        task = wait_until(lambda: (t := ferry.task(task_id))["state"] == "QUEUED" and t,
                          what="the claim to be released")  # fmt: skip
        assert (task["reason"], task["releases"], runs(mark)) == ("RELEASED_TO_QUEUE", 0, 0)
        ferry.ok("work", "--drain")
    task = settled(ferry, task_id)
    assert (task["state"], task["exit_code"], task["attempt"]) == ("SUCCEEDED", 0, 1), task
    assert runs(mark) == 1
    nothing_left_for_recovery(ferry)
    ferry.verify_clean()


# A work whose supervisors all die (SIGKILL) while they plan their task: after the task
# came to them with its go, before their plan (which they send before the spawn).
_DYING_PLANS = """
import os, signal, sys
import ferry.app.supervisor as supervisor
supervisor.plan_task = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
from ferry.cli import main
sys.exit(main())
"""


def test_a_supervisor_that_dies_before_its_plan_started_nothing(ferry: Ferry) -> None:
    """Told to go with its task, a supervisor that dies before its plan reached the
    worker started nothing: the claim goes back to the queue, uncounted, and three such
    deaths stop work (a bug of ferry's). Before the fix the task was left DISPATCHING
    for recovery, which FAILED it (MARKED_FAILED_MUTATION_UNSAFE) though it never ran."""
    task_id = ferry.ok("submit", "--", "true").text.strip()
    done = subprocess.run([sys.executable, "-c", _DYING_PLANS, "work", "--drain"],
                          env=ferry.env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 125, done
    assert "3 supervisors died before starting it" in done.stderr
    task = ferry.task(task_id)
    assert (task["state"], task["reason"], task["releases"]) == ("QUEUED", "RELEASED_TO_QUEUE", 0)
    ferry.ok("work", "--drain")
    assert ferry.task(task_id)["state"] == "SUCCEEDED"
    nothing_left_for_recovery(ferry)


# A work whose supervisors make their plan only once their launcher is gone (a deadline
# bounds the wait).
_LATE_PLANS = """
import os, sys, time
import ferry.app.supervisor as supervisor
plan_task = supervisor.plan_task
def late_plan(*args, **kwargs):
    launcher, deadline = os.getppid(), time.monotonic() + 30
    while os.getppid() == launcher and time.monotonic() < deadline:
        time.sleep(0.01)
    return plan_task(*args, **kwargs)
supervisor.plan_task = late_plan
from ferry.cli import main
sys.exit(main())
"""


def test_a_supervisor_told_to_go_runs_its_task_though_its_launcher_died_before_its_plan(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``work`` killed right after it handed the task over with its go, before the
    supervisor's plan could reach it: nobody will read the plan, and nobody gives the
    task back, so the supervisor runs it alone, as told. (Its plan unsent, it once gave
    the claim back instead: the task waited for the next worker.)"""
    mark = tmp_path / "runs"
    task_id = ferry.ok("submit", "--", *counting_task(mark)).text.strip()
    env = {**ferry.env, "FERRY_FAILPOINTS": "launcher:after:go=self"}
    done = subprocess.run([sys.executable, "-c", _LATE_PLANS, "work", "-j", "1"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done
    task = settled(ferry, task_id)
    assert (task["state"], task["attempt"], runs(mark)) == ("SUCCEEDED", 1, 1), task
    nothing_left_for_recovery(ferry)


@pytest.mark.parametrize("ending", ["exit 0", "exit 3", "killed by SIGTERM"])
def test_an_end_after_the_worker_s_death_is_journaled_as_if_nothing_had_happened(
    ferry: Ferry, tmp_path: Path, ending: str
) -> None:
    """The worker dies while its task runs: the task's state, reason, exit code, signal
    and times are those of a task whose worker lived."""
    how = {"exit 0": "exit 0", "exit 3": "exit 3", "killed by SIGTERM": "kill -TERM $$"}[ending]
    started = tmp_path / "started"
    argv = ["/bin/sh", "-c", f'touch "$0"; sleep 1; {how}', str(started)]
    want = {
        "exit 0": ("SUCCEEDED", None, 0, None),
        "exit 3": ("FAILED", "EXIT_NONZERO", 3, None),
        "killed by SIGTERM": ("FAILED", "SIGNALLED", None, signal.SIGTERM),
    }[ending]
    # the same task, its launcher alive
    reference = ferry.ok("--json", "run", "--", *argv, codes=(0, 3, 143)).json()
    assert (reference["state"], reference["reason"], reference["exit_code"],
            reference["signal"]) == want  # fmt: skip

    started.unlink()
    task_id = ferry.ok("submit", "--", *argv).text.strip()
    worker = ferry.start("work", "-j", "1")
    wait_until(started.exists, what="the task to run")  # (no ferry command in the wait)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    task = settled(ferry, task_id)
    assert (task["state"], task["reason"], task["exit_code"], task["signal"]) == want, task
    for done in (task, reference):
        started = time.mktime(time.strptime(str(done["started_at"])[:19], "%Y-%m-%dT%H:%M:%S"))
        ended = time.mktime(time.strptime(str(done["ended_at"])[:19], "%Y-%m-%dT%H:%M:%S"))
        assert 0 <= ended - started <= 60
    nothing_left_for_recovery(ferry)
    ferry.verify_clean()


def test_started_at_is_the_spawn_and_ended_at_the_end(ferry: Ferry) -> None:
    """Before: started_at was the time of the SPAWNED record, 50 ms and an fsync after
    the spawn (a 0.2 s task lasted 0.15 s)."""
    from datetime import datetime

    task = ferry.json("run", "--", "sleep", "0.3")
    started = datetime.fromisoformat(str(task["started_at"]).replace("Z", "+00:00"))
    ended = datetime.fromisoformat(str(task["ended_at"]).replace("Z", "+00:00"))
    assert (ended - started).total_seconds() >= 0.3


def test_the_task_object_names_its_runner_the_supervisor(ferry: Ferry) -> None:
    launcher = ferry.start("run", "--", "sleep", "300")
    task_id = only_id(ferry)
    task = wait_until(lambda: (t := ferry.task(task_id))["state"] == "RUNNING" and t,
                      what="the task to run")  # fmt: skip
    runner = task["runner"]
    assert runner["alive"] is True and runner["pid"] not in (launcher.pid, task["pid"])
    assert os.getpgid(runner["pid"]) == runner["pid"], "its own session and group"
    ferry.ok("cancel", task_id)
    finish(launcher)
    done = ferry.task(task_id)
    assert done["state"] == "CANCELLED" and done["runner"]["alive"] is False


# ---- -j holds across a restart ---------------------------------------------------------


def test_jobs_holds_across_a_restart_of_the_worker(ferry: Ferry, tmp_path: Path) -> None:
    """Before: a worker killed with two tasks running, and a new ``work -j 2`` started at
    once, ran four tasks at the same time. Now the new worker counts the survivors."""
    stamps = tmp_path / "stamps"
    restart_worker_midway(ferry, stamps, tasks=6, jobs=2, before_restart=lambda: None)
    assert [t["state"] for t in ferry.tasks()] == ["SUCCEEDED"] * 6
    assert stamps.read_text().count("end") == 6
    assert most_at_once(stamps) <= 2
    ferry.verify_clean()


def test_a_task_of_run_holds_a_slot_of_work_and_work_says_whose_it_is(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``-j N`` counts every task of this home that runs: one of ``ferry run``'s too. The
    notice said they ran "under an earlier work's supervisors" (found by a review)."""
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    run = ferry.start("run", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    wait_until(lambda: ferry.tasks() and ferry.tasks()[0]["state"] == "RUNNING", what="run's task")
    ferry.ok("submit", "--", "sh", "-c", f"test -e {gate} && echo after > {ran}")
    work = ferry.start("work", "-j", "1", "--drain", stdout=subprocess.DEVNULL)
    assert work.stderr is not None
    notice = work.stderr.readline()
    assert (
        b"1 task(s) of this home already run (under an earlier work's supervisors, or run's"
        in notice
    )
    gate.touch()
    for proc in (run, work):
        code, err = finish(proc)
        assert code == 0, err
    assert ran.read_text() == "after\n"  # (it waited for run's task to end)


# ---- the supervisor itself killed: recovery decides, as before ----------------------------


@pytest.mark.parametrize("alive", [True, False])
def test_a_killed_supervisor_leaves_the_task_to_recovery(
    ferry: Ferry, tmp_path: Path, alive: bool
) -> None:
    mark = tmp_path / "runs"
    linger = "; exec sleep 300" if alive else ""
    run = ferry("run", "--", *counting_task(mark, linger=linger),
                failpoints="supervisor:after:spawn=self")  # fmt: skip
    # 3, not 125 (ferry failed before the task could start: a script may run it again;
    # a review): the task started, and recovery decides it.
    assert run.code == 3 and run.error_code() == "supervisor.died", run
    task_id = only_id(ferry)
    if alive:
        for ident in task_processes(task_id):
            ferry.end_at_close(ident.pid)
    else:
        wait_task_gone(task_id)
    code, report = ferry.recover()
    decision = "QUARANTINE" if alive else "FAIL_UNSAFE"
    assert code == 3 and [d["decision"] for d in report["decisions"]] == [decision], report
    assert runs(mark) == 1


def test_a_supervisor_dead_before_its_go_started_nothing_and_run_says_125(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Its supervisor killed after its plan, before ``run`` sent its go (the go never
    left: the peer was gone): run exited 3, "may have started", and recovery marked the
    task unsafe, though it never ran (a review). Nothing started: 125, naming the task,
    which is FAILED: it was given back to the queue, and a script that ran it again
    on 125 had it run twice, by the next work (a second review)."""
    mark = tmp_path / "runs"
    run = ferry.start("run", "--", *counting_task(mark), failpoints="launcher:before:go=stop")
    wait_stopped(run, what="run to stop before its go")
    task_id = only_id(ferry)
    supervisor = int(ferry.task(task_id)["runner"]["pid"])
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: (st := read_stat(supervisor)) is None or st.exited, what="it to die")
    code, err = finish(run)
    assert code == 125 and "supervisor.died" in err and task_id in err, err
    task = ferry.task(task_id)
    assert (task["state"], task["reason"]) == ("FAILED", "SPAWN_FAILED"), task
    ferry.ok("work", "--drain")
    assert runs(mark) == 0
    nothing_left_for_recovery(ferry)


def test_a_supervisor_killed_with_its_launcher_is_the_crash_of_before(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A plain failpoint kills the whole command (launcher and supervisor): what a crash
    of ferry did before supervisors, and still must be decided the same way."""
    mark = tmp_path / "runs"
    argv = counting_task(mark, linger="; sleep 0.3")
    assert ferry("run", "--", *argv, failpoints="after:SPAWNED").code == -signal.SIGKILL
    task_id = only_id(ferry)
    wait_task_gone(task_id)
    code, report = ferry.recover()
    assert code == 3 and [d["decision"] for d in report["decisions"]] == ["FAIL_UNSAFE"]


# ---- soak ------------------------------------------------------------------------------


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_workers_killed_at_random_never_disturb_their_tasks(ferry: Ferry, tmp_path: Path) -> None:
    """Workers killed at random many times while tasks of 0.05 to 1 s run: no task is
    disturbed (each runs exactly once, to a SUCCEEDED end written by its supervisor),
    none is left in flight, and -j holds throughout."""
    import random

    seed = int(os.environ.get("FERRY_SOAK_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    stamps = tmp_path / "stamps"
    marks = []
    for n in range(120):
        mark = tmp_path / f"m{n}"
        marks.append(mark)
        sleep_s = rng.choice([0.05, 0.1, 0.3, 0.6, 1.0])
        ferry.ok("submit", "--", *stamping_task(stamps, n, sleep_s, mark))
    kills = 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        worker = ferry.start("work", "-j", "3", "--drain", "--poll", "0.05")
        try:
            worker.wait(timeout=rng.uniform(0.2, 1.5))
            if worker.returncode == 0 and all(runs(m) == 1 for m in marks):
                break
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
            kills += 1
    ferry.ok("work", "-j", "3", "--drain", "--poll", "0.05")
    for task in ferry.tasks():
        wait_task_gone(str(task["id"]))
    states = [t["state"] for t in ferry.tasks()]
    assert states == ["SUCCEEDED"] * len(marks), (seed, states)
    assert [runs(m) for m in marks] == [1] * len(marks), seed
    assert most_at_once(stamps) <= 3, seed
    assert kills >= 5, (seed, kills)
    nothing_left_for_recovery(ferry)
    ferry.verify_clean()
