"""Queue control on a shared PostgreSQL database (docs/postgres.md): groups and their
limits across hosts, pause, --after and DEPENDENCY_FAILED, priorities, retries,
--not-before, each decided in the transaction that claims
(``ferry/storage/postgres/queue.py``); and ``db init`` upgrading a version 2 database."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from clikit import Ferry, Hosts, finish, wait_until
from pgserver import schema_at
from queuekit import Stamps, stamped

from ferry.core.fold import task_to_record
from ferry.core.model import Task
from ferry.core.spec import TaskSpec
from ferry.storage.postgres import queue, schema

pytestmark = pytest.mark.timeout(180)


def submit(ferry: Ferry, *args: str) -> str:
    return str(ferry.json("submit", *args)["id"])


def states(ferry: Ferry) -> dict[str, str]:
    return {t["id"]: t["state"] for t in ferry.tasks()}


def test_priorities_first_then_first_in_first_out(hosts: Hosts, tmp_path: Path) -> None:
    a = hosts("a")
    stamps = Stamps(tmp_path / "stamps")
    for name, priority, grp in [("low", 0, "x"), ("high", 5, "g"), ("mid", 2, "x"),
                                ("high2", 5, "x"), ("neg", -3, "g")]:  # fmt: skip
        submit(a, "--priority", str(priority), "--group", grp, "--", *stamped(stamps, name))
    a.ok("work", "--drain", "-j", "1")
    assert stamps.starts() == ["high", "high2", "mid", "low", "neg"]
    assert set(states(a).values()) == {"SUCCEEDED"}


def test_a_group_limit_holds_across_hosts(hosts: Hosts, tmp_path: Path) -> None:
    """Two hosts, -j 4 each, group g limited to 2: by the tasks' stamps never more than
    two of g ran at once, though each host had room for four."""
    admin = hosts("admin")
    stamps = Stamps(tmp_path / "stamps")
    admin.ok("group", "set", "g", "--jobs", "2")
    names = [f"g{n}" for n in range(8)]
    for name in names:
        submit(admin, "--group", "g", "--", *stamped(stamps, name, sleep_s=0.3))
    workers = [hosts(h).start("work", "-j", "4", "--drain", "--poll", "0.05") for h in "ab"]
    for proc in workers:
        assert proc.wait(timeout=150) == 0
    assert set(states(admin).values()) == {"SUCCEEDED"}
    assert stamps.most_at_once(set(names)) <= 2
    assert sorted(stamps.starts()) == names  # each once
    assert {t["host"] for t in admin.tasks()} <= {"a", "b"}


def test_group_set_and_pause_are_applied_by_running_workers(hosts: Hosts, tmp_path: Path) -> None:
    a = hosts("a")
    stamps, gate = Stamps(tmp_path / "stamps"), tmp_path / "gate"
    a.ok("group", "set", "g", "--jobs", "1")
    a.ok("pause", "p")
    held = submit(a, "--group", "p", "--", "true")
    for n in range(3):
        submit(a, "--group", "g", "--", *stamped(stamps, f"g{n}", gate=gate))
    worker = hosts("b").start("work", "-j", "4", "--poll", "0.1")
    wait_until(lambda: len(stamps.starts()) == 1, what="one task of g to start")
    listed = {g["group"]: g for g in a.json("group")}
    assert (listed["g"]["jobs"], listed["g"]["running"], listed["g"]["queued"]) == (1, 1, 2)
    assert listed["p"]["paused"] and listed["p"]["queued"] == 1
    a.ok("group", "set", "g", "--jobs", "3")
    wait_until(lambda: len(stamps.starts()) == 3, what="the new limit to be applied")
    gate.touch()
    wait_until(lambda: states(a)[held] == "QUEUED" and len(
        [s for s in states(a).values() if s == "SUCCEEDED"]) == 3, what="g to drain")  # fmt: skip
    a.ok("resume")
    wait_until(lambda: states(a)[held] == "SUCCEEDED", what="the paused group to be resumed")
    worker.terminate()
    assert worker.wait(timeout=60) == 0


def test_a_pause_waiting_for_the_queue_never_holds_up_claims(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """A claimer frozen inside its claim (a session holding the queue's lock, shared,
    as ``claim`` stopped between its ``ferry_claim`` and its COMMIT would) and a
    ``pause`` of another group meanwhile: host c's worker goes on claiming, and the
    pause gives up within its bound, nothing changed, ``db.queue_busy`` (75). Was: the
    pause waited without a bound for the lock, exclusive, and the server queued every
    claim of every host behind it: c started nothing for 25 s. Once the claimer is
    gone, the pause goes through."""
    a, c = hosts("a"), hosts("c")
    stamps = Stamps(tmp_path / "stamps")
    for n in range(60):
        submit(a, "--", *stamped(stamps, f"t{n}", sleep_s=0.2))
    worker = c.start("work", "-j", "2", "--poll", "0.1", "--drain")
    wait_until(lambda: len(stamps.starts()) >= 2, what="c to run tasks")
    frozen = psycopg.connect(pg_url)
    try:
        frozen.execute("SELECT pg_advisory_xact_lock_shared(%s)", (queue.QUEUE_LOCK,))
        began = time.monotonic()
        pause = a.start("pause", "other")
        before = len(stamps.starts())
        wait_until(lambda: len(stamps.starts()) >= before + 6, what="claims to go on",
                   timeout_s=8)  # fmt: skip
        code, err = finish(pause, timeout_s=40)
        assert code == 75 and "error[db.queue_busy]" in err, err
        assert time.monotonic() - began < 25  # (its bound: 10 s)
        assert not [g for g in a.json("group") if g["group"] == "other"]  # (nothing changed)
    finally:
        frozen.rollback()
        frozen.close()
    a.ok("pause", "other")
    assert {g["group"]: g["paused"] for g in a.json("group")}["other"] is True
    assert worker.wait(timeout=120) == 0


def test_after_and_dependency_failed_on_the_database(hosts: Hosts, tmp_path: Path) -> None:
    a = hosts("a")
    stamps = Stamps(tmp_path / "stamps")
    first = submit(a, "--", *stamped(stamps, "first", sleep_s=0.2))
    second = submit(a, "--after", first, "--", *stamped(stamps, "second"))
    failing = submit(a, "--", "sh", "-c", "exit 5")
    doomed = submit(a, "--after", failing, "--after", second, "--", "true")
    chained = submit(a, "--after", "last", "--", "true")
    a.refused(5, "task.unknown_dependency", "submit", "--after", "0zzzzzzzzzzzzzzz", "--", "true")
    hosts("b").ok("work", "--drain", "-j", "4", "--poll", "0.1", codes=(1,))
    found = {t["id"]: (t["state"], t["reason"]) for t in a.tasks()}
    assert found == {
        first: ("SUCCEEDED", None), second: ("SUCCEEDED", None),
        failing: ("FAILED", "EXIT_NONZERO"),
        doomed: ("CANCELLED", "DEPENDENCY_FAILED"), chained: ("CANCELLED", "DEPENDENCY_FAILED"),
    }  # fmt: skip
    spans = {name: span for (name, _), span in stamps.intervals().items()}
    assert spans["second"][0] >= spans["first"][1]
    assert a.task(chained)["evidence"]["dependency"] == {"task": doomed, "state": "CANCELLED"}


def test_a_failed_dependency_is_decided_by_recover_without_a_worker(hosts: Hosts) -> None:
    a = hosts("a")
    failing = submit(a, "--", "sh", "-c", "exit 5")
    dependant = submit(a, "--after", failing, "--", "true")
    a.ok("claim", codes=(5,))
    assert states(a)[dependant] == "QUEUED"
    code, report = hosts("b").recover()
    assert code == 0 and [d["task"] for d in report["decisions"]] == [dependant]
    assert a.task(dependant)["reason"] == "DEPENDENCY_FAILED"


def test_retries_and_not_before_on_the_database(hosts: Hosts, tmp_path: Path) -> None:
    a = hosts("a")
    stamps = Stamps(tmp_path / "stamps")
    flaky = submit(a, "--retries", "2", "--retry-delay", "0.1", "--",
                   *stamped(stamps, "flaky", fail_attempts=1))  # fmt: skip
    a.ok("work", "--drain", "--poll", "0.05")
    task = a.task(flaky)
    assert (task["state"], task["attempt"], task["retries_used"]) == ("SUCCEEDED", 2, 1)
    assert stamps.started("flaky") == 2
    far = submit(a, "--not-before", "+3600", "--", "true")
    assert a.json("claim") == {"task": None} and states(a)[far] == "QUEUED"


def test_db_init_upgrades_a_version_2_database(pg_url: str, tmp_path: Path) -> None:
    """A database made by the schema of version 2, with a queued task in it: ``db init``
    upgrades it (version 3, then 4), the task is in group default and runs."""
    schema_at(pg_url, 2)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        old = Task(id="01m8td000000abcd", spec=TaskSpec(argv=("true",), cwd="/"),
                   submit_seq=1, queue_seq=1, updated_seq=1, number=1,
                   created_at=time.time())  # fmt: skip
        conn.execute(
            "INSERT INTO ferry_tasks (id, state, submit_seq, queue_seq, updated_seq, body,"
            " number) VALUES (%s, 'QUEUED', 1, 1, 1, %s, 1)",
            (old.id, psycopg.types.json.Jsonb(task_to_record(old))),
        )
        conn.execute("SELECT setval('ferry_task_numbers', 1)")
    ferry = Ferry(tmp_path / "h")
    ferry.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="h")
    try:
        report = ferry.json("db", "init")
        assert (report["previous_version"], report["schema_version"]) == (2, schema.VERSION)
        assert ferry.json("db", "init")["previous_version"] == schema.VERSION  # idempotent
        assert ferry.json("group")[0] == {
            "group": "default", "jobs": 0, "paused": False, "queued": 1, "running": 0,
        }  # fmt: skip
        ferry.ok("work", "--drain")
        assert states(ferry) == {old.id: "SUCCEEDED"}
        new = ferry.ok("-q", "submit", "--", "true").text.strip()
        assert ferry.task("last")["id"] == new and ferry.task("2")["id"] == new
    finally:
        ferry.close()
