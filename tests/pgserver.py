"""A private PostgreSQL server for tests: ``initdb`` into a temporary directory, start it
with ``pg_ctl`` on a free port of 127.0.0.1 and a private unix socket directory, hand
out a fresh database per test, stop it and remove everything.

No pytest here (``tests/conftest.py`` wraps it in fixtures), and psycopg is imported only
when a server is used, so the rest of the suite runs without the ``postgres`` extra.

If ``FERRY_TEST_DATABASE_URL`` is set, ``PgServer.from_environment`` uses that server
instead: databases are created on it (and dropped again at ``stop``), but it cannot be
restarted (``restartable`` is false).

Durability settings stay as in production (``fsync``, ``synchronous_commit`` and
``full_page_writes`` on): ferry refuses a database that says it is not durable, and the
tests must see what a user's server does. Only ``initdb`` runs with ``--no-sync``: its
files belong to a throwaway cluster that no test expects to survive a power cut.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DATABASE_URL_ENV = "FERRY_TEST_DATABASE_URL"
BINDIR_ENV = "FERRY_TEST_PG_BINDIR"
SUPERUSER = "postgres"
MAINTENANCE_DB = "postgres"
# A unix socket path is at most 107 bytes on Linux; the server adds "/.s.PGSQL.NNNNN".
SOCKET_PATH_BYTES_MAX = 107 - len("/.s.PGSQL.65535")
START_ATTEMPTS = 3  # a free port can be taken by someone else before the server binds it
PG_CTL_TIMEOUT_S = 60
ROOT_PREFIX = "ferry-pg-"  # each private cluster's temporary directory
SOCKET_PREFIX = "ferry-pgs-"  # a socket directory apart, if the temporary path is too long
OWNER_FILE = "owner"  # in it: host, pid of the process that made it, socket directory

# Appended to postgresql.conf. fsync, synchronous_commit and full_page_writes are the
# defaults; they are written out so that nobody "speeds up" the tests by turning them
# off (ferry refuses such a server: db.not_durable).
_SETTINGS_MARKER = "\n# ---- ferry test server (tests/pgserver.py) ----\n"
_SETTINGS = """listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
max_connections = 200
shared_buffers = 32MB
fsync = on
synchronous_commit = on
full_page_writes = on
timezone = 'UTC'
log_timezone = 'UTC'
log_line_prefix = '%m [%p] %q%u@%d '
"""


class PgServerError(RuntimeError):
    """The test server could not be found, started or used; the message says why."""


def find_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: $FERRY_TEST_PG_BINDIR,
    else ``pg_config --bindir`` (if it holds them: libpq-dev's pg_config says /usr/bin,
    which does not), else the newest /usr/lib/postgresql/*/bin, else where ``pg_ctl`` on
    the PATH really lives."""
    candidates: list[Path] = []
    override = os.environ.get(BINDIR_ENV)
    if override:
        if not _has_server_binaries(Path(override)):
            raise PgServerError(f"${BINDIR_ENV}={override} holds no initdb/pg_ctl/postgres")
        return Path(override)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    candidates.extend(_debian_bindirs())
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        candidates.append(Path(pg_ctl).resolve().parent)
    for bindir in candidates:
        if _has_server_binaries(bindir):
            return bindir
    raise PgServerError(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found: not in "
        "`pg_config --bindir`, /usr/lib/postgresql/*/bin or next to pg_ctl on the PATH; "
        "install them (Debian: apt-get install postgresql; .ci/run does) or set "
        f"${DATABASE_URL_ENV} to a server the tests may create databases on"
    )


def _debian_bindirs() -> list[Path]:
    root = Path("/usr/lib/postgresql")
    found: list[tuple[tuple[int, ...], Path]] = []
    if root.is_dir():
        for entry in root.iterdir():
            numbers = tuple(int(n) for n in re.findall(r"\d+", entry.name))
            if numbers:
                found.append((numbers, entry / "bin"))
    return [path for _, path in sorted(found, reverse=True)]


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _clean_env() -> dict[str, str]:
    # PGDATA, PGPORT, PGHOST... from the developer's shell must not redirect the server.
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


class _Cluster:
    """A private cluster on disk: its directory, binaries and the account it runs as."""

    def __init__(
        self,
        root: Path,
        bindir: Path,
        owner: pwd.struct_passwd | None,
        socket_dir: Path,
    ) -> None:
        self.root = root
        self.bindir = bindir
        self.owner = owner
        self.data = root / "data"
        self.socket_dir = socket_dir
        self.log_path = root / "server.log"
        self.port = 0

    @classmethod
    def create(cls, bindir: Path) -> _Cluster:
        """A new temporary directory with an initdb'ed cluster in it (not started)."""
        root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))
        try:
            owner = _server_owner()
            socket_dir = root / "sock"
            socket_dir.mkdir()
            if len(os.fsencode(socket_dir)) > SOCKET_PATH_BYTES_MAX:
                socket_dir.rmdir()
                socket_dir = Path(tempfile.mkdtemp(prefix=SOCKET_PREFIX, dir="/tmp"))
            # Who made it, so that a later session can remove it if we die without
            # stopping it (SIGKILL, os._exit): see sweep_leaked.
            (root / OWNER_FILE).write_text(f"{socket.gethostname()}\n{os.getpid()}\n{socket_dir}\n")
            if owner is not None:
                for path in (root, socket_dir):
                    _check_reachable(path, owner)
                    os.chown(path, owner.pw_uid, owner.pw_gid)
            cluster = cls(root, bindir, owner, socket_dir)
            cluster.run(
                "initdb",
                "--pgdata",
                str(cluster.data),
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            )
        except BaseException:
            _remove_tree(root)
            raise
        return cluster

    @classmethod
    def sweep_leaked(cls) -> list[Path]:
        """Stop and remove the clusters left in the temporary directory by test sessions
        of this host that died without stopping them (a pytest killed by SIGKILL keeps its
        postmaster running for ever otherwise). Only those whose owner file names this
        host and a process that no longer runs; what was removed."""
        removed: list[Path] = []
        for root in Path(tempfile.gettempdir()).glob(ROOT_PREFIX + "*"):
            try:
                host, pid_text, socket_dir = (root / OWNER_FILE).read_text().splitlines()[:3]
                pid = int(pid_text)
            except (OSError, ValueError):
                continue  # not ours, or still being made
            if host != socket.gethostname() or pid == os.getpid() or _is_running(pid):
                continue
            leaked = cls(root, Path(), None, Path(socket_dir))
            leaked.kill()
            leaked.remove()
            removed.append(root)
        return removed

    def boot(self) -> None:
        """Pick a free port, write it to the configuration and start; on another port if
        the server could not bind (someone took it between our probe and the server's bind)."""
        for attempt in range(START_ATTEMPTS):
            self.port = free_port()
            self._write_settings()
            try:
                self.start()
            except PgServerError:
                if attempt + 1 == START_ATTEMPTS or "could not bind" not in self.log_tail():
                    raise
                continue
            return

    def _write_settings(self) -> None:
        conf = self.data / "postgresql.conf"
        text = conf.read_text()
        marker = text.find(_SETTINGS_MARKER)
        if marker >= 0:
            text = text[:marker]
        text += _SETTINGS_MARKER + _SETTINGS.format(port=self.port, socket_dir=self.socket_dir)
        conf.write_text(text)  # root may write it; its owner stays postgres

    def start(self) -> None:
        self.run(
            "pg_ctl",
            "start",
            "--wait",
            "--timeout",
            str(PG_CTL_TIMEOUT_S),
            "--pgdata",
            str(self.data),
            "--log",
            str(self.log_path),
        )

    def stop(self, mode: str) -> None:
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        if not (self.data / "postmaster.pid").exists():
            return  # not running
        self.run(
            "pg_ctl",
            "stop",
            "--wait",
            "--timeout",
            str(PG_CTL_TIMEOUT_S),
            "--pgdata",
            str(self.data),
            "--mode",
            mode,
        )

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends, then wait until it is gone. pg_ctl
        starts it in a session of its own, so its process group is the whole server. The
        pid is checked first (a live process whose working directory is our data
        directory: the postmaster chdirs there), so that a reused pid is never killed."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
            if Path(os.readlink(f"/proc/{pid}/cwd")) != self.data.resolve():
                return
        except (OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _is_running(pid):
            time.sleep(0.02)

    def remove(self) -> None:
        _remove_tree(self.root)
        if self.socket_dir.name.startswith(SOCKET_PREFIX):  # made apart for a long path
            _remove_tree(self.socket_dir)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def run(self, tool: str, *args: str) -> None:
        """Run a server tool as the cluster's owner; a PgServerError with its output and
        the server log's tail if it fails. The output goes to a file, not a pipe: the
        postmaster that pg_ctl starts must not hold a pipe of ours open."""
        argv = [str(self.bindir / tool), *args]
        owner = self.owner
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=_clean_env(),
                    cwd="/",
                    timeout=PG_CTL_TIMEOUT_S + 30,
                    user=owner.pw_uid if owner else None,
                    group=owner.pw_gid if owner else None,
                    extra_groups=[] if owner else None,
                )
                detail = f"exit status {proc.returncode}" if proc.returncode else ""
            except subprocess.TimeoutExpired:
                detail = "timed out"
            except OSError as exc:  # not executable by the owner, no such user...
                who = f" as {owner.pw_name}" if owner else ""
                raise PgServerError(f"could not run {argv[0]}{who}: {exc}") from exc
            if not detail:
                return
            out.seek(0)
            output = out.read().decode(errors="replace").strip()
        tail = self.log_tail(20)
        message = f"{tool} failed ({detail}): {' '.join(argv)}\n{output}"
        if tail:
            message += f"\n--- {self.log_path} (tail) ---\n{tail}"
        raise PgServerError(message)


class PgServer:
    """One PostgreSQL server for tests: a private cluster (``start``) or the server named
    by ``FERRY_TEST_DATABASE_URL`` (``from_environment``). ``create_database`` and
    ``execute`` may be called from many threads."""

    def __init__(self, base_url: str, *, cluster: _Cluster | None = None) -> None:
        self._base_url = base_url
        self._cluster = cluster  # None: the server of $FERRY_TEST_DATABASE_URL
        self._lock = threading.Lock()
        self._template: str | None = None
        self._created: list[str] = []
        self._stopped = False
        self.start_duration_s: float | None = None

    @classmethod
    def from_environment(cls) -> PgServer:
        """The server named by $FERRY_TEST_DATABASE_URL if set, else a private one. An
        ImportError at once (before any server starts) if psycopg is not installed."""
        import psycopg  # noqa: F401  (the postgres extra; every use of a server needs it)

        url = os.environ.get(DATABASE_URL_ENV)
        if url:
            if not url.startswith(("postgresql://", "postgres://")):
                raise PgServerError(f"${DATABASE_URL_ENV} must be a postgresql:// URL")
            server = cls(url)
            server.execute("SELECT 1")  # fail now, with the server's own message
            return server
        return cls.start()

    @classmethod
    def start(cls, *, bindir: Path | None = None) -> PgServer:
        """initdb a private cluster into a new temporary directory and start it."""
        started_at = time.monotonic()
        _Cluster.sweep_leaked()
        cluster = _Cluster.create(bindir or find_bindir())
        try:
            cluster.boot()
        except BaseException:
            cluster.kill()
            cluster.remove()
            raise
        server = cls(f"postgresql://{SUPERUSER}@127.0.0.1:{cluster.port}/", cluster=cluster)
        server.start_duration_s = time.monotonic() - started_at
        atexit.register(server.stop)  # a session that ends before its teardown ran
        return server

    @property
    def restartable(self) -> bool:
        """False for the server of $FERRY_TEST_DATABASE_URL: it is not ours to stop."""
        return self._cluster is not None

    @property
    def log_path(self) -> Path | None:
        """The server's log file (None for an external server)."""
        return self._cluster.log_path if self._cluster else None

    def url(self, dbname: str = MAINTENANCE_DB) -> str:
        """A postgresql:// URL for ``dbname`` on this server."""
        parts = urllib.parse.urlsplit(self._base_url)
        return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(dbname)))

    def create_database(self) -> str:
        """A new, empty database (a copy of a template created once); its name."""
        with self._lock:
            if self._template is None:
                template = _unique_name("ferry_template")
                self.execute(f'CREATE DATABASE "{template}" TEMPLATE template0')
                self._template = template
            template = self._template
        name = _unique_name("ferry_test")
        # Nobody connects to our own template, so a copy is never refused with "source
        # database is being accessed by other users", as a copy of template1 can be.
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        with self._lock:
            self._created.append(name)
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending any session still connected to it."""
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        with self._lock:
            if name in self._created:
                self._created.remove(name)

    def execute(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        dbname: str = MAINTENANCE_DB,
    ) -> list[tuple[Any, ...]]:
        """Run one admin statement in autocommit on ``dbname``; the rows it returned."""
        import psycopg  # the postgres extra: needed only when a server is used

        try:
            with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=10) as conn:
                cur = conn.execute(sql.encode(), params)
                return cur.fetchall() if cur.description is not None else []
        except psycopg.OperationalError as exc:
            raise PgServerError(f"{sql!r} on {self.url(dbname)}: {exc}") from exc

    def restart(self, mode: str = "immediate") -> None:
        """Stop (``immediate``: as a crash, so recovery runs at the start; ``fast`` or
        ``smart``: cleanly) and start again on the same port."""
        if self._cluster is None:
            raise PgServerError(f"the server of ${DATABASE_URL_ENV} cannot be restarted")
        self._cluster.stop(mode)
        self._cluster.start()

    def outage(self, seconds: float) -> None:
        """Down for ``seconds`` (stopped as by a crash), then up again on the same port."""
        if self._cluster is None:
            raise PgServerError(f"the server of ${DATABASE_URL_ENV} cannot be stopped")
        self._cluster.stop("immediate")
        time.sleep(seconds)  # (the outage's length is the point: nothing to wait for)
        self._cluster.start()

    def stop(self) -> None:
        """Stop the server and remove its directory (private), or drop the databases made
        here (external). Idempotent; it does not raise for a server already gone."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        cluster = self._cluster
        if cluster is None:
            leftover = [*self._created, *([self._template] if self._template else [])]
            for name in leftover:
                with contextlib.suppress(PgServerError):
                    self.drop_database(name)
            return
        try:
            cluster.stop("immediate")
        except PgServerError:
            cluster.kill()
        finally:
            cluster.remove()

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def schema_at(url: str, version: int) -> None:
    """Make the database at ``url`` one of ferry's schema ``version`` (its first
    ``version`` migrations, as an older ``ferry db init`` left it): for upgrade tests."""
    import psycopg

    from ferry.storage.postgres import schema

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for number, migration in enumerate(schema.MIGRATIONS[:version], start=1):
            conn.execute(migration)
            conn.execute(
                "INSERT INTO ferry_meta (key, value) VALUES ('version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(number),),
            )


def sweep_leaked() -> list[Path]:
    """Stop and remove the private clusters of this host's dead test sessions (each
    ``PgServer.start`` does it first); the directories removed."""
    return _Cluster.sweep_leaked()


def _is_running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: whoever reaps it may take a while)."""
    try:
        proc_stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return proc_stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _unique_name(prefix: str) -> str:
    # Unique across xdist workers and sessions sharing one external server.
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"


def _server_owner() -> pwd.struct_passwd | None:
    """The account the server runs as: ``postgres`` when we are root (initdb and postgres
    refuse to run as root), else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PgServerError(
            "running as root, and PostgreSQL refuses to; there is no `postgres` user to "
            "run it as (Debian's postgresql package creates one)"
        ) from None


def _check_reachable(path: Path, owner: pwd.struct_passwd) -> None:
    """The server, run as ``owner``, must be able to reach ``path``: pytest's root-only
    temporary directories, or a TMPDIR under /root, are not reachable."""
    for parent in path.parents:
        st = parent.stat()
        if not (st.st_mode & stat.S_IXOTH or st.st_uid == owner.pw_uid):
            raise PgServerError(
                f"the {owner.pw_name} user, which runs the test server, cannot reach {path}: "
                f"{parent} is not searchable by others; set TMPDIR to a directory it can "
                "reach (such as /tmp)"
            )


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
