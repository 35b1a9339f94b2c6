"""The queue's order and its gates (pure): which queued tasks a claim takes next, and
whether a claim may take a task now (contract.md, "Queue control and housekeeping").

Order: priority (higher first), then queue position (``queue_seq``: the journal seq of
the task's SUBMITTED, or of the RETRIED that queued its attempt; a release keeps it).

Gates, each checked again under the journal's lock when the claim is written
(``ferry.core.state.Table.validate_batch``):

* the task's group is not paused (``ferry pause``; every group, or this one);
* its group has room: fewer of its tasks in flight than the group's ``jobs`` (0: no
  limit of its own). In flight means CLAIMED, DISPATCHING, RUNNING or STALE under a
  claim by ``claim`` or ``work``, survivors of an earlier ``work`` included; ``ferry
  run``'s tasks never pass through the queue and do not count;
* every task of its ``--after`` SUCCEEDED (one that ended otherwise dooms it: it is
  cancelled ``DEPENDENCY_FAILED`` by the next leader that looks, see :meth:`doomed`);
* its ``not_before`` (``--not-before``, or a retry's delay) has passed.

How choosing avoids scanning the queue (``bench/run.py claim-order``): each queued task
is in exactly one place. BLOCKED: waiting for dependencies (indexed by the dependency:
a dependency's change visits its waiters only). TIMED: in one heap by ``not_before``,
moved on when its time comes. READY: in its group's heap by (-priority, queue_seq).
A pick looks at the head of each group that is neither paused nor full, and takes
the best head, as often as asked: O((groups + picks) log n), whatever the queue's
length. Heap entries are deleted lazily: an entry is valid while its task is queued in
that incarnation (``serial``), and heaps with too many dead entries are rebuilt.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping

from ferry.core import events as ev
from ferry.core.model import TERMINAL_STATES, State, Task

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["QueueIndex", "counted_in_flight"]

BLOCKED, TIMED, READY = "blocked", "timed", "ready"
_DEAD_ENTRIES_MIN = 64  # a heap is rebuilt once it holds this many more dead entries than live

StateOf = Callable[[str], "State | None"]
"""The state of a task by id, as the table knows it now (None: no such task)."""

if TYPE_CHECKING:
    GroupInfo = dict[str, Any]


def counted_in_flight(task: Task) -> bool:
    """Whether the task holds a place in its group: in flight under a queue claim."""
    return task.in_flight and task.claimed_by != "run"


class _Entry:
    __slots__ = ("after", "group", "not_before", "priority", "queue_seq", "serial", "status")

    def __init__(self, task: Task, serial: int) -> None:
        self.group, self.priority = task.spec.group, task.spec.priority
        self.queue_seq, self.not_before = task.queue_seq, task.not_before
        self.after, self.serial = task.spec.after, serial
        self.status = BLOCKED


class QueueIndex:
    """The queued tasks by group, priority and gate; the groups' settings; the tasks
    in flight per group. Kept by :class:`ferry.core.state.Table` (``update`` for each
    task it folds, ``apply`` for each GROUP_* event)."""

    def __init__(self) -> None:
        self.jobs: dict[str, int] = {}  # group -> limit (absent or 0: none of its own)
        self.paused_groups: dict[str, bool] = {}  # group -> its own pause (absent: all's)
        self.paused_all = False
        self._entries: dict[str, _Entry] = {}  # queued task -> where it is
        self._ready: dict[str, list[tuple[int, int, int, str]]] = {}  # (-prio, qseq, serial, id)
        self._ready_count: dict[str, int] = {}
        self._timed: list[tuple[float, int, str]] = []  # (not_before, serial, id)
        self._timed_count = 0
        self._blocked: dict[str, set[str]] = {}  # queued task -> dependencies not SUCCEEDED
        self._failed: dict[str, set[str]] = {}  # queued task -> dependencies that ended otherwise
        self._waiters: dict[str, set[str]] = {}  # dependency -> queued tasks waiting on it
        # Every dependency of a queued task: how many name it, and its state, kept up to
        # date (a snapshot notes the settled ones: a table loaded from it needs no history).
        self._refs: dict[str, int] = {}
        self._dep_states: dict[str, State | None] = {}
        self._queued: dict[str, int] = {}  # group -> queued tasks
        self._running: dict[str, set[str]] = {}  # group -> tasks in flight (counted)
        self._serials = itertools.count(1)

    # ---- settings ------------------------------------------------------------------

    def paused(self, group: str) -> bool:
        return self.paused_groups.get(group, self.paused_all)

    def apply(self, event: ev.QueueEvent) -> None:
        """A GROUP_SET, GROUP_PAUSED or GROUP_RESUMED, folded."""
        if isinstance(event, ev.GroupSet):
            self.jobs[event.group] = event.jobs  # (0 too: a group set is listed)
            return
        pause = isinstance(event, ev.GroupPaused)
        if event.group is None:  # every group: each one's own setting is forgotten
            self.paused_all = pause
            self.paused_groups.clear()
        elif pause == self.paused_all:
            self.paused_groups.pop(event.group, None)
        else:
            self.paused_groups[event.group] = pause

    # ---- folding ---------------------------------------------------------------------

    def update(self, old: Task | None, new: Task, state_of: StateOf) -> None:
        """The table folded ``old`` (None: just submitted) into ``new``."""
        group = new.spec.group
        was = old is not None and counted_in_flight(old)
        now = counted_in_flight(new)
        if was and not now:
            self._running[group].discard(new.id)
        elif now and not was:
            self._running.setdefault(group, set()).add(new.id)
        was_queued = old is not None and old.state is State.QUEUED
        if new.state is State.QUEUED:
            entry = self._entries.get(new.id)
            if entry is None or not was_queued or entry.queue_seq != new.queue_seq:
                self._remove(new.id)
                self._add(new, state_of)
        elif was_queued or new.id in self._entries:
            self._remove(new.id)
        if new.id in self._refs:
            self._dep_states[new.id] = new.state
            if new.id in self._waiters:
                self._dependency_moved(new.id, new.state)

    def _add(self, task: Task, state_of: StateOf) -> None:
        group = task.spec.group
        entry = _Entry(task, next(self._serials))
        self._entries[task.id] = entry
        self._queued[group] = self._queued.get(group, 0) + 1
        pending: set[str] = set()
        for dependency in task.spec.after:
            if dependency not in self._refs:
                self._refs[dependency] = 0
                self._dep_states[dependency] = state_of(dependency)
            self._refs[dependency] += 1
            state = self._dep_states[dependency]
            if state is State.SUCCEEDED:
                continue  # final: satisfied for good
            pending.add(dependency)
            self._waiters.setdefault(dependency, set()).add(task.id)
            if state is None or state in TERMINAL_STATES:
                self._failed.setdefault(task.id, set()).add(dependency)
        if pending:
            self._blocked[task.id] = pending
        else:
            self._release(task.id, entry)

    def _release(self, task_id: str, entry: _Entry) -> None:
        """Its dependencies all SUCCEEDED: ready now, or once its time comes."""
        if entry.not_before is not None:
            entry.status = TIMED
            heapq.heappush(self._timed, (entry.not_before, entry.serial, task_id))
            self._timed_count += 1
            return
        entry.status = READY
        heap = self._ready.setdefault(entry.group, [])
        heapq.heappush(heap, (-entry.priority, entry.queue_seq, entry.serial, task_id))
        self._ready_count[entry.group] = self._ready_count.get(entry.group, 0) + 1

    def _remove(self, task_id: str) -> None:
        entry = self._entries.pop(task_id, None)
        if entry is None:
            return
        self._queued[entry.group] -= 1
        if not self._queued[entry.group]:
            del self._queued[entry.group]
        if entry.status is READY:
            self._ready_count[entry.group] -= 1
            self._tidy(entry.group)
        elif entry.status is TIMED:
            self._timed_count -= 1
        for dependency in self._blocked.pop(task_id, ()):
            self._forget_waiter(dependency, task_id)
        self._failed.pop(task_id, None)
        for dependency in entry.after:
            self._refs[dependency] -= 1
            if not self._refs[dependency]:
                del self._refs[dependency]
                del self._dep_states[dependency]

    def _forget_waiter(self, dependency: str, task_id: str) -> None:
        waiters = self._waiters.get(dependency)
        if waiters is None:
            return
        waiters.discard(task_id)
        if not waiters:
            del self._waiters[dependency]

    def _dependency_moved(self, dependency: str, state: State) -> None:
        for waiter in list(self._waiters[dependency]):
            failed = self._failed.get(waiter)
            if state is State.SUCCEEDED:
                pending = self._blocked[waiter]
                pending.discard(dependency)
                self._forget_waiter(dependency, waiter)
                if failed is not None:
                    failed.discard(dependency)
                if not pending:
                    del self._blocked[waiter]
                    self._release(waiter, self._entries[waiter])
            elif state in TERMINAL_STATES:
                self._failed.setdefault(waiter, set()).add(dependency)
            elif failed is not None:  # retried: it may succeed yet
                failed.discard(dependency)
                if not failed:
                    del self._failed[waiter]

    def _tidy(self, group: str) -> None:
        """Rebuild a group's heap once dead entries outnumber live ones (cancelled tasks
        leave theirs behind): the heap stays proportional to the ready queue."""
        heap = self._ready.get(group)
        if heap is None or len(heap) < 2 * self._ready_count[group] + _DEAD_ENTRIES_MIN:
            return
        self._ready[group] = [item for item in heap if self._live_ready(item)]
        heapq.heapify(self._ready[group])

    def _live_ready(self, item: tuple[int, int, int, str]) -> bool:
        entry = self._entries.get(item[3])
        return entry is not None and entry.serial == item[2] and entry.status is READY

    # ---- choosing --------------------------------------------------------------------

    def wake(self, now: float) -> None:
        """The TIMED tasks whose time has come become READY."""
        timed = self._timed
        while timed and timed[0][0] <= now:
            _, serial, task_id = heapq.heappop(timed)
            entry = self._entries.get(task_id)
            if entry is not None and entry.serial == serial and entry.status is TIMED:
                self._timed_count -= 1
                entry.not_before = None
                self._release(task_id, entry)
        if len(timed) >= 2 * self._timed_count + _DEAD_ENTRIES_MIN:
            self._timed = [item for item in timed if self._live_timed(item)]
            heapq.heapify(self._timed)

    def _live_timed(self, item: tuple[float, int, str]) -> bool:
        entry = self._entries.get(item[2])
        return entry is not None and entry.serial == item[1] and entry.status is TIMED

    def room(self, group: str, extra: int = 0) -> float:
        """How many more of the group's tasks may be claimed (inf: no limit)."""
        jobs = self.jobs.get(group, 0)
        if not jobs:
            return math.inf
        return jobs - len(self._running.get(group, ())) - extra

    def pick(
        self,
        limit: int,
        now: float,
        *,
        skip: Collection[str] = (),
        extra: Mapping[str, int] | None = None,
    ) -> list[str]:
        """Up to ``limit`` task ids to claim, best first, under every gate. ``skip``:
        queued tasks the caller holds already (not offered again); ``extra``: places the
        caller holds per group beyond the tasks in flight (positive: picked, not yet
        claimed; negative: ended, the end not yet written)."""
        self.wake(now)
        extra = extra or {}
        heads: list[tuple[tuple[int, int, int, str], str]] = []
        room: dict[str, float] = {}
        aside: dict[str, list[tuple[int, int, int, str]]] = {}  # popped, valid: put back
        for group, heap in self._ready.items():
            if not heap or self.paused(group):
                continue
            room[group] = self.room(group, extra.get(group, 0))
            if room[group] > 0:
                head = self._head(group, skip, aside)
                if head is not None:
                    heads.append((head, group))
        heapq.heapify(heads)
        found: list[str] = []
        while heads and len(found) < limit:
            item, group = heapq.heappop(heads)
            aside.setdefault(group, []).append(heapq.heappop(self._ready[group]))
            found.append(item[3])
            room[group] -= 1
            if room[group] > 0:
                head = self._head(group, skip, aside)
                if head is not None:
                    heapq.heappush(heads, (head, group))
        for group, items in aside.items():
            heap = self._ready[group]
            for item in items:
                heapq.heappush(heap, item)
        return found

    def _head(
        self, group: str, skip: Collection[str], aside: dict[str, list[tuple[int, int, int, str]]]
    ) -> tuple[int, int, int, str] | None:
        """The group's best live entry not skipped (left on top of its heap): dead
        entries are dropped for good, skipped ones set aside."""
        heap = self._ready[group]
        while heap:
            item = heap[0]
            if not self._live_ready(item):
                heapq.heappop(heap)
            elif item[3] in skip:
                aside.setdefault(group, []).append(heapq.heappop(heap))
            else:
                return item
        return None

    def next_time(self) -> float | None:
        """When the next TIMED task becomes ready (None: none waits)."""
        return self._timed[0][0] if self._timed else None  # (maybe a dead entry's: early)

    # ---- the claim rule, and the doomed -----------------------------------------------

    def claim_refusal(self, task: Task, extra: int, now: float | None) -> tuple[str, str] | None:
        """(code, why) if ``task`` may not be claimed now: its group paused or full
        (``extra``: more of its group taken in the same write), its time not come
        (``now`` None: not checked). Dependencies are the table's to check: it knows
        the batch's other events."""
        group = task.spec.group
        if self.paused(group):
            return "task.group_paused", f"group {group} is paused"
        if self.room(group, extra) <= 0:
            return "task.group_full", f"group {group} has {self.jobs[group]} task(s) in flight"
        if now is not None and task.not_before is not None and task.not_before > now:
            self._not_yet(task.id, task.not_before)
            return "task.not_before", "its time has not come"
        return None

    def _not_yet(self, task_id: str, not_before: float) -> None:
        """A task woken by a clock that read later than the clock of a write (stepped
        back since: NTP, a VM restored) waits for its time again, so that picks pass it
        by. (Was: picked and refused at every turn, and a run of such refusals stopped
        every claim of the queue.)"""
        entry = self._entries.get(task_id)
        if entry is None or entry.status is not READY:
            return
        self._ready_count[entry.group] -= 1
        self._tidy(entry.group)
        entry.serial = next(self._serials)  # (its item in the ready heap is dead now)
        entry.not_before = not_before
        self._release(task_id, entry)

    def doomed(self) -> list[tuple[str, str]]:
        """(task, dependency) for each queued task to cancel ``DEPENDENCY_FAILED``: one
        of its dependencies ended other than SUCCEEDED (and no retry of it is queued),
        or is itself doomed. Dependencies come before their dependants."""
        found: dict[str, str] = {}
        todo = [(task_id, min(deps)) for task_id, deps in sorted(self._failed.items())]
        while todo:
            task_id, cause = todo.pop(0)
            if task_id in found:
                continue
            found[task_id] = cause
            todo.extend((waiter, task_id) for waiter in sorted(self._waiters.get(task_id, ())))
        return list(found.items())

    # ---- looking -------------------------------------------------------------------

    def groups(self) -> list[GroupInfo]:
        """Every group with a setting or a task queued or in flight (and ``default``)."""
        names = {"default", *self.jobs, *self.paused_groups, *self._queued}
        names.update(group for group, running in self._running.items() if running)
        return [
            {
                "group": name,
                "jobs": self.jobs.get(name, 0),
                "paused": self.paused(name),
                "queued": self._queued.get(name, 0),
                "running": len(self._running.get(name, ())),
            }
            for name in sorted(names)
        ]

    # ---- snapshots -------------------------------------------------------------------

    def to_snapshot(self) -> dict[str, Any]:
        """The settings, and the states of the settled tasks that queued tasks come after
        (so that a table loaded from a snapshot needs no history to know them)."""
        settled = {
            task_id: state.value
            for task_id, state in sorted(self._dep_states.items())
            if state is not None and state in TERMINAL_STATES
        }
        return {
            "jobs": dict(sorted(self.jobs.items())),
            "paused": dict(sorted(self.paused_groups.items())),
            "paused_all": self.paused_all,
            "dependency_states": settled,
        }

    def load_settings(self, data: Mapping[str, Any]) -> None:
        self.jobs = {str(k): int(v) for k, v in (data.get("jobs") or {}).items()}
        self.paused_groups = {str(k): bool(v) for k, v in (data.get("paused") or {}).items()}
        self.paused_all = bool(data.get("paused_all", False))


def settled_states(data: Mapping[str, Any]) -> dict[str, State]:
    """The dependency states a snapshot's queue part carries."""
    return {str(k): State(v) for k, v in (data.get("dependency_states") or {}).items()}


def topological(items: Iterable[tuple[str, Collection[str]]]) -> list[str] | None:
    """The ids of ``items`` (id, ids it comes after), each after those of its ``after``
    that are among the items; None if they form a cycle."""
    after = {key: [dep for dep in deps] for key, deps in items}
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the path, 2: placed
    for start in after:
        if state.get(start) == 2:
            continue
        stack = [(start, iter(after[start]))]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next((c for c in children if c in after and state.get(c) != 2), None)
            if child is None:
                stack.pop()
                state[node] = 2
                order.append(node)
            elif state.get(child) == 1:
                return None
            else:
                state[child] = 1
                stack.append((child, iter(after[child])))
    return order
