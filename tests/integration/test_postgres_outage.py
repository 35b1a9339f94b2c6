"""The database out of reach while a task runs (contract.md, "Many machines: PostgreSQL"):
the task's supervisor keeps its result on its host and delivers it when the database is
back; ``ferry recover`` delivers what a killed supervisor kept; a result that comes too
late (another host decided the task) is kept as evidence and changes no state.

The cut is a real one, for one simulated host: its ferry reaches the server through a
TCP relay (``tcpcut.py``) whose links are shut down at once and whose new connections
are hung up on, until restored. The server itself keeps running for the other hosts.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clikit import Ferry, finish, wait_stopped, wait_until
from tcpcut import TcpCut, relayed

pytestmark = pytest.mark.timeout(180)

# The cut host's supervisors try again quickly; the second test kills one first.
QUICK = {"FERRY_OUTBOX_PATIENCE_S": "120"}


class Cut:
    """Host ``a`` behind the relay; host ``b`` (and the test) straight to the server."""

    def __init__(self, relay: TcpCut, a: Ferry, b: Ferry) -> None:
        self.relay, self.a, self.b = relay, a, b

    def kept(self) -> list[Path]:
        return sorted((self.a.home / "outbox").glob("*.json"))


@pytest.fixture
def cut(pg_url: str, tmp_path: Path) -> Iterator[Cut]:
    with relayed(pg_url) as (relay, relayed_url):
        a, b = Ferry(tmp_path / "a"), Ferry(tmp_path / "b")
        a.env.update(FERRY_DATABASE_URL=relayed_url, FERRY_HOST_ID="a", **QUICK)
        b.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="b")
        b.ok("db", "init")
        try:
            yield Cut(relay, a, b)
        finally:
            relay.restore()
            a.close()
            b.close()


def gated(gate: Path, then: str = "echo done") -> list[str]:
    """A task that runs until ``gate`` exists."""
    return ["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.05; done; {then}']


def running(cut: Cut) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        tasks = cut.b.tasks()
        return tasks[0] if tasks and tasks[0]["state"] == "RUNNING" else None

    found_task: dict[str, Any] = wait_until(found, what="the task to run")
    return found_task


def test_an_end_the_database_could_not_take_is_delivered_when_it_is_back(
    cut: Cut, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run = cut.a.start("run", "--", *gated(gate, "echo done; exit 3"))
    task = running(cut)
    cut.relay.cut()
    gate.touch()  # the task ends while its host cannot reach the database
    wait_until(cut.kept, what="the supervisor to keep the end on its host")
    code, err = finish(run)
    # The task ran: its status passes through (was 75, "try again": a script that does
    # would run it twice), and run says its end is not written yet.
    assert code == 3 and "its supervisor keeps it and writes it" in err, err
    assert cut.b.task(task["id"])["state"] == "RUNNING"  # (nothing written yet)
    cut.relay.restore()
    ended = wait_until(
        lambda: (t := cut.b.task(task["id"]))["state"] != "RUNNING" and t,
        what="the supervisor to deliver the end",
    )
    assert (ended["state"], ended["reason"], ended["exit_code"]) == ("FAILED", "EXIT_NONZERO", 3)
    assert "late_results" not in ended["evidence"]
    wait_until(lambda: not cut.kept(), what="the kept end to be forgotten")
    assert cut.a.ok("logs", task["id"]).out == b"done\n"


def test_recover_delivers_what_a_killed_supervisor_kept(cut: Cut, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run = cut.a.start("run", "--", *gated(gate), failpoints="supervisor:after:outbox=self")
    task = running(cut)
    cut.relay.cut()
    gate.touch()
    [kept] = wait_until(cut.kept, what="the supervisor to keep the end")
    assert finish(run)[0] == 0  # (the task's status)
    wait_until(lambda: not cut.a.live_task_processes(), what="the supervisor to be killed")
    cut.b.ok("recover")  # another host: the task is a's, whose lease lives; nothing
    assert cut.b.task(task["id"])["state"] == "RUNNING" and kept.exists()
    cut.relay.restore()
    result = cut.a.json("recover")
    assert result["delivered"] == [{"task": task["id"], "outcome": "settled"}]
    assert not result["decisions"] and not cut.kept()
    ended = cut.b.task(task["id"])
    assert (ended["state"], ended["exit_code"]) == ("SUCCEEDED", 0)
    assert cut.a.json("recover")["delivered"] == []  # once


def test_an_end_delivered_after_another_host_decided_the_task_is_kept_as_evidence(
    cut: Cut,
) -> None:
    # (--kill-grace 1: b waits twice the grace, twice the TTL and 8 s after the last beat)
    task_id = cut.a.ok("submit", "--kill-grace", "1", "--", "sleep", "60").out.decode().strip()
    worker = cut.a.start("work", "-j", "1", "--lease-ttl", "1", "--poll", "0.1", "--drain")
    running(cut)
    cut.relay.cut()  # a's lease cannot be renewed: it expires; b decides a's task
    wait_until(lambda: cut.b("recover", "--lease-ttl", "1").code == 3, what="b to decide")
    lost = cut.b.task(task_id)
    assert (lost["state"], lost["reason"]) == ("FAILED", "HOST_LOST")
    cut.relay.restore()
    late = wait_until(
        lambda: (t := cut.b.task(task_id))["evidence"].get("late_results") and t,
        what="a's supervisor to deliver its end, late",
    )
    assert (late["state"], late["reason"], late["exit_code"]) == ("FAILED", "HOST_LOST", None)
    # a's worker, its lease lost, stopped the task (SIGTERM): that is the end it saw
    [result] = late["evidence"]["late_results"]
    assert (result["attempt"], result["state"], result["host"]) == (1, "FAILED", "a")
    assert result["signal"] == signal.SIGTERM and result["token"]
    finish(worker)


def cut_off_then_taken_over(
    cut: Cut, script: str, *, kill_grace: str, started: Callable[[], bool]
) -> subprocess.Popen[bytes]:
    """An idempotent ``script`` claimed by a's ``claim --lease-ttl 4``, a cut off once
    it ``started``, and b's ``recover`` polled until it queued the task again (as soon
    as the contract lets it): a's claim, still running or not."""
    task_id = (
        cut.a.ok("submit", "--idempotent", "--kill-grace", kill_grace, "--", "sh", "-c", script)
        .out.decode()
        .strip()
    )
    claim = cut.a.start("claim", "--lease-ttl", "4")
    wait_until(lambda: cut.b.task(task_id)["state"] == "RUNNING" and started(),
               what="the task to run")  # fmt: skip
    cut.relay.cut()
    wait_until(lambda: cut.b("recover", "--lease-ttl", "4").code == 0
               and cut.b.task(task_id)["state"] == "QUEUED",
               what="b to queue a's task again", timeout_s=90)  # fmt: skip
    return claim


def test_a_cut_off_task_is_gone_when_another_host_decides_it_whatever_its_kill_grace(
    cut: Cut, tmp_path: Path
) -> None:
    # (Found by a review: another host waited twice the TTL after the task was last
    # heard; its supervisor stopped it one TTL after, but a task that takes its kill
    # grace to end (here it ignores SIGTERM) still ran when the other host queued it
    # again. The other host now waits the task's --kill-grace too.)
    marks = tmp_path / "marks"
    script = f"trap '' TERM; while :; do echo x >> '{marks}'; sleep 0.05; done"
    claim = cut_off_then_taken_over(cut, script, kill_grace="8", started=marks.exists)
    size = marks.stat().st_size
    finish(claim, timeout_s=60)
    assert marks.stat().st_size == size, "a's task still ran when b took it over"


def test_a_cut_off_task_s_escapees_are_gone_when_another_host_decides_it(
    cut: Cut, tmp_path: Path
) -> None:
    # (Found by a second review: what left the task's group (a setsid daemon, which
    # ferry stops once the group is gone) got a grace of its own after the group's, and
    # still ran when b queued the task again.)
    escapee = tmp_path / "escapee"
    daemon = f"trap '' TERM; while :; do echo y >> '{escapee}'; sleep 0.05; done"
    script = f"trap '' TERM; setsid sh -c \"{daemon}\" & while :; do sleep 0.05; done"
    claim = cut_off_then_taken_over(cut, script, kill_grace="3", started=escapee.exists)
    size = escapee.stat().st_size
    finish(claim, timeout_s=60)
    assert escapee.stat().st_size == size, "a's escapee still ran when b took the task over"


def test_work_rides_out_a_cut_at_the_look_before_its_go(cut: Cut, tmp_path: Path) -> None:
    """``work`` stopped before its go long enough to read the task's row again, and cut
    off meanwhile: that read's failure ended work (75), the read being outside what
    rides an outage out (a review). It says the database is out of reach, tries again,
    and once it is back runs the task."""
    marker = tmp_path / "ran"
    task_id = cut.a.ok("-q", "submit", "--", "touch", str(marker)).text.strip()
    work = cut.a.start("work", "--drain", failpoints="launcher:before:go=stop")
    try:
        wait_stopped(work, what="work to stop before its go")
        deadline = time.monotonic() + 0.6  # (LOOK_AGAIN_S: the look is due)
        wait_until(lambda: time.monotonic() > deadline, what="the look to be due")
        cut.relay.cut()
    finally:
        work.send_signal(signal.SIGCONT)
    try:
        wait_until(lambda: cut.relay.refused >= 2, what="work to try to reconnect")
        assert work.poll() is None, "work rides the outage out"
    finally:
        cut.relay.restore()
    code, err = finish(work)
    assert code == 0 and "trying again" in err, err
    assert cut.b.task(task_id)["state"] == "SUCCEEDED" and marker.exists()
