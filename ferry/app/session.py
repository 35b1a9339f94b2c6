"""What every use case is given instead of the service that called it: the state
directory, the store (opened on first use), the leases, and a :class:`Reporter` that
tells the user what happens along the way. The command line supplies the reporter
(``ferry.cli``); a test can supply its own. Use cases return their results and never
render them: the reporter carries only what must be said while a use case still runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from ferry.app.tally import Progress
    from ferry.core.errors import FerryError
    from ferry.core.model import Task
    from ferry.core.recovery import RecoverReport
    from ferry.storage import Leases, TaskStore
else:
    Protocol = object  # (the protocols below are for the type checker)


class Reporter(Protocol):
    def notice(self, message: str) -> None:
        """Something the user should know now (stderr; not under --quiet)."""
        ...

    def detail(self, message: str) -> None:
        """Something only a --verbose user asked to know."""
        ...

    def recovered(self, report: RecoverReport) -> None:
        """A recovery pass made on the way (``claim``, ``work``): what it decided."""
        ...

    def settled(self, task: Task) -> None:
        """A task's end, durable: one ``work`` settled (its supervisors' ends, its
        recovery's decisions), one ``wait`` waited for. Said once per task."""
        ...

    def started(self, task: Task) -> None:
        """The task ``run`` holds in the foreground is about to be spawned (its intent
        is durable, its supervisor not yet told to go: said before any of its output)."""
        ...

    def progress(self, progress: Progress) -> None:
        """How far a ``work`` is (only when it was asked to tell: ``progress_s``)."""
        ...


class Silent:
    """A reporter that says nothing (a library use, a test)."""

    def notice(self, message: str) -> None:
        pass

    def detail(self, message: str) -> None:
        pass

    def recovered(self, report: RecoverReport) -> None:
        pass

    def settled(self, task: Task) -> None:
        pass

    def started(self, task: Task) -> None:
        pass

    def progress(self, progress: Progress) -> None:
        pass


class Database:
    """A shared database named by ``--database`` (or ``FERRY_DATABASE_URL``), and the
    id this host has in it."""

    def __init__(self, url: str, host: str | None = None) -> None:
        from ferry.storage.postgres.connect import host_id

        self.url, self.host = url, host_id(host)


# The backend the command opened, for the supervisors it forks: one that outlives its
# launcher opens the same backend to write its own records.
_opened: Database | None = None


def this_host() -> str:
    """The name of this host as the backend knows it: its host id on a shared database,
    else the machine's name."""
    if _opened is not None:
        return _opened.host
    from ferry.proc.process import self_identity

    return self_identity().host


def open_store(
    home: str,
    on_lock_wait: Callable[[], None] | None = None,
    *,
    reading: bool = False,
    tolerate_damage: bool = False,
) -> TaskStore:
    """The backend of this command: the shared database if one was named, else the
    local journal of ``home``. (The state directory stays in use either way: logs,
    heartbeats and alive-locks are per host.) ``reading``: the local journal is opened
    read-only (nothing created, no lock taken); ``tolerate_damage``: and a damaged one
    is shown as far as it can be read (``Store.damage`` says what is not)."""
    if _opened is not None:
        from ferry.storage.postgres.store import PgStore

        return PgStore.open(_opened.url, _opened.host, partial(_log_tails, home))
    from ferry.storage.local.store import Store

    return Store.open(
        home, on_lock_wait=on_lock_wait, read_only=reading, tolerate_damage=tolerate_damage
    )


def load_backend() -> None:
    """Import what opening the local journal's store loads, without opening it. ``ferry
    run`` forks its task's supervisor before it opens that store: the supervisor, left
    alone short of descriptors (its launcher killed in an OOM), must still reach the
    store's own open and its coded failure, not fail in an import first. (A shared
    database is opened before the fork: ``foreground.run_task``.)"""
    __import__("ferry.storage.local.store")
    __import__("ferry.storage.local.history")  # (a home with archives reads it)


def _log_tails(home: str, task_id: str, attempt: int) -> dict[str, tuple[bytes, int]]:
    """The tails of an attempt's logs on this host, for a shared database to keep."""
    from ferry.app.logs import read_tails
    from ferry.app.runner import log_paths
    from ferry.storage import LOG_TAIL_BYTES

    return read_tails(log_paths(home, task_id, attempt), LOG_TAIL_BYTES)


class Session:
    """One command's access to one state directory (and, through it, its backend)."""

    def __init__(
        self,
        home: str,
        reporter: Reporter | None = None,
        store: TaskStore | None = None,
        database: Database | None = None,
        *,
        reading: bool = False,
        tolerate_damage: bool = False,
    ) -> None:
        global _opened
        self.home = home
        self.reporter: Reporter = reporter or Silent()
        self._store = store
        self._lease_reader: Leases | None = None  # (``led``'s)
        self.database = database
        # A command that only reads: the store is opened read-only; and, if it shows
        # what it can, a damaged journal is read up to its damage (see ``damage``).
        self.reading = reading
        self.tolerate_damage = tolerate_damage
        if database is not None:
            _opened = database

    @classmethod
    def open(
        cls,
        home: str | None,
        reporter: Reporter | None = None,
        *,
        database: str | None = None,
        host: str | None = None,
        reading: bool = False,
        tolerate_damage: bool = False,
        make: bool = True,
    ) -> Session:
        """The state directory named by ``--home`` (else the environment's), made if
        missing and refused if unsafe; the database named by ``--database`` (else
        ``FERRY_DATABASE_URL``), if any.

        ``reading``: for a command that only reads. Nothing is made, and a directory
        ferry may not write (a disk remounted read-only) is shown as it is, after one
        notice; ``tolerate_damage``: a damaged journal is shown as far as it reads.
        ``make=False``: for a command that acts on tasks that exist (``cancel 12``): a
        missing state directory (a typo in ``--home``) holds none, so it is read as
        empty, not made."""
        from ferry.storage.local.statedir import ensure_home, open_home_for_reading, resolve_home

        shared = None
        if database is not None or os.environ.get("FERRY_DATABASE_URL"):
            from ferry.storage.postgres.connect import database_url

            url = database_url(database)
            shared = None if url is None else Database(url, host)
        path = resolve_home(home, os.environ)
        if not make and shared is None and not os.path.lexists(path):
            reading = True
        if not reading:
            return cls(ensure_home(path), reporter, database=shared)
        path, writable = open_home_for_reading(path)
        session = cls(path, reporter, database=shared, reading=True,
                      tolerate_damage=tolerate_damage)  # fmt: skip
        if not writable:
            session.notice("note: the state directory is read-only; showing it as it is")
        return session

    @property
    def missing(self) -> bool:
        """The local state directory does not exist (it was opened with ``make=False``):
        a maintenance command has nothing to do there, and must not make it."""
        return self.database is None and not os.path.lexists(self.home)

    @property
    def store(self) -> TaskStore:
        """Opened on first use: ``journal verify``/``repair`` must work without it,
        since opening replays the journal and refuses a corrupt one."""
        if self._store is None:
            self._store = open_store(self.home, self._lock_wait_notice, reading=self.reading,
                                     tolerate_damage=self.tolerate_damage)  # fmt: skip
        return self._store

    def damage(self) -> FerryError | None:
        """What a command that shows what it can found damaged in what it read (None:
        nothing, or it opened no store): one coded error (exit 4) naming all of it,
        for the command to raise once its output is out."""
        found: list[FerryError] = list(getattr(self._store, "damage", None) or ())
        if not found:
            return None
        first = found[0]
        message = "; and ".join(dict.fromkeys(error.message for error in found))
        return type(first)(message, code=first.code, details=first.details)

    def leases(self, ttl_s: float) -> Leases:
        if self.database is not None:
            from ferry.storage.postgres.lease import PgLeases
            from ferry.storage.postgres.store import PgStore

            store = self.store
            assert isinstance(store, PgStore)
            return PgLeases(store.db, store.host, ttl_s)
        from ferry.storage.local.lease import LeaseStore

        return LeaseStore(os.path.join(self.home, "lease.json"), ttl_s)

    def led(self) -> bool:
        """Whether a leader may be running the queue now (``Leases.led``), read with
        one lease reader per session (a command that waits asks once a second)."""
        from ferry.storage import LEASE_TTL_S

        if self._lease_reader is None:
            self._lease_reader = self.leases(ttl_s=LEASE_TTL_S)
        return self._lease_reader.led()

    def notice(self, message: str) -> None:
        self.reporter.notice(message)

    def compact_if_due(
        self, *, merge: bool = True, unless_led: bool = False
    ) -> dict[str, Any] | None:
        """Keep every command's start-up cost bounded (``TaskStore.maybe_compact``):
        after ``run`` and ``claim`` settled their task, before a ``submit``'s write
        (``merge=False``, ``unless_led``), between ``work``'s turns (``merge=False``),
        and when ``work`` ends.

        What was done (empty: nothing due, or another process at it). A compaction's
        failure is a warning, never the command's outcome: None. A store that cannot be
        opened (a damaged journal) is no compaction's failure but the command's, raised:
        each caller needs the store (a ``submit``'s write, after this) or has it open
        already; warned of here, the same error was said twice."""
        from ferry.core.errors import FerryError

        store = self.store
        try:
            return store.maybe_compact(merge=merge, unless_led=unless_led) or {}
        except (FerryError, OSError) as error:
            why = error.message if isinstance(error, FerryError) else str(error)
            self.notice(f"warning: compaction skipped: {why}")
            return None

    def _lock_wait_notice(self) -> None:
        self.notice(
            "waiting for the journal's append lock: another ferry process holds it (one"
            " that was stopped holds it until it is continued or killed)"
        )
