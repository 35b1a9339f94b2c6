"""What a claim writes, and the seam's claim operations for the backends that decide
under one writer's lock (the local journal, the memory store); PostgreSQL does the same
in one call of its ``ferry_claim`` function (``ferry.storage.postgres.schema``, version
4), which must write exactly these events and fold them exactly so (the PostgreSQL
tests compare the two).

A claim is CLAIMED (naming the task's runner: its supervisor) and, for a task without
pinned inputs, its DISPATCHING in the same write: such a task's intent depends on
nothing its supervisor has to find out (its marker is ``<id>:<attempt>:<token>``, its
evidence empty: ``ferry.app.runner.plan_task`` makes the same). A task with pinned
inputs is claimed alone (CLAIMED): its supervisor hashes them again first, and the
launcher then writes its DISPATCHING, or its SETTLED FAILED if an input changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ferry.core import events as ev
from ferry.core.errors import RefusedError
from ferry.core.fold import MOVED_CODES, RACE_TRIES
from ferry.core.queue import counted_in_flight
from ferry.proc.process import make_marker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ferry.core.model import Task
    from ferry.storage import Claimant, EncodedEvent, TaskStore, Written

Decide = Callable[[Mapping[str, "Task | None"]], Sequence["ev.Event | EncodedEvent"]]


def dispatching_with_claim(task: Task, token: str) -> ev.Dispatching | None:
    """The DISPATCHING a claim of ``task`` with ``token`` writes with its CLAIMED; None
    for a task with pinned inputs (planned first)."""
    if task.spec.pointers:
        return None
    marker = make_marker(task.id, task.attempt, token)
    return ev.Dispatching(task.id, task.attempt, token, marker, {})


def claim_events(task: Task, runner: Mapping[str, Any], token: str, by: str) -> list[ev.Event]:
    """CLAIMED, and the DISPATCHING that goes with it if any."""
    claimed: list[ev.Event] = [ev.Claimed(task.id, task.attempt, token, dict(runner), by)]
    dispatching = dispatching_with_claim(task, token)
    return claimed if dispatching is None else [*claimed, dispatching]


def claim_by_commit(
    store: TaskStore,
    runner: Mapping[str, Any],
    token: str,
    *,
    by: str,
    epoch: int,
    announce: Sequence[ev.Event] = (),
) -> Task | None:
    """``claim_next`` for a store whose ``commit`` validates under its one writer's lock:
    the best candidate, committed with ``announce``; a candidate that moved meanwhile
    (claimed, cancelled, its group paused: the commit caught up and refused it) is
    skipped for the next."""
    refused: set[str] = set()
    last: RefusedError | None = None
    for _ in range(RACE_TRIES):
        found = store.queued(1, skip=refused)
        if not found:
            return None
        task = found[0]
        try:
            store.commit(*announce, *claim_events(task, runner, token, by), epoch=epoch)
        except RefusedError as error:
            if error.code not in MOVED_CODES:
                raise
            refused.add(task.id)
            last = error
            continue
        return store.get(task.id)
    assert last is not None
    raise last


def claimed_in(store: TaskStore, token: str) -> Task | None:
    """The task in flight under the claim ``token``, from ``store``'s table (caught up)."""
    store.refresh()
    for task in store.in_flight():
        if task.claim_token == token:
            return task
    return None


def commit_decided(
    store: TaskStore,
    ids: Sequence[str],
    decide: Decide,
    *,
    epoch: int,
    claims: Sequence[Claimant] = (),
    by: str = "work",
) -> Written:
    """``commit_against`` for a store whose table is its own: ``decide`` reads the tasks
    as last caught up (the commit validates its records under the lock), the claims
    take the first candidates (the places the records free counted free: ``freed``),
    all in one commit. Refused because a task moved meanwhile (the commit caught the
    table up): decided once again, as a database decides on the rows as they are when
    written. Refused otherwise: the records alone, then each claim as
    ``claim_by_commit`` makes it."""
    from ferry.storage import Written

    tries = 2  # (once more: a write racing on moves the task again, rarely: raised)
    while True:
        tries -= 1
        current = {task_id: store.get(task_id) for task_id in ids}
        batch = list(decide(current))
        candidates = store.queued(len(claims), extra=freed(current, batch)) if claims else []
        pairs = list(zip(claims, candidates, strict=False))
        claiming = [
            e for (runner, token), task in pairs for e in claim_events(task, runner, token, by)
        ]
        if batch or claiming:
            try:
                store.commit(*batch, *claiming, epoch=epoch)
            except RefusedError as error:
                if error.code in MOVED_CODES and tries:
                    continue
                if not claiming:
                    raise
                if batch:
                    store.commit(*batch, epoch=epoch)
                return Written(_tasks(store, ids), _claim_each(store, claims, by, epoch))
        claimed = [store.get(task.id) for _, task in pairs]
        return Written(_tasks(store, ids), [task for task in claimed if task is not None])


def freed(
    current: Mapping[str, Task | None], batch: Sequence[ev.Event | EncodedEvent]
) -> dict[str, int]:
    """Per group, minus the places the tasks ``batch`` ends (SETTLED, RELEASED) hold now:
    a claim in the same write may take them (``queued``'s ``extra``)."""
    ends = {ev.EventType.SETTLED.value, ev.EventType.RELEASED.value}
    extra: dict[str, int] = {}
    for record in batch:
        kind, data = record if isinstance(record, tuple) else record.encode()
        task = current.get(str(data.get("task")))
        if kind in ends and task is not None and counted_in_flight(task):
            extra[task.spec.group] = extra.get(task.spec.group, 0) - 1
    return extra


def _tasks(store: TaskStore, ids: Sequence[str]) -> dict[str, Task | None]:
    return {task_id: store.get(task_id) for task_id in ids}


def _claim_each(store: TaskStore, claims: Sequence[Claimant], by: str, epoch: int) -> list[Task]:
    claimed = []
    for runner, token in claims:
        task = claim_by_commit(store, runner, token, by=by, epoch=epoch)
        if task is None:
            break
        claimed.append(task)
    return claimed


class ClaimsUnderLock:
    """The seam's claim operations of a backend that decides under one writer's lock
    (the local journal, the memory store): each a commit of the store itself, validated
    under that lock. (PostgreSQL has its own: one call of ``ferry_claim``.)"""

    def claim_next(
        self: TaskStore,
        runner: Mapping[str, Any],
        token: str,
        *,
        by: str,
        epoch: int,
        announce: Sequence[ev.Event] = (),
    ) -> Task | None:
        """The best candidate from the table, committed (validated under the lock);
        one that moved meanwhile is skipped for the next."""
        return claim_by_commit(self, runner, token, by=by, epoch=epoch, announce=announce)

    def claimed_with(self: TaskStore, token: str, *, writer_pid: int | None = None) -> Task | None:
        """(A commit's outcome is always known here: it appended, or raised.)"""
        return claimed_in(self, token)

    def commit_against(
        self: TaskStore,
        ids: Sequence[str],
        decide: Decide,
        *,
        epoch: int = 0,
        claims: Sequence[Claimant] = (),
        by: str = "work",
    ) -> Written:
        """One commit: the records decided on the table as last caught up (validated
        under the lock), the claims of the next candidates."""
        return commit_decided(self, ids, decide, epoch=epoch, claims=claims, by=by)
