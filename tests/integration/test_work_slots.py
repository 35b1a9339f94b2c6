"""``ferry work``'s slots: one task's end and the next claim share one durable write;
stopping on SIGTERM (the first stops claiming, the second stops the running tasks).

Failpoints fire per record type of a batch: ``before:X`` before the batch's write,
``after:X`` after its fsync. So a crash at ``after:SETTLED`` shows what that one write
held, and one at ``before:SETTLED`` what the journal held without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest
from clikit import Ferry, wait_until
from crashkit import counting_task, runs, wait_task_gone
from hardkit import holds_open_below, slow_to_hash

pytestmark = pytest.mark.timeout(120)


def submit(ferry: Ferry, mark: Path) -> str:
    task: dict[str, str] = orjson.loads(
        ferry.ok("--json", "submit", "--", *counting_task(mark)).text
    )
    return task["id"]


def states(ferry: Ferry) -> dict[str, str]:
    return {t["id"]: t["state"] for t in ferry.tasks()}


def test_the_end_of_a_task_and_the_next_claim_are_one_write(ferry: Ferry, tmp_path: Path) -> None:
    first, second = submit(ferry, tmp_path / "a"), submit(ferry, tmp_path / "b")
    result = ferry("work", "--drain", "-j", "1", failpoints="after:SETTLED")
    assert result.code == -9, result
    # The write that settled the first task also claimed the second and wrote its intent;
    # ferry died before spawning it.
    assert states(ferry) == {first: "SUCCEEDED", second: "DISPATCHING"}
    assert (runs(tmp_path / "a"), runs(tmp_path / "b")) == (1, 0)
    kinds = [(r["type"], r["data"].get("task")) for r in ferry.records()]
    settled = kinds.index(("SETTLED", first))
    assert kinds[settled + 1 : settled + 3] == [("CLAIMED", second), ("DISPATCHING", second)]
    ferry.verify_clean()


def test_a_crash_before_that_write_loses_neither_task(ferry: Ferry, tmp_path: Path) -> None:
    first, second = submit(ferry, tmp_path / "a"), submit(ferry, tmp_path / "b")
    result = ferry("work", "--drain", "-j", "1", failpoints="before:SETTLED")
    assert result.code == -9, result
    # Neither the end nor the claim reached the journal: the first is in flight with a
    # dead runner (a task that quick gets SPAWNED in SETTLED's write), the second queued.
    assert states(ferry) == {first: "DISPATCHING", second: "QUEUED"}
    code, report = ferry.recover()
    assert code == 3 and [d["task"] for d in report["decisions"]] == [first]
    ferry.ok("work", "--drain", "-j", "2")
    assert states(ferry) == {first: "FAILED", second: "SUCCEEDED"}
    assert (runs(tmp_path / "a"), runs(tmp_path / "b")) == (1, 1)  # neither ran twice
    ferry.verify_clean()


def test_slots_run_every_queued_task_once_and_end_when_drained(
    ferry: Ferry, tmp_path: Path
) -> None:
    marks = [tmp_path / f"m{n}" for n in range(12)]
    ids = [submit(ferry, mark) for mark in marks]
    ferry.ok("work", "--drain", "-j", "3")
    assert states(ferry) == dict.fromkeys(ids, "SUCCEEDED")
    assert [runs(mark) for mark in marks] == [1] * 12
    ferry.verify_clean()


def test_a_claim_refused_because_the_task_was_cancelled_meanwhile_is_skipped(
    ferry: Ferry, tmp_path: Path
) -> None:
    """The race between the loop's pick (from its table, as last caught up) and the
    claim's write, played step by step on a real state directory: another process
    cancels the first task after the worker read its table. The write catches up under
    the journal's lock and refuses that claim; the next task is claimed in its place
    (``claiming.commit_decided``), and nothing was started for the first."""
    from ferry.app.session import Session, Silent
    from ferry.app.worker import Worker

    first, second = submit(ferry, tmp_path / "a"), submit(ferry, tmp_path / "b")
    notices: list[str] = []

    class Noting(Silent):
        def notice(self, message: str) -> None:
            notices.append(message)

    session = Session(ferry.home, Noting())
    worker = Worker(session, jobs=1, drain=True, poll_s=0.05, lease_ttl_s=30.0,
                    stale_after_s=None)  # fmt: skip
    worker.lead.acquire()
    try:
        worker.lead.commit()  # (the worker's table: both tasks queued)
        assert [t.id for t in session.store.queued(2)] == [first, second]
        ferry.ok("cancel", first)  # lands between the worker's read and its write
        worker._write()
        assert list(worker.launches) == [second] and not worker.failures, notices
        worker._await_plans()
        worker._dispatch()
        assert states(ferry)[second] in ("DISPATCHING", "RUNNING", "SUCCEEDED")
        launch = worker.launches[second]
        while not launch.idle and not launch.gone:  # let it run, and write its end
            launch.wait(1.0)
            worker._write()
    finally:
        for launch in worker.supervisors:
            launch.release()
            launch.reap()
        worker.lead.release()
        session.store.close()
    assert states(ferry) == {first: "CANCELLED", second: "SUCCEEDED"}
    assert (runs(tmp_path / "a"), runs(tmp_path / "b")) == (0, 1)
    ferry.verify_clean()


def read_until(proc: subprocess.Popen[bytes], text: str) -> str:
    """Read ``proc``'s stderr until ``text`` appears (or fail at the deadline)."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    os.set_blocking(fd, False)
    seen = b""

    def found() -> bool:
        nonlocal seen
        with contextlib.suppress(BlockingIOError):
            seen += os.read(fd, 65536) or b""
        return text.encode() in seen

    wait_until(found, what=f"{text!r} from ferry work")
    return seen.decode()


def test_sigterm_stops_claiming_and_lets_the_running_task_finish(
    ferry: Ferry, tmp_path: Path
) -> None:
    gate, mark = tmp_path / "gate", tmp_path / "a"
    waits_for_gate = f'; while [ ! -e "{gate}" ]; do sleep 0.02; done'
    first = orjson.loads(
        ferry.ok("--json", "submit", "--", *counting_task(mark, linger=waits_for_gate)).text
    )["id"]
    second = submit(ferry, tmp_path / "b")
    proc = ferry.start("work", "-j", "1", "--poll", "0.05")
    wait_until(lambda: runs(mark) == 1, what="the first task to start")
    proc.send_signal(signal.SIGTERM)
    read_until(proc, "stopping: no new tasks")
    gate.touch()  # the running task may now finish
    assert proc.wait(timeout=60) == 0
    assert states(ferry) == {first: "SUCCEEDED", second: "QUEUED"}
    assert runs(tmp_path / "b") == 0
    assert orjson.loads(ferry.ok("--json", "lease").text)["holder"] is None  # released
    ferry.verify_clean()


def test_a_second_sigterm_stops_the_running_tasks_at_once(ferry: Ferry, tmp_path: Path) -> None:
    """At once, not at the task's next heartbeat: that is 600 s away here, and the
    worker must be gone long before."""
    marks = [tmp_path / "a", tmp_path / "b"]
    for mark in marks:
        ferry.ok("submit", "--heartbeat", "600", "--",
                 *counting_task(mark, linger="; exec sleep 600"))  # fmt: skip
    proc = ferry.start("work", "-j", "2", "--poll", "0.05")
    wait_until(lambda: [runs(m) for m in marks] == [1, 1], what="both tasks to start")
    proc.send_signal(signal.SIGTERM)
    read_until(proc, "stopping: no new tasks")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    for task in ferry.tasks():
        assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", 15)
        wait_task_gone(task["id"])
    ferry.verify_clean()


def test_a_task_s_end_is_not_held_back_while_the_next_one_s_inputs_are_hashed(
    ferry: Ferry, tmp_path: Path
) -> None:
    """The end of a task waits to share the next claim's write, but checking the next
    task's pinned inputs (hashing them again) may take long: a crash then must not
    lose an end already known. Here the worker is killed while the next task's
    supervisor hashes 4 GiB."""
    first = submit(ferry, tmp_path / "a")
    big = tmp_path / "big"
    ferry.ok("submit", "--pointer", slow_to_hash(big), "--", "true")
    worker = ferry.start("work", "--drain", "-j", "1")
    try:
        wait_until(lambda: holds_open_below(worker.pid, big), what="ferry to hash the input")
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait(timeout=30)
    assert runs(tmp_path / "a") == 1
    assert states(ferry)[first] == "SUCCEEDED", "the end known before the hashing is durable"


@pytest.mark.parametrize("task_too", [False, True], ids=["task-runs-on", "task-killed-too"])
def test_a_drain_whose_last_supervisor_is_killed_decides_its_task_before_it_exits(
    ferry: Ferry, tmp_path: Path, task_too: bool
) -> None:
    """The OOM killer takes the supervisor of the last task under ``work --drain`` (a
    review): work exited 0 ("0 succeeded") at once, its recovery pass never run, and
    left the task RUNNING with a dead runner. It decides it first now (quarantined if
    it runs on, else failed: it may have mutated), and the drain exits 1."""
    mark = tmp_path / "a"
    task_id = orjson.loads(
        ferry.ok("--json", "submit", "--", *counting_task(mark, linger="; exec sleep 300")).text
    )["id"]
    proc = ferry.start("work", "--drain", "--poll", "0.05")
    wait_until(lambda: runs(mark) == 1, what="the task to start")
    task = wait_until(lambda: ferry.task(task_id).get("pid") and ferry.task(task_id), what="pid")
    runner = int(task["runner"]["pid"])
    if task_too:
        # Both die at once for work: the supervisor, stopped, cannot see its task end;
        # work cannot see the task alive after its supervisor died (CI once saw that
        # between two kills, and quarantined the task).
        os.kill(runner, signal.SIGSTOP)
        os.kill(int(task["pid"]), signal.SIGKILL)
    os.kill(runner, signal.SIGKILL)
    try:
        assert proc.wait(timeout=60) == 1
        after = ferry.task(task_id)
        want = "MARKED_FAILED_MUTATION_UNSAFE" if task_too else "QUARANTINED_ORPHAN_ALIVE"
        assert (after["state"], after["reason"]) == ("FAILED", want)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(task["pid"]), signal.SIGKILL)
        wait_task_gone(task_id)
    assert runs(mark) == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_drain_stopped_by_a_signal_exits_128_plus_it_and_says_what_is_left(
    ferry: Ferry, tmp_path: Path, signum: int
) -> None:
    """``ferry work --drain && deploy`` deployed after a CI job's cancel or a closed ssh
    session (a review): a drain stopped by a signal exited 0, the queue not drained.
    It exits 128 + the signal now (as a command Ctrl-C stops), and its summary says how
    many tasks are left queued; the running task still finishes (one signal)."""
    gate, mark = tmp_path / "gate", tmp_path / "a"
    waits_for_gate = f'; while [ ! -e "{gate}" ]; do sleep 0.02; done'
    ferry.ok("submit", "--", *counting_task(mark, linger=waits_for_gate))
    for name in ("b", "c"):
        submit(ferry, tmp_path / name)
    proc = ferry.start("work", "--drain", "-j", "1", "--poll", "0.05")
    wait_until(lambda: runs(mark) == 1, what="the first task to start")
    proc.send_signal(signum)
    read_until(proc, "stopping: no new tasks")
    gate.touch()
    assert proc.wait(timeout=60) == 128 + signum
    assert proc.stderr is not None
    assert "2 left queued" in proc.stderr.read().decode()
    assert sorted(states(ferry).values()) == ["QUEUED", "QUEUED", "SUCCEEDED"]


@pytest.mark.parametrize("halt", ["soon", "now"])
def test_a_drain_with_halt_stopped_by_two_signals_exits_130_and_blames_no_task(
    ferry: Ferry, tmp_path: Path, halt: str
) -> None:
    """The tasks work stops itself on a second Ctrl-C end FAILED: they set off
    ``--halt`` ("halting: task ... failed"), and the drain exited 1 (a review)."""
    mark = tmp_path / "a"
    ferry.ok("submit", "--", *counting_task(mark, linger="; exec sleep 300"))
    submit(ferry, tmp_path / "b")
    proc = ferry.start("work", "--drain", "--halt", halt, "-j", "1", "--poll", "0.05")
    wait_until(lambda: runs(mark) == 1, what="the first task to start")
    proc.send_signal(signal.SIGINT)
    read_until(proc, "stopping: no new tasks")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert proc.stderr is not None
    assert "halting" not in proc.stderr.read().decode()
