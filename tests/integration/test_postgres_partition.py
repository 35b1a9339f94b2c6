"""A silent partition between a host and its database (contract.md, "Many machines:
PostgreSQL": a worker that cannot renew within its TTL stops its own tasks).

The cut is a real one, and silent: host ``a``'s ferry runs in a network namespace of its
own and reaches the server over a veth pair (through a relay on the other side, which
forwards to the server); the cut takes the outer end of the link down. Packets are
dropped: nothing is refused or reset, so a call in flight waits for an answer that never
comes (``tcpcut``'s cut, by contrast, resets every connection at once). A worker whose
calls hung there could not see its lease expire, and ran its task on after another host
had taken it over.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from clikit import Ferry, wait_until
from tcpcut import relayed

pytestmark = pytest.mark.timeout(180)

TTL_S = 6  # a's lease: b may take a's tasks over TTL_S after it expired


class Namespace:
    """A network namespace joined to this one by a veth pair: ``inner`` (in it) and
    ``outer`` (here, at ``outer_ip``)."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name, self.outer, inner = f"ferry-{tag}", f"fyo{tag}", f"fyi{tag}"
        net = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:4], 16)}"  # (tests run at once)
        self.outer_ip, inner_ip = f"{net}.1", f"{net}.2"
        ip("netns", "add", self.name)
        try:
            ip("link", "add", self.outer, "type", "veth", "peer", "name", inner)
            ip("link", "set", inner, "netns", self.name)
            ip("addr", "add", f"{self.outer_ip}/24", "dev", self.outer)
            ip("link", "set", self.outer, "up")
            inside = ("-n", self.name)
            ip(*inside, "addr", "add", f"{inner_ip}/24", "dev", inner)
            ip(*inside, "link", "set", inner, "up")
            ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def command(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name, sys.executable, "-m", "ferry.cli")

    def cut(self) -> None:
        ip("link", "set", self.outer, "down")

    def restore(self) -> None:
        ip("link", "set", self.outer, "up")

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True, check=False)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=True, timeout=30)


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    try:
        made = Namespace()
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot make a network namespace here: {error}")
    try:
        yield made
    finally:
        made.close()


def _written(path: Path) -> bool:
    return path.exists() and path.read_text().endswith("\n")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


class Hosts:
    """Host ``a`` in the namespace, through the relay; host ``b`` (and the test) straight
    to the server, and ``db``, the test's own connection."""

    def __init__(self, a: Ferry, b: Ferry, namespace: Namespace, pids: Path, db: Any) -> None:
        self.a, self.b, self.namespace, self.pids, self.db = a, b, namespace, pids, db

    def run_on_a(self, jobs: int = 1) -> tuple[list[str], subprocess.Popen[bytes], list[int]]:
        """``jobs`` idempotent tasks (beating each second) started by one ``work -j
        jobs`` of host a: their ids, the worker, their pids."""
        ids = []
        for n in range(jobs):
            script = f'echo $$ > "{self.pids / str(n)}"; exec sleep 600'
            submitted = self.b.ok(
                "submit",
                "--idempotent",
                "--heartbeat",
                "1",
                "--kill-grace",
                "1",
                "--",
                "sh",
                "-c",
                script,
            )
            ids.append(submitted.out.decode().strip())
        worker = self.a.start("work", "-j", str(jobs), "--lease-ttl", str(TTL_S), "--poll", "0.2")
        wait_until(
            lambda: all(_written(self.pids / str(n)) for n in range(jobs)),
            what="a's worker to start the tasks",
        )
        assert {self.b.task(task_id)["state"] for task_id in ids} == {"RUNNING"}
        return ids, worker, [int((self.pids / str(n)).read_text()) for n in range(jobs)]

    def taken_over(self, task_id: str) -> None:
        """b takes the task over as soon as the contract lets it: a's lease expired and
        a had the lease's time after it to stop its tasks."""
        wait_until(
            lambda: (
                self.b("recover", "--lease-ttl", str(TTL_S))
                and self.b.task(task_id)["state"] != "RUNNING"
            ),
            what="b to take a's task over",
            timeout_s=8 * TTL_S,
        )


@pytest.fixture
def hosts(pg_url: str, tmp_path: Path, namespace: Namespace) -> Iterator[Hosts]:
    with relayed(pg_url, bind=namespace.outer_ip) as (_relay, relayed_url):
        a = Ferry(tmp_path / "a", command=namespace.command())
        b = Ferry(tmp_path / "b")
        a.env.update(FERRY_DATABASE_URL=relayed_url, FERRY_HOST_ID="a")
        b.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="b")
        pids = tmp_path / "pids"
        pids.mkdir()
        try:
            with psycopg.connect(pg_url, autocommit=True) as db:
                b.ok("db", "init")
                yield Hosts(a, b, namespace, pids, db)
        finally:
            for pid_file in pids.iterdir():  # (a's tasks, had they outlived their worker)
                if _written(pid_file) and alive(pid := int(pid_file.read_text())):
                    os.kill(pid, signal.SIGKILL)
            namespace.restore()
            a.close()
            b.close()


@pytest.mark.parametrize("jobs", [1, 4])
def test_a_host_cut_off_silently_stops_its_tasks_before_another_may_take_them(
    hosts: Hosts, jobs: int
) -> None:
    # With 4 tasks, each turn of the worker makes more calls, each of which hangs
    # until its connection's bound: the deadline is looked at after each.
    ids, _, pids = hosts.run_on_a(jobs)
    hosts.namespace.cut()
    hosts.taken_over(ids[0])
    running = [pid for pid in pids if alive(pid)]
    assert running == [], "a's tasks still ran when b took them over: they may run twice"
    assert hosts.b.task(ids[0])["state"] == "QUEUED"  # (released: it is idempotent)


@pytest.mark.parametrize("cut_at", ["once-it-beat-alone", "at-once"])
def test_an_orphaned_supervisor_cut_off_silently_stops_its_task_in_time(
    hosts: Hosts, cut_at: str
) -> None:
    # a's worker killed: its supervisor beats the task on its own. Cut off, its beats
    # are neither taken nor refused. "at-once": cut before its first own beat (was:
    # it knew no deadline until one was taken, and ran its task on for good).
    [task_id], worker, [pid] = hosts.run_on_a()
    killed_at = hosts.db.execute("SELECT now()").fetchone()[0]
    worker.kill()
    worker.wait(timeout=30)

    def beaten() -> bool:
        row = hosts.db.execute("SELECT heartbeat_at FROM ferry_tasks WHERE id = %s", (task_id,))
        at = row.fetchone()[0]
        return at is not None and at > killed_at

    if cut_at == "once-it-beat-alone":
        wait_until(beaten, what="the orphaned supervisor to beat on its own")
    hosts.namespace.cut()
    hosts.taken_over(task_id)
    assert not alive(pid), "a's task still ran when b took it over: it may run twice"
