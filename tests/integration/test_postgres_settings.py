"""What a database's own settings, or its URL's, may not change in ferry (a review of
operating ferry on PostgreSQL): its sessions run at READ COMMITTED whatever the
database's default (the key and group-limit rules rely on it), a URL's ``options``
(a schema per fleet) are kept, a role's ``statement_timeout`` does not make every
command 75, a password never shows, and a table that is not ferry's is said so."""

from __future__ import annotations

import os
import signal
import urllib.parse
from pathlib import Path

import psycopg
import pytest
from clikit import Ferry, finish, wait_stopped, wait_until

pytestmark = pytest.mark.timeout(120)


def host(tmp_path: Path, name: str, url: str) -> Ferry:
    ferry = Ferry(tmp_path / name)
    ferry.env.update(FERRY_DATABASE_URL=url, FERRY_HOST_ID=name)
    return ferry


def sql(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def waiting_for_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        ).fetchone()
    return bool(row and row[0])


def test_the_key_rule_holds_on_a_database_whose_default_isolation_is_repeatable_read(
    pg_url: str, tmp_path: Path
) -> None:
    """``ALTER DATABASE ... SET default_transaction_isolation = 'repeatable read'``: the
    second ``submit --key K``, waiting for the key's lock while the first one's write
    was open, took its snapshot before the lock and queued a second task of the key."""
    a, b = host(tmp_path, "a", pg_url), host(tmp_path, "b", pg_url)
    a.ok("db", "init")
    name = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    sql(pg_url, f"ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'")
    first = a.start("submit", "--key", "K", "--", "true", failpoints="before:SUBMITTED=stop")
    try:
        wait_stopped(first, what="the first submit inside its write")
        second = b.start("submit", "--key", "K", "--", "true")
        wait_until(lambda: waiting_for_a_lock(pg_url), what="the second to wait for the key")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert finish(first)[0] == 0
    code, err = finish(second)
    assert code == 75 and "task.key_in_flight" in err, err
    assert len(a.tasks()) == 1


def test_a_url_s_options_are_kept_so_two_fleets_share_a_server_in_two_schemas(
    pg_url: str, tmp_path: Path
) -> None:
    """``?options=-csearch_path%3Dfleet1``: ferry's own options replaced the URL's (and
    PGOPTIONS), so both fleets' tables were made in ``public`` and each ran the
    other's tasks."""
    for schema in ("fleet1", "fleet2"):
        sql(pg_url, f"CREATE SCHEMA {schema}")
    fleets = {
        schema: host(tmp_path, schema, f"{pg_url}?options=-csearch_path%3D{schema}")
        for schema in ("fleet1", "fleet2")
    }
    for ferry in fleets.values():
        assert ferry.ok("--json", "db", "init").json()["created"]
    fleets["fleet1"].ok("submit", "--", "true")
    assert fleets["fleet2"].tasks() == [] and len(fleets["fleet1"].tasks()) == 1
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'ferry_tasks'"
            " AND schemaname IN ('fleet1', 'fleet2')"
        ).fetchone()
    assert row == (2,)


def test_a_role_s_tiny_statement_timeout_does_not_cut_ferry_s_statements(
    pg_url: str, tmp_path: Path
) -> None:
    """A role or database with ``statement_timeout = 1ms`` (set for interactive users):
    every submit, ls and work was ``db.unavailable`` (75), for ever. ferry's sessions
    bound what they wait for themselves (a supervisor's, a lease holder's)."""
    a = host(tmp_path, "a", pg_url)
    a.ok("db", "init")
    name = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    sql(pg_url, f"ALTER DATABASE {name} SET statement_timeout = '1ms'")
    a.ok("submit", "--", "true")
    a.ok("work", "--drain")
    assert [t["state"] for t in a.tasks()] == ["SUCCEEDED"]


def test_a_password_never_shows_in_an_error(pg_url: str, tmp_path: Path) -> None:
    """A password given as ``?password=`` was printed in the error line and its
    details; one libpq refuses to parse, quoted in the message."""
    parts = urllib.parse.urlsplit(pg_url)
    secret = "S3cretPW"
    given = [
        f"{pg_url}_missing?password={secret}",  # (no such database: a refusal)
        f"postgresql://app:{secret}@127.0.0.1:1/x?password={secret}",  # (nothing there)
        f"postgresql://app@{parts.hostname}:{parts.port}/x?password={secret}%ZZ",  # (bad %)
    ]
    for url in given:
        result = host(tmp_path, "a", url)("--json", "ls")
        assert result.code in (2, 75, 125) and result.error_code(), result
        assert secret not in result.err and secret.encode() not in result.out, result


def test_a_table_of_another_application_is_said_not_ferry_s(pg_url: str, tmp_path: Path) -> None:
    """A database whose ``ferry_meta`` is another application's: every command said
    ``error[internal]: UndefinedColumn``."""
    sql(pg_url, "CREATE TABLE ferry_meta (id int PRIMARY KEY, note text)")
    a = host(tmp_path, "a", pg_url)
    for args in (("ls",), ("db", "status"), ("db", "init")):
        result = a.refused(125, "db.not_ferry", *args)
        assert "ferry_meta" in result.err, result


def test_db_init_leaves_a_newer_schema_and_names_what_is_in_its_way(
    pg_url: str, tmp_path: Path
) -> None:
    """``db init`` against a schema newer than this ferry's said "schema version 8 (was
    9)" and exited 0, changing nothing; another application's table of a ferry name,
    or a search_path naming no schema, was ``error[internal]``."""
    a = host(tmp_path, "a", pg_url)
    a.ok("db", "init")
    sql(pg_url, "UPDATE ferry_meta SET value = '99' WHERE key = 'version'")
    refused = a.refused(125, "db.version", "db", "init")
    assert "upgrade ferry" in refused.err, refused.err
    sql(pg_url, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    sql(pg_url, "CREATE TABLE ferry_tasks (id int)")
    assert "ferry_tasks" in a.refused(125, "db.not_ferry", "db", "init").err
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('ferry_meta')").fetchone() == (None,)
    elsewhere = host(tmp_path, "b", f"{pg_url}?options=-csearch_path%3Dnowhere")
    assert "CREATE SCHEMA" in elsewhere.refused(125, "db.no_schema", "db", "init").err


def test_a_password_libpq_reads_is_never_shown_and_never_changes_what_an_error_is(
    pg_url: str, tmp_path: Path
) -> None:
    """A second review: a ``?`` in a password (the password's, for libpq) left it in
    the message; a password that is a common word (``postgres``, ``a``) was blanked
    out of the server's words, which then no longer said what they meant (a missing
    database became 75, retried for ever)."""
    parts = urllib.parse.urlsplit(pg_url)
    for secret in ("pa?ss", "postgres", "a"):
        url = f"postgresql://postgres:{secret}@{parts.hostname}:{parts.port}/no_such_db"
        result = host(tmp_path, "a", url)("--json", "ls")
        assert result.error_code() == "db.no_database" and result.code == 125, result
        shown = result.err + result.out.decode()
        assert f"postgres:{secret}@" not in shown and "postgresql://postgres@" in shown, shown


def test_a_setting_the_server_refuses_in_the_url_s_options_is_bad_input(
    pg_url: str, tmp_path: Path
) -> None:
    """``?options=-c no_such_param=1`` (or PGOPTIONS): the server's refusal was
    ``db.unavailable`` (75), which no retry mends."""
    result = host(tmp_path, "a", f"{pg_url}?options=-cno_such_param%3D1")("ls")
    assert (result.code, result.error_code()) == (2, "usage.bad_database"), result
    assert "no_such_param" in result.err
