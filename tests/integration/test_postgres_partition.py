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
        octet = 1 + int(tag[:2], 16) % 250
        self.outer_ip, inner_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
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


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_host_cut_off_silently_stops_its_task_before_another_may_take_it(
    pg_url: str, tmp_path: Path, namespace: Namespace
) -> None:
    with relayed(pg_url, bind=namespace.outer_ip) as (_relay, relayed_url):
        a = Ferry(tmp_path / "a", command=namespace.command())
        b = Ferry(tmp_path / "b")
        a.env.update(FERRY_DATABASE_URL=relayed_url, FERRY_HOST_ID="a")
        b.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="b")
        pid_file = tmp_path / "pid"
        try:
            b.ok("db", "init")
            script = f'echo $$ > "{pid_file}"; exec sleep 600'
            task_id = b.ok("submit", "--idempotent", "--", "sh", "-c", script).out.decode().strip()
            a.start("work", "-j", "1", "--lease-ttl", str(TTL_S), "--poll", "0.2")
            wait_until(pid_file.exists, what="a's worker to start the task")
            pid = int(pid_file.read_text())
            assert b.task(task_id)["state"] == "RUNNING"
            namespace.cut()
            # b takes the task over as soon as the contract lets it: a's lease expired
            # and a had the lease's time after it to stop its tasks.
            wait_until(
                lambda: (
                    b("recover", "--lease-ttl", str(TTL_S))
                    and b.task(task_id)["state"] != "RUNNING"
                ),
                what="b to take a's task over",
                timeout_s=8 * TTL_S,
            )
            assert not alive(pid), "a's task still ran when b took it over: it may run twice"
            assert b.task(task_id)["state"] == "QUEUED"  # (released: it is idempotent)
        finally:
            if pid_file.exists() and alive(pid := int(pid_file.read_text())):
                os.kill(pid, signal.SIGKILL)  # (a's task, had it outlived its worker)
            namespace.restore()
            a.close()
            b.close()
