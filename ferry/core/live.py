"""The table's tasks not settled, by id: a snapshot's records stay records until asked
for (pure).

A snapshot holds every task not settled, and most commands touch a few of them: a
``submit`` or a ``run`` adds one, ``show`` reads one, ``ls --limit N`` the newest N.
Decoding every one of them (a ``Task`` and its ``TaskSpec``) was most of what opening a
home with a long queue cost: 16 us a task here, 17 ms of every ``submit`` with 1,000
tasks queued. A record is decoded the first time it is asked for, in place (the order
the table took its tasks in is kept); what the table indexes at load (key, number,
state, submission order) is read from the record itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ferry.core.errors import UsageError
from ferry.core.fold import task_from_record
from ferry.core.model import Reason, State, Task
from ferry.core.spec import check_shape

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_STATE_VALUES = frozenset(state.value for state in State)
_REASON_VALUES = frozenset(reason.value for reason in Reason)


def check_record(record: Any) -> tuple[str, str, str | None, int]:
    """A snapshot record's id, state, key and number, once it is known to decode: every
    field that ``task_from_record`` converts or builds from is of its type (ValueError,
    TypeError or KeyError otherwise: the snapshot is not a table this ferry reads, said
    when it is read, as when every record was decoded then). A record that passes
    always decodes (``tests/property/test_live_props.py``)."""
    task_id, state, spec = record["id"], record["state"], record["spec"]
    reason, runner, evidence = record.get("reason"), record.get("runner"), record.get("evidence")
    if not isinstance(task_id, str) or state not in _STATE_VALUES:
        raise ValueError(f"not a task record: id {task_id!r}, state {state!r}")
    if reason is not None and reason not in _REASON_VALUES:
        raise ValueError(f"task {task_id}: no reason {reason!r}")
    if not (runner is None or isinstance(runner, dict)) or not isinstance(evidence or {}, dict):
        raise TypeError(f"task {task_id}: runner {runner!r}, evidence {evidence!r}")
    try:
        check_shape(spec)
    except UsageError as error:
        raise ValueError(f"task {task_id}: {error.message}") from None
    key, number = spec.get("key"), record.get("number") or 0
    if not (key is None or isinstance(key, str)) or not isinstance(number, int):
        raise TypeError(f"task {task_id}: key {key!r}, number {number!r}")
    return task_id, state, key, number


class TasksById:
    """Tasks by id, a record decoded when it is first asked for (``get``: None when not
    held; ``[]``: KeyError)."""

    __slots__ = ()

    def get(self, task_id: str) -> Task | None:
        raise NotImplementedError

    def __getitem__(self, task_id: str) -> Task:
        task = self.get(task_id)
        if task is None:
            raise KeyError(task_id)
        return task


class LiveTasks(TasksById):
    """Tasks (or records not decoded yet) by id, in the order they were put."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[str, Task | Mapping[str, Any]] = {}

    def get(self, task_id: str) -> Task | None:
        item = self._items.get(task_id)
        if item is None or isinstance(item, Task):
            return item
        task = self._items[task_id] = task_from_record(item)
        return task

    def __setitem__(self, task_id: str, task: Task) -> None:
        self._items[task_id] = task

    def add_record(self, task_id: str, record: Mapping[str, Any]) -> None:
        """A snapshot's record of a task not settled (``check_record`` passed it)."""
        self._items[task_id] = record

    def pop(self, task_id: str) -> None:
        self._items.pop(task_id, None)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def tasks(self) -> list[Task]:
        """Every one, decoded, in the order they were put."""
        return [self[task_id] for task_id in list(self._items)]

    def state_of(self, task_id: str) -> str:
        return _state(self._items[task_id])

    def submit_seq(self, task_id: str) -> int:
        item = self._items[task_id]
        return item.submit_seq if isinstance(item, Task) else int(item.get("submit_seq", 0))

    def in_states(self, wanted: frozenset[str]) -> list[str]:
        """The ids of those in ``wanted`` states, none decoded."""
        return [task_id for task_id, item in self._items.items() if _state(item) in wanted]


def _state(item: Task | Mapping[str, Any]) -> str:
    return item.state.value if isinstance(item, Task) else str(item["state"])
