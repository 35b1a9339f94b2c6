"""For mypy only: every backend keeps the seam's protocols (a missing or mistyped
method fails ``mypy --strict``). Imported by nothing at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferry.storage import Leases, TaskStore
    from ferry.storage.local.lease import LeaseStore
    from ferry.storage.local.store import Store
    from ferry.storage.memory import MemoryStore
    from ferry.storage.postgres.lease import PgLeases
    from ferry.storage.postgres.store import PgStore

    _stores: tuple[type[TaskStore], ...] = (Store, MemoryStore, PgStore)
    _leases: tuple[type[Leases], ...] = (LeaseStore, PgLeases)
