"""ferry's connections killed (``pg_terminate_backend``) in the middle of a claim, a
heartbeat and a settle, and the server crashed and restarted (``pg_ctl restart -m
immediate``) under load: nothing acknowledged is lost, nothing runs twice, and the
worker goes on on a new connection (contract.md, "Many machines: PostgreSQL").

"In the middle" is made to happen. A claim: the worker is stopped (SIGSTOP, a failpoint
armed in the launcher only) just before it sends the claim; its connection is killed;
then it is continued (the claim's answer is lost: read back by its token). A settle:
the test holds the task's row lock, so the worker's write (one call of ``ferry_write``,
or the commit path's transaction) waits for it inside its own transaction; the
worker's connection is killed there; then the lock is let go.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from clikit import Ferry, finish, wait_until
from pgserver import PgServer

pytestmark = pytest.mark.timeout(180)

TERMINATE = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def terminate_others(pg_url: str) -> int:
    """Kill every other connection to the test's database; how many."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(TERMINATE).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def host(pg_url: str, tmp_path: Path) -> Ferry:
    ferry = Ferry(tmp_path / "a")
    ferry.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    ferry.ok("db", "init")
    yield ferry
    ferry.close()


def marking(marks: Path, then: str = "") -> list[str]:
    """A task that appends its id to ``marks`` when it starts (runs are counted)."""
    return ["sh", "-c", f'echo "$FERRY_TASK_ID" >> "{marks}"; {then}']


def runs(marks: Path) -> dict[str, int]:
    counted: dict[str, int] = {}
    for line in marks.read_text().split() if marks.exists() else []:
        counted[line] = counted.get(line, 0) + 1
    return counted


def dispatched(pg_url: str) -> list[tuple[str, int]]:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT task, (data->>'attempt')::int FROM ferry_events WHERE type = 'DISPATCHING'"
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


def test_the_worker_s_connection_killed_before_its_claim_is_answered(
    host: Ferry, pg_url: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    task_id = host.ok("submit", "--", *marking(marks)).out.decode().strip()
    worker = host.start_stopped("work", "-j", "1", "--drain", "--poll", "0.1",
                                at="launcher:before:CLAIMED")  # fmt: skip
    assert terminate_others(pg_url) >= 1
    os.kill(worker.pid, signal.SIGCONT)
    code, err = finish(worker)
    assert code == 0, err
    task = host.task(task_id)
    assert (task["state"], task["attempt"]) == ("SUCCEEDED", 1)
    assert runs(marks) == {task_id: 1}
    assert dispatched(pg_url) == [(task_id, 1)]


def test_the_worker_s_connection_killed_inside_its_settle_s_transaction(
    host: Ferry, pg_url: str, tmp_path: Path
) -> None:
    """The point: the worker's end of a task, with the claim of the next task queued,
    waits for the task's row lock (held by the test) inside the transaction that
    writes them; there its connection is killed. Nothing of that transaction is
    committed; the claim's answer is lost (read back by its token); the worker writes
    the end again on a new connection: each task SUCCEEDED once, ran once, one
    DISPATCHING each."""
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    wait = f'while [ ! -e "{gate}" ]; do sleep 0.05; done'
    task_id = host.ok("submit", "--", *marking(marks, wait)).out.decode().strip()
    worker = host.start("work", "-j", "1", "--drain", "--poll", "0.1")
    wait_until(lambda: host.task(task_id)["state"] == "RUNNING", what="the task's SPAWNED")
    next_id = host.ok("submit", "--", *marking(marks)).out.decode().strip()
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE 'ferry %%' AND wait_event_type = 'Lock'"
    )
    with psycopg.connect(pg_url, autocommit=True) as locker, locker.transaction():
        locker.execute("SELECT 1 FROM ferry_tasks WHERE id = %s FOR UPDATE", (task_id,))
        gate.touch()
        wait_until(lambda: locker.execute(waiting).fetchone()[0] >= 1,  # type: ignore[index]
                   what="the worker's end to wait for the row lock")  # fmt: skip
        killed = locker.execute(TERMINATE).fetchone()
        assert killed is not None and killed[0] >= 1
    code, err = finish(worker)
    assert code == 0, err
    assert [(host.task(i)["state"], host.task(i)["attempt"]) for i in (task_id, next_id)] == [
        ("SUCCEEDED", 1), ("SUCCEEDED", 1)]  # fmt: skip
    assert runs(marks) == {task_id: 1, next_id: 1}
    assert sorted(dispatched(pg_url)) == sorted([(task_id, 1), (next_id, 1)])
    with psycopg.connect(pg_url) as conn:
        ends = conn.execute("SELECT count(*) FROM ferry_events WHERE task = %s"
                            " AND type = 'SETTLED'", (task_id,)).fetchone()  # fmt: skip
    assert ends == (1,)


def test_connections_killed_while_tasks_run_and_beat(
    host: Ferry, pg_url: str, tmp_path: Path
) -> None:
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    wait = f'while [ ! -e "{gate}" ]; do sleep 0.05; done'
    ids = [
        host.ok("submit", "--heartbeat", "0.1", "--", *marking(marks, wait)).out.decode().strip()
        for _ in range(2)
    ]
    worker = host.start("work", "-j", "2", "--drain", "--poll", "0.1")
    wait_until(lambda: {t["state"] for t in host.tasks()} == {"RUNNING"}, what="both running")
    for _ in range(5):  # each time: the worker's, the supervisors' beats, ls's
        wait_until(lambda: terminate_others(pg_url) >= 1, what="a connection of ferry's")
    gate.touch()
    code, err = finish(worker)
    assert code == 0, err
    assert [host.task(i)["state"] for i in ids] == ["SUCCEEDED", "SUCCEEDED"]
    assert runs(marks) == dict.fromkeys(ids, 1)


def test_the_server_crashed_and_restarted_under_load(
    host: Ferry, pg_server: PgServer, pg_url: str, tmp_path: Path
) -> None:
    if not pg_server.restartable:
        pytest.skip("FERRY_TEST_DATABASE_URL names a server the tests may not restart")
    marks = tmp_path / "marks"
    lines = "".join(f'echo "$FERRY_TASK_ID" >> "{marks}"; sleep 0.1 # {n}\n' for n in range(30))
    host.ok("submit", "--lines", "-", stdin=lines.encode())
    worker = host.start("work", "-j", "2", "--drain", "--poll", "0.1")
    settled: Callable[[], bool] = lambda: len(runs(marks)) >= 8  # noqa: E731
    wait_until(settled, what="some tasks to run")
    pg_server.restart("immediate")  # (a crash: committed data survives, sessions do not)
    code, err = finish(worker)
    assert code == 0, err
    tasks = host.tasks()
    assert len(tasks) == 30 and {t["state"] for t in tasks} == {"SUCCEEDED"}
    assert runs(marks) == {t["id"]: 1 for t in tasks}
    assert sorted(dispatched(pg_url)) == sorted((t["id"], 1) for t in tasks)


def test_work_rides_out_an_outage_longer_than_a_recovery_pass(
    host: Ferry, pg_server: PgServer, tmp_path: Path
) -> None:
    """The server down for 7 s (a recovery pass every 5 s) while ``work --drain``, whose
    lease lasts 30 s, runs a task: it goes on when the server is back, drains the queue
    and exits 0 (was: 75, from the pass's look for orphans, which nothing guarded; and
    a drain whose lease's release met a killed connection exited 75 after every task
    SUCCEEDED)."""
    if not pg_server.restartable:
        pytest.skip("FERRY_TEST_DATABASE_URL names a server the tests may not restart")
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    host.ok(
        "submit",
        "--name",
        "long",
        "--",
        *marking(marks, f"while [ ! -e {gate} ]; do sleep 0.05; done"),
    )
    host.ok("submit", "--name", "next", "--", *marking(marks))
    worker = host.start("work", "-j", "1", "--drain", "--poll", "0.1", "--lease-ttl", "30")
    wait_until(lambda: len(runs(marks)) == 1, what="the long task to start")
    pg_server.outage(7.0)
    gate.touch()
    code, err = finish(worker)
    assert code == 0, err
    tasks = host.tasks()
    assert [t["state"] for t in tasks] == ["SUCCEEDED", "SUCCEEDED"]
    assert runs(marks) == {t["id"]: 1 for t in tasks}
    assert "Traceback" not in err and "error ignored" not in err, err


@pytest.mark.crash  # (12-15 s each: tox -e soak)
@pytest.mark.parametrize(
    ("point", "reruns"),
    [
        ("after:CLAIMED", True),  # claim and intent committed, nothing spawned: released
        ("after:SPAWNED", False),  # the task runs: its supervisor finishes it
        ("before:SETTLED", False),  # the settle not sent yet (inside its transaction, on
        # the commit path): nothing committed
        ("after:SETTLED", False),  # the end committed, not yet acknowledged
    ],
)
def test_the_worker_killed_at_each_step(
    host: Ferry, pg_url: str, tmp_path: Path, point: str, reruns: bool
) -> None:
    """kill -9 of ``work`` (only it: its supervisors go on) at each step of a task's
    life on the database; then whatever a new ``work --drain`` needs to do."""
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    wait = f'while [ ! -e "{gate}" ]; do sleep 0.05; done'
    task_id = host.ok("submit", "--", *marking(marks, wait)).out.decode().strip()
    worker = host.start("work", "-j", "1", "--drain", "--poll", "0.1",
                        failpoints=f"launcher:{point}=self")  # fmt: skip
    if point != "after:CLAIMED":
        wait_until(lambda: runs(marks), what="the task to start")
    gate.touch()
    code, _ = finish(worker)
    assert code == -signal.SIGKILL
    wait_until(lambda: host.task(task_id)["state"] in ("QUEUED", "SUCCEEDED"),
               what="the supervisor to release or finish the task")  # fmt: skip
    if reruns:
        assert host.task(task_id)["state"] == "QUEUED" and not runs(marks)
        assert finish(host.start("work", "--drain", "--poll", "0.1"))[0] == 0
    task = host.task(task_id)
    assert (task["state"], task["exit_code"], task["releases"]) == ("SUCCEEDED", 0, 0)
    assert runs(marks) == {task_id: 1}
    assert len(dispatched(pg_url)) == (2 if reruns else 1)


def test_wait_and_logs_follow_ride_out_an_outage(
    host: Ferry, pg_server: PgServer, tmp_path: Path
) -> None:
    """``ferry wait ID && deploy`` through a database restarted under it (an upgrade, a
    failover): wait exited 75 at the first look that found it down, and logs -f with
    it, though the task ran on and SUCCEEDED. They say once that it cannot be reached
    and wait for it, as ``work`` does (to ``--timeout``, for wait)."""
    if not pg_server.restartable:
        pytest.skip("FERRY_TEST_DATABASE_URL names a server the tests may not restart")
    gate = tmp_path / "gate"
    task_id = host.ok(
        "submit",
        "--",
        "/bin/sh",
        "-c",
        f'echo started; while [ ! -e "{gate}" ]; do sleep 0.05; done; echo done',
    ).text.strip()
    worker = host.start("work", "--drain", "--poll", "0.1")
    waiting = host.start("wait", task_id)
    following = host.start("logs", "-f", task_id)
    try:
        wait_until(lambda: host.task(task_id)["state"] == "RUNNING", what="the task to run")
        pg_server.outage(2.0)
    finally:
        gate.touch()
    assert finish(worker)[0] == 0
    code, err = finish(waiting)
    assert code == 0 and err.count("cannot be reached") == 1, err
    assert following.stdout is not None
    code, err = finish(following)
    assert code == 0, err
