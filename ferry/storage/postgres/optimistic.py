"""A worker's write in one round trip (schema version 6: ``ferry_write``).

The commit path (``PgStore.commit_against``) locks the rows, decides on them, then
writes: a BEGIN, a locking read, the events, the rows, the claims and a COMMIT, six
round trips and as many statements for each task a worker ends. Most of the time the
rows are exactly as this process last wrote or claimed them: a worker claims a task,
writes its SPAWNED and its SETTLED, and nobody else writes about it meanwhile. So the
store keeps those rows (``Known``), decides on them, folds and validates the records by
the same rules (``ferry.core.state.Table``), and sends everything in one call; the
function locks the rows and compares each one's version (``updated_seq``: a new seq at
every change of a row) with the one the decision was made on. The same: it writes what
the commit path would have written, in one transaction. Any other (a cancel asked for,
recovery's mark, another host's write): it writes nothing, answers ``moved``, and the
caller decides again on the rows locked, as before. The decision is still checked at
write time, against the rows as they are: by their version instead of their contents.

Only for what a version settles alone: records whose fold takes nothing from their seq
but the row's version (not SUBMITTED nor RETRIED), about rows this process knows, none
of them with a key (the key rules read the other tasks of a key, which no version here
covers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ferry.core import events as ev
from ferry.core.fold import task_to_record
from ferry.core.model import State, Task

if TYPE_CHECKING:
    from ferry.storage import Claimant, EncodedEvent

_TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
# Records whose fold uses their seq for more than the row's version (queue_seq,
# submit_seq), or that write more than their task's row: the commit path's.
_NOT_HERE = frozenset(
    kind.value
    for kind in (
        ev.EventType.SUBMITTED,
        ev.EventType.RETRIED,
        ev.EventType.CLAIMED,
        ev.EventType.FORGOTTEN,
    )
)
_WRITE = "SELECT write_status, write_epoch, write_seq, write_body FROM ferry_write(%s)"


class Known:
    """The rows of the tasks in flight this process last wrote or claimed, as written
    (the body and its task): what a write in one call is decided on. A settled task is
    let go (its next write, if any, is not a worker's); at ``LIMIT`` rows, all are."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._rows: dict[str, tuple[dict[str, Any], Task]] = {}

    def keep(self, task: Task, body: dict[str, Any] | None = None) -> None:
        if task.state in _TERMINAL:
            self._rows.pop(task.id, None)
            return
        if len(self._rows) >= self.LIMIT:
            self._rows.clear()
        self._rows[task.id] = (task_to_record(task) if body is None else body, task)

    def forget(self, ids: Iterable[str]) -> None:
        for task_id in ids:
            self._rows.pop(task_id, None)

    def rows(self, ids: Sequence[str]) -> dict[str, tuple[dict[str, Any], Task]] | None:
        """Each of ``ids``'s row (None: one is not known)."""
        found = {task_id: self._rows.get(task_id) for task_id in ids}
        if any(row is None for row in found.values()):
            return None
        return {task_id: row for task_id, row in found.items() if row is not None}


def eligible(batch: Sequence[EncodedEvent], rows: Mapping[str, tuple[Any, Task]]) -> bool:
    """Whether ``batch``, about tasks whose ``rows`` are known, is a write for one call."""
    if not batch:
        return False  # (nothing to write is answered on the rows locked)
    for kind, data in batch:
        if kind in _NOT_HERE or data.get("task") not in rows:
            return False
    return not any(task.spec.key is not None for _, task in rows.values())


def row(task: Task, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task's row, as ``ferry_tasks``'s columns (``body``: its record, if made)."""
    return {
        "id": task.id, "state": task.state.value,
        "reason": None if task.reason is None else task.reason.value, "key": task.spec.key,
        "host": None if task.runner is None else task.runner.get("host_id"),
        "submit_seq": task.submit_seq, "queue_seq": task.queue_seq,
        "updated_seq": task.updated_seq,
        "body": task_to_record(task) if body is None else body,
        "number": task.number or None, "grp": task.spec.group, "priority": task.spec.priority,
        "deps": list(task.spec.after), "not_before": task.not_before,
        "claimed_by": task.claimed_by,
    }  # fmt: skip


class Answer:
    """What ``ferry_write`` said: ``written`` (the seqs of the records, in order, and
    the claims' bodies), ``moved`` or ``fenced`` (the lease's epoch now: ``epoch``)."""

    def __init__(self, status: str, epoch: int | None, seqs: list[int], claimed: list[Any]):
        self.status, self.epoch, self.seqs, self.claimed = status, epoch, seqs, claimed


def call(
    execute: Callable[..., Any],
    json: Callable[[Any], Any],
    *,
    host: str,
    epoch: int,
    expected: Mapping[str, int],
    batch: Sequence[EncodedEvent],
    ts: float,
    rows: Sequence[dict[str, Any]],
    tails: Sequence[dict[str, Any]],
    claims: Sequence[Claimant],
    by: str,
) -> Answer:
    """One call of ``ferry_write``, in autocommit (one statement, one transaction). Its
    one argument: the rows' ``ids`` and the versions decided on (``seqs``), the
    ``events`` (each ``{"type", "data"}``) stamped ``host``, ``epoch`` and ``ts``, the
    changed ``rows`` (``row``), the log ``tails`` (``ferry_log_tails``'s rows, the
    bytes in hex), and the claims' ``tokens`` and ``runners`` and ``by``."""
    found = execute(_WRITE, (json({
        "host": host, "epoch": epoch, "ids": list(expected), "seqs": list(expected.values()),
        "events": [{"type": kind, "data": data} for kind, data in batch], "ts": ts,
        "rows": rows, "tails": tails, "tokens": [token for _, token in claims],
        "runners": [{"host_id": host, **runner} for runner, _ in claims], "by": by,
    }),)).fetchall()  # fmt: skip
    if found and found[0][0] in ("fenced", "moved"):
        return Answer(found[0][0], found[0][1], [], [])
    seqs = [int(r[2]) for r in found if r[0] == "written"]
    return Answer("written", epoch, seqs, [r[3] for r in found if r[0] == "claimed"])
