"""What a table may ask of the settled history it has not loaded (pure: the store's
archives do the reading, ``ferry.storage.local.history``).

A snapshot names archives that hold every settled task; loading them all is what made
``ls`` and ``show`` of an old task cost as much as the history. A :class:`History`
answers the few questions those commands ask by reading a few lines: one task by id,
by number, the ids that start with a prefix, and the settled tasks newest first (the
order ``ls`` lists). With ``settled_counts`` from the snapshot (how many settled tasks
there are in each state) a table answers ``ls --limit N`` and its "N of M shown"
without loading history (:meth:`ferry.core.state.Table.newest`).

Every answer is what loading the whole history would give for that question: a task's
newest record (a later archive wins), never one the table holds itself (the fold's is
newer) or one ``ferry gc`` forgot. A history that cannot answer (an index missing or
damaged, an archive pruned by compactions since the table was loaded, damage in a line
it read) raises :class:`HistoryMissed`, and the table loads its history whole instead:
that path decides what is damage (``journal.snapshot_mismatch``) and what is not.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, Protocol


class HistoryMissed(Exception):
    """The history could not answer this way: load it whole instead (which reports
    real damage)."""


if TYPE_CHECKING:  # (protocols for mypy: nothing to build when a command starts)

    class ArchivedTask(Protocol):
        """One settled task as an archive's index has it, its record not read yet."""

        @property
        def submit_seq(self) -> int: ...
        @property
        def task_id(self) -> str: ...
        @property
        def state(self) -> str: ...
        def record(self) -> Mapping[str, Any]:
            """The task's record, read and checked (HistoryMissed if it does not check)."""
            ...

    class History(Protocol):
        def find(self, task_id: str) -> Mapping[str, Any] | None:
            """The newest record of the task with this id (None: no archive holds it)."""
            ...

        def find_number(self, number: int) -> Mapping[str, Any] | None:
            """The newest record of the task with this number (None: no archive holds it)."""
            ...

        def with_prefix(self, prefix: str, limit: int) -> tuple[list[str], bool]:
            """Ids that start with ``prefix``, sorted, at most ``limit`` of each archive;
            True with them if some archive held more (the list is then not all of them)."""
            ...

        def newest(self, skip: Callable[[str], bool]) -> Iterator[ArchivedTask]:
            """Every archived task, newest first by (``submit_seq``, id), once each (its
            newest record), but those ``skip`` names."""
            ...
