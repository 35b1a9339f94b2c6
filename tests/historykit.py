"""A settled history held in memory, answering as the store's archives do
(``ferry.storage.local.history.ArchiveHistory``): for tests of the table's reads of
history it has not loaded. Counts what it was asked."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ferry.core.history import HistoryMissed


def order_key(record: Mapping[str, Any]) -> tuple[int, str]:
    return int(record.get("submit_seq") or 0), str(record["id"])


class Entry:
    def __init__(self, record: Mapping[str, Any], asked: list[str]) -> None:
        self._record, self._asked = record, asked
        self.submit_seq, self.task_id = order_key(record)
        self.state = str(record["state"])

    def record(self) -> Mapping[str, Any]:
        self._asked.append(f"record {self.task_id}")
        return self._record


class ListHistory:
    """``archives``: lists of records, oldest archive first (a later one's record of a
    task is newer). ``missing``: every question raises HistoryMissed."""

    def __init__(self, archives: Sequence[Iterable[Mapping[str, Any]]]) -> None:
        self.archives = [list(archive) for archive in archives]
        self.asked: list[str] = []
        self.missing = False

    def _newest(self) -> dict[str, Mapping[str, Any]]:
        if self.missing:
            raise HistoryMissed("gone")
        merged: dict[str, Mapping[str, Any]] = {}
        for archive in self.archives:
            for record in archive:
                merged[record["id"]] = record
        return merged

    def find(self, task_id: str) -> Mapping[str, Any] | None:
        self.asked.append(f"find {task_id}")
        return self._newest().get(task_id)

    def find_number(self, number: int) -> Mapping[str, Any] | None:
        self.asked.append(f"number {number}")
        found = [r for r in self._newest().values() if int(r.get("number") or 0) == number]
        return found[0] if found else None

    def with_prefix(self, prefix: str, limit: int) -> tuple[list[str], bool]:
        self.asked.append(f"prefix {prefix}")
        ids = sorted(i for i in self._newest() if i.startswith(prefix))
        return ids[:limit], len(ids) > limit

    def newest(self, skip: Callable[[str], bool]) -> Iterator[Entry]:
        self.asked.append("newest")
        for record in sorted(self._newest().values(), key=order_key, reverse=True):
            if not skip(record["id"]):
                yield Entry(record, self.asked)
