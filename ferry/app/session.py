"""What every use case is given instead of the service that called it: the state
directory, the store (opened on first use), the leases, and a :class:`Reporter` that
tells the user what happens along the way. The command line supplies the reporter
(``ferry.cli``); a test can supply its own. Use cases return their results and never
render them: the reporter carries only what must be said while a use case still runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ferry.core.recovery import RecoverReport
    from ferry.storage import Leases, TaskStore


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


class Silent:
    """A reporter that says nothing (a library use, a test)."""

    def notice(self, message: str) -> None:
        pass

    def detail(self, message: str) -> None:
        pass

    def recovered(self, report: RecoverReport) -> None:
        pass


class Session:
    """One command's access to one state directory (and, through it, its backend)."""

    def __init__(
        self, home: Path, reporter: Reporter | None = None, store: TaskStore | None = None
    ) -> None:
        self.home = home
        self.reporter: Reporter = reporter or Silent()
        self._store = store

    @classmethod
    def open(cls, home: str | None, reporter: Reporter | None = None) -> Session:
        """The state directory named by ``--home`` (else the environment's), made if
        missing and refused if unsafe."""
        from ferry.storage.local.statedir import ensure_home, resolve_home

        return cls(ensure_home(resolve_home(home, os.environ)), reporter)

    @property
    def store(self) -> TaskStore:
        """Opened on first use: ``journal verify``/``repair`` must work without it,
        since opening replays the journal and refuses a corrupt one."""
        if self._store is None:
            from ferry.storage.local.store import Store

            self._store = Store.open(self.home, on_lock_wait=self._lock_wait_notice)
        return self._store

    def leases(self, ttl_s: float) -> Leases:
        from ferry.storage.local.lease import LeaseStore

        return LeaseStore(self.home / "lease.json", ttl_s)

    def notice(self, message: str) -> None:
        self.reporter.notice(message)

    def _lock_wait_notice(self) -> None:
        self.notice(
            "waiting for the journal's append lock: another ferry process holds it (one"
            " that was stopped holds it until it is continued or killed)"
        )
