"""`ferry run` forks its supervisor before it opens the store: a signal, a kill -9 or a
failure between the fork and the intent leaves no supervisor behind and nothing started;
on a shared database the store is opened before the fork (a review)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
from clikit import Ferry, processes_with_env, wait_stopped, wait_until
from hardkit import children, holds_open, slow_to_hash

pytestmark = pytest.mark.timeout(120)


def supervisors_of(ferry: Ferry) -> list[int]:
    """Live ferry processes (supervisors) carrying this home, not task processes."""
    needle = f"FERRY_HOME={ferry.home}".encode()
    return [p.pid for p in processes_with_env(needle)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_run_opens_the_store_ends_its_planning_supervisor(
    ferry: Ferry, tmp_path: Path, signum: int
) -> None:
    """run_foreground's docstring and _interruptible: before the intent, SIGTERM and
    SIGHUP end ferry through its finally blocks, "which end the supervisor, not by their
    default action (which would leave it planning for nothing)". The store is opened
    after the fork, inside _interruptible: a signal there (a slow open: a long tail)
    ends run through those blocks, and the supervisor hashing a pinned input goes with
    it (a review found the open outside _interruptible: run killed by the default
    action, the supervisor hashing on for nothing)."""
    ferry.ok("submit", "--", "true")  # (the home exists, with a journal to open)
    big = tmp_path / "big"
    run = ferry.start(
        "run",
        "--pointer",
        slow_to_hash(big),
        "--",
        "true",
        failpoints="launcher:before:replay=stop",
    )
    wait_stopped(run, what="run to stop in its store's open")
    try:
        run.send_signal(signum)
        run.send_signal(signal.SIGCONT)
        code = run.wait(timeout=30)
        # (ferry's finally blocks SIGKILL an unclaimed supervisor at once)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not supervisors_of(ferry), what="no supervisor", timeout_s=3)
        left = [p for p in supervisors_of(ferry) if holds_open(p, big)]
        assert not left, f"run exited {code}; its supervisor {left} hashes on for nothing"
    finally:
        for pid in supervisors_of(ferry):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not supervisors_of(ferry), what="the supervisors to die")


def _silent_server() -> tuple[object, list[object], int]:
    """A TCP listener that takes connections and never answers (a database behind a
    partition that drops packets, as libpq sees it: its connect_timeout runs)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                accepted.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return listener, accepted, listener.getsockname()[1]


def _close_and_kill_supervisors(listener: object, accepted: list[object], ferry: Ferry) -> None:
    """The silent server's sockets closed; any supervisor left killed, and gone."""
    listener.close()  # type: ignore[attr-defined]
    for conn in accepted:
        conn.close()  # type: ignore[attr-defined]
    for pid in supervisors_of(ferry):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not supervisors_of(ferry), what="the supervisors to die")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_run_signalled_while_its_database_does_not_answer_leaves_no_supervisor(
    ferry: Ferry, signum: int
) -> None:
    """`ferry run` on a shared database that does not answer: the store's open (the
    connect, up to CONNECT_TIMEOUT_S) now comes after the fork. SIGTERM then (a CI
    cancel, `timeout 3 ferry run`) kills run by its default action (not trapped:
    _interruptible starts after the open); kill -9 likewise. Before, nothing else
    existed; now the supervisor is left alone, and tries to open the database to release
    a claim that was never written, for STORE_OPEN_PATIENCE_S (300 s)."""
    listener, accepted, port = _silent_server()
    ferry.env["FERRY_DATABASE_URL"] = f"postgresql://ferry@127.0.0.1:{port}/ferry"
    ferry.env["FERRY_HOST_ID"] = "a"
    try:
        run = ferry.start("run", "--", "true")
        wait_until(lambda: accepted, what="run to connect to the database")
        run.send_signal(signum)
        code = run.wait(timeout=30)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not supervisors_of(ferry), what="no supervisor", timeout_s=8)
        left = supervisors_of(ferry)
        assert not left, f"run exited {code}; supervisor(s) {left} left waiting on the database"
    finally:
        _close_and_kill_supervisors(listener, accepted, ferry)


@pytest.mark.timeout(180)
def test_a_supervisor_on_a_database_that_cannot_open_files_does_not_kill_its_task(
    hosts: object, tmp_path: Path
) -> None:
    """test_supervisor_attacks.py::test_a_supervisor_that_cannot_open_the_journal_does_
    not_kill_its_task, on a shared database, the shortage lasting past run's beat TTL
    (RUN_BEAT_TTL_S, 30 s). Left alone, the supervisor must beat the task itself: it
    can, as it connects with a socket (not an openat), once the driver is loaded. With
    the store opened after the fork, the driver (psycopg: some 240 modules) was not
    loaded in the supervisor; each try failed in ``import psycopg`` (openat), the task
    went unheard, and at its deadline the supervisor stopped it. A shared database is
    opened before the fork again (foreground.run_task)."""
    import time

    from crashkit import wait_task_gone
    from test_supervisor_attacks import run_gated_without_descriptors, stop_strace

    from ferry.app.launch import RUN_BEAT_TTL_S

    ferry = hosts("a")  # type: ignore[operator]
    out, gate, log = tmp_path / "out", tmp_path / "gate", tmp_path / "strace.log"
    run, task_id, tracer = run_gated_without_descriptors(ferry, out, gate, log)
    try:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        # The shortage lasts past the TTL (and the launcher's last beat); the task runs on.
        deadline = time.monotonic() + RUN_BEAT_TTL_S + 10
        while time.monotonic() < deadline and ferry.live_task_processes():
            time.sleep(0.2)
        stopped = not ferry.live_task_processes()
        gate.touch()
        wait_task_gone(task_id)
    finally:
        stop_strace(tracer)
    tried = sorted({line.split('"')[1] for line in log.read_text().splitlines()
                    if "EMFILE" in line})[:4]  # fmt: skip
    assert not stopped and out.read_text().split() == ["start", "done"], (
        "the task was stopped as unheard",
        tried,
    )


@pytest.mark.parametrize(
    "point", ["before:replay", "after:replay", "before:SUBMITTED", "after:DISPATCHING"]
)
def test_run_killed_between_the_fork_and_the_intent_leaves_nothing_running(
    ferry: Ferry, tmp_path: Path, point: str
) -> None:
    """kill -9 of `ferry run` (only it: =self) at each point between its fork and its
    intent: its supervisor, left alone (now possibly before run opened the store),
    starts nothing, exits by itself, and the journal is clean: no task, or (the intent
    written) the task FAILED SPAWN_FAILED, never run."""
    for _ in range(13):  # (a home with a snapshot and an archive)
        ferry.ok("run", "--", "true")
    marker = tmp_path / "ran"
    run = ferry.start("run", "--", "touch", str(marker), failpoints=f"launcher:{point}=self")
    assert run.wait(timeout=30) == -signal.SIGKILL
    wait_until(lambda: not supervisors_of(ferry), what="the supervisor to exit by itself")
    assert not marker.exists()
    tasks = ferry.tasks()
    assert len(tasks) in (13, 14)
    if len(tasks) == 14:
        newest = max(tasks, key=lambda t: t["id"])  # (run's own, never started: not
        assert (newest["state"], newest["reason"]) == ("FAILED", "SPAWN_FAILED"), newest
        ferry.ok("work", "--drain")  # left queued for a work to run it later)
        assert not marker.exists()
    ferry.verify_clean()


def test_a_store_that_fails_to_open_after_the_fork_leaves_no_child_behind(
    tmp_path: Path,
) -> None:
    """run_foreground(open_store=...) in a long-lived process (a library use; the
    tests' own runner): the store fails to open after the fork (a damaged journal, the
    database out of reach). The supervisor, which started nothing, is SIGKILLed and
    reaped (a review found it reaped with timeout 0, before it was dead: a zombie child
    of the caller left for good)."""
    import time

    from ferry.app.launch import run_foreground
    from ferry.core.errors import FerryError
    from ferry.core.ids import new_claim_token, new_task_id
    from ferry.core.model import State, Task
    from ferry.core.spec import TaskSpec
    from ferry.storage.local.statedir import ensure_home

    home = Path(ensure_home(tmp_path / "home"))
    spec = TaskSpec(argv=("true",), cwd=str(tmp_path))
    token = new_claim_token(os.urandom(10))
    task = Task(id=new_task_id(time.time_ns(), os.urandom(4)), spec=spec,
                state=State.CLAIMED, claim_token=token)  # fmt: skip
    before = set(children(os.getpid()))

    def broken() -> object:
        raise FerryError("the journal is damaged", code="journal.corrupt")

    try:
        with pytest.raises(FerryError):
            run_foreground(broken, home, task, token)  # type: ignore[arg-type]
        with contextlib.suppress(AssertionError):
            wait_until(
                lambda: not [c for c in children(os.getpid()) if c not in before],
                what="no child",
                timeout_s=5,
            )
        left = [c for c in children(os.getpid()) if c not in before]
        assert not left, f"left behind: {left}"
    finally:
        for pid in children(os.getpid()):
            if pid not in before:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def test_run_terminated_while_its_database_does_not_answer_lets_go_of_its_stdout(
    ferry: Ferry,
) -> None:
    """`ferry run ... | tee log` in CI, cancelled (SIGTERM) while run connects to a
    database that does not answer: the reader must see the pipe's end when run is gone.
    The supervisor left alone holds run's stdout and stderr while it tries to open the
    store (STORE_OPEN_PATIENCE_S: 300 s, a try every CONNECT_TIMEOUT_S + 1 s): the
    pipeline hangs for five minutes."""
    import select

    listener, accepted, port = _silent_server()
    ferry.env["FERRY_DATABASE_URL"] = f"postgresql://ferry@127.0.0.1:{port}/ferry"
    ferry.env["FERRY_HOST_ID"] = "a"
    try:
        run = ferry.start("run", "--", "true", stdout=subprocess.PIPE)
        wait_until(lambda: accepted, what="run to connect to the database")
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        assert run.stdout is not None
        ready, _, _ = select.select([run.stdout], [], [], 10)
        assert ready and run.stdout.read() == b"", "run's stdout is still open, 10 s after it died"
    finally:
        _close_and_kill_supervisors(listener, accepted, ferry)
