"""Races between ferry processes over one state directory: concurrent ``recover`` runs
decide each crashed task exactly once, concurrent ``work --drain`` runs each queued
task exactly once, and a leader paused with SIGSTOP is replaced after its lease TTL
and, once continued, gets none of its writes accepted (it stops and exits 75).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from clikit import CLI_TIMEOUT_S, Ferry, wait_until
from crashkit import OUTLIVES_SPAWNED, counting_task, decision_records, runs, wait_task_gone

from ferry.proc.process import read_stat

pytestmark = pytest.mark.timeout(180)


def finish(procs: list[subprocess.Popen[bytes]]) -> list[tuple[int, str, str]]:
    """Wait for every process (reaping it) and return (exit status, stdout, stderr)."""
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S * 2)
        results.append((proc.returncode, out.decode(), err.decode()))
    return results


@pytest.mark.soak  # (11 s of twenty racing processes; tox -e soak)
def test_twenty_concurrent_recovers_decide_each_crashed_task_exactly_once(
    ferry: Ferry, tmp_path: Path
) -> None:
    # One claim crashed (with its supervisor) right after its claim and intent, nothing
    # started (an idempotent task: released); then four crashed with their task done
    # (two mutating, two idempotent). In this order: a claim recovers first.
    ferry.ok("submit", "--idempotent", "--", *counting_task(tmp_path / "runs-claimed"))
    assert ferry("claim", failpoints="after:CLAIMED").code == -9
    for i, idempotent in enumerate((False, True, False, True)):
        options = ["--idempotent"] if idempotent else []
        argv = counting_task(tmp_path / f"runs{i}", linger=OUTLIVES_SPAWNED)
        result = ferry("run", *options, "--", *argv, failpoints="after:SPAWNED")
        assert result.code == -9
    tasks = ferry.tasks()
    assert len(tasks) == 5
    for task in tasks:
        wait_task_gone(task["id"])

    results = finish([ferry.start("--json", "recover") for _ in range(20)])

    codes = Counter(code for code, _, _ in results)
    assert set(codes) <= {0, 3, 75}, results
    assert codes[3] == 1, f"exactly one recover decides (the two unsafe tasks): {codes}"
    decided = decision_records(ferry.records())
    assert sorted(decided) == sorted(t["id"] for t in tasks)
    assert all(len(records) == 1 for records in decided.values()), decided
    reported = [
        d["task"]
        for code, out, _ in results
        if code in (0, 3)
        for d in orjson.loads(out)["decisions"]
    ]
    assert Counter(reported) == Counter(t["id"] for t in tasks)
    states = Counter((t["state"], t["reason"]) for t in ferry.tasks())
    assert states == {
        ("FAILED", "MARKED_FAILED_MUTATION_UNSAFE"): 2,
        ("QUEUED", "RELEASED_TO_QUEUE"): 3,
    }
    ferry.verify_clean()


def test_four_concurrent_drains_run_each_of_a_hundred_tasks_exactly_once(
    ferry: Ferry, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    lines = [
        orjson.dumps({"argv": counting_task(marks / str(i)), "idempotent": i % 2 == 0})
        for i in range(100)
    ]
    ferry.ok("submit", "--from", "-", stdin=b"\n".join(lines) + b"\n")

    workers = [ferry.start("work", "--drain", "-j", "2", "--poll", "0.05") for _ in range(4)]
    results = finish(workers)

    assert [code for code, _, _ in results] == [0, 0, 0, 0], results
    assert [runs(marks / str(i)) for i in range(100)] == [1] * 100
    tasks = ferry.tasks()
    assert len(tasks) == 100 and {t["state"] for t in tasks} == {"SUCCEEDED"}
    claims = Counter(r["data"]["task"] for r in ferry.records() if r["type"] == "CLAIMED")
    assert set(claims.values()) == {1}
    ferry.verify_clean()


def holds_a_lock(pid: int) -> bool:
    """Whether ``pid`` holds an exclusive file lock (the lease's or the journal's append
    lock). Shared ones are the journal's segment pins, held as long as a handle is open."""
    with open("/proc/locks") as f:
        rows = [line.split() for line in f]
    return any(row[4] == str(pid) and row[3] == "WRITE" for row in rows if len(row) > 4)


def stop_outside_locks(pid: int) -> None:
    """SIGSTOP ``pid`` at a moment it holds no lock: a leader paused inside the lease's
    short lock would stall everyone (that is the lock timeout's business, not ours)."""
    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: (st := read_stat(pid)) is not None and st.state == "T", what="stop")
        if not holds_a_lock(pid):
            return
        os.kill(pid, signal.SIGCONT)


def test_a_stopped_leader_is_replaced_after_its_ttl_and_fenced_when_it_wakes(
    ferry: Ferry, tmp_path: Path
) -> None:
    old = ferry.start("work", "--lease-ttl", "1", "--poll", "0.05")

    def old_leads() -> bool:
        lease = orjson.loads(ferry.ok("--json", "lease").text)
        return bool(lease.get("holder")) and lease["holder"]["pid"] == old.pid

    wait_until(old_leads, what="the first worker to lead")
    stop_outside_locks(old.pid)
    try:
        old_epoch = orjson.loads(ferry.ok("--json", "lease").text)["epoch"]
        marks = tmp_path / "marks"
        marks.mkdir()
        for i in range(3):
            ferry.ok("submit", "--", *counting_task(marks / str(i)))
        # The paused leader still holds an unexpired lease: the new one waits as a
        # standby, takes over once the TTL has run out, and drains the queue.
        new = ferry.start("work", "--drain", "--lease-ttl", "1", "--poll", "0.05")
        [(code, _, err)] = finish([new])
        assert code == 0, err
        assert [runs(marks / str(i)) for i in range(3)] == [1, 1, 1]
        late = ferry.ok("submit", "--", *counting_task(marks / "late")).text.strip()
    finally:
        os.kill(old.pid, signal.SIGCONT)

    [(code, _, err)] = finish([old])
    assert code == 75, err
    assert "lease.lost" in err or "journal.fenced" in err, err
    records = ferry.records()
    takeover = next(
        r["seq"] for r in records if r["type"] == "LEASE_ACQUIRED" and r["epoch"] > old_epoch
    )
    assert all(r["seq"] < takeover for r in records if r["epoch"] == old_epoch)
    assert ferry.task(late)["state"] == "QUEUED", "the woken leader claimed nothing"
    assert runs(marks / "late") == 0
    for r in records:
        if r["type"] == "CLAIMED":
            assert r["data"]["runner"]["pid"] != old.pid
    ferry.verify_clean()
    wait_task_gone(late)


def test_recover_from_cron_is_silent_while_a_live_worker_leads(ferry: Ferry) -> None:
    """Exit 75, and nothing printed (cron mails any output, every minute): the live
    leader is responsible. ``-v`` and ``--json`` still say why."""
    worker = ferry.start("work", "--poll", "0.05")
    try:
        wait_until(
            lambda: bool(orjson.loads(ferry.ok("--json", "lease").text).get("holder")),
            what="the worker to lead",
        )
        quiet = ferry("recover")
        assert (quiet.code, quiet.out, quiet.err) == (75, b"", ""), quiet
        assert ferry.refused(75, "lease.held", "-v", "recover")
        assert ferry("--json", "recover").json()["error"]["code"] == "lease.held"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert finish([worker])[0][0] == 0


@pytest.mark.parametrize(
    ("point", "pinned"),
    [
        ("after:CLAIMED", False),  # its supervisor told a claim naming it is written
        ("before:go", False),  # its claim written with its DISPATCHING, no go sent
        ("before:go", True),  # its supervisor planned the task, waits for the go
    ],
)
def test_a_claim_of_a_stopped_leader_goes_back_once_another_leads(
    ferry: Ferry, tmp_path: Path, point: str, pinned: bool
) -> None:
    """A ``work`` stopped (Ctrl-Z, SIGSTOP) with a claim written and its task not
    started: its supervisor, in a session of its own, waits for the task or its go. A
    new leader takes the lease: the supervisor sees it, gives the claim back (nothing
    started), and the new leader runs the task, once; the old one, continued, is fenced,
    starts nothing and says nothing of the claim. (Found by a review: the claim held the new leader's only slot
    for as long as the old one stayed stopped.)"""
    mark = tmp_path / "mark"
    pin = ["--pointer", str(tmp_path / "input")] if pinned else []
    (tmp_path / "input").write_text("pinned\n")
    task = ferry.ok("submit", *pin, "--", *counting_task(mark)).text.strip()
    old = ferry.start("work", "-j", "1", "--lease-ttl", "1", failpoints=f"launcher:{point}=stop")
    try:
        wait_until(lambda: read_stat(old.pid).state == "T", what="the old leader to stop")
        expires = orjson.loads(ferry.ok("--json", "lease").text)["expires_boot_s"]
        wait_until(
            lambda: time.clock_gettime(time.CLOCK_BOOTTIME) > expires,
            what="the old leader's lease to expire",
        )
        new = ferry.start("work", "-j", "1", "--drain", "--lease-ttl", "1", "--poll", "0.05")
        [(code, _, err)] = finish([new])
        assert code == 0, err
        assert runs(mark) == 1, err
        ended = ferry.task(task)
        assert ended["state"] == "SUCCEEDED" and ended["releases"] == 0
    finally:
        os.kill(old.pid, signal.SIGCONT)
    [(code, _, err)] = finish([old])
    assert code == 75 and ("lease.lost" in err or "journal.fenced" in err), err
    # (Its own try to give the claim back, refused since the supervisor had, said
    # "not given back yet", as if it would be: a review.)
    assert "not given back" not in err, err
    assert runs(mark) == 1
    released = [r for r in ferry.records() if r["type"] == "RELEASED"]
    assert len(released) == 1 and "took its launcher's lease" in str(released[0]["data"]), released
    ferry.verify_clean()


def test_a_claim_stopped_before_its_go_keeps_its_task_while_its_lease_lives(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``claim`` stopped after its claim was written, before its go: a ``recover`` is
    refused (the lease is claim's until its go), the task runs once claim goes on.
    (Found by a review: claim let its lease go before the go, a recover took it, and
    the supervisor, seeing another leader, gave the task back; claim exited 125.) Past
    its lease's TTL, the task goes back to the queue and claim says so (75)."""
    mark = tmp_path / "mark"
    ferry.ok("submit", "--", *counting_task(mark))
    claim = ferry.start("claim", failpoints="launcher:before:go=stop")
    try:
        wait_until(lambda: read_stat(claim.pid).state == "T", what="claim to stop")
        code = ferry("recover").code
        deadline = time.monotonic() + 2.5  # (the supervisor looks every LEASE_LOOK_S)
        wait_until(lambda: time.monotonic() > deadline, what="two looks of the supervisor")
    finally:
        os.kill(claim.pid, signal.SIGCONT)
    [(claimed, _, err)] = finish([claim])
    assert (code, claimed, runs(mark)) == (75, 0, 1), err

    late = tmp_path / "late"
    task = ferry.ok("submit", "--", *counting_task(late)).text.strip()
    claim = ferry.start("claim", "--lease-ttl", "1", failpoints="launcher:before:go=stop")
    try:
        wait_until(lambda: read_stat(claim.pid).state == "T", what="claim to stop")
        wait_until(lambda: ferry("recover").code == 0, what="recover to take the lease")
        wait_until(lambda: ferry.task(task)["state"] == "QUEUED", what="the claim to go back")
    finally:
        os.kill(claim.pid, signal.SIGCONT)
    [(claimed, _, err)] = finish([claim])
    assert claimed == 75 and "error[lease.lost]" in err and "went back to the queue" in err, err
    assert runs(late) == 0 and ferry.task(task)["state"] == "QUEUED"

    # The task given back has run elsewhere before claim goes on: claim still says what
    # happened to its claim (it said "supervisor died ... 'ferry recover' decides the
    # task", 125, once the task was no longer QUEUED: found by a review).
    claim = ferry.start("claim", "--lease-ttl", "1", failpoints="launcher:before:go=stop")
    try:
        wait_until(lambda: read_stat(claim.pid).state == "T", what="claim to stop")
        wait_until(lambda: ferry("recover").code == 0, what="recover to take the lease")
        wait_until(lambda: ferry.task(task)["state"] == "QUEUED", what="the claim to go back")
        ferry.ok("work", "--drain")
    finally:
        os.kill(claim.pid, signal.SIGCONT)
    [(claimed, _, err)] = finish([claim])
    assert claimed == 75 and "error[lease.lost]" in err and "went back to the queue" in err, err
    assert runs(late) == 1 and ferry.task(task)["state"] == "SUCCEEDED"
