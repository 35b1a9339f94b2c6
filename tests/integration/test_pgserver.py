"""The PostgreSQL test server itself (tests/pgserver.py, the pg_server and pg_url
fixtures): a database per test, empty and isolated; durable settings; a crash restart;
many connections at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pgserver
import psycopg
import pytest
from pgserver import PgServer

USER_TABLES_SQL = (
    "SELECT count(*) FROM pg_catalog.pg_class c"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
)

RECOVERY_LOG_LINE = "database system was not properly shut down; automatic recovery in progress"


def _user_relations(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(USER_TABLES_SQL).fetchone()
        assert row is not None
        count: int = row[0]
        return count


def test_a_test_using_the_server_is_marked_postgres(
    pg_url: str, request: pytest.FixtureRequest
) -> None:
    # Set by tests/conftest.py for every test whose fixtures include pg_server, so that
    # `-m "not postgres"` leaves them all out.
    assert request.node.get_closest_marker("postgres") is not None


def test_a_test_not_using_the_server_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("postgres") is None


def test_a_fresh_database_is_empty_and_isolated(pg_server: PgServer, pg_url: str) -> None:
    assert _user_relations(pg_url) == 0
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
    assert _user_relations(pg_url) == 1

    # A database made after that one has been written is still empty (the template
    # was not touched), and the first one's table is not visible from it.
    other = pg_server.create_database()
    try:
        assert pg_server.url(other) != pg_url
        assert _user_relations(pg_server.url(other)) == 0
        with (
            psycopg.connect(pg_server.url(other)) as conn,
            pytest.raises(psycopg.errors.UndefinedTable),
        ):
            conn.execute("SELECT * FROM t")
    finally:
        pg_server.drop_database(other)


def test_each_test_has_its_own_database(pg_server: PgServer, pg_url: str) -> None:
    names = {pg_url, *(pg_server.url(pg_server.create_database()) for _ in range(3))}
    assert len(names) == 4
    for url in names - {pg_url}:
        pg_server.drop_database(url.rsplit("/", 1)[1])


def test_the_server_is_durable(pg_url: str) -> None:
    # ferry refuses a database that is not (db.not_durable); the tests must not run on one.
    with psycopg.connect(pg_url) as conn:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()
            for name in ("fsync", "synchronous_commit", "full_page_writes")
        }
    assert settings == {name: ("on",) for name in settings}


def test_an_immediate_restart_keeps_committed_data_and_accepts_new_connections(
    pg_server: PgServer, pg_url: str
) -> None:
    if not pg_server.restartable:
        pytest.skip("FERRY_TEST_DATABASE_URL names a server the tests may not restart")
    log = pg_server.log_path
    assert log is not None
    recoveries_before = log.read_text().count(RECOVERY_LOG_LINE)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (42)")
    survivor = psycopg.connect(pg_url)
    try:
        pg_server.restart("immediate")
        # The connection made before the crash is gone with its backend...
        with pytest.raises(psycopg.OperationalError):
            survivor.execute("SELECT 1")
    finally:
        survivor.close()
    # ...a new one works, and what was committed before the crash is there.
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(42,)]
    # It was a crash: the server recovered from its WAL at the start.
    assert log.read_text().count(RECOVERY_LOG_LINE) == recoveries_before + 1


def test_twenty_connections_at_once(pg_url: str) -> None:
    connections = 20
    all_open = threading.Barrier(connections, timeout=30)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (worker int PRIMARY KEY)")

    def work(worker: int) -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            all_open.wait()  # every connection is open at this point
            conn.execute("INSERT INTO t VALUES (%s)", (worker,))
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchone()
            all_open.wait()  # nobody closes before everyone has counted
            assert row is not None
            count: int = row[0]
            return count

    with ThreadPoolExecutor(connections) as pool:
        seen = list(pool.map(work, range(connections)))
    assert min(seen) >= connections
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (connections,)


LEAKING_SESSION = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import pgserver
server = pgserver.PgServer.start()
print(server.log_path.parent, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # a session killed before its teardown
"""


@pytest.mark.postgres
def test_a_server_leaked_by_a_killed_session_is_stopped_and_removed_by_the_next() -> None:
    tests_dir = str(Path(pgserver.__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", LEAKING_SESSION, tests_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    root = Path(proc.stdout.strip())
    postmaster_pid = int((root / "data" / "postmaster.pid").read_text().split()[0])
    assert pgserver._is_running(postmaster_pid)  # leaked: it outlived its session

    assert root in pgserver.sweep_leaked()
    assert not root.exists()
    assert not pgserver._is_running(postmaster_pid)
