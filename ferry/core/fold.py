"""One event applied to one task (pure): what is legal (:func:`check_event`,
:func:`check_write`) and what it makes of the task (:func:`fold_event`).
:mod:`ferry.core.state` runs these over the table.

THE RULE (every writer follows it; nothing else makes a write legal):

    A write whose legality depends on the state of a task (a claim, a settle, a
    release, a cancel, a retry, a resolve, a kill's intent, a key check) is decided
    by the store's ``check`` hook, under the journal's append lock, against the
    journal's true end, with the writer's claim token or the leader's epoch. A value
    read from the table before the lock is a guess: the write carries what the guess
    was about (the attempt, the claim token), and is refused if that is no longer so.

So (:func:`check_write`, at write time only):

* an event about a task in flight (CLAIMED, DISPATCHING, RUNNING, STALE) must name
  the task's current claim token, whoever writes it: the runner that owns the claim,
  recovery deciding it, ``cancel``, ``kill``. A token-less settle of an in-flight task
  is never legal: a ``cancel`` of a task it read QUEUED is refused once a runner
  claimed it (``task.stale_claim``), and the ``cancel`` then reads again;
* a release of a task whose cancel was requested is refused (``task.cancel_requested``):
  recovery decides again and cancels it; so is its DISPATCHING (a task with pinned
  inputs, claimed before the request, is then CANCELLED unstarted), and an end other
  than CANCELLED (:data:`ENDS_A_CANCEL_DECIDES`): its writer decides it again, CANCELLED;
* a key is checked against every task with that key (:func:`key_refusal`): one that
  SUCCEEDED (or was resolved as succeeded), one in flight, or a latest task that ended
  in a way that may have mutated (``task.key_unsafe``) blocks a new task;
* leader events also carry the lease's epoch, which the journal fences
  (``ferry.storage.local.store.LeaseFence``), and a ``LEASE_ACQUIRED`` is accepted only for an epoch
  no record has used yet (``ferry.storage.local.store``).

Replay (:meth:`ferry.core.state.Table.apply`) checks only :func:`check_event`: a journal
written by an older version, under looser rules, must read back as it was written.

Which event may move a task from which states (then the transition table decides)::

    SUBMITTED         (new)                        -> QUEUED
    CLAIMED           QUEUED                       -> CLAIMED
    DISPATCHING       CLAIMED                      -> DISPATCHING
    SPAWNED           DISPATCHING                  -> RUNNING
    SETTLED           QUEUED or in flight          -> SUCCEEDED | FAILED | CANCELLED
    RELEASED          in flight                    -> QUEUED
    STALE             RUNNING                      -> STALE
    RESUMED           STALE                        -> RUNNING
    RETRIED           FAILED | CANCELLED           -> QUEUED (attempt + 1, releases 0)
    RESOLVED          FAILED | CANCELLED           (no state change; evidence, key)
    CANCEL_REQUESTED  in flight                    (no state change)
    ORPHAN_SIGNALLED  any                          (no state change; evidence)
    LATE_RESULT       any, but not the live claim  (no state change; evidence)
    FORGOTTEN         SUCCEEDED | FAILED | CANCELLED  (the task leaves the table)

``ferry gc`` forgets settled tasks (FORGOTTEN). Never one in flight or queued; never
the latest task of a key that ended unsafe and was neither retried nor resolved (its
operator must still act on it: ``task.key_unsafe``); a quarantined one only once its
orphan is proven dead (the use case probes: the fold cannot). A key that SUCCEEDED
stays succeeded after its task is forgotten: the table's key index keeps it (a
tombstone), so gc never lets such a key run again. Replay applies a FORGOTTEN of any
task not live without loading history for it (the table remembers the id, so that
history loaded later leaves it out).

Fencing by claim: an event carrying a ``token`` is accepted only if it is the token of
the claim that owns the task now and names its current attempt; otherwise it is refused
with ``task.stale_claim``. So a runner that recovery gave up on can never settle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ferry.core import events as ev
from ferry.core.errors import (
    FerryError,
    IllegalTransitionError,
    KeyInFlightError,
    KeyUnsafeError,
    NotFoundError,
    RefusedError,
)
from ferry.core.model import IN_FLIGHT_STATES, Reason, State, Task, check_transition, rfc3339
from ferry.core.spec import TaskSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The refusals that mean "the task is no longer as you read it": a writer that gets one
# reads again (its failed commit caught the table up) and decides again, this many
# times at most (each try follows a real change of the task's state).
# A claim refused by the queue's rules (its group paused or full meanwhile, a dependency
# not succeeded, its time not come: ferry.core.queue) means the same: read again.
QUEUE_CODES = frozenset(
    {"task.group_paused", "task.group_full", "task.dependencies_pending", "task.not_before"}
)
MOVED_CODES = (
    frozenset(
        {
            "task.stale_claim",
            "task.stale_attempt",
            "task.illegal_transition",
            "task.not_in_flight",
            "task.cancel_requested",
        }
    )
    | QUEUE_CODES
)
RACE_TRIES = 8

_ANY = frozenset(State)
_FROM: Mapping[type, frozenset[State]] = {
    ev.Claimed: frozenset({State.QUEUED}),
    ev.Dispatching: frozenset({State.CLAIMED}),
    ev.Spawned: frozenset({State.DISPATCHING}),
    ev.Settled: IN_FLIGHT_STATES | {State.QUEUED},
    ev.Released: IN_FLIGHT_STATES,
    ev.Stale: frozenset({State.RUNNING}),
    ev.Resumed: frozenset({State.STALE}),
    ev.Retried: frozenset({State.FAILED, State.CANCELLED}),
    ev.Resolved: frozenset({State.FAILED, State.CANCELLED}),
    ev.CancelRequested: IN_FLIGHT_STATES,
    ev.OrphanSignalled: _ANY,
    ev.LateResult: _ANY,
    ev.Forgotten: frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED}),
}
_TARGET: Mapping[type, State] = {
    ev.Submitted: State.QUEUED,
    ev.Claimed: State.CLAIMED,
    ev.Dispatching: State.DISPATCHING,
    ev.Spawned: State.RUNNING,
    ev.Released: State.QUEUED,
    ev.Stale: State.STALE,
    ev.Resumed: State.RUNNING,
    ev.Retried: State.QUEUED,
}


def target_state(event: ev.TaskEvent, task: Task) -> State:
    if isinstance(event, ev.Settled):
        return event.state
    return _TARGET.get(type(event), task.state)


def _stale(task: Task, event: ev.TaskEvent, code: str, why: str) -> RefusedError:
    return RefusedError(
        f"task {task.id}: {why}; refused",
        code=code,
        details={
            "task": task.id,
            "type": event.TYPE.value,
            "attempt": getattr(event, "attempt", None),
            "current_attempt": task.attempt,
            "state": task.state.value,
        },
    )


def check_event(task: Task | None, event: ev.TaskEvent) -> None:
    """Raise unless ``event`` is legal for ``task`` (None: no such task) right now."""
    if isinstance(event, ev.Submitted):
        if task is not None:
            raise RefusedError(
                f"task {event.task} already exists",
                code="task.duplicate_id",
                details={"task": event.task},
            )
        return
    if task is None:
        raise NotFoundError(f"no task {event.task}", details={"task": event.task})
    if isinstance(event, ev.LateResult):
        _check_late(task, event)
        return
    token = getattr(event, "token", None)
    if isinstance(event, ev.Claimed):
        token = None  # a claim brings a new token; it has nothing to match yet
    if token is not None and token != task.claim_token:
        raise _stale(task, event, "task.stale_claim", "claim token is not the current claim's")
    if isinstance(event, ev.Retried):
        if task.state in _FROM[ev.Retried] and event.attempt != task.attempt + 1:
            raise _stale(
                task, event, "task.stale_attempt", f"retry must be attempt {task.attempt + 1}"
            )
    elif event.attempt != task.attempt:
        code = "task.stale_claim" if token is not None else "task.stale_attempt"
        raise _stale(task, event, code, f"event is about attempt {event.attempt}")
    allowed = _FROM[type(event)]
    new = target_state(event, task)
    if task.state not in allowed:
        if isinstance(event, ev.CancelRequested):
            raise RefusedError(
                f"task {task.id} is {task.state}: nothing in flight to cancel",
                code="task.not_in_flight",
                details={"task": task.id, "state": task.state.value},
            )
        # Also when the table allows old -> new but not by this event (SPAWNED from STALE).
        raise IllegalTransitionError(
            f"task {task.id}: illegal transition {task.state} -> {new} by {event.TYPE.value}",
            details={"task": task.id, "old": task.state.value, "new": new.value},
        )
    if new != task.state:
        check_transition(task.state, new, task=task.id)
    if isinstance(event, ev.Resolved) and resolution(task) is not None:
        raise RefusedError(
            f"task {task.id} was already resolved as {resolution(task)}",
            code="task.already_resolved",
            details={"task": task.id, "verdict": resolution(task)},
        )
    if isinstance(event, ev.Released) and event.counted and task.releases >= task.spec.max_releases:
        raise RefusedError(
            f"task {task.id} was released {task.releases} times (max {task.spec.max_releases})",
            code="task.release_limit",
            details={"task": task.id, "releases": task.releases},
        )


def _check_late(task: Task, event: ev.LateResult) -> None:
    """A late result is about this attempt or an earlier one, and not from the claim
    that still owns the task (that one settles)."""
    if event.attempt > task.attempt:
        raise _stale(task, event, "task.stale_attempt", f"there is no attempt {event.attempt} yet")
    token = event.result.get("token")
    for late in task.evidence.get("late_results", ()):
        if late.get("token") == token and late.get("attempt") == event.attempt:
            raise _stale(task, event, "task.stale_claim", "this claim's late result is kept")
    if task.in_flight and event.attempt == task.attempt and token == task.claim_token:
        raise RefusedError(
            f"task {task.id}: its claim is still current; it settles, a late result is refused",
            code="task.not_late",
            details={"task": task.id, "state": task.state.value},
        )


# Late results kept per task (the latest): one per attempt is usual; a bound keeps a
# runaway writer from growing a task's record without end.
LATE_RESULTS_MAX = 10


def check_write(task: Task | None, event: ev.TaskEvent) -> None:
    """The rules a new write must follow beyond :func:`check_event` (see THE RULE
    above); run at write time only, never on replay."""
    if task is None or isinstance(event, ev.Submitted | ev.Claimed):
        return
    if (
        task.in_flight
        and getattr(event, "token", None) is None
        and not isinstance(event, ev.LateResult)
    ):
        raise _stale(
            task, event, "task.stale_claim",
            f"it is {task.state} under a claim this write does not name",
        )  # fmt: skip
    if isinstance(event, ev.Released) and task.cancel_requested:
        raise RefusedError(
            f"task {task.id}: a cancel was requested; it is not released to the queue",
            code="task.cancel_requested",
            details={"task": task.id, "state": task.state.value},
        )
    if isinstance(event, ev.Dispatching) and task.cancel_requested:
        raise RefusedError(
            f"task {task.id}: a cancel was requested; it is not started",
            code="task.cancel_requested",
            details={"task": task.id, "state": task.state.value},
        )
    if (
        isinstance(event, ev.Settled)
        and task.cancel_requested
        and event.state is not State.CANCELLED
        and event.reason in ENDS_A_CANCEL_DECIDES
    ):
        raise RefusedError(
            f"task {task.id}: a cancel was requested; its end is CANCELLED, not {event.state}",
            code="task.cancel_requested",
            details={"task": task.id, "state": task.state.value},
        )
    if isinstance(event, ev.Retried) and event.automatic:
        retryable = task.state is State.FAILED and task.reason in RETRIED_REASONS
        if not retryable or task.retries_used >= task.spec.retries:
            raise RefusedError(
                f"task {task.id}: no automatic retry is due (it is {task.state}"
                f" {task.reason or ''}, {task.retries_used} of {task.spec.retries} retries used)",
                code="task.no_retry_due",
                details={"task": task.id, "state": task.state.value},
            )


# The ends that a cancel requested before their write makes CANCELLED (their exit status
# kept): a runner's end (``ferry.app.outbox.end_writes``), recovery's verdict on a task
# found dead (``ferry.core.recovery``). Decided on a table read before the request, such
# an end is refused (``task.cancel_requested``) and decided again: written as decided, a
# FAILED end took its automatic retry with it and the cancelled task ran again. A
# quarantine (an orphan lives: a cancel cannot make that so), a lost host, and a pinned
# input's verdict (nothing ran) are written as decided.
ENDS_A_CANCEL_DECIDES = frozenset(
    {
        None,  # SUCCEEDED
        Reason.EXIT_NONZERO,
        Reason.TIMEOUT,
        Reason.SIGNALLED,
        Reason.SPAWN_FAILED,
        Reason.MARKED_FAILED_MUTATION_UNSAFE,
        Reason.RELEASE_LIMIT_EXCEEDED,
    }
)

# The ends --retries retries (contract.md): the task's own failure, not a crash (those
# stay recovery's), a refused spawn, a cancel or a changed input.
RETRIED_REASONS = frozenset({Reason.EXIT_NONZERO, Reason.TIMEOUT})


# A task that ended this way may have changed things and its end is unknown: its key
# is not run again until an operator retries or resolves it.
UNSAFE_REASONS = frozenset(
    {Reason.MARKED_FAILED_MUTATION_UNSAFE, Reason.QUARANTINED_ORPHAN_ALIVE, Reason.HOST_LOST}
)
# A task that ended this way may still run (an orphan: quarantined, or on a host that
# was lost, its worker and supervisor killed together): not retried, resolved, nor
# forgotten beside it (``retry``, ``resolve``, ``gc``), its alive-lock kept.
MAY_RUN_ON = frozenset({Reason.QUARANTINED_ORPHAN_ALIVE, Reason.HOST_LOST})
MAY_RUN_ON_VALUES = frozenset(reason.value for reason in MAY_RUN_ON)
_UNSAFE_VALUES = frozenset(reason.value for reason in UNSAFE_REASONS)


def resolution(task: Task) -> str | None:
    """The operator's verdict on the task's current attempt (``ferry resolve``)."""
    found = task.evidence.get("resolution")
    return found.get("verdict") if isinstance(found, Mapping) else None


def key_outcome(state: str, reason: str | None, evidence: Mapping[str, Any]) -> str | None:
    """What a task's end means for its key: ``succeeded`` (a later task with the key is
    skipped), ``unsafe`` (refused until an operator acts), or None (free to run again).
    From plain values, so archived records need not be decoded."""
    if state == State.SUCCEEDED.value:
        return "succeeded"
    if state not in (State.FAILED.value, State.CANCELLED.value):
        return None
    found = evidence.get("resolution")
    verdict = found.get("verdict") if isinstance(found, Mapping) else None
    if verdict == "succeeded":
        return "succeeded"
    if verdict is None and reason in _UNSAFE_VALUES:
        return "unsafe"
    return None


def task_key_outcome(task: Task) -> str | None:
    reason = None if task.reason is None else task.reason.value
    return key_outcome(task.state.value, reason, task.evidence)


def key_refusal(
    key: str,
    task_id: str,
    *,
    succeeded: str | None,
    unsafe: str | None,
    in_flight: Sequence[Task],
) -> FerryError | None:
    """Why task ``task_id`` may not run with ``key`` now, if it may not: the task that
    succeeded with it, the latest task with it if that ended unsafe, or one of them
    still in flight (each other than ``task_id`` itself)."""
    if succeeded is not None and succeeded != task_id:
        return RefusedError(
            f"key {key!r} already succeeded (task {succeeded})",
            code="task.key_succeeded",
            details={"key": key, "task": succeeded},
        )
    if unsafe is not None and unsafe != task_id:
        return KeyUnsafeError(
            f"key {key!r}: its latest task {unsafe} ended in a way that may have changed"
            f" things; see 'ferry show {unsafe}', then 'ferry retry {unsafe}' or"
            f" 'ferry resolve {unsafe} --as succeeded|failed'",
            details={"key": key, "task": unsafe},
        )
    for other in in_flight:
        if other.id != task_id and not other.terminal:
            return KeyInFlightError(
                f"key {key!r} is in flight (task {other.id}, {other.state})",
                details={"key": key, "task": other.id, "state": other.state.value},
            )
    return None


def _merge(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    return {**old, **new}


_UNCLAIMED: dict[str, Any] = {
    "claim_token": None,
    "runner": None,
    "claimed_by": None,
    "marker": None,
    "pid": None,
    "pgid": None,
    "start_time": None,
    "started_at": None,
    "heartbeat_at": None,
    "cancel_requested": False,
}


def fold_event(task: Task | None, event: ev.TaskEvent, seq: int, ts: float) -> Task:
    """The task after ``event`` (already checked). ``ts`` is the record's time."""
    if isinstance(event, ev.Submitted):
        return Task(id=event.task, spec=event.spec, created_at=event.created_at,
                    submit_seq=seq, queue_seq=seq, updated_seq=seq,
                    not_before=event.spec.not_before)  # fmt: skip
    assert task is not None
    change: dict[str, Any] = {"updated_seq": seq, "state": target_state(event, task)}
    if isinstance(event, ev.Claimed):
        change.update(_UNCLAIMED, reason=None, exit_code=None, signal=None,
                      claim_token=event.token, runner=dict(event.runner), claimed_by=event.by)  # fmt: skip
    elif isinstance(event, ev.Dispatching):
        change.update(marker=event.marker, evidence=_merge(task.evidence, event.evidence))
    elif isinstance(event, ev.Spawned):
        started = ts if event.started_at is None else event.started_at
        change.update(pid=event.pid, pgid=event.pgid, start_time=event.start_time,
                      started_at=started, heartbeat_at=ts)  # fmt: skip
    elif isinstance(event, ev.Settled):
        ended = ts if event.ended_at is None else event.ended_at
        change.update(reason=event.reason, exit_code=event.exit_code, signal=event.signal,
                      ended_at=ended, claim_token=None,
                      evidence=_merge(task.evidence, event.evidence))  # fmt: skip
    elif isinstance(event, ev.Released):
        change.update(_UNCLAIMED, reason=event.reason,
                      releases=task.releases + (1 if event.counted else 0),
                      evidence=_merge(task.evidence, event.evidence))  # fmt: skip
    elif isinstance(event, ev.Stale):
        change.update(reason=Reason.HEARTBEAT_STALE, evidence=_merge(task.evidence, event.evidence))
    elif isinstance(event, ev.Resumed):
        change.update(reason=None, heartbeat_at=ts, evidence=_merge(task.evidence, event.evidence))
    elif isinstance(event, ev.CancelRequested):
        change.update(cancel_requested=True)
    elif isinstance(event, ev.Retried):
        previous = {"attempt": task.attempt, "state": task.state.value,
                    "reason": None if task.reason is None else task.reason.value,
                    "exit_code": task.exit_code, "signal": task.signal,
                    "evidence": {k: v for k, v in task.evidence.items() if k not in _HISTORY}}  # fmt: skip
        earlier = [*task.evidence.get("earlier_attempts", ())]
        if "previous_attempt" in task.evidence:
            earlier.append(task.evidence["previous_attempt"])
        evidence: dict[str, Any] = {"previous_attempt": previous}
        if earlier:  # (oldest first; the one just before is previous_attempt)
            evidence["earlier_attempts"] = earlier[-EARLIER_ATTEMPTS_MAX:]
        # --retries counts the automatic ones; a retry by hand starts the count again.
        used = task.retries_used + 1 if event.automatic else 0
        change.update(_UNCLAIMED, attempt=event.attempt, releases=0, reason=None,
                      exit_code=None, signal=None, ended_at=None, queue_seq=seq,
                      evidence=evidence, retries_used=used, not_before=event.not_before)  # fmt: skip
    elif isinstance(event, ev.Resolved):
        verdict = {"verdict": event.verdict, "at": rfc3339(ts)}
        change.update(evidence=_merge(task.evidence, {"resolution": verdict}))
    elif isinstance(event, ev.LateResult):
        late = {**event.result, "attempt": event.attempt, "at": ts}
        kept = [*task.evidence.get("late_results", ()), late][-LATE_RESULTS_MAX:]
        change.update(evidence=_merge(task.evidence, {"late_results": kept}))
    elif isinstance(event, ev.OrphanSignalled):
        signals = [*task.evidence.get("signals", ()), {
            "pid": event.pid, "pgid": event.pgid, "start_time": event.start_time,
            "signal": event.signal, "at": ts}]  # fmt: skip
        change.update(evidence=_merge(task.evidence, {"signals": signals}))
    return _evolve(task, change)


# The evidence of the attempts before the previous one, kept with the task (each
# attempt's log stays in logs/<id>/<attempt>.*): the last this many.
EARLIER_ATTEMPTS_MAX = 100
_HISTORY = frozenset({"previous_attempt", "earlier_attempts"})


def _evolve(task: Task, change: Mapping[str, Any]) -> Task:
    """:func:`ferry.core.model.replace` without ``__init__`` (a fraction of the cost;
    the fold runs once per journal record at start-up). Only for fields of Task."""
    new = object.__new__(Task)
    new.__dict__.update(task.__dict__)
    new.__dict__.update(change)
    return new


# ---- the table's own serialisation (snapshots): every field, lossless --------------

_SCALARS = ("id", "attempt", "releases", "exit_code", "signal", "created_at", "started_at",
            "ended_at", "heartbeat_at", "pid", "pgid", "start_time", "claimed_by",
            "claim_token", "marker", "cancel_requested", "submit_seq", "queue_seq",
            "updated_seq", "number", "not_before", "retries_used")  # fmt: skip


def _is_empty(value: Any) -> bool:
    # Every Task/TaskSpec field whose value can be None, False or empty has exactly that
    # as its default, so leaving it out of a snapshot record loses nothing.
    return value is None or value is False or (isinstance(value, list | dict) and not value)


def task_to_record(task: Task) -> dict[str, Any]:
    """A compact, lossless record of every field (defaults left out)."""
    spec = {k: v for k, v in task.spec.to_json().items() if not _is_empty(v)}
    record = {name: getattr(task, name) for name in _SCALARS}
    if not task.retries_used:
        del record["retries_used"]  # (0, the default: as records were before it existed)
    record.update(
        spec=spec,
        state=task.state.value,
        reason=None if task.reason is None else task.reason.value,
        runner=None if task.runner is None else dict(task.runner),
        evidence=dict(task.evidence),
    )
    return {k: v for k, v in record.items() if not _is_empty(v)}


def task_from_record(record: Mapping[str, Any]) -> Task:
    """The inverse of :func:`task_to_record`. The spec is not re-validated: it was
    validated when it was submitted, and snapshots are written by ferry itself."""
    fields = {name: record[name] for name in _SCALARS if name in record}
    reason = record.get("reason")
    runner = record.get("runner")
    return Task(
        spec=TaskSpec.from_json(record["spec"], validate=False),
        state=State(record["state"]),
        reason=None if reason is None else Reason(reason),
        runner=None if runner is None else dict(runner),
        evidence=dict(record.get("evidence") or {}),
        **fields,
    )
