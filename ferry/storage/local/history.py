"""A snapshot's settled-task archives, asked a task at a time through their indexes
(``ferry.core.history.History``): what ``ls --limit N`` and ``show`` of an old task
read instead of every archive (``archive_index`` has the format and what it checks).

The archives are named oldest first; a task may be in several (retried and settled
again: a later one holds its newer record), so every answer is the newest archive's.
The snapshot's entry for each archive says which ids, numbers and submissions it
holds, so an archive that cannot hold the answer is not opened.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence

from ferry.core.history import HistoryMissed

TYPE_CHECKING = False  # (no typing at run time: docs/architecture.md, "Start-up cost")
if TYPE_CHECKING:
    from typing import Any

    from ferry.storage.local.archive_index import IndexedArchive, Position


class ArchiveHistory:
    def __init__(self, directory: str, refs: Sequence[Mapping[str, Any]]) -> None:
        self.directory = directory
        self.refs = list(refs)

    @classmethod
    def of(cls, directory: str, refs: Sequence[Mapping[str, Any]]) -> ArchiveHistory | None:
        """The history of a snapshot's archives; None unless each has an index (those
        written before indexes: the table loads them whole, as it did)."""
        if not refs or not all(_indexed(ref) for ref in refs):
            return None
        return cls(directory, refs)

    def _open(self, ref: Mapping[str, Any]) -> IndexedArchive:
        # (lazy, as heapq below: every command that opens a compacted home makes this
        # object, few ask it anything; `ferry run` never)
        from ferry.storage.local.archive_index import IndexedArchive

        return IndexedArchive(self.directory, ref)

    def find(self, task_id: str) -> Mapping[str, Any] | None:
        for ref in reversed(self.refs):  # the newest archive first: its record is newer
            if ref["count"] and ref["id_min"] <= task_id <= ref["id_max"]:
                with self._open(ref) as archive:
                    position = archive.find_id(task_id)
                    if position is not None:
                        return position.record()
        return None

    def find_number(self, number: int) -> Mapping[str, Any] | None:
        for ref in reversed(self.refs):
            if not ref["count"]:
                continue
            numbers = ref.get("numbers")
            if numbers is None:  # (some task in it has no number: not in order by them)
                raise HistoryMissed(f"archive {ref['name']} is not in order by numbers")
            if numbers[0] <= number <= numbers[1]:
                with self._open(ref) as archive:
                    position = archive.find_number(number)
                    if position is not None:
                        return position.record()
        return None

    def with_prefix(self, prefix: str, limit: int) -> tuple[list[str], bool]:
        found: set[str] = set()
        more = False
        width = len(prefix)
        for ref in self.refs:
            if ref["count"] and ref["id_min"][:width] <= prefix <= ref["id_max"][:width]:
                with self._open(ref) as archive:
                    ids, over = archive.with_prefix(prefix, limit)
                found.update(ids)
                more = more or over
        return sorted(found), more

    def newest(self, skip: Callable[[str], bool]) -> Iterator[Position]:
        """A merge of the archives' indexes read from their ends, newest first. An
        archive is opened only once its newest task may come next (the snapshot says
        its highest ``submit_seq``): ``ls`` reads the few recent ones."""
        import heapq

        self._check_present()
        pending = sorted(range(len(self.refs)), key=lambda rank: self.refs[rank]["submit_max"])
        heads: list[_Head] = []
        opened: list[IndexedArchive] = []
        last: tuple[int, str] | None = None
        try:
            while True:
                while pending and (
                    not heads or self.refs[pending[-1]]["submit_max"] >= heads[0].key[0]
                ):
                    rank = pending.pop()
                    if not self.refs[rank]["count"]:
                        continue
                    archive = self._open(self.refs[rank])
                    opened.append(archive)
                    _push(heads, archive.newest_first(), rank)
                if not heads:
                    return
                head = heapq.heappop(heads)
                _push(heads, head.rest, head.rank)
                if head.key == last:
                    continue  # an older archive's record of a task already given
                last = head.key
                if not skip(head.position.task_id):
                    yield head.position
        finally:
            for archive in opened:
                archive.close()

    def _check_present(self) -> None:
        """Every archive is there at its size: a missing or cut one is noticed by ``ls``
        as when it read them all (a ``stat`` each, at most ARCHIVES_MAX + 1; an index
        is checked when read: one missing costs speed, not an answer)."""
        try:
            directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise HistoryMissed(f"{self.directory}: {error}") from error
        try:
            for ref in self.refs:
                try:
                    found = os.stat(ref["name"], dir_fd=directory, follow_symlinks=False)
                except OSError as error:
                    raise HistoryMissed(f"archive {ref['name']}: {error}") from error
                if found.st_size != ref["bytes"]:
                    raise HistoryMissed(f"archive {ref['name']} is not the size it was")
        finally:
            os.close(directory)


_REF_FIELDS = {"name": str, "index": str, "count": int, "bytes": int, "submit_max": int,
               "id_min": str, "id_max": str}  # fmt: skip


def _indexed(ref: Mapping[str, Any]) -> bool:
    """The snapshot's entry for an archive says what its index is and holds."""
    if not all(isinstance(ref.get(key), kind) for key, kind in _REF_FIELDS.items()):
        return False
    numbers = ref.get("numbers")
    return numbers is None or (
        isinstance(numbers, list) and len(numbers) == 2 and all(isinstance(n, int) for n in numbers)
    )


class _Head:
    """An archive's next entry in a newest-first merge (heapq is a min-heap: the
    newest, then the later archive, compares lowest)."""

    __slots__ = ("key", "position", "rank", "rest")

    def __init__(self, position: Position, rank: int, rest: Iterator[Position]) -> None:
        self.position, self.rank, self.rest = position, rank, rest
        self.key = position.key

    def __lt__(self, other: _Head) -> bool:
        return (self.key, self.rank) > (other.key, other.rank)


def _push(heads: list[_Head], rest: Iterator[Position], rank: int) -> None:
    import heapq

    position = next(rest, None)
    if position is not None:
        heapq.heappush(heads, _Head(position, rank, rest))
