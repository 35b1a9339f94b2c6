"""Attacks on "tasks outlive the ferry process that started them" (supervisors).

Each test drives the real ``ferry`` (``clikit.Ferry``) and breaks one of the feature's
guarantees the hard way: a launcher stopped (SIGSTOP) past the supervisor's wait for
its ``ack``, a supervisor stopped or killed at a chosen point, a syscall failed with
strace, very large tasks and outputs. The tests under "bugs" each reproduced a bug of
the first version of supervisors (its docstring says how it failed) and pass since
its fix; the others are attacks the feature withstood, kept as regression tests.

``ACK_WAIT_S`` (10 s) is how long a supervisor waits for its launcher's word that its
end is durable before it writes the end itself. Tests that need that wait to run out
start ferry through :data:`SHORT_ACK` (the same CLI, with a shorter wait patched in
before anything runs: the supervisor is a fork of the launcher, so it inherits it),
so that they stay fast.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry, finish, wait_stopped, wait_until
from crashkit import counting_task, runs, wait_task_gone
from hardkit import children, holds_open, pid_alive, slow_to_hash

pytestmark = pytest.mark.timeout(120)

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def short_ack(wait_s: float) -> tuple[str, ...]:
    """The ferry CLI with the supervisors' ACK_WAIT_S set to ``wait_s``."""
    code = (
        "import sys, ferry.app.supervisor as s\n"
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


def run_gated_without_descriptors(
    ferry: Ferry, out: Path, gate: Path, log: Path
) -> tuple[subprocess.Popen[bytes], str, subprocess.Popen[bytes]]:
    """``ferry run`` of a task that writes "start" to ``out``, waits for ``gate``, then
    writes "done"; once it runs, its supervisor's every openat fails with EMFILE
    (strace, logging to ``log``). The run, the task's id, and the tracer."""
    script = (f'trap "" PIPE; echo start >> "{out}"; '
              f'while [ ! -e "{gate}" ]; do sleep 0.02; done; echo done >> "{out}"')  # fmt: skip
    run = ferry.start("run", "--", "/bin/sh", "-c", script)
    wait_until(out.exists, what="the task to start")
    task_id = first_id(ferry)
    supervisor = int(wait_until(lambda: ferry.task(task_id)["runner"]["pid"], what="runner"))
    tracer = strace_attach(
        supervisor, "-e", "trace=openat", "-e", "inject=openat:error=EMFILE", log=log
    )
    return run, task_id, tracer


@needs_strace
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
    run, task_id, tracer = run_gated_without_descriptors(ferry, out, gate, log)
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


def standard_descriptors(pid: int) -> dict[int, str]:
    """What ``pid``'s descriptors 0, 1 and 2 are (one left out: it is free)."""
    return {fd: to for fd, to in descriptors(pid).items() if fd <= 2}


def delivered_alone(
    ferry: Ferry, run: subprocess.Popen[bytes], task_id: str, supervisor: int
) -> dict[str, object]:
    """The task's end, once its supervisor (its launcher gone) delivered it and exited:
    no ``recover`` ran, so a task not settled then had its end lost. ``run``'s stderr
    (the pipe the supervisor held) has no traceback."""
    wait_until(lambda: not pid_alive(supervisor), what="the supervisor to deliver and exit")
    task = ferry.task(task_id)
    records = [r for r in ferry.records() if r["data"].get("task") == task_id]
    assert records[-1]["type"] == "SETTLED", (task["state"], "the end was lost", records[-1])
    _, err = run.communicate(timeout=30)
    assert b"Traceback" not in err, err
    return task


def test_a_supervisor_out_of_descriptors_at_its_task_s_end_still_delivers_it(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``kill -9`` of ``ferry run``; its supervisor then has no descriptor to spare
    (RLIMIT_NOFILE lowered to 3 with prlimit: 0, 1 and 2 are open, so every open,
    pipe or socket fails with EMFILE) when its task exits 7. It cannot open the store,
    and lets go of the terminal before it waits to deliver the end: ``os.open`` of
    /dev/null, unguarded (supervisor.py ``_let_go_of_the_terminal``), raised; the
    supervisor exited 125 before it kept the end, and the task's end (its exit code)
    was lost, for recovery to decide the task without it. Now it frees one of the
    terminal's descriptors for /dev/null, and once it has descriptors again (the
    limit raised) delivers the end itself."""
    out, gate = tmp_path / "out", tmp_path / "gate"
    script = f'echo start > "{out}"; while [ ! -e "{gate}" ]; do sleep 0.02; done; exit 7'
    run = ferry.start("run", "--", "/bin/sh", "-c", script)
    wait_until(out.exists, what="the task to start")
    task_id = first_id(ferry)
    supervisor = int(wait_until(lambda: ferry.task(task_id)["runner"]["pid"], what="runner"))
    soft, hard = resource.prlimit(supervisor, resource.RLIMIT_NOFILE)
    assert sorted(standard_descriptors(supervisor)) == [0, 1, 2]
    resource.prlimit(supervisor, resource.RLIMIT_NOFILE, (3, hard))
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    gate.touch()

    def let_go() -> bool:
        held = standard_descriptors(supervisor) if pid_alive(supervisor) else None
        return held is None or held == dict.fromkeys((0, 1, 2), os.devnull)

    wait_until(let_go, what="the supervisor to let go of the terminal (or to die)")
    with contextlib.suppress(ProcessLookupError):
        resource.prlimit(supervisor, resource.RLIMIT_NOFILE, (soft, hard))
    task = delivered_alone(ferry, run, task_id, supervisor)
    assert (task["state"], task["exit_code"]) == ("FAILED", 7), task


@needs_strace
def test_a_supervisor_that_cannot_open_dev_null_at_its_task_s_end_still_delivers_it(
    ferry: Ferry, tmp_path: Path
) -> None:
    """The same, but every openat fails (EMFILE, injected with strace), /dev/null's
    too after a terminal descriptor is freed for it: the supervisor keeps the terminal
    (none of 0, 1 and 2 left free for a later open to take: a journal's writes would
    land in what it writes to stderr) and still delivers the end once it can."""
    out, gate, log = tmp_path / "out", tmp_path / "gate", tmp_path / "strace.log"
    run, task_id, tracer = run_gated_without_descriptors(ferry, out, gate, log)
    supervisor = int(ferry.task(task_id)["runner"]["pid"])
    try:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        gate.touch()

        def tried_twice() -> bool:
            if not pid_alive(supervisor):
                return True
            return log.read_text().count(f'"{os.devnull}"') >= 2

        wait_until(tried_twice, what="the supervisor to try /dev/null twice (or to die)")
        assert pid_alive(supervisor), "the supervisor died"
        assert sorted(standard_descriptors(supervisor)) == [0, 1, 2]
    finally:
        stop_strace(tracer)
    task = delivered_alone(ferry, run, task_id, supervisor)
    assert (task["state"], task["exit_code"]) == ("SUCCEEDED", 0), task


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


def test_claim_keeps_its_lease_while_its_supervisor_hashes_a_pinned_input(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``ferry claim`` holds the lease from its claim until its task's intent is
    written, and in between the task's supervisor hashes its pinned input again: for as
    long as that takes (a stopped supervisor stands for a slow disk), claim renews the
    lease, so that no other leader takes over and fences the intent. It lapsed after
    one TTL, and a leader starting then made the claim fail (``lease.lost``)."""
    big = tmp_path / "big"
    task_id = ferry.ok("submit", "--pointer", slow_to_hash(big), "--", "true").text.strip()
    claimer = ferry.start("claim", "--lease-ttl", "1")
    hashing = wait_until(
        lambda: [pid for pid in children(claimer.pid) if holds_open(pid, big)],
        what="the supervisor to hash the pinned input",
    )
    os.kill(hashing[0], signal.SIGSTOP)
    try:
        held = ferry.json("lease")
        assert held["holder"]["pid"] == claimer.pid
        wait_until(
            lambda: ferry.json("lease")["expires_boot_s"] > held["expires_boot_s"] + 2,
            what="claim to renew its lease twice while the hashing lasts",
        )
        assert ferry.json("lease")["holder"]["pid"] == claimer.pid
    finally:
        os.kill(hashing[0], signal.SIGCONT)
    code, err = finish(claimer)
    assert code == 0, err
    assert ferry.task(task_id)["state"] == "SUCCEEDED"


@needs_strace
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
            code: int | None = worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        stop_strace(tracer)
    assert code is not None, "work --drain did not exit"


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
            code: int | None = worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            code = None
        assert code is not None, "work did not stop"
        assert ferry.task(task_id)["state"] == "QUEUED"
    finally:
        with contextlib.suppress(ProcessLookupError):  # (work ended it: it had started nothing)
            os.kill(hashing, signal.SIGKILL)  # (it would hash 4 GiB once continued)
            os.kill(hashing, signal.SIGCONT)


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
        task = settled(ferry, small, timeout_s=15)
        assert task["state"] == "SUCCEEDED"
    finally:
        os.kill(supervisor, signal.SIGCONT)


def test_work_stopped_past_the_ack_wait_reports_no_refusal(tmp_path: Path) -> None:
    """``work`` stopped (SIGSTOP) while its task ends, past the supervisor's ack wait:
    the supervisor writes the end itself, as designed. Continued, work commits the same
    end, which is refused (the token moved on), and ``Worker._done`` prints the refusal
    as a notice, with the task id twice: an operator reads that something was refused
    for a task that simply SUCCEEDED. (The refusal is the expected outcome of the
    fallback: it should be silent, or say that the supervisor wrote the end.)"""
    ferry = Ferry(tmp_path / "home", command=SHORT_ACK)
    gate = tmp_path / "gate"
    try:
        task_id = ferry.ok("submit", "--", *gated(gate)).text.strip()
        worker = ferry.start("work", "-j", "1", "--poll", "0.05")
        wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="RUNNING")
        os.kill(worker.pid, signal.SIGSTOP)
        gate.touch()
        assert settled(ferry, task_id)["state"] == "SUCCEEDED"  # by its supervisor
        os.kill(worker.pid, signal.SIGCONT)
        done = ferry.ok("submit", "--", "true").text.strip()  # one more turn of the loop
        settled(ferry, done)
        worker.send_signal(signal.SIGTERM)
        code, err = finish(worker)
        assert code == 0, err
        assert "refused" not in err, err
    finally:
        ferry.close()


# ---- attacks that held ---------------------------------------------------------------


def gated(gate: Path, *, before: str = "", after: str = "") -> list[str]:
    """A task that runs ``before``, waits for ``gate`` to exist, then runs ``after``."""
    wait = f'while [ ! -e "{gate}" ]; do sleep 0.02; done'
    return ["/bin/sh", "-c", f'trap "" PIPE; {before} {wait}; {after}']


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_run_forwards_a_signal_to_its_task_once_and_exits_with_it(
    ferry: Ferry, tmp_path: Path, sig: signal.Signals
) -> None:
    """The terminal's signal reaches ``ferry run`` alone (the supervisor and the task
    are in sessions of their own); run forwards it to its supervisor, which forwards it
    to the task's group: once. The task (which notes it, then dies of it) makes run
    exit 128+N."""
    got = tmp_path / "got"
    name = sig.name[3:]
    script = (f'trap \'echo {name} >> "{got}"; trap - {name}; kill -{name} $$\' {name}; '
              f'echo up >> "{got}"; while :; do sleep 0.02; done')  # fmt: skip
    run = ferry.start("run", "--", "/bin/sh", "-c", script)
    wait_until(got.exists, what="the task to start")
    os.killpg(run.pid, sig)  # (as a terminal does: run's whole process group)
    code, _ = finish(run)
    assert code == 128 + sig
    assert got.read_text().split() == ["up", name]
    task = ferry.only_task()
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", sig)


@pytest.mark.parametrize("command", ["run", "work"])
def test_a_task_of_a_megabyte_crosses_the_control_channel_whole(ferry: Ferry, command: str) -> None:
    """A task travels to its supervisor in 64 KiB frames: 900 arguments of 1 KB each
    arrive whole and in order (the task prints their count and checksum)."""
    import hashlib

    args = [f"{n:04d}" + "x" * 1000 for n in range(900)]
    argv = ["/bin/sh", "-c", 'echo "$#"; printf "%s" "$*" | md5sum', "sh", *args]
    if command == "run":
        out = ferry.ok("run", "--", *argv).out
    else:
        task_id = ferry.ok("submit", "--", *argv).text.strip()
        ferry.ok("work", "--drain", "-j", "1")
        out = ferry.ok("logs", task_id).out
    want = hashlib.md5(" ".join(args).encode()).hexdigest()
    assert out.decode().split() == ["900", want, "-"]


def descriptors(pid: int) -> dict[int, str]:
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return found


def test_neither_a_task_nor_a_supervisor_holds_what_is_not_theirs(
    ferry: Ferry, tmp_path: Path
) -> None:
    """work -j 3, three tasks running: each task holds its stdio and its own alive-lock
    only; each supervisor holds no journal, lock or lease descriptor, and one channel
    socket (its own: not its siblings')."""
    gate = tmp_path / "gate"
    ids = [ferry.ok("submit", "--", *gated(gate)).text.strip() for _ in range(3)]
    worker = ferry.start("work", "-j", "3", "--poll", "0.05")
    try:
        wait_until(lambda: {t["state"] for t in ferry.tasks()} == {"RUNNING"}, what="3 running")
        supervisors = children(worker.pid)
        assert len(supervisors) == 3
        for task_id in ids:
            task = ferry.task(task_id)
            held = descriptors(int(task["pid"]))
            lock = str(ferry.home / "heartbeats" / f"{task_id}.1")
            assert sorted(held) == [0, 1, 2, *[fd for fd, to in held.items() if to == lock]]
            assert list(held.values()).count(lock) == 1, held
        for pid in supervisors:
            held = descriptors(pid)
            assert not [to for to in held.values() if str(ferry.home) in to and (
                "journal" in to or "lease" in to or to.endswith(".lock"))], held  # fmt: skip
            assert sum(1 for to in held.values() if to.startswith("socket:")) == 1, held
    finally:
        gate.touch()
    for task_id in ids:
        assert settled(ferry, task_id)["state"] == "SUCCEEDED"


def test_output_and_logs_follow_are_whole_after_run_is_killed_mid_stream(
    ferry: Ferry,
) -> None:
    """``kill -9`` of ``ferry run`` while its task writes 16 MB: the reader of run's
    stdout still gets every byte (the supervisor holds that pipe), the log holds every
    byte, and ``logs -f`` started after the kill ends with the task, exit 0."""
    lines = 500_000
    script = f"import sys\nfor i in range({lines}): sys.stdout.write('%031d\\n' % i)\n"
    run = ferry.start("run", "--", sys.executable, "-c", script)
    assert run.stdout is not None
    got = bytearray()

    def read() -> None:
        assert run.stdout is not None
        while chunk := os.read(run.stdout.fileno(), 1 << 20):
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        wait_until(lambda: len(got) > 1 << 20, what="a first megabyte")
        run.kill()
        run.wait(timeout=30)
        follow = ferry.start("logs", "-f", first_id(ferry))
        out, _ = follow.communicate(timeout=60)
    finally:
        reader.join(timeout=60)
    want = b"".join(b"%031d\n" % i for i in range(lines))
    task_id = first_id(ferry)
    assert settled(ferry, task_id)["state"] == "SUCCEEDED"
    assert bytes(got) == want
    assert (ferry.home / "logs" / task_id / "1.stdout").read_bytes() == want
    assert (follow.returncode, out == want) == (0, True)


def test_an_orphaned_supervisor_honours_cancel_and_recover_leaves_it_alone(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Two ``ferry run``s killed -9 while their tasks run: ``recover`` decides neither
    (their supervisors live); one is cancelled (its supervisor sees the request at a
    heartbeat and stops it), the other ends by itself. Nothing is left to recover."""
    gate = tmp_path / "gate"
    runs_ = [ferry.start("run", "--heartbeat", "0.2", "--", *gated(gate)) for _ in range(2)]
    wait_until(lambda: [t["state"] for t in ferry.tasks()] == ["RUNNING"] * 2, what="running")
    for run in runs_:
        run.kill()
        run.wait(timeout=30)
    code, report = ferry.recover()
    assert (code, report.get("decisions", [])) == (0, []), report
    cancelled, ending = (str(t["id"]) for t in ferry.tasks())
    ferry.ok("cancel", cancelled)
    assert settled(ferry, cancelled)["state"] == "CANCELLED"
    gate.touch()
    assert settled(ferry, ending)["state"] == "SUCCEEDED"
    code, report = ferry.recover()
    assert (code, report.get("decisions", [])) == (0, []), report
    ferry.verify_clean()


def test_a_pooled_supervisor_shrugs_off_signals_between_tasks_and_is_replaced_if_killed(
    ferry: Ferry,
) -> None:
    """SIGTERM, SIGINT and SIGHUP sent to an idle pooled supervisor are for no task: its
    next task runs undisturbed (in the same supervisor). Killed while idle, it is reaped
    (no zombie child of work) and the next task gets a new one."""
    from ferry.proc.process import read_stat

    worker = ferry.start("work", "-j", "1", "--poll", "0.05")
    first = ferry.ok("submit", "--", "true").text.strip()
    supervisor = int(settled(ferry, first)["runner"]["pid"])  # type: ignore[index]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(supervisor, sig)
    second = ferry.ok("submit", "--", "sleep", "0.2").text.strip()
    task = settled(ferry, second)
    assert (task["state"], task["runner"]["pid"]) == ("SUCCEEDED", supervisor)  # type: ignore[index]
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: supervisor not in children(worker.pid), what="work to reap it")
    assert all(read_stat(pid).state != "Z" for pid in children(worker.pid))  # type: ignore[union-attr]
    third = ferry.ok("submit", "--", "true").text.strip()
    assert settled(ferry, third)["state"] == "SUCCEEDED"
    assert worker.poll() is None


@needs_strace
@pytest.mark.crash
@pytest.mark.parametrize(
    ("command", "nth"), [("work", n) for n in range(1, 10)] + [("run", n) for n in range(1, 5)]
)
def test_the_launcher_killed_before_each_message_it_sends(
    ferry: Ferry, tmp_path: Path, command: str, nth: int
) -> None:
    """strace kills the launcher as it enters its ``nth`` channel send (task, go,
    durable, ack, the next task...): every task still runs exactly once, to SUCCEEDED
    (written by its supervisor, or run by the next worker when it was released before
    its spawn; ``run``'s own task, never started, FAILED), and nothing is left to
    recover."""
    marks = [tmp_path / f"m{n}" for n in range(3 if command == "work" else 1)]
    argvs = [counting_task(mark, linger="; sleep 0.2") for mark in marks]
    strace = ("strace", "-o", str(tmp_path / "strace.log"), "-e", "trace=sendto",
              "-e", f"inject=sendto:signal=SIGKILL:when={nth}")  # fmt: skip
    if command == "work":
        for argv in argvs:
            ferry.ok("submit", "--", *argv)
        launcher = ferry("work", "-j", "1", "--drain", "--poll", "0.05",
                         command=(*strace, *ferry.command))  # fmt: skip
    else:
        launcher = ferry("run", "--", *argvs[0], command=(*strace, *ferry.command))
    assert launcher.code in (0, -signal.SIGKILL), launcher
    for task in ferry.tasks():
        wait_task_gone(str(task["id"]))
    ferry.ok("work", "--drain", "-j", "1")
    if command == "run" and nth == 1:  # killed before its task reached the supervisor:
        assert (ferry.tasks(), runs(marks[0])) == ([], 0)  # nothing written, nothing ran
        return
    if command == "run" and nth == 2:  # killed before its go: nothing ran, and run's own
        [task] = ferry.tasks()  # task is not left for a work to run later
        assert (task["state"], task["reason"], runs(marks[0])) == ("FAILED", "SPAWN_FAILED", 0)
        return
    assert [t["state"] for t in ferry.tasks()] == ["SUCCEEDED"] * len(marks)
    assert [runs(mark) for mark in marks] == [1] * len(marks)
    code, report = ferry.recover()
    assert (code, report.get("decisions", [])) == (0, []), report


@pytest.mark.soak
@pytest.mark.timeout(600)
def test_a_pooled_supervisor_does_not_grow_over_many_tasks(ferry: Ferry) -> None:
    """work -j 1 runs 600 tiny tasks in its pooled supervisors: their memory and
    descriptor counts at the end are those after the first tasks (no leak per task)."""
    lines = b"".join(
        b'{"argv": ["/bin/sh", "-c", "echo %d; echo e >&2"]}\n' % n for n in range(600)
    )
    ferry.ok("submit", "--from", "-", stdin=lines)
    # (No --drain: the late sample must find work and its pooled supervisors still
    # there; a drained work had exited before a slow look saw 560 done, a soak flake.)
    worker = ferry.start("work", "-j", "1", "--poll", "0.05")

    def sample() -> dict[int, tuple[int, int]]:
        found = {}
        for pid in children(worker.pid):
            try:
                with open(f"/proc/{pid}/status") as status:
                    rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
                found[pid] = (rss, len(os.listdir(f"/proc/{pid}/fd")))
            except (OSError, StopIteration):
                continue
        return found

    def done() -> int:
        return sum(1 for t in ferry.tasks() if t["state"] == "SUCCEEDED")

    wait_until(lambda: done() >= 20, what="20 tasks", timeout_s=120)
    early = sample()
    wait_until(lambda: done() >= 560, what="560 tasks", timeout_s=500)
    late = sample()
    wait_until(lambda: done() == 600, what="600 tasks", timeout_s=120)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=120) == 0
    common = set(early) & set(late)
    assert common, (early, late)
    for pid in common:
        assert late[pid][0] <= early[pid][0] + 2048, (pid, early[pid], late[pid])  # KiB
        assert late[pid][1] <= 16, (pid, late[pid])
