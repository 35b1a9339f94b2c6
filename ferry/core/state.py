"""Fold journal events into the table of tasks (pure). The journal is the only source of
truth; this table is a replay of it, kept current by a journal subscriber.

Two entry points, two attitudes:

* :meth:`Table.validate` / :meth:`Table.validate_batch` run *before* a write, under the
  journal's append lock against the caught-up table, and raise: an illegal transition,
  a stale claim (wrong attempt or token, or none for a task in flight), a key
  conflict (the rule at the top of :mod:`ferry.core.fold`). Nothing illegal is written.
* :meth:`Table.apply` folds a record that is already in the journal. It never raises for
  a bad record (a journal written by an older, buggy version must stay readable): the
  record is skipped and listed in :attr:`Table.anomalies`. Unknown event types are
  ignored (forward compatibility).

Snapshots make start-up follow live work, not history: :meth:`Table.to_snapshot` keeps
``live`` tasks apart from ``settled`` ones, plus a small ``succeeded_keys`` index so the
key rules work without loading history (and ``unsafe_keys``: keys whose latest task
ended unsafe), and the ``quarantined`` tasks (FAILED
``QUARANTINED_ORPHAN_ALIVE``: their orphans may still run, and every ``recover`` checks
them, so they must be at hand without loading history). :meth:`Table.from_snapshot` may be given the
snapshot without ``settled`` and a ``load_settled`` callback; the table calls it once,
the first time it needs a settled task (``get`` of an unknown id, ``ids``, ``by_key``,
an event about a task it does not hold, ``to_snapshot``). A history load that fails
raises, in ``apply`` too: the record cannot be judged without it, and skipping it as an
anomaly would lose a committed record (see :data:`SettledLoader`).

With a :class:`ferry.core.history.History` as well (archives with an index), a lazy
table does not load history for what a few lines answer: ``get`` and ``resolve`` of an
old task, ``by_number``, and ``newest``/``count`` (``ls --limit N``: the snapshot's
``settled_counts`` say how many settled tasks there are without them). The tasks it
reads so are taken in as the full load would take them; anything the history cannot
answer loads it whole, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from ferry.core import events as ev
from ferry.core._value import Value, init, replace
from ferry.core.decoding import decode
from ferry.core.errors import (
    FerryError,
    IllegalTransitionError,
    KeyUnsafeError,
    NotFoundError,
    RefusedError,
)
from ferry.core.fold import (
    check_event,
    check_write,
    fold_event,
    key_outcome,
    key_refusal,
    task_from_record,
    task_key_outcome,
    task_to_record,
)
from ferry.core.history import HistoryMissed
from ferry.core.ids import AMBIGUOUS_LISTED_MAX, LAST, resolve_prefix, shown, task_number
from ferry.core.live import LiveTasks, TasksById, check_record
from ferry.core.model import IN_FLIGHT_STATES, TERMINAL_STATES, Reason, State, Task
from ferry.core.queue import QueueIndex, counted_in_flight, settled_states

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from ferry.core.history import History
    from ferry.core.queue import GroupInfo
else:
    Protocol = object  # (the protocols below are for the type checker)

SNAPSHOT_FORMAT = 1
ANOMALIES_KEPT_MAX = 100
_SETTLED_VALUES = frozenset(state.value for state in TERMINAL_STATES)
_IN_FLIGHT_VALUES = frozenset(state.value for state in IN_FLIGHT_STATES)
_QUEUED_VALUES = frozenset({State.QUEUED.value})
_RETRYABLE_VALUES = frozenset({State.FAILED.value, State.CANCELLED.value})
_QUARANTINED = Reason.QUARANTINED_ORPHAN_ALIVE.value

SettledLoader = Callable[[int], "Iterable[Mapping[str, Any]] | Table"]
"""Loads a lazy table's settled tasks; called with the seq the table has folded through.

Returns the records of the tasks settled as of that seq (several records of one task:
the newest ``updated_seq`` wins; tasks the table holds itself, from its own fold, win
over these), or a table rebuilt from a newer snapshot that this one becomes: when the
history as of that seq is gone (the archives were merged and pruned by compactions
since) and the newest snapshot is past the table, the records in between are covered
by that snapshot (the fold skips them). A load that fails raises (a FerryError)."""


class RecordLike(Protocol):
    @property
    def seq(self) -> int: ...
    @property
    def ts(self) -> float: ...
    @property
    def type(self) -> str: ...
    @property
    def data(self) -> Mapping[str, Any]: ...


class Anomaly(Value):
    """A journaled record the fold skipped because it was illegal or malformed."""

    __slots__ = ("code", "message", "seq", "task", "type")
    _FIELDS = ("seq", "type", "task", "code", "message")
    seq: int
    type: str
    task: str | None
    code: str
    message: str

    def __init__(self, seq: int, type: str, task: str | None, code: str, message: str) -> None:
        init(self, "seq", seq)
        init(self, "type", type)
        init(self, "task", task)
        init(self, "code", code)
        init(self, "message", message)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "task": self.task, "code": self.code,
                "message": self.message}  # fmt: skip


class _Settled(TasksById):
    """Settled tasks by id: the ones decoded, and archive records not decoded yet.

    An archive holds every task that ever settled and most commands look at a few of
    them (``ls`` the newest, ``show`` one), so a record becomes a Task only when it is
    asked for: decoding is most of what loading history costs.
    """

    __slots__ = ("_checkpoint", "_counts", "_recent", "_records", "_retryable", "_tasks")

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._records: dict[str, Mapping[str, Any]] = {}
        # The FAILED and CANCELLED that come after others (``--after``) -> those: a
        # retry of each needs their SUCCEEDED (gc keeps them). Kept as tasks come and
        # go: gc asks at every batch it forgets, and a scan cost 40 ms at 100,000.
        self._retryable: dict[str, Sequence[str]] = {}
        # How many are held in each state, and the ids set or added since the last
        # ``checkpoint`` with their updated_seq: a long-lived table (work) holds every
        # task settled since it started, and each compaction asked both of all of them
        # (a simulated work service: 140 ms per compaction at 125,000 tasks, once a
        # second; quadratic in its life).
        self._counts: dict[str, int] = {}
        self._recent: dict[str, int] = {}
        self._checkpoint = 0

    def get(self, task_id: str) -> Task | None:
        task = self._tasks.get(task_id)
        if task is None and task_id in self._records:
            task = self._tasks[task_id] = task_from_record(self._records.pop(task_id))
        return task

    def __setitem__(self, task_id: str, task: Task) -> None:
        self._count(task_id, task.state.value)
        self._note_retryable(task_id, task.state.value, task.spec.after)
        self._records.pop(task_id, None)
        self._tasks[task_id] = task
        self._recent[task_id] = task.updated_seq

    def pop(self, task_id: str) -> None:
        self._count(task_id, None)
        self._retryable.pop(task_id, None)
        self._tasks.pop(task_id, None)
        self._records.pop(task_id, None)
        self._recent.pop(task_id, None)

    def _note_retryable(self, task_id: str, state: str, after: Sequence[str] | None) -> None:
        if after and state in _RETRYABLE_VALUES:
            self._retryable[task_id] = after
        else:
            self._retryable.pop(task_id, None)

    def _count(self, task_id: str, state: str | None) -> None:
        """``task_id`` is now held in ``state`` (None: no longer held)."""
        if task_id in self:
            was = self.state_of(task_id)
            self._counts[was] -= 1
        if state is not None:
            self._counts[state] = self._counts.get(state, 0) + 1

    def counts(self) -> dict[str, int]:
        """How many are held in each state (none: left out), sorted by state."""
        return {state: n for state, n in sorted(self._counts.items()) if n}

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._tasks or task_id in self._records

    def __len__(self) -> int:
        return len(self._tasks) + len(self._records)

    def ids(self) -> list[str]:
        return [*self._tasks, *self._records]

    def updated_seq(self, task_id: str) -> int | None:
        """The task's ``updated_seq`` (None: not held), without decoding it."""
        task = self._tasks.get(task_id)
        if task is not None:
            return task.updated_seq
        record = self._records.get(task_id)
        return None if record is None else int(record.get("updated_seq", 0))

    def submit_seq(self, task_id: str) -> int:
        """The task's ``submit_seq``, without decoding it."""
        task = self._tasks.get(task_id)
        if task is not None:
            return task.submit_seq
        return int(self._records[task_id].get("submit_seq", 0))

    def add_record(self, record: Mapping[str, Any]) -> None:
        task_id = record["id"]
        self._count(task_id, str(record["state"]))
        self._note_retryable(task_id, str(record["state"]), record["spec"].get("after"))
        self._tasks.pop(task_id, None)
        self._records[task_id] = record
        self._recent[task_id] = int(record.get("updated_seq", 0))

    def key_and_number(self, task_id: str) -> tuple[str | None, int] | None:
        """The task's key and number (None: not held), without decoding it."""
        task = self._tasks.get(task_id)
        if task is not None:
            return task.spec.key, task.number
        record = self._records.get(task_id)
        if record is None:
            return None
        return record["spec"].get("key"), int(record.get("number") or 0)

    def retryable_after(self) -> dict[str, Sequence[str]]:
        """Each FAILED or CANCELLED task that comes after others -> its ``--after``."""
        return self._retryable

    def ended_before(self, seconds: float, states: frozenset[str]) -> list[str]:
        """Ids of the tasks in ``states`` that ended before ``seconds`` (Unix time; a
        task without an end time by its creation), without decoding the others."""
        found = [
            task.id
            for task in self._tasks.values()
            if task.state.value in states and _end_of(task.ended_at, task.created_at) < seconds
        ]
        for task_id, record in self._records.items():
            end = _end_of(record.get("ended_at"), record.get("created_at"))
            if record["state"] in states and end < seconds:
                found.append(task_id)
        return found

    def state_of(self, task_id: str) -> str:
        record = self._records.get(task_id)
        return self._tasks[task_id].state.value if record is None else str(record["state"])

    def since(self, seq: int) -> list[Task]:
        """The tasks whose last change came after journal seq ``seq``: those set or
        added since the last ``checkpoint``, if ``seq`` is not before it; else all."""
        if seq >= self._checkpoint:
            late = [i for i, at in self._recent.items() if at > seq]
        else:
            late = [i for i in self.ids() if (self.updated_seq(i) or 0) > seq]
        return [self[task_id] for task_id in late]

    def checkpoint(self, seq: int) -> None:
        """Nothing will ask ``since`` of a seq before ``seq`` (a snapshot covers it):
        the ids changed up to it need not be remembered."""
        if seq > self._checkpoint:
            self._checkpoint = seq
            self._recent = {i: at for i, at in self._recent.items() if at > seq}


def _end_of(ended_at: float | None, created_at: float | None) -> float:
    return float(ended_at if ended_at is not None else created_at or 0.0)


# A state, several (any of them), or None (every state).
States = str | Iterable[str] | None


class Table:
    def __init__(self, *, load_settled: SettledLoader | None = None) -> None:
        self._live = LiveTasks()  # (a snapshot's records decoded when asked for)
        self._settled = _Settled()
        self._keys: dict[str, list[str]] = {}  # key -> ids of loaded tasks, submit order
        self._succeeded_keys: dict[str, str] = {}  # complete even when settled not loaded
        # key -> its latest task, when that ended unsafe (fold.key_outcome): complete
        # even when settled tasks are not loaded. None: not known (a snapshot written
        # before this index existed), rebuilt from every task when first needed.
        self._unsafe_keys: dict[str, str] | None = {}
        self._quarantined: dict[str, Task] = {}  # complete even when settled not loaded
        # Ids ``ferry gc`` forgot (FORGOTTEN) that the archives may still hold, with the
        # seq that forgot each: history loaded later leaves them out. Kept in snapshots
        # until a compaction rewrote the archives without them (``forget_done``).
        self._forgotten: dict[str, int] = {}
        # The queue's order, gates and group settings (ferry.core.queue); and the states
        # of settled tasks queued ones wait for, from the snapshot (no history needed).
        # A table loaded from a snapshot orders its queue when first asked (``queue``):
        # a submit, a run or a show never does, and decodes none of the tasks queued.
        self._queue = QueueIndex()
        self._queue_built = True
        self._dependency_states: dict[str, State] = {}
        self._load_settled = load_settled
        # History not loaded, asked a task at a time (None: none, loaded, or it could
        # not answer once); and how many settled tasks in each state it holds that the
        # table does not (None: not known; ``settled_counts``).
        self._history: History | None = None
        self._hidden: dict[str, int] | None = None
        self._settled_id_max = ""  # the greatest id of any settled task, loaded or not
        self._numbers: dict[int, str] = {}  # task number -> id (loaded tasks)
        self.submitted = 0  # tasks ever submitted: the number of the last one
        self.last_seq = 0
        self.lease: dict[str, Any] | None = None  # last LEASE_* event: epoch, holder, state
        self.anomalies: list[Anomaly] = []

    # ---- reading -------------------------------------------------------------------

    def get(self, task_id: str) -> Task | None:
        task = self._live.get(task_id) or self._settled.get(task_id)
        if task is None and self._history is not None:
            if task_id in self._forgotten:
                return None  # (the full load would leave it out)
            try:
                found = self._history.find(task_id)
            except HistoryMissed:
                self._history = None
            else:
                if found is not None:
                    self._take_hidden(found)
                return self._live.get(task_id) or self._settled.get(task_id)
        if task is None and self._ensure_settled():
            task = self._live.get(task_id) or self._settled.get(task_id)
        return task

    @property
    def queue(self) -> QueueIndex:
        """The queue's index, made from the tasks not settled the first time it is asked
        for (in submission order, as they were folded) when the table was loaded from a
        snapshot; kept by each fold from then on."""
        if not self._queue_built:
            self._queue_built = True
            for task in self.live():
                self._queue.update(None, task, self.state_of)
        return self._queue

    def live(self) -> list[Task]:
        """Tasks not in a terminal state, in submission order."""
        return sorted(self._live.tasks(), key=lambda task: task.submit_seq)

    def in_flight(self) -> list[Task]:
        """Tasks in flight, in submission order (only those are decoded)."""
        found = [self._live[i] for i in self._live.in_states(_IN_FLIGHT_VALUES)]
        return sorted(found, key=lambda task: task.submit_seq)

    def ids(self) -> list[str]:
        """Every task id (loads settled tasks), sorted (= creation order)."""
        self._ensure_settled()
        return sorted([*self._live, *self._settled.ids()])

    def newest(self, limit: int, state: States = None) -> list[Task]:
        """The ``limit`` last submitted tasks (every one for 0), only those in ``state``
        (a state, or several) if given, in submission order (ids made in one millisecond sort at random): the
        others are not decoded (``_Settled``). With a history not loaded, ``limit``
        tasks are read from it newest first, not all of it (``_take_newest``)."""
        if limit and self._history is not None:
            wanted = _wanted(state)
            try:
                self._take_newest(self._history, limit, wanted)
            except HistoryMissed:
                self._history = None
            else:
                ids = self._held_ids(wanted)
                ids.sort(key=self._submit_seq)
                return [self[i] for i in ids[-limit:]]
        ids = self._ids_in(state)
        ids.sort(key=self._submit_seq)
        return [self[i] for i in (ids[-limit:] if limit else ids)]

    def count_live(self) -> int:
        """How many tasks are not settled (no history needed)."""
        return len(self._live)

    def count(self, state: States = None) -> int:
        """How many tasks (in ``state`` if given) there are (without loading history
        when the snapshot said how many settled tasks it holds in each state, nor
        ever for states that are not terminal: those tasks are all held, in ``_live``)."""
        wanted = _wanted(state)
        if wanted is not None and wanted.isdisjoint(_SETTLED_VALUES):
            return len(self._live.in_states(wanted))
        if self._history is not None and self._hidden is not None:
            return len(self._held_ids(wanted)) + self._hidden_in(wanted)
        return len(self._ids_in(state))

    def _take_newest(self, history: History, limit: int, wanted: frozenset[str] | None) -> None:
        """Take in from ``history`` the tasks that belong among the ``limit`` newest (in
        ``wanted`` states): it yields the tasks the table does not hold, newest first;
        one belongs while fewer than ``limit`` tasks, held or taken, are newer, and
        none is left once every one in ``wanted`` states is found (``_hidden``)."""
        import bisect  # (lazy: `ferry run` never asks)

        left = None if self._hidden is None else self._hidden_in(wanted)
        if left == 0:
            return
        held = sorted(self._submit_seq(i) for i in self._held_ids(wanted))
        found: list[Mapping[str, Any]] = []
        for entry in history.newest(self._holds):
            newer = len(held) - bisect.bisect_right(held, (entry.submit_seq, entry.task_id))
            if newer + len(found) >= limit:
                break
            if wanted is not None and entry.state not in wanted:
                continue
            found.append(entry.record())
            if len(found) == left:
                break
        for record in found:
            self._take_hidden(record)

    def _held_ids(self, wanted: frozenset[str] | None) -> list[str]:
        """The ids of the tasks the table holds (in ``wanted`` states), no history load."""
        ids = [*self._live, *self._settled.ids()]
        return ids if wanted is None else [i for i in ids if self._state_of(i) in wanted]

    def _hidden_in(self, wanted: frozenset[str] | None) -> int:
        hidden = self._hidden or {}
        return sum(n for state, n in hidden.items() if wanted is None or state in wanted)

    def _holds(self, task_id: str) -> bool:
        """The table holds the task (its own version wins), or ``ferry gc`` forgot it."""
        return task_id in self._live or task_id in self._settled or task_id in self._forgotten

    def _take_hidden(self, record: Mapping[str, Any]) -> None:
        """A settled task read from the history not loaded, taken in as the full load
        takes it (``_add_settled``); it is no longer among the ``_hidden``."""
        if self._holds(record["id"]):
            return
        self._add_settled((record,))
        if self._hidden is not None:
            state = str(record["state"])
            left = self._hidden.get(state, 0) - 1
            if left < 0:
                self._hidden = None  # (the counts were wrong: not trusted any more)
            else:
                self._hidden[state] = left

    def _ids_in(self, state: States) -> list[str]:
        ids = self.ids()
        if state is None:
            return ids
        wanted = {state} if isinstance(state, str) else set(state)
        return [i for i in ids if self._state_of(i) in wanted]

    def _submit_seq(self, task_id: str) -> tuple[int, str]:
        held = self._live if task_id in self._live else self._settled
        return held.submit_seq(task_id), task_id

    def _state_of(self, task_id: str) -> str:
        held = self._live if task_id in self._live else self._settled
        return held.state_of(task_id)

    def __getitem__(self, task_id: str) -> Task:
        return self._live.get(task_id) or self._settled[task_id]

    def tasks(self) -> Iterator[Task]:
        """Every task (loads settled tasks), in id order."""
        for task_id in self.ids():
            yield self[task_id]

    def resolve(self, reference: str) -> Task:
        """The task ``reference`` names: its id or a unique prefix of it, its number, or
        ``last`` (NotFoundError / AmbiguousIdError, exit 5, otherwise)."""
        number = task_number(reference)
        if reference == LAST or number is not None:
            task = self.by_number(self.submitted if number is None else number)
            if task is None:
                raise NotFoundError(
                    f"no task {shown(reference)}"
                    + (" (none submitted yet)" if not self.submitted else ""),
                    details={"prefix": reference},
                )
            return task
        task = self.get(reference)
        if task is None and self._history is not None and reference.strip():
            task_id = self._unique_in_history(self._history, reference)
            if task_id is not None:
                task = self.get(task_id)
        if task is None:
            task = self.get(resolve_prefix(reference, self.ids()))
        assert task is not None
        return task

    def _unique_in_history(self, history: History, reference: str) -> str | None:
        """The one id ``reference`` is a prefix of, from the tasks held and the history
        not loaded (NotFoundError if none). None if several (the full load then names
        them all) or the history could not answer."""
        wanted = reference.strip().lower()
        try:
            archived, more = history.with_prefix(wanted, AMBIGUOUS_LISTED_MAX + 1)
        except HistoryMissed:
            self._history = None
            return None
        ids = {i for i in archived if i not in self._forgotten}
        ids.update(i for i in (*self._live, *self._settled.ids()) if i.startswith(wanted))
        if more or len(ids) > 1:
            return None
        return resolve_prefix(reference, ids)

    def by_number(self, number: int) -> Task | None:
        """The task with that number (loads history if it is not a live one's)."""
        task_id = self._numbers.get(number)
        if task_id is None and number <= self.submitted and self._history is not None:
            try:
                found = self._history.find_number(number)
            except HistoryMissed:
                self._history = None
            else:
                if found is not None:
                    self._take_hidden(found)
                task_id = self._numbers.get(number)
                return None if task_id is None else self.get(task_id)
        if task_id is None and number <= self.submitted and self._ensure_settled():
            task_id = self._numbers.get(number)
        return None if task_id is None else self.get(task_id)

    def by_key(self, key: str) -> list[str]:
        """Ids of every task submitted with ``key``, in submission order."""
        self._ensure_settled()
        found = (self.get(task_id) for task_id in self._keys.get(key, ()))
        tasks = sorted((task for task in found if task is not None), key=lambda t: t.submit_seq)
        return [task.id for task in tasks]

    def succeeded_with_key(self, key: str) -> str | None:
        """The id of the task that SUCCEEDED with ``key`` (or was resolved as having
        succeeded), if any (no history load)."""
        return self._succeeded_keys.get(key)

    def unsafe_with_key(self, key: str) -> str | None:
        """The id of ``key``'s latest task if it ended unsafe and nobody resolved it."""
        return self._unsafe_index().get(key)

    def settled_before(self, seconds: float, states: Iterable[str]) -> list[Task]:
        """The settled tasks in ``states`` that ended before ``seconds`` (Unix time), in
        submission order: what ``ferry gc`` may forget (loads history, decodes only
        those)."""
        self._ensure_settled()
        wanted = frozenset(states) & _SETTLED_VALUES
        ids = sorted(self._settled.ended_before(seconds, wanted), key=self._submit_seq)
        return [self._settled[task_id] for task_id in ids]

    @property
    def forgotten_pending(self) -> bool:
        """Tasks were forgotten whose records the archives may still hold: the next
        compaction rewrites the archives without them."""
        return bool(self._forgotten)

    def history_needs_rewrite(self) -> bool:
        """The next compaction must rewrite the archives (a merge): tasks were
        forgotten that they may hold, or the settled tasks cannot be counted without
        loading them (a snapshot from before the counts, a task forgotten unloaded)."""
        return self.forgotten_pending or self.settled_counts() is None

    def forgotten_ids(self, upto_seq: int | None = None) -> list[str]:
        """The ids forgotten (up to ``upto_seq``) that the table still remembers."""
        return sorted(i for i, at in self._forgotten.items() if upto_seq is None or at <= upto_seq)

    def forget_done(self, seq: int) -> None:
        """A compaction at ``seq`` wrote every settled task this table held then into new
        archives (the forgotten ones left out): the ids forgotten up to ``seq`` need not
        be remembered any more. Only once its history is loaded (a lazy load would
        bring them back)."""
        if self._load_settled is None:
            self._forgotten = {i: at for i, at in self._forgotten.items() if at > seq}

    def quarantined(self) -> list[Task]:
        """FAILED ``QUARANTINED_ORPHAN_ALIVE`` tasks, in id order (no history load)."""
        return [self._quarantined[i] for i in sorted(self._quarantined)]

    def queued(self) -> list[Task]:
        """QUEUED tasks, oldest first (submission order; a retry queues at its time)."""
        tasks = [self._live[i] for i in self._live.in_states(_QUEUED_VALUES)]
        return sorted(tasks, key=lambda task: (task.queue_seq, task.id))

    def oldest_queued(self) -> Task | None:
        found = self.oldest_queued_n(1)
        return found[0] if found else None

    def oldest_queued_n(self, limit: int) -> list[Task]:
        """The first ``limit`` claim candidates, whatever the time (``candidates``)."""
        return self.candidates(limit, now=math.inf)

    def candidates(
        self,
        limit: int,
        *,
        now: float,
        skip: Collection[str] = (),
        extra: Mapping[str, int] | None = None,
    ) -> list[Task]:
        """Up to ``limit`` QUEUED tasks a claim may take at ``now``, in claim order
        (priority, then queue position), under the queue's gates (``ferry.core.queue``),
        without sorting or scanning the queue. ``skip`` and ``extra``: see
        ``QueueIndex.pick`` (what the caller holds and has not claimed yet)."""
        return [self._live[i] for i in self.queue.pick(limit, now, skip=skip, extra=extra)]

    def groups(self) -> list[GroupInfo]:
        """Each group: its ``jobs`` limit (0: none), ``paused``, its tasks ``queued``
        and ``running`` (in flight under a queue claim)."""
        return self.queue.groups()

    def doomed(self) -> list[tuple[Task, str]]:
        """The queued tasks to cancel ``DEPENDENCY_FAILED``, each with the dependency
        that dooms it (one that ended other than SUCCEEDED, or is doomed itself), the
        dependencies first."""
        return [(self._live[task_id], cause) for task_id, cause in self.queue.doomed()]

    def state_of(self, task_id: str) -> State | None:
        """A task's state (None: no such task), for the dependency rules: from the
        tasks held, else the snapshot's note of it, else history."""
        if task_id in self._live:
            return State(self._live.state_of(task_id))
        if task_id in self._settled:
            return State(self._settled.state_of(task_id))
        known = self._dependency_states.get(task_id)
        if known is not None:
            return known
        task = self.get(task_id)  # (loads history)
        return None if task is None else task.state

    # ---- writing -------------------------------------------------------------------

    def validate(self, record_type: str, data: Mapping[str, Any]) -> None:
        """Raise (a FerryError) unless the event is legal now. Writes nothing."""
        self.validate_batch([(record_type, data)])

    def validate_batch(
        self, batch: Sequence[tuple[str, Mapping[str, Any]]], *, now: float | None = None
    ) -> None:
        """Validate events meant to be appended together, each against the table as the
        earlier ones of the batch would leave it (e.g. SUBMITTED then CLAIMED). ``now``:
        the time a claim's ``not_before`` is checked against (None: not checked)."""
        overlay: dict[str, Task] = {}
        keyed: dict[str, set[str]] = {}  # key -> the overlay's tasks with it (linear)
        gone: set[str] = set()  # forgotten by an earlier event of the batch
        dependants: dict[str, list[str]] | None = None  # (for a FORGOTTEN: when needed)
        taken: dict[str, int] = {}  # group -> tasks put in flight by the batch so far
        for index, (record_type, data) in enumerate(batch):
            event = decode(record_type, data)
            if event is None:
                raise ev.MalformedEventError(
                    f"unknown event type {record_type!r}", details={"type": record_type}
                )
            if isinstance(event, ev.LeaseAcquired | ev.LeaseReleased | ev.QueueEvent):
                continue
            task = None if event.task in gone else overlay.get(event.task) or self._find(event)
            if isinstance(event, ev.Forgotten):
                check_event(task, event)
                assert task is not None
                if dependants is None:
                    dependants = self._dependants(overlay)
                self._check_forget(task, dependants, gone)
                gone.add(task.id)
                if overlay.pop(task.id, None) is not None and task.spec.key is not None:
                    keyed.get(task.spec.key, set()).discard(task.id)
                continue
            check_event(task, event)
            check_write(task, event)
            self._check_queue_rules(task, event, overlay, taken, now)
            key = _key_of(event, task)
            if key is not None:
                error = key_refusal(
                    key, event.task,
                    succeeded=self._succeeded_keys.get(key),
                    unsafe=self._unsafe_index().get(key),
                    in_flight=self._key_in_flight(key, overlay, keyed.get(key, ())),
                )  # fmt: skip
                if error is not None:
                    raise error
            new = overlay[event.task] = fold_event(task, event, -(index + 1), 0.0)
            if new.spec.key is not None:
                keyed.setdefault(new.spec.key, set()).add(new.id)
            change = counted_in_flight(new) - (task is not None and counted_in_flight(task))
            if change:
                taken[new.spec.group] = taken.get(new.spec.group, 0) + change

    def _check_queue_rules(
        self,
        task: Task | None,
        event: ev.TaskEvent,
        overlay: Mapping[str, Task],
        taken: Mapping[str, int],
        now: float | None,
    ) -> None:
        """The queue's rules for a new write (``ferry.core.queue``): a claim (other than
        ``run``'s) only of a task whose group is neither paused nor full, whose
        dependencies all SUCCEEDED, whose time has come; a task submitted after tasks
        that exist; a DEPENDENCY_FAILED cancel only of a task one of whose dependencies
        really ended other than SUCCEEDED."""

        def state(task_id: str) -> State | None:
            found = overlay.get(task_id)
            return found.state if found is not None else self.state_of(task_id)

        if isinstance(event, ev.Claimed) and event.by != "run" and task is not None:
            refusal = self.queue.claim_refusal(task, taken.get(task.spec.group, 0), now)
            pending = [dep for dep in task.spec.after if state(dep) is not State.SUCCEEDED]
            if refusal is None and pending:
                refusal = "task.dependencies_pending", f"task {pending[0]} has not succeeded"
            if refusal is not None:
                code, why = refusal
                raise RefusedError(f"task {task.id}: not claimed: {why}", code=code,
                                   details={"task": task.id, "group": task.spec.group})  # fmt: skip
        elif isinstance(event, ev.Submitted):
            for dependency in event.spec.after:
                if dependency not in overlay and self.get(dependency) is None:
                    raise NotFoundError(
                        f"--after {dependency}: no such task",
                        code="task.unknown_dependency",
                        details={"task": dependency},
                    )
        elif isinstance(event, ev.Settled) and event.reason is Reason.DEPENDENCY_FAILED:
            assert task is not None
            failed = [
                dep for dep in task.spec.after
                if (found := state(dep)) is None or (found in TERMINAL_STATES
                                                     and found is not State.SUCCEEDED)
            ]  # fmt: skip
            if event.state is not State.CANCELLED or not failed:
                raise RefusedError(
                    f"task {task.id}: no task it comes after ended other than SUCCEEDED",
                    code="task.dependency_not_failed",
                    details={"task": task.id},
                )

    def _dependants(self, overlay: Mapping[str, Task]) -> dict[str, list[str]]:
        """Each task that a task not SUCCEEDED comes after (``--after``) -> those tasks:
        each may still be claimed, now or once retried (a FAILED or CANCELLED one)."""
        self._ensure_settled()
        after = dict(self._settled.retryable_after())
        after.update((task.id, task.spec.after) for task in self._live.tasks())
        for task in overlay.values():
            after[task.id] = () if task.state is State.SUCCEEDED else task.spec.after
        found: dict[str, list[str]] = {}
        for task_id, dependencies in after.items():
            for dependency in dependencies:
                found.setdefault(dependency, []).append(task_id)
        return found

    def _check_forget(
        self, task: Task, dependants: Mapping[str, list[str]], gone: set[str]
    ) -> None:
        """Kept: a task that a task not SUCCEEDED comes after, unless that one is
        forgotten first (it needs its SUCCEEDED to be claimed, now or when retried:
        forgetting it would doom that task); a key's latest task that ended unsafe (its
        operator must still retry or resolve it, and forgetting it would free the key:
        ``ferry.core.fold``)."""
        dependant = next((d for d in dependants.get(task.id, ()) if d not in gone), None)
        if dependant is not None:
            raise RefusedError(
                f"task {task.id}: task {dependant} comes after it and has not succeeded",
                code="task.has_dependants",
                details={"task": task.id, "dependant": dependant},
            )
        key = task.spec.key
        if key is not None and self._unsafe_index().get(key) == task.id:
            raise KeyUnsafeError(
                f"task {task.id} is the latest task of key {key!r} and ended in a way that"
                f" may have changed things: 'ferry retry' or 'ferry resolve' it first",
                details={"key": key, "task": task.id},
            )

    def apply(self, record_type: str, data: Mapping[str, Any], seq: int, ts: float) -> None:
        """Fold one journaled record. Records at or below ``last_seq`` are already in.

        An illegal or malformed record is skipped (an anomaly); a failure to load the
        history needed to judge it raises: never skipped, or a committed record (a
        RETRIED of an old task) would be lost without a word."""
        if seq <= self.last_seq:
            return
        try:
            event = decode(record_type, data)
        except FerryError as error:
            self._skip(seq, record_type, data, error)
            return
        if isinstance(event, ev.Forgotten):
            self.last_seq = seq
            if event.task in self._live:
                refusal = IllegalTransitionError(
                    f"task {event.task} is {self._live[event.task].state}: not forgotten"
                )
                self._skip(seq, record_type, data, refusal)
                return
            self._forget(event.task, seq)  # (no history loaded for it: see _forget)
            return
        old: Task | None = None
        not_task = ev.LeaseAcquired | ev.LeaseReleased | ev.QueueEvent
        if event is not None and not isinstance(event, not_task):
            old = self._find(event)  # (may load history as of last_seq: raises if it fails)
            self._know_dependencies(event, old)  # (the same: before the fold, never in it)
            if seq <= self.last_seq:
                return  # the load moved the table on to a snapshot that covers this record
        self.last_seq = seq
        if event is None:
            return  # a type from a newer version: ignored on purpose
        if isinstance(event, ev.QueueEvent):
            self._queue.apply(event)  # (its settings: the order need not be made)
            return
        if isinstance(event, ev.LeaseAcquired | ev.LeaseReleased):
            held = isinstance(event, ev.LeaseAcquired)
            self.lease = {"epoch": event.epoch, "holder": dict(event.holder),
                          "held": held, "seq": seq, "ts": ts}  # fmt: skip
            return
        try:
            check_event(old, event)
            new = fold_event(old, event, seq, ts)
            if isinstance(event, ev.Submitted):
                self.submitted += 1
                new = replace(new, number=self.submitted)
                self._forgotten.pop(new.id, None)  # (an id used again: never in practice)
            self._put(old, new)
            if new.spec.key is not None:
                self._index_outcome(new.spec.key, old, new)
        except FerryError as error:
            self._skip(seq, record_type, data, error)

    def _forget(self, task_id: str, seq: int) -> None:
        """The task leaves the table and its indexes, but for the succeeded-key index (a
        tombstone: the key stays succeeded). Its id is remembered until the archives no
        longer hold it, so that history loaded later leaves it out: a replay never
        loads history to apply a FORGOTTEN (the record was checked when written)."""
        # Ordered now, before anything of the task goes, the queue answers as one
        # ordered at load: it keeps the last state of a forgotten dependency of a
        # queued task, and asks again for a task queued anew after the forget
        # (tests/property/test_lazy_table_props.py). The cost: a command that folds a
        # FORGOTTEN (gc's) decodes every live task, until a compaction takes it in.
        self.queue  # noqa: B018 (built on first use)
        self._forgotten[task_id] = seq
        found = self._settled.key_and_number(task_id)
        if found is None:
            # In history not loaded yet (or never known): left out when loaded. Which
            # state it leaves is not known without reading it: nor is ``_hidden``.
            self._hidden = None
            return
        key, number = found
        self._settled.pop(task_id)
        self._quarantined.pop(task_id, None)
        if number and self._numbers.get(number) == task_id:
            del self._numbers[number]
        if key is not None:
            ids = self._keys.get(key, [])
            if task_id in ids:
                ids.remove(task_id)
            if self._unsafe_keys is not None and self._unsafe_keys.get(key) == task_id:
                del self._unsafe_keys[key]  # (a journal whose writer broke the rule)

    def _skip(self, seq: int, record_type: str, data: Any, error: FerryError) -> None:
        """Record ``seq`` is illegal or malformed: skipped, listed as an anomaly."""
        self.last_seq = seq
        task_id = data.get("task") if isinstance(data, Mapping) else None
        anomaly = Anomaly(
            seq, record_type, task_id if isinstance(task_id, str) else None,
            error.code, error.message,
        )  # fmt: skip
        self.anomalies.append(anomaly)
        del self.anomalies[:-ANOMALIES_KEPT_MAX]

    def apply_record(self, record: RecordLike) -> None:
        """``apply`` for a ``journal.Record`` (usable directly as a subscriber)."""
        self.apply(record.type, record.data, record.seq, record.ts)

    # ---- snapshots -----------------------------------------------------------------

    def to_snapshot(self) -> dict[str, Any]:
        self._ensure_settled()
        snapshot = self.live_snapshot()
        snapshot["settled"] = [
            task_to_record(self._settled[i]) for i in sorted(self._settled.ids())
        ]
        return snapshot

    def live_snapshot(self) -> dict[str, Any]:
        """The snapshot without settled tasks, and without loading history: what a
        store keeps in the journal snapshot while settled tasks go to an archive."""
        return {
            "format": SNAPSHOT_FORMAT,
            "last_seq": self.last_seq,
            "lease": self.lease,
            "anomalies": [anomaly.to_json() for anomaly in self.anomalies],
            "live": [task_to_record(task) for task in self.live()],
            "succeeded_keys": dict(self._succeeded_keys),
            "unsafe_keys": dict(self._unsafe_index()),
            "quarantined": [task_to_record(t) for t in self.quarantined()],
            "settled_id_max": self._settled_id_max,
            "submitted": self.submitted,
            **({"forgotten": sorted(self._forgotten)} if self._forgotten else {}),
            "queue": self.queue.to_snapshot(),
            **({} if (counts := self.settled_counts()) is None else {"settled_counts": counts}),
        }

    def settled_counts(self) -> dict[str, int] | None:
        """How many settled tasks there are in each state, history loaded or not: in
        the snapshot, a table loaded from it counts (``ls``'s "N of M") and knows when
        its history holds no more in a state, without loading it. None: not known
        without loading history (a snapshot from before the counts, a task forgotten
        that the table had not loaded)."""
        counts: dict[str, int] = {}
        if self._load_settled is not None:
            if self._hidden is None:
                return None
            counts.update(self._hidden)
        for state, n in self._settled.counts().items():
            counts[state] = counts.get(state, 0) + n
        return {state: counts[state] for state in sorted(counts) if counts[state]}

    def settled_since(self, seq: int) -> list[dict[str, Any]]:
        """Records of the tasks that became terminal after journal seq ``seq`` (the
        archive delta for a new snapshot; needs no history)."""
        return [task_to_record(t) for t in self._settled.since(seq)]

    def settled_held(self) -> int:
        """How many settled tasks this table holds (loaded or folded) that a table
        loaded from its snapshot would not (the quarantined are in it), no I/O."""
        return len(self._settled) - len(self._quarantined)

    def archived(self, seq: int) -> None:
        """A snapshot at ``seq`` is written, with every task settled up to it in its
        archives: ``settled_since`` will not be asked of an earlier seq."""
        self._settled.checkpoint(seq)

    @classmethod
    def from_snapshot(
        cls,
        data: Mapping[str, Any],
        *,
        load_settled: SettledLoader | None = None,
        history: History | None = None,
    ) -> Table:
        """Rebuild a table. Without ``settled`` in ``data``, settled tasks come from
        ``load_settled`` when first needed (None: the table holds live tasks only), and
        those a few lines answer from ``history`` (the same archives, read a task at a
        time: see the module's docstring)."""
        if data.get("format") != SNAPSHOT_FORMAT:
            raise ev.MalformedEventError(
                f"unsupported snapshot format {data.get('format')!r}",
                code="snapshot.format", details={"format": data.get("format")},
            )  # fmt: skip
        table = cls(load_settled=load_settled)
        table.last_seq = int(data["last_seq"])
        table.lease = data.get("lease")
        table.anomalies = [Anomaly(**anomaly) for anomaly in data.get("anomalies", ())]
        table._succeeded_keys = dict(data.get("succeeded_keys", {}))
        table._settled_id_max = str(data.get("settled_id_max", ""))
        table.submitted = int(data.get("submitted", 0))
        table._forgotten = dict.fromkeys(data.get("forgotten", ()), table.last_seq)
        queue = data.get("queue") or {}
        table._queue.load_settings(queue)
        table._queue_built = False
        table._dependency_states = settled_states(queue)
        for record in data["live"]:
            task_id, state, key, number = check_record(record)
            if state in _SETTLED_VALUES:  # (never written so: taken in as it says)
                table._put(None, task_from_record(record))
            else:
                table._take_live(task_id, record, key, number)
        for record in data.get("quarantined", ()):  # settled, but needed without history
            table._put(None, task_from_record(record))
        if "settled" in data:
            table._load_settled = None
            table._add_settled(data["settled"])
        elif load_settled is not None and history is not None:
            table._history = history
            table._hidden = table._hidden_from(data)
        unsafe = data.get("unsafe_keys")
        table._unsafe_keys = None if unsafe is None else dict(unsafe)
        return table

    # ---- internals -----------------------------------------------------------------

    def _hidden_from(self, data: Mapping[str, Any]) -> dict[str, int] | None:
        """The settled tasks by state that the snapshot's history holds and this table
        (just loaded from it) does not: its ``settled_counts`` less the quarantined."""
        counts = data.get("settled_counts")
        if not isinstance(counts, Mapping) or data.get("forgotten"):
            return None  # (forgotten ids: the counts, if any, are not to be trusted)
        hidden = {str(state): int(n) for state, n in counts.items()}
        for state, n in self._settled.counts().items():
            hidden[state] = hidden.get(state, 0) - n
        return None if any(n < 0 for n in hidden.values()) else hidden

    def _find(self, event: ev.TaskEvent) -> Task | None:
        if isinstance(event, ev.Submitted):
            # A new id sorts after every settled one (ids sort by creation time), so
            # history is loaded only if the clock went back: duplicates are refused
            # the same way whether or not history is loaded.
            known = self._live.get(event.task) or self._settled.get(event.task)
            if known is None and event.task <= self._settled_id_max:
                return self.get(event.task)
            return known
        return self.get(event.task)

    def _know_dependencies(self, event: ev.TaskEvent, task: Task | None) -> None:
        """Make sure the states of the tasks ``task`` comes after are at hand (loading
        history if one is settled and unknown), so that folding ``event`` needs none."""
        spec = (
            event.spec if isinstance(event, ev.Submitted) else None if task is None else task.spec
        )
        if spec is not None:
            for dependency in spec.after:
                self.state_of(dependency)

    def _ensure_settled(self) -> bool:
        """Load settled tasks if a loader is pending; True if it just did. The table may
        then have become one rebuilt from a newer snapshot (see SettledLoader), with a
        loader of its own: loaded in turn. A load that fails raises, the loader kept."""
        loaded = False
        while self._load_settled is not None:
            history = self._load_settled(self.last_seq)
            loaded = True
            if isinstance(history, Table):
                self.__dict__.update(history.__dict__)  # this table, moved on
                continue
            self._add_settled(history)  # (taking a record twice is harmless)
            self._load_settled = None
        if loaded:
            self._history, self._hidden = None, None
        return loaded

    def _add_settled(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Take archived tasks in.  A plainly settled one stays a record until asked for
        (``_Settled``); this indexes it from the record's own fields."""
        for record in records:
            task_id = record["id"]
            if task_id in self._live or task_id in self._forgotten:
                continue  # retried since it was archived (newer), or forgotten since
            known = self._settled.updated_seq(task_id)
            if known is not None and int(record.get("updated_seq", 0)) <= known:
                continue  # archived twice: the newer wins
            state, key = record["state"], record["spec"].get("key")
            outcome = key_outcome(state, record.get("reason"), record.get("evidence") or {})
            if outcome == "succeeded" and key is not None:
                self._succeeded_keys[key] = task_id
            if state not in _SETTLED_VALUES or record.get("reason") == _QUARANTINED:
                # Not terminal, or quarantined (kept as a Task in its own index): decoded
                # now, and indexed by _put.
                old = None if known is None else self._settled.get(task_id)
                self._put(old, task_from_record(record))
                continue
            # What _put does for a settled task, from the record's fields:
            if known is None and key is not None:
                self._keys.setdefault(key, []).append(task_id)
            if record.get("number"):
                self._numbers[int(record["number"])] = task_id
            self._quarantined.pop(task_id, None)
            self._settled.add_record(record)
            self._settled_id_max = max(self._settled_id_max, task_id)

    def _take_live(self, task_id: str, record: Mapping[str, Any], key: str | None,
                   number: int) -> None:  # fmt: skip
        """What ``_put`` does for a task not settled, loaded from a snapshot, from its
        record's fields (the queue's order is made later: ``queue``)."""
        if key is not None:
            self._keys.setdefault(key, []).append(task_id)
        if number:
            self._numbers[number] = task_id
        self._live.add_record(task_id, record)

    def _put(self, old: Task | None, new: Task) -> None:
        if old is None and new.spec.key is not None:
            self._keys.setdefault(new.spec.key, []).append(new.id)
        if new.number:
            self._numbers[new.number] = new.id
        if new.state is State.FAILED and new.reason is Reason.QUARANTINED_ORPHAN_ALIVE:
            self._quarantined[new.id] = new
        else:
            self._quarantined.pop(new.id, None)
        if new.terminal:
            self._live.pop(new.id)
            self._settled[new.id] = new
            self._settled_id_max = max(self._settled_id_max, new.id)
        else:
            self._settled.pop(new.id)
            self._live[new.id] = new
        if self._queue_built:
            self._queue.update(old, new, self.state_of)

    def _index_outcome(self, key: str, old: Task | None, new: Task) -> None:
        """Keep the key outcome indexes true after the fold made ``old`` (None: just
        submitted) into ``new``. Only the fold moves them: a snapshot carries them
        whole, and an archive's records are older than what they say."""
        outcome = task_key_outcome(new)
        if outcome == "succeeded":
            self._succeeded_keys[key] = new.id
        elif self._succeeded_keys.get(key) == new.id:
            del self._succeeded_keys[key]  # resolved as succeeded, then retried
        unsafe = self._unsafe_keys
        if unsafe is not None:
            if outcome == "unsafe":
                unsafe[key] = new.id
            elif old is None or unsafe.get(key) == new.id:
                # A newer task with the key is its latest now (journals written before
                # the unsafe rule); or this one was retried or resolved.
                unsafe.pop(key, None)

    def _unsafe_index(self) -> dict[str, str]:
        """``_unsafe_keys``, rebuilt from every task (loading history) if not known."""
        if self._unsafe_keys is None:
            latest: dict[str, tuple[int, str, str | None]] = {}
            for task in self.tasks():
                key = task.spec.key
                if key is not None and task.submit_seq >= latest.get(key, (-1, "", None))[0]:
                    latest[key] = (task.submit_seq, task.id, task_key_outcome(task))
            self._unsafe_keys = {
                key: task_id for key, (_, task_id, outcome) in latest.items() if outcome == "unsafe"
            }
        return self._unsafe_keys

    def _key_in_flight(
        self, key: str, overlay: Mapping[str, Task], batch_ids: Iterable[str]
    ) -> list[Task]:
        """The live tasks with ``key`` (those of the batch being checked included:
        ``batch_ids``, the overlay's tasks with it, from an index the batch keeps, not a
        scan of the overlay for each record: a ``submit --from`` of 20,000 keyed lines
        spent most of a minute here, inside a database transaction)."""
        ids = {task_id for task_id in self._keys.get(key, ()) if task_id in self._live}
        ids.update(batch_ids)
        found = [overlay.get(i) or self._live.get(i) for i in ids]
        return [task for task in found if task is not None]


def _wanted(state: States) -> frozenset[str] | None:
    return None if state is None else frozenset({state} if isinstance(state, str) else state)


def _key_of(event: ev.TaskEvent, task: Task | None) -> str | None:
    if isinstance(event, ev.Submitted):
        return event.spec.key
    if isinstance(event, ev.Retried) and task is not None:
        return task.spec.key
    return None
