"""What ``db.unavailable`` says, by the server's error (pure: no server). A lock wait cut
by ferry's own bound was reported as "cannot be reached", which sent operators to look
at the network (found by a review)."""

from __future__ import annotations

import pytest

from ferry.storage.postgres.connect import refusal, unavailable

URL = "postgresql://ferry:secret@db.example/ferry"


class _ServerError(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("sqlstate", "says"),
    [
        (None, "cannot be reached"),
        ("08006", "cannot be reached"),
        ("25006", "takes no writes now"),
        ("55P03", "a lock it needs is held by another session"),
        ("57014", "cancelled a statement (past ferry's bound, or by an administrator)"),
        ("25P03", "ended this session, idle inside a transaction"),
        (
            "53200",
            "is out of shared memory (its lock table is full: other sessions hold many"
            " locks; max_locks_per_transaction and max_connections size it)",
        ),
    ],
)
def test_the_message_says_what_the_server_said(sqlstate: str | None, says: str) -> None:
    error = unavailable(_ServerError("the server's own words", sqlstate), URL)
    assert error.code == "db.unavailable"
    assert error.message == (
        f"the database postgresql://ferry@db.example/ferry {says}: the server's own words"
    )


@pytest.mark.parametrize(
    ("sqlstate", "text", "code"),
    [
        ("42501", "permission denied for table ferry_meta", "db.permission_denied"),
        ("3D000", 'database "x" does not exist', "db.no_database"),
        ("28000", 'role "x" does not exist', "db.auth_failed"),
        ("28P01", 'password authentication failed for user "ferry"', "db.auth_failed"),
        # a connection that failed: no SQLSTATE, the server's words
        (None, 'connection failed: ... failed: FATAL:  database "x" does not exist',
         "db.no_database"),
        (None, 'connection failed: ... failed: FATAL:  role "x" does not exist', "db.auth_failed"),
        (None, 'connection failed: ... FATAL:  password authentication failed for user "ferry"',
         "db.auth_failed"),
        (None, 'connection failed: ... FATAL:  no pg_hba.conf entry for host "10.0.0.1"',
         "db.auth_failed"),
        (None, 'connection failed: ... FATAL:  role "x" is not permitted to log in',
         "db.auth_failed"),
        # libpq's refusal of a value of the URL
        (None, 'connection is bad: invalid port number: "99999"', "usage.bad_database"),
        (None, 'connection is bad: invalid integer value "abc" for connection option "port"',
         "usage.bad_database"),
        (None, 'connection is bad: invalid sslmode value: "bogus"', "usage.bad_database"),
        (None, 'connection is bad: invalid "ssl_min_protocol_version" value: "bogus"',
         "usage.bad_database"),
    ],
)  # fmt: skip
def test_what_no_retry_mends_has_a_code_of_its_own(
    sqlstate: str | None, text: str, code: str
) -> None:
    """A role without a privilege (42501) was ``internal``; a database or role that does
    not exist, a refused login, a port out of range were ``db.unavailable`` (75: "try
    again later", for ever, under cron or CI). Found by a review (sixteenth session)."""
    error = refusal(_ServerError(text, sqlstate), URL)
    assert error is not None and error.code == code
    assert error.exit_code == (2 if code.startswith("usage.") else 125)
    assert "secret" not in error.message and text.splitlines()[0] in error.message


@pytest.mark.parametrize(
    "text",
    [
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused',
        "failed to resolve host 'db.example': [Errno -3] Temporary failure in name resolution",
        "connection failed: ... FATAL:  the database system is starting up",
        "connection failed: ... FATAL:  sorry, too many clients already",
    ],
)
def test_what_may_pass_is_still_unavailable(text: str) -> None:
    assert refusal(_ServerError(text, None), URL) is None


def test_what_psycopg_logs_does_not_reach_stderr() -> None:
    """psycopg logs what it ignores ("error ignored in rollback of ..." on a connection
    the server killed); with no handler, Python printed it on stderr, beside ferry's
    coded error (found by a review). A process of its own: the logging setup is global."""
    import subprocess
    import sys

    script = (
        "import logging\n"
        "from ferry.storage.postgres.connect import _psycopg\n"
        "_psycopg(); _psycopg()\n"
        "logging.getLogger('psycopg.transaction').warning('error ignored in rollback')\n"
        "assert len(logging.getLogger('psycopg').handlers) == 1\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
