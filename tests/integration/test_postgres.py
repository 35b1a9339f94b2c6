"""ferry on a shared PostgreSQL database (docs/postgres.md), against a real server the
tests start (``pg_url``: a fresh database per test). Hosts are simulated by distinct
``FERRY_HOST_ID``s, each with its own state directory (logs, heartbeats, alive-locks).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from clikit import Ferry, Hosts, finish, processes_with_env, wait_until
from crashkit import (
    most_at_once,
    restart_worker_midway,
    survivor_keeps_its_slot_under_a_new_host_id,
)
from pgserver import PgServer

from ferry.core import events as ev
from ferry.core.errors import FerryError, LeaseHeldError
from ferry.core.ids import new_claim_token, new_task_id
from ferry.core.model import State
from ferry.core.spec import TaskSpec
from ferry.proc.process import self_identity
from ferry.storage.postgres import schema
from ferry.storage.postgres.store import PgStore

pytestmark = pytest.mark.timeout(120)


def events(pg_url: str, kind: str) -> list[tuple[str, int]]:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT task, (data->>'attempt')::int FROM ferry_events WHERE type = %s", (kind,)
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


def runs(marks: Path) -> dict[str, int]:
    """Task id -> how many times it started (each start appends a line)."""
    counted: dict[str, int] = {}
    if marks.exists():
        for line in marks.read_text().splitlines():
            counted[line] = counted.get(line, 0) + 1
    return counted


# ---- setting up ----------------------------------------------------------------------


def test_db_init_is_idempotent_and_every_command_needs_it(pg_url: str, tmp_path: Path) -> None:
    ferry = Ferry(tmp_path / "a")
    ferry.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    try:
        ferry.refused(125, "db.not_initialised", "ls")
        ferry.refused(125, "db.not_initialised", "run", "--", "true")
        assert ferry.json("db", "init")["created"] is True
        again = ferry.json("db", "init")
        assert (again["created"], again["schema_version"]) == (False, schema.VERSION)
        ferry.ok("run", "--", "true")
        ferry.ok("work", "--drain")  # (a host row: its lease)
        status = ferry.json("db", "status")
        assert status["tasks"] == {"SUCCEEDED": 1} and status["host"] == "a"
        # Times as everywhere else in JSON: RFC 3339, UTC as Z, milliseconds (they
        # were Python's isoformat, '+00:00' and microseconds).
        times = [h[key] for h in status["hosts"] for key in ("renewed_at", "expires_at")]
        assert times and all(
            re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", t) for t in times
        )
    finally:
        ferry.close()


def test_an_unreachable_database_is_exit_75_for_every_command(tmp_path: Path) -> None:
    ferry = Ferry(tmp_path / "a")
    ferry.env["FERRY_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:9/none"  # (discard port)
    try:
        for args in (("ls",), ("submit", "--", "true"), ("run", "--", "true"), ("work", "--drain")):
            ferry.refused(75, "db.unavailable", *args)
        ferry.refused(2, "usage.bad_database", "--database", "mysql://x", "ls")
    finally:
        ferry.close()


def test_a_malformed_database_url_is_a_usage_error(tmp_path: Path) -> None:
    """A URL libpq cannot parse is bad input (exit 2, before any connection), not
    ``internal``: the driver raised ProgrammingError, which nothing mapped."""
    ferry = Ferry(tmp_path / "a")
    try:
        for url in ("postgresql://[::1", "postgresql://h/db?bogus=1", "postgresql://%zz@h/db"):
            ferry.refused(2, "usage.bad_database", "--database", url, "ls")
            ferry.refused(2, "usage.bad_database", "--database", url, "run", "--", "true")
        ferry.env["FERRY_DATABASE_URL"] = "postgresql://h/d b"
        said = ferry.refused(2, "usage.bad_database", "submit", "--", "true").err
        assert "FERRY_DATABASE_URL 'postgresql://h/d b' is not" in said, said  # (not --database)
    finally:
        ferry.close()


def test_a_database_that_may_lose_commits_is_refused(hosts: Hosts, pg_url: str) -> None:
    dbname = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = off')
    result = hosts("a").refused(125, "db.not_durable", "run", "--", "true")
    assert "synchronous_commit=off" in result.err


def test_a_server_without_fsync_is_refused(hosts: Hosts, pg_server: PgServer) -> None:
    # (fsync is the server's, not a database's: set on this session's private server
    # for the length of the test, every test of this worker waiting meanwhile.)
    if not pg_server.restartable:
        pytest.skip("fsync is server-wide: not changed on a server that is not ours")

    def fsync_is(value: str) -> bool:
        return bool(pg_server.execute("SHOW fsync")[0][0] == value)

    pg_server.execute("ALTER SYSTEM SET fsync = off")
    pg_server.execute("SELECT pg_reload_conf()")
    try:
        wait_until(lambda: fsync_is("off"), what="the server to reload with fsync off")
        result = hosts("a").refused(125, "db.not_durable", "run", "--", "true")
        assert "fsync=off" in result.err
    finally:
        pg_server.execute("ALTER SYSTEM RESET fsync")
        pg_server.execute("SELECT pg_reload_conf()")
        wait_until(lambda: fsync_is("on"), what="the server to reload with fsync on")
    assert hosts("a").tasks() == []  # (nothing was written)


# ---- one queue, many hosts -----------------------------------------------------------


def test_a_task_run_on_one_host_is_seen_from_another(hosts: Hosts) -> None:
    hosts("a").ok("run", "--name", "from-a", "--", "true")
    [task] = hosts("b").tasks()
    assert (task["name"], task["state"], task["host"]) == ("from-a", "SUCCEEDED", "a")


def test_ls_state_given_twice_lists_both_states(hosts: Hosts) -> None:
    """As on the local journal (test_daily_use): each task in any of the states given."""
    a = hosts("a")
    a.ok("run", "--", "false", codes=(1,))
    a.ok("submit", "--", "true")
    a.ok("run", "--", "true")
    states = [t["state"] for t in a.json("ls", "--state", "QUEUED", "--state", "failed")]
    assert states == ["FAILED", "QUEUED"]
    assert [t["state"] for t in a.json("ls", "--state", "FAILED")] == ["FAILED"]
    result = a.ok("ls", "--state", "QUEUED", "--state", "SUCCEEDED", "--limit", "1")
    assert "1 of 2 shown" in result.err


def drain_each_once(
    hosts: Hosts, pg_url: str, marks: Path, names: tuple[str, ...], tasks: int
) -> set[str]:
    """``tasks`` tasks drained by a `work -j 2` on each host of ``names``: each run once
    (by its own mark), one DISPATCHING each; the hosts that ran them."""
    line = b'{"argv": ["sh", "-c", "echo $FERRY_TASK_ID >> %s"]}\n' % str(marks).encode()
    hosts("a").ok("submit", "--from", "-", stdin=line * tasks)
    workers = [hosts(name).start("-q", "work", "-j", "2", "--drain") for name in names]
    for proc in workers:
        proc.wait(timeout=500)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else b""
    states = {t["id"]: t["state"] for t in hosts("a").tasks()}
    assert set(states.values()) == {"SUCCEEDED"} and len(states) == tasks
    assert runs(marks) == dict.fromkeys(states, 1)
    dispatched = events(pg_url, "DISPATCHING")
    assert sorted(dispatched) == sorted(set(dispatched)) and len(dispatched) == tasks
    return {str(t["host"]) for t in hosts("a").tasks()}


def test_two_hosts_drain_one_queue_each_task_run_once(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    ran_on = drain_each_once(hosts, pg_url, tmp_path / "marks", ("a", "a2", "b", "b2"), 60)
    assert ran_on <= {"a", "a2", "b", "b2"}


@pytest.mark.soak
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "names", [("a", "a", "b", "b"), ("a", "a2", "b", "b2")], ids=["2-hosts", "4-hosts"]
)
def test_four_workers_drain_a_thousand_tasks_each_run_once(
    hosts: Hosts, pg_url: str, tmp_path: Path, names: tuple[str, ...]
) -> None:
    # (The case: four `work -j 2` on two hosts, so each host's second worker
    # stands by for its host's lease; and on four.)
    assert drain_each_once(hosts, pg_url, tmp_path / "marks", names, 1000) == set(names)


def test_a_task_running_on_another_host_takes_no_slot_of_a_worker_here(
    hosts: Hosts, tmp_path: Path
) -> None:
    # (Was: a new `work` counted every task running under a live supervisor as a
    # survivor of an earlier `work` of its own, whatever its host: b's worker, started
    # while a's ran its -j tasks, claimed nothing until they ended.)
    gate = tmp_path / "gate"
    a, b = hosts("a"), hosts("b")
    for _ in range(2):
        a.ok("submit", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")

    def running() -> int:
        return [t["state"] for t in a.tasks()].count("RUNNING")

    first = a.start("work", "-j", "1", "--drain", "--poll", "0.1")
    wait_until(lambda: running() == 1, what="a's worker to run a task")
    second = b.start("work", "-j", "1", "--drain", "--poll", "0.1")
    try:
        wait_until(lambda: running() == 2, what="b's worker to run the other task")
    finally:
        gate.touch()
    for proc in (first, second):
        proc.wait(timeout=60)
        assert proc.returncode == 0
    assert second.stderr is not None and b"earlier work" not in second.stderr.read()
    assert sorted(t["host"] for t in a.tasks()) == ["a", "b"]


def test_jobs_holds_across_a_restart_with_a_new_host_id(hosts: Hosts, tmp_path: Path) -> None:
    # (Was: the survivors of the killed `work` were counted only if their runner's host
    # id was this worker's; a restart on the same home under a changed FERRY_HOST_ID
    # took them for another host's and ran two tasks under -j 1.)
    stamps = tmp_path / "stamps"
    a = hosts("a")

    def rename() -> None:
        a.env["FERRY_HOST_ID"] = "a-renamed"

    restart_worker_midway(a, stamps, tasks=3, jobs=1, before_restart=rename)
    assert [t["state"] for t in a.tasks()] == ["SUCCEEDED"] * 3
    assert stamps.read_text().count("end") == 3
    assert most_at_once(stamps) <= 1


def test_a_task_released_here_and_run_by_another_host_takes_no_slot_here(
    hosts: Hosts, tmp_path: Path
) -> None:
    # (Found by a review: a release keeps the attempt, and a crash leaves the attempt's
    # alive-lock file in a's home; a restarted `work -j 1` on a took b's run of the same
    # attempt for its own survivor, by that file, and claimed nothing while it ran.)
    gate = tmp_path / "gate"
    a, b = hosts("a"), hosts("b")
    waits = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]
    x = a.ok("submit", "--idempotent", "--", *waits).out.decode().strip()
    a.start("work", "-j", "1", "--poll", "0.05")
    a.wait_running()
    kill_host(a)
    assert (a.home / "heartbeats" / f"{x}.1").exists()  # (left by the crash)
    _, report = a.recover()
    assert (a.task(x)["state"], a.task(x)["attempt"]) == ("QUEUED", 1), report
    b.start("work", "-j", "1", "--poll", "0.05")
    wait_until(lambda: (t := a.task(x))["state"] == "RUNNING" and t["host"] == "b",
               what="b to run x (attempt 1 again)")  # fmt: skip
    y = a.ok("submit", "--", "true").out.decode().strip()
    try:
        a.ok("work", "-j", "1", "--drain", "--poll", "0.05")  # (b's run of x left alone)
        assert a.task(y)["state"] == "SUCCEEDED" and a.task(x)["state"] == "RUNNING"
    finally:
        gate.touch()
    wait_until(lambda: a.task(x)["state"] == "SUCCEEDED", what="b's run of x to end")


def test_a_survivor_stopped_before_its_alive_lock_holds_its_slot(
    hosts: Hosts, tmp_path: Path
) -> None:
    # (Found by a review: a supervisor makes the alive-lock after the DISPATCHING is
    # durable; stopped in between, its worker killed, and the home restarted under a new
    # host id, its task was taken for another host's: y ran while x's supervisor held
    # x's slot, then x ran.)
    survivor_keeps_its_slot_under_a_new_host_id(hosts("a"), tmp_path / "stamps")


def test_in_flight_reads_only_the_tasks_in_flight(hosts: Hosts, pg_url: str) -> None:
    # (What recovery and a new `work` read: a queue of many tasks is not decoded.)
    store = PgStore.open(pg_url, "h1")
    try:
        spec = TaskSpec(argv=("true",), cwd="/")
        ids = [new_task_id(time.time_ns() + i, os.urandom(4)) for i in range(4)]
        store.commit(*(ev.Submitted(task_id, spec, time.time()) for task_id in ids))
        me = self_identity().to_json()
        for task_id in (ids[2], ids[0]):
            token = new_claim_token(os.urandom(10))
            store.commit(ev.Claimed(task_id, 1, token, me, "claim"),
                         ev.Dispatching(task_id, 1, token, f"m-{task_id}", {}))  # fmt: skip
        assert [t.id for t in store.in_flight()] == [ids[0], ids[2]]
        assert [t.id for t in store.in_flight()] == [t.id for t in store.live() if t.in_flight]
    finally:
        store.close()


def claim_all(pg_url: str, host: str, stop: threading.Event, claimed: list[str]) -> None:
    """Claim (CLAIMED + DISPATCHING in one transaction) until the queue is empty."""
    store = PgStore.open(pg_url, host)
    me = self_identity().to_json()
    try:
        while not stop.is_set():
            candidates = store.queued(1)
            if not candidates:
                return
            task = candidates[0]
            token = new_claim_token(os.urandom(10))
            try:
                store.commit(
                    ev.Claimed(task.id, 1, token, me, "claim"),
                    ev.Dispatching(task.id, 1, token, f"m-{task.id}", {}),
                )
            except FerryError:
                continue  # another claimer won it: the next one
            claimed.append(task.id)
    finally:
        store.close()


def exclusive_claims(pg_url: str, claimers: int, tasks: int) -> None:
    store = PgStore.open(pg_url, "submitter")
    spec = TaskSpec(argv=("true",), cwd="/")
    batch = [ev.Submitted(new_task_id(time.time_ns(), os.urandom(4)), spec, time.time())
             for _ in range(tasks)]  # fmt: skip
    for start in range(0, tasks, 500):
        store.commit(*batch[start : start + 500])
    store.close()
    stop, results = threading.Event(), [[] for _ in range(claimers)]  # type: list[list[str]]
    threads = [
        threading.Thread(target=claim_all, args=(pg_url, f"h{i}", stop, results[i]))
        for i in range(claimers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    stop.set()
    claimed = [task_id for found in results for task_id in found]
    assert sorted(claimed) == sorted(e.task for e in batch)  # each once, none left
    dispatched = events(pg_url, "DISPATCHING")
    assert len(dispatched) == len(set(dispatched)) == tasks


def test_concurrent_claimers_claim_each_task_exactly_once(hosts: Hosts, pg_url: str) -> None:
    exclusive_claims(pg_url, claimers=8, tasks=400)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_sixteen_claimers_over_twenty_thousand_tasks(hosts: Hosts, pg_url: str) -> None:
    exclusive_claims(pg_url, claimers=16, tasks=20_000)


def test_a_batch_s_events_are_numbered_in_batch_order(hosts: Hosts, pg_url: str) -> None:
    """A commit inserts its events in one statement: the seqs it reports are the rows'
    own, rising in the batch's order (every fold follows seq), not the ids' order."""
    store = PgStore.open(pg_url, "a")
    spec = TaskSpec(argv=("true",), cwd="/")
    batch = [ev.Submitted(new_task_id(time.time_ns(), os.urandom(4)), spec, time.time())
             for _ in range(300)]  # fmt: skip
    try:
        records = store.commit(*batch)
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(
                "SELECT seq, task FROM ferry_events WHERE type = 'SUBMITTED' ORDER BY seq"
            ).fetchall()
        assert (
            [task for _, task in rows] == [e.task for e in batch] != sorted(e.task for e in batch)
        )
        assert [(seq, data["task"]) for seq, _, _, data in records] == rows
        assert [t.id for t in store.queued(300)] == [e.task for e in batch]
    finally:
        store.close()


def test_a_claim_batch_waits_for_a_locked_row_it_does_not_claim(hosts: Hosts, pg_url: str) -> None:
    """A worker's one write per turn: the end of its task X and the claim of the next
    task Y. Meanwhile another host's claimer, which picked X from the queue a moment
    before X was claimed, holds X's row in its own claim attempt (refused soon after).
    Only the claimed rows are locked SKIP LOCKED: the write waits for X's row. (It was
    skipped too: X was missing from the rows the batch was checked against, and the
    commit raised task.not_found; `ferry work` stopped with exit 5, four workers over
    2,000 tasks in bench/pg_bench.py.)"""
    store = PgStore.open(pg_url, "a")
    me = self_identity().to_json()
    spec = TaskSpec(argv=("true",), cwd="/")
    x, y = (new_task_id(time.time_ns(), os.urandom(4)) for _ in range(2))
    token_x, token_y = (new_claim_token(os.urandom(10)) for _ in range(2))
    outcome: list[BaseException | None] = []

    def write_turn() -> None:
        try:
            store.commit(
                ev.Spawned(x, 1, token_x, 4242, 4242, 1),
                ev.Settled(x, 1, token_x, State.SUCCEEDED, None, 0),
                ev.Claimed(y, 1, token_y, me, "work"),
                ev.Dispatching(y, 1, token_y, f"m-{y}", {}),
            )
            outcome.append(None)
        except BaseException as error:  # (reported by the test's thread below)
            outcome.append(error)

    def waiting_for_a_lock() -> bool:
        row = store_reader.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
        return bool(row[0])

    try:
        store.commit(ev.Submitted(x, spec, time.time()), ev.Submitted(y, spec, time.time()))
        store.commit(ev.Claimed(x, 1, token_x, me, "work"),
                     ev.Dispatching(x, 1, token_x, f"m-{x}", {}))  # fmt: skip
        with (
            psycopg.connect(pg_url, autocommit=True) as store_reader,
            psycopg.connect(pg_url) as other_claimer,
        ):
            other_claimer.execute("SELECT 1 FROM ferry_tasks WHERE id = %s FOR UPDATE", (x,))
            writer = threading.Thread(target=write_turn)
            writer.start()
            wait_until(lambda: outcome or waiting_for_a_lock(), what="the write to wait or end")
            other_claimer.rollback()  # its claim of X refused: X's row is free again
            writer.join(timeout=30)
        assert outcome == [None]
        assert (store.get(x).state, store.get(y).state) == (State.SUCCEEDED, State.DISPATCHING)
    finally:
        store.close()


# ---- fencing ---------------------------------------------------------------------------


def test_a_leader_write_after_its_lease_expired_is_fenced(hosts: Hosts, pg_url: str) -> None:
    from ferry.storage.postgres.lease import PgLeases

    store = PgStore.open(pg_url, "a")
    try:
        leases = PgLeases(store.db, "a", ttl_s=0.2)
        lease = leases.acquire(self_identity())
        store.commit(ev.LeaseAcquired(lease.epoch, self_identity().to_json()), epoch=lease.epoch)
        wait_until(lambda: not store.db.execute(
            "SELECT expires_at > now() FROM ferry_hosts WHERE host_id = 'a'").fetchone()[0],
            what="the lease to expire")  # fmt: skip
        with pytest.raises(LeaseHeldError) as fenced:
            store.commit(
                ev.LeaseReleased(lease.epoch, self_identity().to_json()), epoch=lease.epoch
            )
        assert fenced.value.code == "journal.fenced"
        with pytest.raises(LeaseHeldError):
            leases.renew(lease)
        newer = leases.acquire(self_identity())
        assert newer.epoch > lease.epoch
    finally:
        store.close()


def test_two_first_acquisitions_of_a_host_lease_elect_one_holder(hosts: Hosts, pg_url: str) -> None:
    # (Was: a host's first acquisition found no row, so its FOR UPDATE locked nothing;
    # two workers of one host starting at once both inserted, the second's upsert
    # taking epoch 3 over the first's 2: two leaders, and the first fenced at its next
    # write, exiting 75. Seen under load in the soak's four workers on two hosts.)
    from ferry.proc.process import identity_of
    from ferry.storage.postgres.lease import PgLeases

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    blocker = psycopg.connect(pg_url)
    stores = [PgStore.open(pg_url, "a") for _ in range(2)]
    try:
        other = identity_of(sleeper.pid)
        assert other is not None
        # Both acquisitions read the table, then queue behind this lock to write in it.
        blocker.execute("LOCK TABLE ferry_hosts IN SHARE MODE")
        outcomes: list[object] = []

        def acquire(store: PgStore, me: Any) -> None:
            try:
                outcomes.append(PgLeases(store.db, "a", ttl_s=30).acquire(me).epoch)
            except FerryError as error:
                outcomes.append(error.code)

        threads = [
            threading.Thread(target=acquire, args=(store, me))
            for store, me in zip(stores, (self_identity(), other), strict=True)
        ]
        for thread in threads:
            thread.start()
        with psycopg.connect(pg_url, autocommit=True) as watcher:  # (no stats snapshot)
            wait_until(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()").fetchone()[0] == 2,
                what="both acquisitions to wait for the lock")  # fmt: skip
        blocker.commit()
        for thread in threads:
            thread.join(timeout=30)
        assert len(outcomes) == 2 and outcomes.count("lease.held") == 1, outcomes
    finally:
        blocker.close()
        for store in stores:
            store.close()
        sleeper.kill()
        sleeper.wait()


# ---- host loss --------------------------------------------------------------------------


def kill_host(ferry: Ferry) -> None:
    """Every process of the host dies at once: its ferry commands, supervisors, tasks."""
    for proc in ferry.background:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for identity in processes_with_env(f"FERRY_HOME={ferry.home}".encode()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(identity.pid, signal.SIGKILL)
    for proc in ferry.background:
        proc.wait(timeout=10)


# Tasks whose host another host is to find lost: b waits twice their kill grace (and
# twice the TTL, and 8 s) after they were last heard, so a short grace keeps it brief.
QUICK_GRACE = ("--kill-grace", "1")


def start_two_tasks(hosts: Hosts, ttl: str) -> tuple[str, str, subprocess.Popen[bytes]]:
    a = hosts("a")
    mutating = (
        a.ok("submit", *QUICK_GRACE, "--name", "mutating", "--", "sleep", "60").out.decode().strip()
    )
    idem = (
        a.ok("submit", *QUICK_GRACE, "--idempotent", "--name", "idem", "--", "sleep", "60")
        .out.decode()
        .strip()
    )
    worker = a.start("work", "-j", "2", "--lease-ttl", ttl, "--poll", "0.1")
    wait_until(lambda: {t["state"] for t in a.tasks()} == {"RUNNING"}, what="both tasks running")
    return mutating, idem, worker


def test_a_lost_host_tasks_are_failed_or_requeued_by_another_host(hosts: Hosts) -> None:
    mutating, idem, _ = start_two_tasks(hosts, ttl="1")
    kill_host(hosts("a"))
    b = hosts("b")

    # Each task is decided once it has been unheard long enough, from its own last
    # beat: under load the two can fall to two passes (the first exits 3 for the
    # mutating one, the other 0), as they did once in CI.
    codes: list[int] = []

    def decided() -> bool:
        codes.append(b("recover", "--lease-ttl", "1").code)
        return b.task(mutating)["state"] != "RUNNING" and b.task(idem)["state"] != "RUNNING"

    wait_until(decided, what="recovery on b to decide a's tasks")
    assert 3 in codes, codes
    lost, requeued = b.task(mutating), b.task(idem)
    assert (lost["state"], lost["reason"]) == ("FAILED", "HOST_LOST")
    assert lost["evidence"]["recovery"]["host_lost"] is True
    assert (requeued["state"], requeued["releases"]) == ("QUEUED", 1)
    assert b("recover", "--lease-ttl", "1").code == 0  # decided once


@pytest.mark.soak  # (27 s, in its teardown; tox -e soak)
def test_a_host_is_left_alone_while_its_lease_lives(hosts: Hosts) -> None:
    mutating, idem, _ = start_two_tasks(hosts, ttl="30")
    b = hosts("b")
    assert b("recover", "--lease-ttl", "1").code == 0
    assert {b.task(mutating)["state"], b.task(idem)["state"]} == {"RUNNING"}
    b.refused(1, "task.other_host", "kill", mutating)


def test_a_paused_host_writes_nothing_once_another_decided_its_tasks(
    hosts: Hosts, tmp_path: Path
) -> None:
    a = hosts("a")
    gate = tmp_path / "gate"  # (the task ends only once the host is continued)
    script = f'while [ ! -e "{gate}" ]; do sleep 0.05; done; echo done'
    task_id = a.ok("submit", *QUICK_GRACE, "--", "sh", "-c", script).out.decode().strip()
    worker = a.start("work", "-j", "1", "--lease-ttl", "1", "--poll", "0.1", "--drain")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run")
    paused = [i.pid for i in processes_with_env(f"FERRY_HOME={a.home}".encode())]
    for pid in paused:
        # (One of the task's short-lived children, its loop's sleep, may be gone since
        # the listing; its shell, stopped, starts no other.)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    b = hosts("b")
    try:
        wait_until(lambda: b("recover", "--lease-ttl", "1").code == 3, what="b to decide")
    finally:
        gate.touch()
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    worker.wait(timeout=60)
    task = b.task(task_id)
    assert (task["state"], task["reason"]) == ("FAILED", "HOST_LOST")  # a's end changed nothing
    # ... and is kept as evidence: what a saw, once
    [late] = task["evidence"]["late_results"]
    assert (late["attempt"], late["host"]) == (1, "a") and late["state"] in ("SUCCEEDED", "FAILED")


def test_a_lost_host_decision_is_refused_once_the_task_is_heard_again(
    hosts: Hosts, pg_url: str
) -> None:
    # (Found by a review: recover read that a's task was lost, then wrote its decision;
    # a beat of the task between the two, its host back (its supervisor, paused before
    # its spawn, beat and spawned), was not looked at: the task was queued again and
    # run by another host while it ran on a.)
    from ferry.app.recoverer import lost_host_observation
    from ferry.core.errors import RefusedError
    from ferry.core.recovery import Policy, decide
    from ferry.storage.postgres.lease import PgLeases

    a, b = PgStore.open(pg_url, "a"), PgStore.open(pg_url, "b")
    try:
        me = self_identity()
        task_id = new_task_id(time.time_ns(), os.urandom(4))
        spec = TaskSpec(argv=("true",), cwd="/", idempotent=True)
        a.commit(ev.Submitted(task_id, spec, time.time()))
        epoch = PgLeases(a.db, "a", ttl_s=600).acquire(me).epoch
        task = a.claim_next(me.to_json(), new_claim_token(os.urandom(10)), by="work", epoch=epoch)
        assert task is not None
        a.db.execute("UPDATE ferry_hosts SET expires_at = now() - interval '1 hour'"
                     " WHERE host_id = 'a'")  # fmt: skip
        unheard = ("UPDATE ferry_tasks SET heartbeat_at = now() - interval '1 hour',"
                   " updated_at = now() - interval '1 hour' WHERE id = %s")  # fmt: skip
        a.db.execute(unheard, (task_id,))
        assert b.host_lost(task, 1.0) is True
        now = time.time()
        decision = decide(task, lost_host_observation(task, now, 1.0), Policy(), now)
        assert decision.event is not None and decision.event[0] == "RELEASED"
        assert a.beat(task)  # heard again, before b's write
        b_epoch = PgLeases(b.db, "b", ttl_s=600).acquire(me).epoch
        with pytest.raises(RefusedError) as refused:
            b.commit(decision.event, epoch=b_epoch)
        assert refused.value.code == "task.heard_again"
        assert b.get(task_id).state is State.DISPATCHING  # (left to its host)
        a.db.execute(unheard, (task_id,))  # unheard again: the decision stands
        a.db.execute("UPDATE ferry_hosts SET expires_at = now() + interval '1 hour'"
                     " WHERE host_id = 'a'")  # fmt: skip
        with pytest.raises(RefusedError):  # (but not while its host's lease lives)
            b.commit(decision.event, epoch=b_epoch)
        a.db.execute("UPDATE ferry_hosts SET expires_at = now() - interval '1 hour'"
                     " WHERE host_id = 'a'")  # fmt: skip
        b.commit(decision.event, epoch=b_epoch)
        assert b.get(task_id).state is State.QUEUED
    finally:
        a.close()
        b.close()


def test_a_cancel_resumed_after_a_retry_leaves_the_new_attempt_alone(hosts: Hosts) -> None:
    """Found by a review: ``cancel`` paused just after its CANCEL_REQUESTED (attempt 1)
    was durable; the runner stopped the task (CANCELLED) and a ``retry`` queued attempt
    2; the cancel, continued, read the task again and cancelled attempt 2 with its own
    token (or SIGTERMed it, running): a stale writer, whose request was for attempt 1.
    (On the local journal the cancel's table, not caught up, still held attempt 1.)"""
    ferry = hosts("a")
    task_id = ferry.ok(
        "submit", "--heartbeat", "0.5", "--kill-grace", "1", "--", "sleep", "60"
    ).text.strip()
    worker = ferry.start("work", "-j", "1", "--poll", "0.1")
    wait_until(lambda: ferry.task(task_id)["state"] == "RUNNING", what="the task to run")
    cancel = ferry.start_stopped("cancel", task_id, at="after:CANCEL_REQUESTED")
    wait_until(lambda: ferry.task(task_id)["state"] == "CANCELLED", what="its runner to stop it")
    worker.send_signal(signal.SIGTERM)
    finish(worker)
    ferry.ok("retry", task_id)
    code, err = finish(cancel)
    assert code == 0, err
    task = ferry.task(task_id)
    assert (task["attempt"], task["state"], task["cancel_requested"]) == (2, "QUEUED", False)
    ferry.verify_clean()


@pytest.mark.soak
@pytest.mark.timeout(300)
def test_a_client_paused_inside_its_write_holds_its_locks_a_minute_at_most(
    hosts: Hosts,
) -> None:
    # (Found by a third review: a `resolve` paused inside its write (^Z; or cut off,
    # its COMMIT lost on the way) kept its key's lock on the server until the server's
    # TCP keepalive gave up, about two hours: a `submit --key` of that key, on any
    # host, waited as long. The server now ends such a session after a minute.)
    a, b = hosts("a"), hosts("b")
    first = a.ok("submit", "--key", "K", "--", "false").out.decode().strip()
    a.ok("work", "--drain", codes=(1,))
    resolve = b.start_stopped("resolve", first, "--as", "failed", at="before:RESOLVED")
    started = time.monotonic()
    submit = a.start("submit", "--key", "K", "--", "true")
    code, err = finish(submit, timeout_s=150)
    assert code == 0, err
    assert time.monotonic() - started < 120
    code, err = finish(resolve)
    assert code == 75 and "db.unavailable" in err, err  # (its write rolled back: unknown)


def test_two_recovers_on_two_hosts_decide_each_task_once(hosts: Hosts, pg_url: str) -> None:
    a = hosts("a")
    for _ in range(4):
        a.ok("submit", *QUICK_GRACE, "--", "sleep", "60")
    a.start("work", "-j", "4", "--lease-ttl", "1", "--poll", "0.1")
    wait_until(lambda: {t["state"] for t in a.tasks()} == {"RUNNING"}, what="4 running")
    kill_host(a)
    wait_until(lambda: hosts("b")("recover", "--lease-ttl", "1", "--dry-run").code == 3,
               what="a's lease to expire")  # fmt: skip
    both = [hosts(h).start("recover", "--lease-ttl", "1") for h in ("b", "c")]
    for proc in both:
        proc.wait(timeout=60)
    settled = events(pg_url, "SETTLED")
    assert len(settled) == len(set(settled)) == 4
    assert {t["reason"] for t in a.tasks()} == {"HOST_LOST"}


def test_a_worker_killed_leaves_its_task_to_finish_and_record_its_end(
    hosts: Hosts, tmp_path: Path
) -> None:
    a = hosts("a")
    gate = tmp_path / "gate"
    task_id = (
        a.ok("submit", "--", "sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.05; done; echo done')
        .out.decode()
        .strip()
    )
    worker = a.start("work", "-j", "1", "--poll", "0.1")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run")
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(timeout=30) == -signal.SIGKILL
    gate.touch()
    task = wait_until(lambda: (t := hosts("b").task(task_id))["state"] == "SUCCEEDED" and t,
                      what="its supervisor to record the end")  # fmt: skip
    assert (task["exit_code"], task["host"]) == (0, "a")
    assert a.ok("logs", task_id).out == b"done\n"


def gated(gate: Path, marks: Path | None = None) -> list[str]:
    """Runs until ``gate`` exists (appending a line to ``marks`` as it goes, if given:
    the proof that it still runs)."""
    mark = "" if marks is None else f'echo x >> "{marks}"; '
    return ["sh", "-c", f'while [ ! -e "{gate}" ]; do {mark}sleep 0.05; done; echo done']


def still_runs(marks: Path) -> bool:
    """The task appending to ``marks`` appends again (within a few seconds)."""
    size = marks.stat().st_size if marks.exists() else 0
    with contextlib.suppress(AssertionError):
        return bool(wait_until(lambda: marks.exists() and marks.stat().st_size > size,
                               what="another mark", timeout_s=3))  # fmt: skip
    return False


def test_a_task_outlives_its_killed_worker_past_the_host_s_lease(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    # (Was: the orphaned supervisor's beats were fenced by its host's lease, which no
    # worker renews once `work` is killed: the lease expired and the supervisor stopped
    # its task. A worker's death disturbed every task that outlived its lease's TTL.)
    a, b = hosts("a"), hosts("b")
    gate = tmp_path / "gate"
    task_id = a.ok("submit", "--heartbeat", "0.5", "--", *gated(gate)).out.decode().strip()
    worker = a.start("work", "-j", "1", "--lease-ttl", "1", "--poll", "0.1")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run")
    worker.kill()
    worker.wait(timeout=30)
    with psycopg.connect(pg_url, autocommit=True) as db:
        wait_until(lambda: db.execute(
            "SELECT expires_at < now() - interval '3 seconds' FROM ferry_hosts"
            " WHERE host_id = 'a'").fetchone()[0], what="a's lease to be 3 TTLs past")  # fmt: skip
    assert b("recover", "--lease-ttl", "1").code == 0  # (it beats: left alone)
    assert a.task(task_id)["state"] == "RUNNING"
    gate.touch()
    task = wait_until(lambda: (t := b.task(task_id))["state"] != "RUNNING" and t,
                      what="its supervisor to record the end")  # fmt: skip
    assert (task["state"], task["exit_code"], task["signal"]) == ("SUCCEEDED", 0, None)


def test_a_long_run_is_left_alone_by_another_host_s_recover(hosts: Hosts, tmp_path: Path) -> None:
    # (Was: `run` holds no host lease, and a beat was taken only under one: its beats
    # never landed, and b's recover, finding a's lease (none) expired and the task
    # silent, failed it HOST_LOST while it ran, a second after it started.)
    a, b = hosts("a"), hosts("b")
    gate = tmp_path / "gate"
    run = a.start("run", "--heartbeat", "0.5", "--", *gated(gate))
    try:
        wait_until(lambda: [t["state"] for t in a.tasks()] == ["RUNNING"], what="the run")
        watched_until = time.monotonic() + 4  # (four of b's TTLs, eight of a's beats)
        while time.monotonic() < watched_until:
            assert b("recover", "--lease-ttl", "1").code == 0
    finally:
        gate.touch()
        run.wait(timeout=60)
    assert run.returncode == 0
    assert [t["state"] for t in b.tasks()] == ["SUCCEEDED"]


def test_a_run_is_left_alone_before_its_first_beat(hosts: Hosts, tmp_path: Path) -> None:
    # (Found by a review: the TTL of a task's beats was kept with its first beat only;
    # before it (5 s, the default --heartbeat), b's recover --lease-ttl 1 waited its
    # own TTL from the claim, and queued a's running task again.)
    a, b = hosts("a"), hosts("b")
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    run = a.start("run", "--idempotent", "--", *gated(gate, marks))
    try:
        wait_until(lambda: [t["state"] for t in a.tasks()] == ["RUNNING"], what="the run")
        watched_until = time.monotonic() + 4  # (four of b's TTLs, before a's first beat)
        while time.monotonic() < watched_until:
            assert b("recover", "--lease-ttl", "1").code == 0
    finally:
        gate.touch()
        run.wait(timeout=60)
    assert (run.returncode, [t["state"] for t in b.tasks()]) == (0, ["SUCCEEDED"])


def test_a_paused_launcher_does_not_stop_its_task(hosts: Hosts, tmp_path: Path) -> None:
    # (Found by a review: a launcher paused past the TTL (Ctrl-Z, a long recovery pass)
    # wrote no beat, and the supervisor stopped a healthy task at its deadline. It now
    # beats the task itself when its launcher is late.)
    a, b = hosts("a"), hosts("b")
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    task_id = a.ok("submit", "--idempotent", "--", *gated(gate, marks)).out.decode().strip()
    claim = a.start("claim", "--lease-ttl", "2")
    try:
        wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the claim to run it")
        claim.send_signal(signal.SIGSTOP)
        paused_until = time.monotonic() + 8  # (four TTLs)
        while time.monotonic() < paused_until:
            assert b("recover", "--lease-ttl", "2").code == 0
        assert still_runs(marks)
    finally:
        claim.send_signal(signal.SIGCONT)
        gate.touch()
        claim.wait(timeout=60)
    assert (claim.returncode, b.task(task_id)["state"]) == (0, "SUCCEEDED")


def paused_past_its_lease(host: Ferry, task_id: str, *options: str) -> subprocess.Popen[bytes]:
    """A ``work`` (``options``) running the task, paused (SIGSTOP) for three times its
    lease's TTL, continued: it exits 75, having stopped its task."""
    worker = host.start("work", "-j", "1", "--lease-ttl", "2", "--poll", "0.1", *options)
    try:
        wait_until(lambda: host.task(task_id)["state"] == "RUNNING", what="work to run it")
        worker.send_signal(signal.SIGSTOP)
        paused_until = time.monotonic() + 6  # (three TTLs: the pause is the point)
        while time.monotonic() < paused_until:
            time.sleep(0.1)
        worker.send_signal(signal.SIGCONT)
        assert worker.wait(timeout=60) == 75
    finally:
        worker.send_signal(signal.SIGCONT)
    return worker


def test_a_worker_that_lost_its_lease_says_why_it_stopped_its_tasks(
    hosts: Hosts, tmp_path: Path
) -> None:
    # (Found by a review: a ``work`` paused past its lease (Ctrl-Z; a database out of
    # reach as long) stops its running tasks when it is continued, as a worker that
    # cannot renew must; they ended FAILED SIGNALLED 15, as if a user had killed them.)
    a = hosts("a")
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    task_id = a.ok("submit", "--", *gated(gate, marks)).out.decode().strip()
    try:
        worker = paused_past_its_lease(a, task_id, "--halt", "now")
    finally:
        gate.touch()
    task = a.task(task_id)
    assert (task["state"], task["reason"], task["signal"]) == ("FAILED", "SIGNALLED", 15)
    assert task["evidence"]["stopped_because"] == "lease_lost", task["evidence"]
    assert worker.stderr is not None
    assert "halting" not in worker.stderr.read().decode()  # (--halt: not a task's failure)


def test_an_idempotent_task_a_worker_stopped_for_its_lost_lease_is_queued_again(
    hosts: Hosts, tmp_path: Path
) -> None:
    # (Found by a review: a worker that lost its lease stops its tasks, as the contract
    # asks, and their ends were written FAILED SIGNALLED; another host's recovery
    # queues an idempotent task of a lost host again, and so does this end now, bounded
    # by --max-releases as recovery's release is.)
    a, b = hosts("a"), hosts("b")
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    task_id = a.ok("submit", "--idempotent", "--", *gated(gate, marks)).out.decode().strip()
    paused_past_its_lease(a, task_id)
    task = a.task(task_id)
    assert (task["state"], task["reason"], task["releases"]) == ("QUEUED", "RELEASED_TO_QUEUE", 1)
    assert task["evidence"]["stopped_because"] == "lease_lost", task["evidence"]
    assert task["evidence"]["signal"] == 15, task["evidence"]
    gate.touch()
    b.ok("work", "--drain")
    task = a.task(task_id)
    assert (task["state"], task["host"], task["attempt"]) == ("SUCCEEDED", "b", 1), task


def test_a_task_unheard_past_its_deadline_is_not_started(hosts: Hosts, tmp_path: Path) -> None:
    # (Found by a review: a supervisor frozen between its go and the spawn, past its
    # deadline, spawned the task once continued, after b had queued it again.)
    a, b = hosts("a"), hosts("b")
    gate, marks = tmp_path / "gate", tmp_path / "marks"
    task_id = (
        a.ok("submit", "--idempotent", "--kill-grace", "1", "--", *gated(gate, marks))
        .out.decode()
        .strip()
    )  # (b waits 2 TTLs, 2 graces and 8 s: within wait_until's 30)
    claim = a.start("claim", "--lease-ttl", "2", failpoints="supervisor:before:spawn=stop")
    try:
        pid = a.stopped_runner(task_id)
        wait_until(lambda: b("recover", "--lease-ttl", "2").code == 3 or b.task(task_id)[
            "state"] == "QUEUED", what="b to queue the task again")  # fmt: skip
        os.kill(pid, signal.SIGCONT)
        claim.wait(timeout=60)
    finally:
        gate.touch()
    assert not marks.exists(), "the task was started after b had taken it over"
    assert b.task(task_id)["state"] == "QUEUED"


def test_a_cancel_while_work_is_stopped_before_its_go_starts_nothing(
    hosts: Hosts, tmp_path: Path
) -> None:
    """``work`` stopped between its claim and its go (Ctrl-Z, a frozen VM), the task
    cancelled meanwhile from another host: continued, work sent the go it had decided
    on the row read with its claim, and the task ran until its first beat. Its claim
    written long before the go, it reads the row again first: nothing starts."""
    a, b = hosts("a"), hosts("b")
    marker = tmp_path / "ran"
    task_id = a.ok("submit", "--kill-grace", "0.2", "--", "touch", str(marker)).out.decode().strip()
    work = a.start_stopped("work", "--drain", at="launcher:before:go")
    try:
        b.ok("cancel", task_id)
    finally:
        os.kill(work.pid, signal.SIGCONT)
    assert work.wait(timeout=60) == 1
    task = b.task(task_id)
    assert (task["state"], task["reason"]) == ("CANCELLED", "CANCELLED_BY_USER"), task
    assert not marker.exists(), "nothing was started"


def test_a_row_lock_held_elsewhere_does_not_keep_a_task_past_its_deadline(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    # (Found by a second review: a beat waiting on the task's row lock, which another
    # session held (a client gone between its FOR UPDATE and its COMMIT), held the
    # supervisor's loop: the network's bound does not cover a lock wait, its deadline
    # went unenforced, and b could queue the task again while it ran.)
    a = hosts("a")
    marks = tmp_path / "marks"
    script = f"trap '' TERM; while :; do echo x >> '{marks}'; sleep 0.05; done"
    task_id = (
        a.ok("submit", "--idempotent", "--kill-grace", "2", "--", "sh", "-c", script)
        .out.decode()
        .strip()
    )
    claim = a.start("claim", "--lease-ttl", "2")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run")
    with psycopg.connect(pg_url) as locker:
        locker.execute("SELECT 1 FROM ferry_tasks WHERE id = %s FOR UPDATE", (task_id,))
        store = PgStore.open(pg_url, "b")
        try:
            wait_until(lambda: store.host_lost(store.get(task_id), 2.0),
                       what="b to be allowed to decide it", timeout_s=60)  # fmt: skip
        finally:
            store.close()
        assert not still_runs(marks), "a's task still ran when b could take it over"
        locker.rollback()
    claim.wait(timeout=60)


def assert_lease_kept(
    pg_url: str, host: str, worker: subprocess.Popen[bytes], seconds: float
) -> None:
    """For ``seconds``, ``host``'s lease stays live and its ``worker`` runs."""
    with psycopg.connect(pg_url, autocommit=True) as look:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            [[live]] = look.execute(
                "SELECT expires_at > now() FROM ferry_hosts WHERE host_id = %s", (host,)
            ).fetchall()
            assert live and worker.poll() is None, f"{host}'s worker let its lease lapse"
            time.sleep(0.2)


def test_a_row_lock_held_elsewhere_does_not_stall_a_worker_past_its_lease(
    hosts: Hosts, pg_url: str
) -> None:
    # (Found by a third review: a `cancel` from another host, paused (^Z, a frozen VM)
    # inside its write, held one task's row lock; the worker's beat of that task waited
    # for it without a bound, its loop stalled, its lease lapsed, and it stopped every
    # task it ran, the other one too, and exited 75.)
    a = hosts("a")
    held, other = (a.ok("submit", "--", "sleep", "60").out.decode().strip() for _ in range(2))
    worker = a.start("work", "-j", "2", "--lease-ttl", "3", "--poll", "0.1")
    wait_until(lambda: {t["state"] for t in a.tasks()} == {"RUNNING"}, what="both to run")
    with psycopg.connect(pg_url) as locker:
        locker.execute("SELECT 1 FROM ferry_tasks WHERE id = %s FOR UPDATE", (held,))
        assert_lease_kept(pg_url, "a", worker, 12)  # (four of its TTLs)
        locker.rollback()
    assert a.task(other)["state"] == "RUNNING" and worker.poll() is None
    kill_host(a)  # (its supervisors, which hold the worker's stderr, and their tasks)


def test_a_key_lock_held_elsewhere_does_not_stall_a_worker_past_its_lease(
    hosts: Hosts, pg_url: str
) -> None:
    # (Found by a third review: another session held key K's lock (a `resolve` paused
    # inside its write) while a task with --key K ended: each of the worker's writes of
    # that end waited a quarter of its TTL, one after another in one turn, its
    # supervisor's too, and the lease lapsed between two renewals: it stopped the other
    # task it ran.)
    a = hosts("a")
    keyed = a.ok("submit", "--key", "K", "--", "sleep", "2").out.decode().strip()
    other = a.ok("submit", "--", "sleep", "60").out.decode().strip()
    worker = a.start("work", "-j", "2", "--lease-ttl", "8", "--poll", "0.1")
    wait_until(lambda: {t["state"] for t in a.tasks()} == {"RUNNING"}, what="both to run")
    with psycopg.connect(pg_url) as locker:
        locker.execute("SELECT pg_advisory_xact_lock(hashtextextended('K', 0))")
        assert_lease_kept(pg_url, "a", worker, 30)  # (the keyed task ends meanwhile)
        locker.rollback()
    wait_until(lambda: a.task(keyed)["state"] == "SUCCEEDED", what="the keyed task's end")
    assert a.task(other)["state"] == "RUNNING" and worker.poll() is None
    kill_host(a)


def test_a_late_start_whose_claim_is_still_its_own_goes_ahead(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    # (Found by a second review: a supervisor that came to its spawn past its deadline
    # (stopped there, its worker alive and its lease renewed) settled the task FAILED
    # SPAWN_FAILED: it now beats first, and starts the task if the beat is taken.)
    a = hosts("a")
    marks = tmp_path / "marks"
    task_id = a.ok("submit", "--", "sh", "-c", f"echo x >> '{marks}'").out.decode().strip()
    worker = a.start("work", "-j", "1", "--lease-ttl", "2", "--poll", "0.1", "--drain",
                     failpoints="supervisor:before:spawn=stop")  # fmt: skip
    try:
        pid = a.stopped_runner(task_id)
        with psycopg.connect(pg_url, autocommit=True) as db:
            wait_until(lambda: db.execute(
                "SELECT updated_at < now() - interval '3 seconds' FROM ferry_tasks"
                " WHERE id = %s", (task_id,)).fetchone()[0],
                what="its deadline to pass")  # fmt: skip
        os.kill(pid, signal.SIGCONT)
        assert worker.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            worker.send_signal(signal.SIGCONT)
    task = a.task(task_id)
    assert (task["state"], marks.read_text()) == ("SUCCEEDED", "x\n")


def test_a_read_only_database_stops_a_task_with_its_grace_not_a_crash(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    # (Found by a second review: a driver error that is not a lost connection (here
    # ReadOnlySqlTransaction) escaped from a supervisor beating alone, its launcher
    # paused: the task loop's abort SIGKILLed the task, without its SIGTERM, and the
    # supervisor died without an end.)
    a = hosts("a")
    marks, trace = tmp_path / "marks", tmp_path / "trace"
    script = f"trap 'echo TERM >> {trace}; exit 0' TERM; while :; do echo x >> '{marks}'; sleep 0.05; done"
    task_id = a.ok("submit", "--idempotent", "--", "sh", "-c", script).out.decode().strip()
    claim = a.start("claim", "--lease-ttl", "2")
    wait_until(lambda: a.task(task_id)["state"] == "RUNNING", what="the task to run")
    dbname = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
        claim.send_signal(signal.SIGSTOP)  # (its launcher late: the supervisor beats alone)
        try:
            wait_until(trace.exists, what="the task's SIGTERM, past its deadline")
        finally:
            claim.send_signal(signal.SIGCONT)
            conn.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
    assert claim.wait(timeout=60) != 125  # (not error[internal]: the supervisor lived)
    task = wait_until(lambda: (t := a.task(task_id))["state"] != "RUNNING" and t,
                      what="the task's end")  # fmt: skip
    assert "unheard" in task["evidence"]


@pytest.mark.parametrize("command", ["run", "work"])
def test_an_end_a_read_only_database_could_not_take_is_kept_and_delivered(
    hosts: Hosts, pg_url: str, tmp_path: Path, command: str
) -> None:
    # (Found by a review: ReadOnlySqlTransaction, a server that takes no writes (a
    # standby after a failover, default_transaction_read_only), is not a lost
    # connection: it escaped as error[internal], the supervisor died without keeping
    # the end, and recover later marked the task FAILED MARKED_FAILED_MUTATION_UNSAFE.)
    a = hosts("a")
    a.env["FERRY_OUTBOX_PATIENCE_S"] = "120"  # (its supervisor tries again quickly)
    gate = tmp_path / "gate"
    script = f'while [ ! -e "{gate}" ]; do sleep 0.05; done; echo done'
    if command == "run":
        launcher = a.start("run", "--", "sh", "-c", script)
    else:
        a.ok("submit", "--", "sh", "-c", script)
        launcher = a.start("work", "-j", "1", "--drain", "--lease-ttl", "10", "--poll", "0.1")
    task = wait_until(lambda: (t := a.only_task_or_none()) and t["state"] == "RUNNING" and t,
                      what="the task to run")  # fmt: skip
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")  # (this session writes)
        conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        conn.execute("SELECT pg_reload_conf()")
        try:
            gate.touch()  # the task ends while the database takes no writes
            wait_until(lambda: sorted((a.home / "outbox").glob("*.json")),
                       what="the supervisor to keep the end")  # fmt: skip
            if command == "run":  # (the task's status, and that its end is not written)
                code, err = finish(launcher)
                assert code == 0 and "its supervisor keeps it and writes it" in err, (code, err)
        finally:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")
    ended = wait_until(lambda: (t := a.task(task["id"]))["state"] != "RUNNING" and t,
                       what="the kept end to be delivered")  # fmt: skip
    assert (ended["state"], ended["exit_code"]) == ("SUCCEEDED", 0)
    if command == "work":  # (no crash: done, or its lease lost in the spell: it stopped)
        code, err = finish(launcher)
        assert code == 0 or (code == 75 and "error[lease.lost]" in err), err


def test_supervisors_let_go_of_the_connections_they_beat_alone_with(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    # (Found by a second review: a supervisor that beat its task itself, its worker
    # late, kept its own connection for the rest of the task: one per running task.)
    a = hosts("a")
    gate = tmp_path / "gate"
    ids = [a.ok("submit", "--", *gated(gate)).out.decode().strip() for _ in range(3)]
    worker = a.start("work", "-j", "3", "--lease-ttl", "6", "--poll", "0.1")
    with psycopg.connect(pg_url, autocommit=True) as db:
        try:
            wait_until(lambda: all(a.task(i)["state"] == "RUNNING" for i in ids),
                       what="the tasks to run")  # fmt: skip
            supervisors = {f"ferry {a.task(i)['runner']['pid']}@a" for i in ids}

            def connections() -> int:
                rows = db.execute("SELECT application_name FROM pg_stat_activity").fetchall()
                return sum(1 for (name,) in rows if name in supervisors)

            paused = db.execute("SELECT now()").fetchone()[0]
            worker.send_signal(signal.SIGSTOP)  # (a long pass: the launcher is late)
            wait_until(lambda: db.execute(
                "SELECT count(*) FROM ferry_tasks WHERE heartbeat_at > %s", (paused,)
            ).fetchone()[0] == 3, what="each supervisor to beat alone")  # fmt: skip
            worker.send_signal(signal.SIGCONT)
            wait_until(lambda: connections() == 0, what="the supervisors to let go")
        finally:
            worker.send_signal(signal.SIGCONT)
            gate.touch()
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)


def test_task_numbers_are_one_sequence_across_hosts(hosts: Hosts) -> None:
    hosts("a").ok("submit", "--", "true")
    hosts("b").ok("submit", "--", "true")
    hosts("a").ok("run", "--", "true")
    assert [t["number"] for t in hosts("b").tasks()] == [1, 2, 3]
    assert hosts("b").task("last")["number"] == 3
    assert hosts("a").task("2")["number"] == 2
    hosts("a").refused(5, "task.not_found", "show", "9")
