"""The seam in memory, for unit tests of the use cases: the same fold, the same write
rule (validated against the true end under one lock) and the same epoch fence as the
local journal, with nothing on disk and nothing durable. Not a backend for users."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ferry.core import events as ev
from ferry.core.errors import LeaseHeldError
from ferry.core.state import States, Table
from ferry.storage.claiming import ClaimsUnderLock

if TYPE_CHECKING:
    from ferry.core.model import Task
    from ferry.storage import EncodedEvent

_LEASE_ACQUIRED = ev.EventType.LEASE_ACQUIRED.value


class MemoryStore(ClaimsUnderLock):
    """``ferry.storage.TaskStore`` over a list. ``records`` is what was committed, in
    order: (seq, epoch, type, data)."""

    def __init__(self) -> None:
        self.table = Table()
        self.records: list[tuple[int, int, str, dict[str, Any]]] = []
        self._highest_epoch = 0
        self._lock = threading.Lock()

    def commit(self, *events: ev.Event | EncodedEvent, epoch: int = 0) -> list[Any]:
        batch = [e if isinstance(e, tuple) else e.encode() for e in events]
        if any(ev.WAIT in data for _, data in batch):
            batch = ev.resolve_waits(batch, None)
        with self._lock:
            if 0 < epoch < self._highest_epoch:
                raise LeaseHeldError(
                    f"fenced: epoch {epoch} is older than the store's {self._highest_epoch}",
                    code="journal.fenced",
                    details={"epoch": epoch, "current_epoch": self._highest_epoch},
                )
            for record_type, data in batch:
                if record_type == _LEASE_ACQUIRED and int(data["epoch"]) <= self._highest_epoch:
                    raise LeaseHeldError(
                        f"epoch {data['epoch']} was already used", code="journal.fenced"
                    )
            self.table.validate_batch(batch, now=time.time())
            committed = []
            for record_type, data in batch:
                seq = len(self.records) + 1
                self.table.apply(record_type, data, seq, time.time())
                self.records.append((seq, epoch, record_type, data))
                committed.append(self.records[-1])
            self._highest_epoch = max(self._highest_epoch, epoch)
            return committed

    def refresh(self) -> None:
        """Nothing to catch up with: every writer shares this object."""

    def bound_calls(self) -> None:
        """Local calls wait on no network and no other session's lock."""

    def beat(self, task: Task) -> bool:
        """Beats are the heartbeat file the supervisor touches: nothing to record."""
        return True

    def host_lost(self, task: Task, ttl_s: float) -> bool | None:
        """One host: every task is this host's to decide."""
        return None

    def log_tails(self, task_id: str, attempt: int) -> dict[str, tuple[bytes, int]]:
        """One host: the logs are here, nothing is kept of them."""
        return {}

    def sync(self, within_s: float | None = None) -> bool:
        """Nothing to make durable."""
        return True

    def get(self, task_id: str) -> Task | None:
        with self._lock:
            return self.table.get(task_id)

    def resolve(self, prefix: str) -> Task:
        """The task ``prefix`` names: an id or a unique prefix of it, a number, ``last``."""
        with self._lock:
            return self.table.resolve(prefix)

    def live(self) -> list[Task]:
        with self._lock:
            return self.table.live()

    def in_flight(self) -> list[Task]:
        with self._lock:
            return self.table.in_flight()

    def newest(self, limit: int, state: States = None) -> list[Task]:
        with self._lock:
            return self.table.newest(limit, state)

    def count(self, state: States = None) -> int:
        with self._lock:
            return self.table.count(state)

    def queued(
        self,
        limit: int,
        *,
        skip: Collection[str] = (),
        extra: Mapping[str, int] | None = None,
    ) -> list[Task]:
        with self._lock:
            return self.table.candidates(limit, now=time.time(), skip=skip, extra=extra)

    def groups(self) -> list[dict[str, Any]]:
        with self._lock:
            return self.table.groups()

    def doomed(self) -> list[tuple[Task, str]]:
        with self._lock:
            return self.table.doomed()

    def quarantined(self) -> list[Task]:
        with self._lock:
            return self.table.quarantined()

    def succeeded_with_key(self, key: str) -> str | None:
        with self._lock:
            return self.table.succeeded_with_key(key)

    def settled_before(self, seconds: float, states: Iterable[str]) -> list[Task]:
        with self._lock:
            return self.table.settled_before(seconds, states)

    def now(self) -> float:
        """This host's clock: the journal's."""
        return time.time()

    def forgotten_here(self) -> list[str]:
        with self._lock:
            return self.table.forgotten_ids()

    def files_removed(self, task_ids: Iterable[str]) -> None:
        """Nothing to record: the compaction that drops the ids removes their files
        first (``_compact_locked``)."""

    @property
    def highest_epoch(self) -> int:
        return self._highest_epoch

    def maybe_compact(
        self, *, merge: bool = True, unless_led: bool = False
    ) -> dict[str, Any] | None:
        return None

    def compact(
        self, *, wait: bool = True, on_lock_wait: Callable[[], None] | None = None
    ) -> dict[str, Any] | None:
        return {"snapshot_seq": len(self.records), "removed": [], "archives": 0}

    def close(self) -> None:
        pass
