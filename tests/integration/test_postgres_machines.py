"""What one host may do about another host's task on a shared database, when the other
host is another machine (contract.md, "Many machines: PostgreSQL": a host decides only
its own tasks, with its own probes).

Simulated hosts on one machine see each other's processes, so a probe of another
host's runner answers as it never could across machines. Here host ``b`` runs ferry as
a second machine would: in a PID and mount namespace of its own (its own /proc, none of
``a``'s processes in it) with a boot id of its own, so that every probe of ``a``'s
processes answers DEAD, as it does on another machine. (Found by a review: ``cancel``
from such a host settled a running task CANCELLED while it ran on, and ``retry``
beside a quarantined orphan of another host was not refused.)
"""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from clikit import FERRY, Ferry, Hosts, finish, processes_with_env, read_until, wait_until

from ferry.proc.process import ProcessIdentity

pytestmark = pytest.mark.timeout(120)


def another_machine(ferry: Ferry, boot_id_file: Path) -> Ferry:
    """``ferry``'s commands run from here on as on a machine of their own (see the
    module docstring)."""
    ferry.command = (*machine(boot_id_file), *FERRY)
    return ferry


def machine(boot_id_file: Path) -> tuple[str, ...]:
    """The words that run a command as on another machine, with a boot id of its own.
    (Not exec'd: the command would be its namespace's PID 1, which the kernel does not
    let signal itself, and a failpoint's ``=stop`` or ``=self`` would do nothing.)"""
    boot_id_file.write_text(f"{uuid.uuid4()}\n")
    inner = f'mount --bind {shlex.quote(str(boot_id_file))} /proc/sys/kernel/random/boot_id && "$@"'
    return ("unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c", inner, "sh")


def task_processes(ferry: Ferry, task_id: str) -> list[ProcessIdentity]:
    """The live processes of the task (its marker) that ``ferry``'s host started."""
    home = f"FERRY_HOME={ferry.home}".encode()
    return list(processes_with_env(home, f"FERRY_TASK={task_id}:".encode()))


def settled_by(pg_url: str, task_id: str) -> list[str]:
    """The hosts that wrote the task's SETTLED events, in order."""
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT host FROM ferry_events WHERE task = %s AND type = 'SETTLED' ORDER BY seq",
            (task_id,),
        ).fetchall()
    return [row[0] for row in rows]


def test_the_other_machine_sees_none_of_a_s_processes(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    # (The premise of this module: without it the tests below prove nothing.)
    a = hosts("a")
    task_id = a.ok("submit", "--", "sleep", "60").out.decode().strip()
    a.start("work", "-j", "1", "--lease-ttl", "10", "--poll", "0.1")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run on a")
    with psycopg.connect(pg_url) as conn:
        [runner] = conn.execute(
            "SELECT body->'runner' FROM ferry_tasks WHERE id = %s", (task_id,)
        ).fetchone()
    look = (
        "import os, sys, json; from ferry.proc.process import ProcessIdentity, boot_id;"
        " from ferry.proc.liveness import probe;"
        " r = ProcessIdentity.from_json(json.loads(sys.argv[1]));"
        " print(probe(r), boot_id() == r.boot_id, sum(p.isdigit() for p in os.listdir('/proc')))"
    )
    words = (*machine(tmp_path / "boot-b"), sys.executable, "-c", look, json.dumps(runner))
    seen = a.ok(command=words)
    liveness, same_boot, processes = seen.out.decode().split()
    assert (liveness, same_boot) == ("DEAD", "False") and int(processes) < 10, seen


def test_a_cancel_from_another_machine_is_carried_out_by_the_task_s_own_host(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    a, b = hosts("a"), another_machine(hosts("b"), tmp_path / "boot-b")
    marks = tmp_path / "marks"
    script = f"trap 'sleep 1; exit 143' TERM; while :; do echo x >> '{marks}'; sleep 0.05; done"
    task_id = a.ok("submit", "--", "sh", "-c", script).out.decode().strip()
    a.start("work", "-j", "1", "--lease-ttl", "10", "--poll", "0.1")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run on a")
    b.ok("cancel", task_id)
    task = wait_until(
        lambda: (t := a.task(task_id))["state"] != "RUNNING" and t, what="the task to settle"
    )
    assert (task["state"], task["reason"]) == ("CANCELLED", "CANCELLED_BY_USER")
    # Settled by a, once its task was stopped: b, which cannot see a's processes,
    # decided nothing about them.
    assert settled_by(pg_url, task_id) == ["a"]
    assert not task_processes(a, task_id)


def quarantined_on_a(hosts: Hosts, tmp_path: Path) -> tuple[Ferry, str]:
    """A task of host ``a`` FAILED QUARANTINED_ORPHAN_ALIVE, its orphan running on."""
    a = hosts("a")
    marks = tmp_path / "marks"
    script = f"while :; do echo x >> '{marks}'; sleep 0.05; done"
    task_id = a.ok("submit", "--idempotent", "--", "sh", "-c", script).out.decode().strip()
    worker = a.start(
        "work", "-j", "1", "--lease-ttl", "10", "--poll", "0.1", "--drain",
        failpoints="supervisor:after:spawn=self",
    )  # fmt: skip
    wait_until(lambda: task_processes(a, task_id), what="the task to start on a")
    worker.kill()
    worker.wait(timeout=30)
    a.ok("recover", codes=(3,))
    task = a.task(task_id)
    assert (task["state"], task["reason"]) == ("FAILED", "QUARANTINED_ORPHAN_ALIVE")
    assert task_processes(a, task_id)
    return a, task_id


@pytest.mark.parametrize("action", [("retry",), ("resolve", "--as", "failed")])
def test_another_machine_does_not_act_beside_a_quarantined_orphan_it_cannot_see(
    hosts: Hosts, tmp_path: Path, action: tuple[str, ...]
) -> None:
    a, task_id = quarantined_on_a(hosts, tmp_path)
    b = another_machine(hosts("b"), tmp_path / "boot-b")
    refused = b.refused(3, "task.orphan_alive", *action, task_id)
    assert "host a" in refused.err  # (where it can be seen to)
    assert a.task(task_id)["attempt"] == 1 and a.task(task_id)["state"] == "FAILED"
    b.ok(*action, "--force", task_id)  # (the operator may insist)


def test_another_machine_shows_a_running_task_s_runner_as_not_known(
    hosts: Hosts, tmp_path: Path
) -> None:
    # (Found by a review: b's probe of a's runner answers DEAD (another boot), and
    # `show` said "alive": false of a task running on a.)
    a, b = hosts("a"), another_machine(hosts("b"), tmp_path / "boot-b")
    task_id = a.ok("submit", "--", "sleep", "60").out.decode().strip()
    a.start("work", "-j", "1", "--lease-ttl", "10", "--poll", "0.1")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run on a")
    assert a.task(task_id)["runner"]["alive"] is True
    assert b.task(task_id)["runner"]["alive"] is None  # (null: it cannot be proven here)
    assert [t["runner"]["alive"] for t in b.tasks()] == [None]


def host_lost_on_a(hosts: Hosts) -> tuple[Ferry, Ferry, str]:
    """A task that may mutate, FAILED HOST_LOST by ``b``'s recover while it runs on:
    ``a``'s work and the task's supervisor were killed together (a cgroup's OOM)."""
    a, b = hosts("a"), hosts("b")
    task_id = a.ok("submit", "--kill-grace", "1", "--key", "K", "--", "sleep", "300")
    task_id = task_id.out.decode().strip()
    a("work", "-j", "1", "--lease-ttl", "2", "--poll", "0.1",
      failpoints="supervisor:after:spawn")  # fmt: skip
    orphans = task_processes(a, task_id)
    assert orphans, "the task runs on, orphaned"
    for process in orphans:
        a.end_at_close(process.pid)

    def lost() -> bool:
        return b("recover", "--lease-ttl", "2").code == 3

    wait_until(lost, what="b to decide a's task lost", timeout_s=60)
    task = a.task(task_id)
    assert (task["state"], task["reason"]) == ("FAILED", "HOST_LOST")
    return a, b, task_id


def test_a_task_lost_with_its_host_is_not_retried_beside_its_orphan(hosts: Hosts) -> None:
    """A host lost (its work and the task's supervisor killed together), its task that
    may mutate running on: ``retry``, on its host or another, ran it a second time at
    once (a review). On its own host a probe finds the orphan; elsewhere nothing can
    tell: refused (exit 3), unless the operator insists."""
    a, b, task_id = host_lost_on_a(hosts)
    refused = a.refused(3, "task.orphan_alive", "retry", task_id)
    assert "still alive" in refused.err, refused.err
    refused = b.refused(3, "task.orphan_alive", "retry", task_id)
    assert "host a" in refused.err, refused.err
    assert a.task(task_id)["attempt"] == 1
    # Its own host's recover probes it, as a quarantined task's: its orphan alive, exit 3
    # (it said nothing of it, exit 0: a review).
    code, report = a.recover()
    assert (code, report["orphans_alive"]) == (3, [task_id]), report
    # Nor by its key (contract.md, "Keys after an unsafe end": HOST_LOST is one), nor
    # forgotten by gc with the evidence of it (a second review).
    for host in (a, b):
        host.refused(3, "task.key_unsafe", "submit", "--key", "K", "--", "true")
        host.ok("gc", "--older-than", "0s")
    assert a.task(task_id)["reason"] == "HOST_LOST"


def test_a_machine_sharing_a_host_id_leaves_the_other_s_running_tasks_alone(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """Two machines with one host id (cloned images share /etc/machine-id, the default
    one) (a review): the second one's ``recover`` took the first one's running tasks
    for its own, probed their runners (another boot: DEAD), failed the one that may
    mutate while it ran on and requeued the idempotent one, which its ``work`` then ran
    a second time beside the first. A task of this host id started in another boot is
    judged as another host's: by what is heard of it, so left alone while it beats."""
    a = hosts("a")
    twin = Ferry(tmp_path / "twin")
    twin.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    another_machine(twin, tmp_path / "boot-twin")
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    body = f'echo start >> "{marks}"; while [ ! -e "{gate}" ]; do sleep 0.05; done'
    runs = [a.start("run", *flag, "--", "/bin/sh", "-c", body) for flag in (["--idempotent"], [])]
    try:
        wait_until(
            lambda: [t["state"] for t in a.tasks()] == ["RUNNING", "RUNNING"], what="both running"
        )
        decided = twin("--json", "recover")
        assert decided.code == 0 and json.loads(decided.out)["decisions"] == [], decided
        twin.ok("work", "--drain")
        assert [t["state"] for t in a.tasks()] == ["RUNNING", "RUNNING"]
    finally:
        gate.touch()
        codes = [finish(run)[0] for run in runs]
        twin.close()
    assert codes == [0, 0] and marks.read_text().split() == ["start", "start"]
    assert [t["state"] for t in a.tasks()] == ["SUCCEEDED", "SUCCEEDED"]


def test_after_a_reboot_a_host_decides_its_tasks_of_the_boot_before_once_unheard(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """The other side of the rule above: a host's tasks from before its reboot are
    not left for ever. A probe cannot tell a reboot from a twin machine, so they are
    decided as a lost host's are: once unheard for the TTL their runner promised
    (twice, with the grace and a slack), the one that may mutate FAILED
    ``HOST_LOST``, the idempotent one back to the queue."""
    a = hosts("a")
    before = another_machine(Ferry(a.home), tmp_path / "boot-before")
    before.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    idempotent, mutating = (
        a.ok("submit", *flag, "--kill-grace", "1", "--", "sleep", "300").text.strip()
        for flag in (["--idempotent"], [])
    )
    before.start("work", "-j", "2", "--lease-ttl", "2", "--poll", "0.1")
    wait_until(lambda: {t["state"] for t in a.tasks()} == {"RUNNING"}, what="both to run")
    before.close()  # (the machine goes down: every process of this home killed)
    # Its lease, of the boot before, is waited out (75 until then); its tasks, heard
    # of a moment ago, are not decided yet.
    wait_until(lambda: a("recover", "--lease-ttl", "2").code != 75, what="the lease to expire")
    assert {t["state"] for t in a.tasks()} == {"RUNNING"}

    def decided() -> bool:  # (each by its own last beat: maybe in two passes; CI once
        a("recover", "--lease-ttl", "2")  # saw the mutating one decided a pass first)
        return a.task(idempotent)["state"] == "QUEUED" and a.task(mutating)["state"] == "FAILED"

    wait_until(decided, what="the tasks of the boot before to be decided", timeout_s=60)
    assert a.task(mutating)["reason"] == "HOST_LOST"
    # Its own host acts on them, as on any task of its own (a second review: retry,
    # resolve, kill, gc and logs sent the operator to host a, from host a, for ever).
    a.ok("retry", mutating)
    assert a.task(mutating)["state"] == "QUEUED"
    a.ok("cancel", mutating)
    a.ok("resolve", mutating, "--as", "failed")
    assert "no process of the task is alive" in a.ok("kill", mutating).text


def test_a_machine_sharing_a_host_id_does_not_take_the_other_s_lease(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """The twin's ``work`` took the host's lease at once from the first one's (its
    probe of the holder, of another boot, said DEAD): the first one's work, fenced,
    would stop its tasks. A holder of another boot gives its lease up only by expiry:
    the twin waits, as a standby does, and says once why; its ``recover`` is refused."""
    a = hosts("a")
    twin = another_machine(Ferry(tmp_path / "twin"), tmp_path / "boot-twin")
    twin.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    try:
        a.start("work", "--poll", "0.1")
        wait_until(lambda: a.ok("--json", "lease").json()["holder"], what="a's work to lead")
        epoch = a.ok("--json", "lease").json()["epoch"]
        standby = twin.start("work", "--poll", "0.1")
        read_until(standby, "of another boot")
        refused = twin.refused(75, "lease.held", "recover")
        assert "give each machine its own --host-id" in refused.err, refused.err
        assert a.ok("--json", "lease").json()["epoch"] == epoch
    finally:
        twin.close()
