"""Bad input on a shared database (a sixteenth-session review): a home whose path is
not UTF-8, the server's refusals of a role or a database, URLs libpq refuses, host ids
that are no names. Each: one coded line, the contract's exit status, no traceback."""

from __future__ import annotations

import os
import secrets
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry
from crashkit import survivor_keeps_its_slot_under_a_new_host_id
from pgserver import PgServer

pytestmark = pytest.mark.timeout(120)


def test_a_home_not_utf8_names_its_claims_and_keeps_its_survivors(
    pg_url: str, tmp_path: Path
) -> None:
    """``work`` in a home whose path is not UTF-8 failed every claim; its claims now
    name the home losslessly (``runner.home``), so a work restarted there under a new
    host id still counts a survivor stopped before its alive-lock was made (the case
    where only ``runner.home`` tells)."""
    home = Path(os.fsdecode(os.fsencode(tmp_path) + b"/a-\xff"))
    a = Ferry(home, tmp_path)
    a.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    try:
        a.ok("db", "init")
        survivor_keeps_its_slot_under_a_new_host_id(a, tmp_path / "stamps")
    finally:
        a.close()


def _as(url: str, *, user: str | None = None, dbname: str | None = None) -> str:
    """``url`` with another user or database."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc if user is None else f"{user}@{parts.netloc.rpartition('@')[2]}"
    path = parts.path if dbname is None else f"/{dbname}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, path=path))


@pytest.fixture
def role(pg_server: PgServer, pg_url: str) -> Iterator[str]:
    """A login role of its own with no privilege on the test's database (which may
    not create tables in its schema either); dropped after the test."""
    name = f"limited_{os.getpid()}_{secrets.token_hex(3)}"
    dbname = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    pg_server.execute(f'CREATE ROLE "{name}" LOGIN')
    pg_server.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC", dbname=dbname)
    try:
        yield name
    finally:
        pg_server.execute(f'DROP OWNED BY "{name}"', dbname=dbname)
        pg_server.execute(f'DROP ROLE "{name}"')


def test_a_role_without_privileges_is_told_so_never_an_internal_error(
    pg_url: str, role: str, tmp_path: Path
) -> None:
    """A role that may not create ferry's tables (``db init``) or use them (every other
    command) met SQLSTATE 42501, InsufficientPrivilege: ``error[internal]`` (125), as a
    bug of ferry's. Now ``db.permission_denied`` (125: no retry mends it), naming what
    was refused; nothing is run or queued."""
    cli = Ferry(tmp_path / "h", tmp_path)
    cli.env.update(FERRY_DATABASE_URL=_as(pg_url, user=role), FERRY_HOST_ID="a")
    admin = Ferry(tmp_path / "admin", tmp_path)
    admin.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="admin")
    try:
        refused = cli.refused(125, "db.permission_denied", "db", "init")
        assert "permission denied for schema public" in refused.err, refused.err
        admin.ok("db", "init")
        mark = tmp_path / "ran"
        for args in (("ls",), ("db", "status"), ("submit", "--", "true"),
                     ("run", "--", "touch", str(mark)), ("work", "--drain")):  # fmt: skip
            refused = cli.refused(125, "db.permission_denied", *args)
            assert "permission denied for table" in refused.err and role in refused.err, refused
        assert not mark.exists() and admin.tasks() == []
    finally:
        cli.close()
        admin.close()


def test_a_database_or_role_that_does_not_exist_is_no_temporary_failure(
    pg_url: str, tmp_path: Path
) -> None:
    """A database or a role that does not exist was ``db.unavailable`` (75, "cannot be
    reached": cron and CI try again for ever). Now a permanent code of its own (125)."""
    cli = Ferry(tmp_path / "h", tmp_path)
    cli.env["FERRY_HOST_ID"] = "a"
    try:
        cases = ((_as(pg_url, dbname="no_such_db"), "db.no_database"),
                 (_as(pg_url, user="no_such_role"), "db.auth_failed"))  # fmt: skip
        for url, code in cases:
            for args in (("ls",), ("run", "--", "true"), ("db", "init")):
                refused = cli.refused(125, code, "--database", url, *args)
                assert "does not exist" in refused.err, refused.err
    finally:
        cli.close()


BAD_HOST_IDS = [
    os.fsdecode(b"x\xff"),  # not UTF-8: was error[internal] (UnicodeEncodeError)
    "\x1b[31mRED\x1b[0m\nline2",  # a terminal's escape, a new line: was taken, and shown raw
    "h" * 257,  # any length was taken
]


@pytest.mark.parametrize("bad", BAD_HOST_IDS, ids=["not-utf8", "control", "too-long"])
def test_a_host_id_that_is_no_name_is_a_usage_error(pg_url: str, tmp_path: Path, bad: str) -> None:
    """``FERRY_HOST_ID`` / ``--host-id`` is checked as a task's name is: printable, at
    most 256 characters. It names this host's tasks to every other host (``show``'s
    ``host``, ``db status``): another operator's terminal must not get its escapes."""
    cli = Ferry(tmp_path / "h", tmp_path)
    cli.env["FERRY_DATABASE_URL"] = pg_url
    mark = tmp_path / "ran"
    try:
        cli.ok("db", "init")
        for args in (("run", "--", "touch", str(mark)), ("ls",), ("work", "--drain")):
            cli.env["FERRY_HOST_ID"] = bad
            refused = cli.refused(2, "usage.bad_host_id", *args)
            assert "\x1b" not in refused.err and "line2" not in refused.err, refused.err
            del cli.env["FERRY_HOST_ID"]
            cli.refused(2, "usage.bad_host_id", "--host-id", bad, *args)
        assert not mark.exists() and cli.tasks() == []
        cli.env["FERRY_HOST_ID"] = "a host, named in words: ok"
        cli.ok("run", "--", "true")
        assert cli.only_task()["host"] == "a host, named in words: ok"
    finally:
        cli.close()
