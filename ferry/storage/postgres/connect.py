"""One connection to the shared database, and the database's failures as ferry's
errors: unreachable is ``db.unavailable`` (exit 75: try again), not durable is
``db.not_durable``, no schema is ``db.not_initialised``; what no retry mends has a code
of its own (:func:`refusal`): a role without a privilege it needs
(``db.permission_denied``), a database that does not exist (``db.no_database``), a
login refused (``db.auth_failed``), a value in the URL that libpq refuses
(``usage.bad_database``).

Why not psycopg_pool: its pool keeps worker threads, and ``ferry work`` forks a
supervisor per task from a loop that must stay single-threaded (a fork copies only the
forking thread; a lock another thread held stays held in the child for ever). One
connection per process, opened on first use and opened again after a failure, is all a
ferry process needs: its writes are one transaction at a time.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ferry.core.errors import DatabaseError, DatabaseUnavailableError, FerryError, UsageError

CONNECT_TIMEOUT_S = 5
# The longest a call may wait on a silent network (a partition drops packets: nothing is
# refused or reset) before its connection is given up: ``tcp_user_timeout`` (data or
# keepalive probes unanswered that long) with keepalives on. A server that is slow but
# there answers the probes: a long statement is not cut. A lease holder bounds it
# tighter, by its TTL (``bound``): it must see its lease expire in time to stop its tasks.
SILENCE_S = 10.0
# A ferry session the server finds idle inside a transaction this long is ended, its
# transaction rolled back and its locks let go: the client is paused (^Z, a frozen VM)
# or cut off mid-write (its COMMIT lost on the way). Without it the server keeps the
# locks until its own TCP keepalive gives up (about two hours by default), and every
# command that needs one (a key's, a task's row) waits for them. ferry's transactions
# are never idle but between statements of one write (milliseconds).
IDLE_IN_TRANSACTION_S = 60
_process_silence_s = SILENCE_S  # this process's bound (Database.bound)


def database_url(given: str | None) -> str | None:
    """``--database`` if given, else ``FERRY_DATABASE_URL``, else None (the local journal)."""
    url = given if given is not None else os.environ.get("FERRY_DATABASE_URL") or None
    if url is not None and not url.startswith(("postgresql://", "postgres://")):
        source = "--database" if given is not None else "FERRY_DATABASE_URL"
        raise UsageError(
            f"{source} must be a postgresql:// URL, not {url[:80]!r}", code="usage.bad_database"
        )
    return url


def host_id(given: str | None = None) -> str:
    """``--host-id``, else ``FERRY_HOST_ID``, else this machine's id (/etc/machine-id).
    One given is checked as a task's name is (``usage.bad_host_id``): it names this
    host's tasks to every other host (``show``, ``db status``), whose operator's
    terminal must get no escape from it, and it goes into the database as text."""
    from ferry.core.spec import check_text

    found = given or os.environ.get("FERRY_HOST_ID")
    if found:
        where = "--host-id" if given else "FERRY_HOST_ID"
        check_text(found, f"{where} (this host's id)", "usage.bad_host_id")
        return found
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="ascii") as f:
                machine = f.read().strip()
        except (OSError, ValueError):  # (gone, or not text: the next one)
            continue
        if machine and machine.isprintable():
            return machine
    return os.uname().nodename


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as error:
        raise UsageError(
            "a database needs the postgres extra: pip install 'ferry[postgres]'",
            code="usage.no_postgres_driver",
        ) from error
    # psycopg logs what it ignores (a ROLLBACK on a connection the server killed: "error
    # ignored in rollback of ..."); with no handler, Python printed it on stderr, not a
    # line of ferry's. What ferry must say, it says with its own error.
    import logging

    logger = logging.getLogger("psycopg")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return psycopg


def _json_codec(conn: Any) -> None:
    """In a process that handles many records (``work``: ``journal._json.bulk``), JSON
    to and from the server by orjson, not psycopg's default (the standard library's):
    the same documents, a fraction of a worker's CPU. (Not ``journal._json``'s own
    standard-library mode: its checks, which make it refuse what orjson refuses, cost
    a short command more than the server's check of the same document.)"""
    from journal import _json

    if _json.in_bulk():
        from psycopg.types.json import set_json_dumps, set_json_loads

        set_json_dumps(_json.dumps, conn)
        set_json_loads(_json.loads, conn)


def _check_url(psycopg: Any, url: str) -> None:
    """A URL libpq cannot parse (an unclosed ``[``, a bad ``%`` escape, a space, an
    unknown parameter) is bad input, refused before any connection: ``connect`` would
    raise ProgrammingError, which is no failure of the database's."""
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as error:
        where = _redacted(url)
        first = str(error).strip().splitlines()[0].replace(url, where) if str(error) else ""
        first = _scrubbed(first, url)
        raise UsageError(
            f"{_given_as(url)} {where!r} is not a valid URL: {first}",
            code="usage.bad_database",
            details={"database": where},
        ) from None


def _given_as(url: str) -> str:
    """How the user gave ``url``: the variable, or the option (which wins)."""
    return "FERRY_DATABASE_URL" if os.environ.get("FERRY_DATABASE_URL") == url else "--database"


# What went wrong, by the server's SQLSTATE, where it is not the connection itself.
_WHAT_FAILED = {
    "25006": "takes no writes now",  # read_only_sql_transaction
    "55P03": "a lock it needs is held by another session",  # lock_timeout (Database.bound)
    "40P01": "found this write in a deadlock with another session's, and cancelled it",
    "57014": "cancelled a statement (past ferry's bound, or by an administrator)",
    "25P03": "ended this session, idle inside a transaction",  # (paused past the bound)
    # (out_of_memory: mostly its lock table, max_locks_per_transaction x max_connections
    # entries shared by every session; ferry's own writes take a bounded number)
    "53200": "is out of shared memory (its lock table is full: other sessions hold many"
    " locks; max_locks_per_transaction and max_connections size it)",
}


# What no retry mends, by SQLSTATE: its code. The role, the URL or
# the database must change; a cron job or CI that retries 75 would retry for ever.
_REFUSED = {
    "42501": "db.permission_denied",  # insufficient_privilege
    "3D000": "db.no_database",  # invalid_catalog_name
    "28000": "db.auth_failed",  # invalid_authorization_specification (no such role...)
    "28P01": "db.auth_failed",  # invalid_password
}
# The same refusals when the connection is made: the driver has no SQLSTATE for a
# failed connection, only the server's words (in English: a server that speaks another
# language still gets db.unavailable).
_REFUSED_SAYING = (
    (r'FATAL:\s+database ".*" does not exist', "3D000"),
    (r'FATAL:\s+role ".*" does not exist', "28000"),
    (r'FATAL:\s+role ".*" is not permitted to log in', "28000"),
    (r"FATAL:\s+no pg_hba\.conf entry", "28000"),
    (r"FATAL:\s+.*authentication failed for user", "28P01"),
    (r"fe_sendauth: no password supplied", "28P01"),  # (the server asks for one)
)
# libpq's own refusal of a value in the URL (a port out of range or not a number, an
# sslmode or target_session_attrs it does not know): said before any connection.
_BAD_VALUE = r'\binvalid (?:port number|integer value|"?\w+"? value)'
# The server's refusal of a setting the URL's options (or PGOPTIONS) gave it.
_BAD_OPTION = r"FATAL:\s+(?:unrecognized configuration parameter|invalid value for parameter)"
_GRANTS = (
    "grant it USAGE on the schema, and SELECT, INSERT, UPDATE, DELETE on ferry's tables"
    " and USAGE on its sequences; 'db init' also needs CREATE on the schema"
    " (docs/postgres.md)"
)


def refusal(error: Exception, url: str) -> FerryError | None:
    """The error, if the database's failure is one no retry mends (``_REFUSED``, by
    its SQLSTATE or, for a connection, by the server's words), or a value of the URL
    libpq refuses (``usage.bad_database``); None: something else (``unavailable``,
    or a bug)."""
    import re

    where = _redacted(url)
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    sqlstate = getattr(error, "sqlstate", None) or ""
    if sqlstate not in _REFUSED:
        if re.search(_BAD_VALUE, first) and "FATAL:" not in first:
            return UsageError(
                f"{_given_as(url)} {where!r} is not a valid URL: {first}",
                code="usage.bad_database",
                details={"database": where},
            )
        if re.search(_BAD_OPTION, first):
            return UsageError(
                f"{_given_as(url)} {where!r}: the server refuses a setting of its options (or"
                f" of PGOPTIONS): {first}",
                code="usage.bad_database",
                details={"database": where},
            )
        said = (state for pattern, state in _REFUSED_SAYING if re.search(pattern, first))
        sqlstate = next(said, "")
    if sqlstate not in _REFUSED:
        return None
    code = _REFUSED[sqlstate]
    role = _role_of(url)
    role = f"role {role}" if role else "the role"
    if code == "db.permission_denied":
        message = f"the database {where} refuses {role} a privilege ferry needs: {first}; {_GRANTS}"
    elif code == "db.no_database":
        message = f"the database {where} does not exist: {first}"
    else:
        message = f"the database {where} refuses the login of {role}: {first}"
    return DatabaseError(message, code=code, details={"database": where, "sqlstate": sqlstate})


def _role_of(url: str) -> str | None:
    """The role a postgresql:// URL names (None: libpq's default, the login name)."""
    import urllib.parse

    try:
        return urllib.parse.urlsplit(url).username
    except ValueError:
        return None


def _unavailable_errors(psycopg: Any) -> tuple[type[Exception], ...]:
    """The driver's errors that mean "not now" (``unavailable``): a connection lost or
    refused, or a bound of ferry's own that cut a wait (OperationalError: lock and
    statement timeouts too), a read-only server, a session ended idle in a transaction
    (both InternalError, for the driver)."""
    errors = psycopg.errors
    return (
        psycopg.OperationalError,
        errors.AdminShutdown,
        errors.ReadOnlySqlTransaction,
        errors.IdleInTransactionSessionTimeout,
    )


def _refused_errors(psycopg: Any) -> tuple[type[Exception], ...]:
    """The driver's errors of a statement that no retry mends (``_REFUSED``)."""
    errors = psycopg.errors
    return (
        errors.InsufficientPrivilege,
        errors.InvalidCatalogName,
        errors.InvalidAuthorizationSpecification,
        errors.InvalidPassword,
    )


def unavailable(error: Exception, url: str) -> DatabaseUnavailableError:
    """``db.unavailable`` (75): what was to be written waits (a supervisor keeps a
    task's end), and the message says why, by the server's SQLSTATE (``_WHAT_FAILED``):
    out of reach, read-only (a standby after a failover), or a wait cut at ferry's
    bound."""
    where = _redacted(url)
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    what = _WHAT_FAILED.get(getattr(error, "sqlstate", None) or "", "cannot be reached")
    return DatabaseUnavailableError(
        f"the database {where} {what}: {first}", details={"database": where}
    )


def _redacted(url: str) -> str:
    """The URL without its passwords (``user:password@``, ``?password=``), cut as libpq
    reads them (a ``?`` in a password is the password's)."""
    import re

    scheme, sep, rest = url.partition("://")
    rest = re.sub(r"^([^:/@]*):[^/]*@", r"\1@", rest)
    rest = re.sub(r"([?&])password=[^&]*", r"\1password=***", rest)
    for secret in _passwords(url):  # (one the patterns missed, where libpq found it)
        rest = rest.replace(f":{secret}@", "@")
    return f"{scheme}{sep}{rest}"


def _scrubbed(text: str, url: str) -> str:
    """``text``, libpq's words about a URL it could not parse (they quote the part
    that failed), with each of the URL's passwords shown as ``***``."""
    for secret in _passwords(url):
        text = text.replace(secret, "***")
    return text


def _passwords(url: str) -> list[str]:
    """The URL's passwords, as libpq reads them and as written (encoded or not),
    longest first."""
    import re
    import urllib.parse

    rest = url.partition("://")[2]
    found = re.findall(r"(?:^|[?&])password=([^&]*)", rest.partition("?")[2])
    found += re.findall(r"^[^:/@]*:([^/]*)@", rest)
    with contextlib.suppress(Exception):  # (a URL libpq cannot parse: what is written)
        from psycopg.conninfo import conninfo_to_dict

        found.append(str(conninfo_to_dict(url).get("password") or ""))
    every = {*found, *map(urllib.parse.unquote, found)} - {""}
    return sorted(every, key=len, reverse=True)


def application_name(pid: int, host: str) -> str:
    """The name a ferry process's connection carries (``pg_stat_activity``): its pid and
    host. A claim whose answer was lost is known once no connection of its writer but
    the asker's own is open (``PgStore.claimed_with``). (Cut to the server's 63 bytes.)"""
    return f"ferry {pid}@{host}".encode()[:63].decode(errors="ignore")


class Database:
    """A connection opened on first use, reopened after a failure. ``run`` maps the
    driver's errors: a lost or refused connection is ``db.unavailable``. ``host``: the
    host id, for the connection's name (``application_name``)."""

    def __init__(self, url: str, host: str = "") -> None:
        self.url = url
        self.host = host
        self.silence_s = _process_silence_s
        self.statements_bound = False  # every statement cut after silence_s (bound_statements)
        self.locks_bound = False  # every wait for a lock cut after silence_s (bound)
        self._conn: Any = None
        self._psycopg = _psycopg()
        _check_url(self._psycopg, url)

    def bound(self, silence_s: float) -> None:
        """Give a connection up after ``silence_s`` of silence (no tighter than 1 s), from
        the next connection on (an open one is closed). For every connection this
        process opens from now on too, and its forks': a supervisor forked by a lease
        holder must see the lease expire as soon as its launcher would. And on this
        one, a wait for a lock is cut after the bound too (``lock_timeout``:
        ``db.unavailable``, and the caller goes on): a lease holder must renew whatever
        another session holds (a client paused between its FOR UPDATE and its COMMIT),
        and the network's bound does not cover a lock wait."""
        global _process_silence_s
        silence_s = max(1.0, silence_s)
        _process_silence_s = min(_process_silence_s, silence_s)
        if silence_s < self.silence_s or not self.locks_bound:
            self.silence_s = min(self.silence_s, silence_s)
            self.locks_bound = True
            self.close()

    def bound_statements(self) -> None:
        """Cut every statement after the silence bound too, a wait for a lock included
        (``statement_timeout``: ``db.unavailable``), from the next connection on: for a
        process whose calls must end in time whatever the server does (a supervisor).
        A lock held by a session whose client vanished is kept until the server sees it
        gone, and the network's bound does not cover that wait."""
        if not self.statements_bound:
            self.statements_bound = True
            self.close()

    @contextmanager
    def mapped(self) -> Iterator[None]:
        """The driver's errors inside as ferry's: what no retry mends (:func:`refusal`),
        else ``db.unavailable`` for what means "not now" (the connection is dropped, and
        opened again next time). For calls on :meth:`connection` itself (``db init``'s
        migration, a schema's version, ``db status``)."""
        psycopg = self._psycopg
        try:
            yield
        except _unavailable_errors(psycopg) as error:
            self.close()
            raise (refusal(error, self.url) or unavailable(error, self.url)) from error
        except _refused_errors(psycopg) as error:
            raise (refusal(error, self.url) or unavailable(error, self.url)) from error

    def connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            try:
                silence_s = self.silence_s
                self._conn = self._psycopg.connect(
                    self.url, autocommit=True, options=self._options(silence_s),
                    # (libpq: whole seconds, at least 2)
                    connect_timeout=max(2, min(CONNECT_TIMEOUT_S, math.ceil(silence_s))),
                    keepalives=1, keepalives_idle=max(1, int(silence_s / 3)),
                    keepalives_interval=1, keepalives_count=3,
                    tcp_user_timeout=int(silence_s * 1000),
                    application_name=application_name(os.getpid(), self.host),
                )  # fmt: skip
            except self._psycopg.OperationalError as error:
                raise (refusal(error, self.url) or unavailable(error, self.url)) from error
            _json_codec(self._conn)
            try:
                with self.mapped():
                    self._check_durable(self._conn)
            except BaseException:
                self.close()
                raise
        return self._conn

    def _options(self, silence_s: float) -> str:
        """The session's settings: the URL's own ``options`` (else ``PGOPTIONS``: a
        schema per fleet, say), then ferry's, which win. READ COMMITTED whatever the
        database's default (a statement that waited for a key's or a group's lock
        must see what its holder committed: a snapshot taken before the wait, as
        REPEATABLE READ takes, queued a second task of a key); jit off (ferry's
        statements are short, and planned each time: one past jit_above_cost spent a
        second compiling what runs in a millisecond); no statement or lock timeout but
        ferry's own bound (a role's, set for its interactive users, cut every command)."""
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(self.url).get("options") or os.environ.get("PGOPTIONS", "")
        bound_ms = int(silence_s * 1000)
        return (
            f"{given} -c jit=off -c default_transaction_isolation=read\\ committed"
            f" -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S}s"
            f" -c statement_timeout={bound_ms if self.statements_bound else 0}"
            f" -c lock_timeout={bound_ms if self.locks_bound and not self.statements_bound else 0}"
        ).strip()

    @contextmanager
    def transaction(self, *, rollback: bool = False) -> Iterator[Any]:
        """A transaction; the connection is dropped (and reopened next time) when the
        server or the network failed under it. A commit whose answer was lost is
        unknown: the caller reads back what it wrote (claims carry client-made tokens).
        ``rollback``: rolled back at the end, for a read that takes row locks only to
        hold them while it runs (committing them would wait for a WAL flush)."""
        conn = self.connection()
        with self.mapped(), conn.transaction(force_rollback=rollback):
            yield conn

    def execute(self, sql: str, params: Any = None) -> Any:
        """One statement outside any transaction (autocommit), with the errors mapped."""
        with self.mapped():
            return self.connection().execute(sql, params)

    def check_durable(self) -> None:
        """Refuse a database that may lose a commit it acknowledged (``db.not_durable``):
        checked on every connection this process opens (``_check_durable``)."""
        with self.mapped():
            self.connection()

    def _check_durable(self, conn: Any) -> None:
        """``fsync`` off, or ``synchronous_commit`` off (``local`` with synchronous
        standbys configured is fine: that still flushes the local WAL), is refused;
        and the session keeps the ``synchronous_commit`` it was checked with (pinned:
        a configuration reloaded later, ``ALTER SYSTEM SET synchronous_commit = off``,
        does not reach it)."""
        fsync, commit = conn.execute(
            "SELECT current_setting('fsync'),"
            " set_config('synchronous_commit', current_setting('synchronous_commit'), false)"
        ).fetchone()
        if fsync != "on" or commit == "off":
            raise DatabaseError(
                f"the database {_redacted(self.url)} is not durable (fsync={fsync},"
                f" synchronous_commit={commit}): an acknowledged commit could be lost in a"
                " crash, and ferry records its intent there before every spawn; turn both on",
                code="db.not_durable",
                details={"fsync": fsync, "synchronous_commit": commit},
            )

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # (a broken connection closes as it can)
                self._conn.close()
            self._conn = None
