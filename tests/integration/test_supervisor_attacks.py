"""Attacks on "tasks outlive the ferry process that started them" (supervisors).

Each test drives the real ``ferry`` (``clikit.Ferry``) and breaks one of the feature's
guarantees the hard way: a launcher stopped (SIGSTOP) past the supervisor's wait for
its ``ack``, a supervisor stopped or killed at a chosen point, a syscall failed with
strace, very large tasks and outputs. A test marked ``xfail(strict=True)`` reproduces
a bug of the current code (its docstring says how it fails); the others are attacks
the feature withstood, kept as regression tests.

``ACK_WAIT_S`` (10 s) is how long a supervisor waits for its launcher's word that its
end is durable before it writes the end itself. Tests that need that wait to run out
start ferry through :data:`SHORT_ACK` (the same CLI, with a shorter wait patched in
before anything runs: the supervisor is a fork of the launcher, so it inherits it),
so that they stay fast.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry, finish, wait_stopped, wait_until
from crashkit import wait_task_gone
from hardkit import children, holds_open, slow_to_hash

pytestmark = pytest.mark.timeout(120)

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def short_ack(wait_s: float) -> tuple[str, ...]:
    """The ferry CLI with the supervisors' ACK_WAIT_S set to ``wait_s``."""
    code = (
        "import sys, ferry.supervisor as s\n"
        f"s.ACK_WAIT_S = {wait_s!r}\n"
        "from ferry.cli import main\n"
        "sys.exit(main())\n"
    )
    return (sys.executable, "-c", code)


SHORT_ACK = short_ack(1.0)


@pytest.fixture
def ferry_short_ack(tmp_path: Path) -> Iterator[Ferry]:
    f = Ferry(tmp_path / "home", command=SHORT_ACK)
    try:
        yield f
    finally:
        f.close()


def settled(ferry: Ferry, task_id: str, timeout_s: float = 30.0) -> dict[str, object]:
    def done() -> dict[str, object] | None:
        task = ferry.task(task_id)
        return task if task["state"] in TERMINAL else None

    task: dict[str, object] = wait_until(
        done, what=f"task {task_id} to settle", timeout_s=timeout_s
    )
    return task


def first_id(ferry: Ferry) -> str:
    return str(wait_until(lambda: ferry.tasks() and ferry.tasks()[0]["id"], what="a task"))


def traced_by(pid: int) -> bool:
    """Is ``pid`` stopped under a tracer (strace attached)?"""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("TracerPid:"):
                return line.split()[1] != "0"
    return False


def strace_attach(pid: int, *options: str, log: Path) -> subprocess.Popen[bytes]:
    """strace attached to ``pid`` (returns once attached) with ``options``."""
    proc = subprocess.Popen(
        ["strace", "-p", str(pid), "-o", str(log), *options],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_until(lambda: traced_by(pid) or proc.poll() is not None, what="strace to attach")
    assert proc.poll() is None, f"strace could not attach to {pid}"
    return proc


def stop_strace(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=30)


needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


# ---- bugs ------------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="run writes the SPAWNED it held after its supervisor wrote the task's end "
    "itself: refused, and run exits 125 task.stale_claim instead of the task's status",
)
def test_run_stopped_past_the_ack_wait_exits_with_the_task_s_status(
    ferry_short_ack: Ferry,
) -> None:
    """``ferry run`` stopped (SIGSTOP: a frozen container, ^Z) just before it writes its
    task's SPAWNED, for longer than the supervisor waits for an ack: the supervisor
    writes SPAWNED and SETTLED itself (right). Continued, run still commits the SPAWNED
    it held (launch.py ``_watch``: ``store.commit(spawned)`` is not guarded), the store
    refuses it, and run exits 125 ``task.stale_claim`` for a task that SUCCEEDED."""
    ferry = ferry_short_ack
    run = ferry.start(
        "run", "--", "/bin/sh", "-c", "sleep 0.3; echo done",
        failpoints="launcher:before:SPAWNED=stop",
    )  # fmt: skip
    wait_stopped(run, what="run to stop before SPAWNED")
    task_id = first_id(ferry)
    task = settled(ferry, task_id)  # by its supervisor, its launcher being silent
    assert (task["state"], task["exit_code"]) == ("SUCCEEDED", 0), task
    code, err = finish(run)
    assert (code, err) == (0, ""), err


@pytest.mark.xfail(
    strict=True,
    reason="the supervisor never flushes its outbox while it waits for its ack: the "
    "'ended' message queued behind beats never reaches a launcher continued in time; "
    "run exits 125 supervisor.died",
)
def test_run_continued_before_the_ack_wait_ends_gets_the_task_s_end(tmp_path: Path) -> None:
    """``ferry run`` stopped for a few seconds while its task runs with a short
    heartbeat: the supervisor's beats fill the channel (about 280 packets), so its
    ``ended`` waits in its outbox. Run is continued well within the ack wait, reads
    the beats, and waits for ``ended``, which the supervisor never sends: neither
    ``Channel.wait_for`` (``_hand_over``) nor the task loop's control descriptor
    watches for writability, and nothing is sent after ``ended``. When the ack wait
    runs out the supervisor writes the end itself and exits, and run reports
    ``supervisor.died`` (exit 125) for a task that SUCCEEDED."""
    ferry = Ferry(tmp_path / "home", command=short_ack(4.0))
    ending = tmp_path / "ending"
    try:
        # Stopped right after SPAWNED's write; the task then runs 4 s: 400 beats.
        script = f'sleep 4; echo > "{ending}"; sleep 0.1'
        run = ferry.start(
            "run", "--heartbeat", "0.01", "--", "/bin/sh", "-c", script,
            failpoints="launcher:after:SPAWNED=stop",
        )  # fmt: skip
        wait_stopped(run, what="run to stop after SPAWNED")
        task_id = first_id(ferry)
        wait_until(ending.exists, what="the task to end")
        wait_task_gone(task_id)
        code, err = finish(run)  # continued at once: well within the 4 s ack wait
        assert ferry.task(task_id)["state"] == "SUCCEEDED"
        assert (code, err) == (0, ""), err
    finally:
        ferry.close()


@needs_strace
@pytest.mark.xfail(
    strict=True,
    reason="an orphaned supervisor that cannot open the journal raises out of its "
    "task loop, which kills the task's group (TaskLoop.abort)",
)
def test_a_supervisor_that_cannot_open_the_journal_does_not_kill_its_task(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``kill -9`` of ``ferry run`` while its supervisor cannot open files (EMFILE,
    injected with strace into the supervisor's openat: the moment of an OOM kill is
    one of scarce resources). The supervisor's ``_launcher_gone`` opens the store
    unguarded (supervisor.py ``_open_store``); the FerryError leaves the task loop, and
    ``supervise`` kills the task's whole group and the supervisor exits 125. The task
    never writes its last line. The contract: the launcher's death neither stops nor
    signals the task (and ``_should_stop`` already says a lack of descriptors must not
    kill a running task)."""
    out, gate, log = tmp_path / "out", tmp_path / "gate", tmp_path / "strace.log"
    script = (f'trap "" PIPE; echo start >> "{out}"; '
              f'while [ ! -e "{gate}" ]; do sleep 0.02; done; echo done >> "{out}"')  # fmt: skip
    run = ferry.start("run", "--", "/bin/sh", "-c", script)
    wait_until(out.exists, what="the task to start")
    task_id = first_id(ferry)
    supervisor = int(wait_until(lambda: ferry.task(task_id)["runner"]["pid"], what="runner"))
    tracer = strace_attach(
        supervisor, "-e", "trace=openat", "-e", "inject=openat:error=EMFILE", log=log
    )
    try:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        # The supervisor saw its launcher go and tried to open the journal.
        wait_until(lambda: "/journal" in log.read_text(), what="the supervisor to open it")
        gate.touch()
        wait_task_gone(task_id)
    finally:
        stop_strace(tracer)
    assert out.read_text().split() == ["start", "done"], "the task was killed"


@pytest.mark.xfail(
    strict=True,
    reason="a supervisor that dies before its plan halts work: --drain exits 0 with "
    "every task still QUEUED",
)
def test_work_drain_runs_the_queue_after_a_supervisor_died_while_planning(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A pooled supervisor killed (OOM killer, kill -9) while it hashes a task's pinned
    input again: nothing was claimed, nothing started. ``Worker._let_go`` (worker.py)
    takes a supervisor gone before its plan for a failure of the whole worker and
    halts it, without failing it: ``work --drain`` says "stopping: ... its supervisor
    died before it planned the task" and exits 0 with both tasks QUEUED (a service
    ``work`` exits 0 too, and systemd does not restart it)."""
    big = tmp_path / "big"
    pinned = ferry.ok("submit", "--pointer", slow_to_hash(big), "--", "true").text.strip()
    plain = ferry.ok("submit", "--", "true").text.strip()
    worker = ferry.start("work", "-j", "1", "--drain", "--poll", "0.05")
    hashing = wait_until(
        lambda: [pid for pid in children(worker.pid) if holds_open(pid, big)],
        what="a supervisor to hash the pinned input",
    )
    os.kill(hashing[0], signal.SIGKILL)
    big.write_bytes(b"changed")  # (its next plan is quick: POINTER_STALE)
    code, err = finish(worker)
    states = {t["id"]: t["state"] for t in ferry.tasks()}
    assert states == {pinned: "FAILED", plain: "SUCCEEDED"}, (code, err)


@needs_strace
@pytest.mark.xfail(
    strict=True,
    reason="after a failed journal write with a task's end pending, work never exits "
    "and spins on the supervisor's closed channel",
)
def test_work_exits_after_its_journal_failed_with_an_end_pending(
    ferry: Ferry, tmp_path: Path
) -> None:
    """One fdatasync of ``work``'s journal fails (EIO, injected once with strace) as it
    writes its task's end. The handle is failed for good, so work halts (right) but
    keeps the end as pending: each loop turn retries the commit (refused at once), and
    ``_sleep`` selects on the supervisor's channel, which has ended (the supervisor
    wrote the end itself after ACK_WAIT_S and exited): readable at once, a busy loop.
    ``work --drain`` never exits (the test saw ~60 % of a CPU for minutes); the
    supervisor that ended stays in ``launches`` because ``_let_go`` keeps a gone
    supervisor whose ``ended`` is not None."""
    gate = tmp_path / "gate"
    script = f'while [ ! -e "{gate}" ]; do sleep 0.02; done'
    task_id = ferry.ok("submit", "--", "/bin/sh", "-c", script).text.strip()
    worker = Ferry(ferry.home, command=SHORT_ACK).start(
        "work", "-j", "1", "--drain", "--poll", "0.05"
    )
    ferry.background.append(worker)  # (reaped by the fixture)
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="RUNNING")
    tracer = strace_attach(
        worker.pid, "-e", "trace=fdatasync", "-e", "inject=fdatasync:error=EIO:when=1",
        log=tmp_path / "strace.log",
    )  # fmt: skip
    try:
        gate.touch()
        settled(ferry, task_id)  # by its supervisor: its launcher's write failed
        try:
            code: int | None = worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        stop_strace(tracer)
    assert code is not None, "work --drain did not exit"


@pytest.mark.xfail(
    strict=True,
    reason="work cannot be stopped (SIGTERM, twice) while a supervisor holds a task "
    "it has not planned",
)
def test_work_stops_on_sigterm_while_a_supervisor_has_not_planned(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A supervisor stuck while it plans its task (hashing a pinned input on a hung NFS
    mount, in D state; here: stopped with SIGSTOP while it reads the input). SIGTERM,
    then SIGTERM again: work never exits. ``_finished`` waits for every supervisor
    holding a task, ``_units`` drops (aborts) only tasks already planned, and
    ``_on_signals`` stops only planned ones; yet nothing was claimed for that task (it
    is QUEUED), nothing runs, and the supervisor could simply be killed (``Launch.kill``,
    as ``run`` does for an unclaimed one)."""
    big = tmp_path / "big"
    task_id = ferry.ok("submit", "--pointer", slow_to_hash(big), "--", "true").text.strip()
    worker = ferry.start("work", "-j", "1", "--poll", "0.05")
    hashing = wait_until(
        lambda: [pid for pid in children(worker.pid) if holds_open(pid, big)],
        what="a supervisor to hash the pinned input",
    )[0]
    os.kill(hashing, signal.SIGSTOP)
    try:
        worker.send_signal(signal.SIGTERM)
        worker.send_signal(signal.SIGTERM)
        try:
            code: int | None = worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            code = None
        assert code is not None, "work did not stop"
        assert ferry.task(task_id)["state"] == "QUEUED"
    finally:
        os.kill(hashing, signal.SIGCONT)


@pytest.mark.xfail(
    strict=True,
    reason="Launch.assign blocks work's whole loop (Channel.flush_all) while a large "
    "task is sent to a supervisor that does not read",
)
def test_a_stopped_idle_supervisor_does_not_wedge_the_worker(ferry: Ferry) -> None:
    """An idle pooled supervisor is stopped (SIGSTOP, or stuck in D state); work gives
    it the next task, which is larger than the socket's buffer (a long argv: 900 KB).
    ``Launch.assign`` calls ``Channel.flush_all``, which waits in ``select`` for the
    supervisor to read: work's single loop blocks there for good. No other slot gets a
    task (-j 2, a tiny task queued behind it never runs), no end is written (they
    fall back to the supervisors after ACK_WAIT_S), the lease is not renewed, and
    signals are not looked at."""
    first = ferry.ok("submit", "--", "true").text.strip()
    ferry.start("work", "-j", "2", "--poll", "0.05")
    supervisor = int(settled(ferry, first)["runner"]["pid"])  # type: ignore[index]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        large = ["x" * 1000 + str(n) for n in range(900)]
        ferry.ok("submit", "--", "/bin/sh", "-c", "true", "sh", *large)
        small = ferry.ok("submit", "--", "true").text.strip()
        task = settled(ferry, small)
        assert task["state"] == "SUCCEEDED"
    finally:
        os.kill(supervisor, signal.SIGCONT)
