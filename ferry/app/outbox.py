"""Ends that could not be written yet, kept on this host until they can.

A supervisor whose store is out of reach when its task ends (the database down or cut
off, the journal's disk full) keeps the end here, durably (``<home>/outbox/``, one
file per end, fsynced with its directory), and delivers it once the store answers
again; ``ferry recover`` on this host delivers what a supervisor left behind (killed,
or out of patience). The end is delivered as it would have been written, if the claim
still owns the task; as a ``LATE_RESULT`` (evidence, no state change) if recovery or
another host decided the task meanwhile; not at all if it was delivered already (a
commit whose answer was lost).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence

from ferry.app.runner import as_cancelled, not_started, unstarted_end
from ferry.app.session import this_host
from ferry.core import events as ev
from ferry.core.errors import FerryError, RefusedError, UsageError
from ferry.core.fold import MOVED_CODES, RACE_TRIES
from ferry.core.model import Reason, State, Task
from ferry.storage import TaskStore
from ferry.storage.local.statedir import fsync_dir, make_dir_durable, write_atomic
from journal import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

OUTBOX = "outbox"

# What delivery made of an end.
SETTLED = "settled"  # written as the task's end
LATE = "late"  # kept as a LATE_RESULT: the task had been decided meanwhile
ALREADY = "already"  # it was written before (an answer lost on the way back)
RELEASED = "released"  # back to the queue: it never started, or its lease was lost


DEFAULT_PATIENCE_S = 600.0


def patience_s() -> float:
    """How long a supervisor keeps trying to deliver an end the store cannot take now
    (``FERRY_OUTBOX_PATIENCE_S``, seconds; unset or empty: 600). Read by the launcher
    before it forks a supervisor, so that a bad value is a usage error there, not a
    supervisor that dies at its start."""
    raw = os.environ.get("FERRY_OUTBOX_PATIENCE_S") or str(DEFAULT_PATIENCE_S)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:  # (NaN too)
        raise UsageError(
            f"FERRY_OUTBOX_PATIENCE_S must be a number of seconds, 0 or more, not {raw[:40]!r}",
            code="usage.bad_setting",
        )
    return value


def _directory(home: str) -> str:
    return os.path.join(home, OUTBOX)


def keep(home: str, records: Sequence[ev.Event]) -> str:
    """Durably keep a task's end (SETTLED, maybe after its SPAWNED) until delivered."""
    settled = _settled(records)
    directory = _directory(home)
    make_dir_durable(directory)  # (made now: its entry in the home fsynced too)
    name = f"{settled.task}.{settled.attempt}.{settled.token}.json"
    data = _json.dumps({"records": [list(record.encode()) for record in records]})
    return write_atomic(directory, name, data)  # (the file and the directory fsynced)


def pending(home: str) -> list[str]:
    """The ends kept on this host, oldest first."""
    entries: list[tuple[float, str]] = []
    try:
        with os.scandir(_directory(home)) as found:
            for entry in found:
                if entry.name.endswith(".json"):
                    with contextlib.suppress(FileNotFoundError):  # (delivered meanwhile)
                        entries.append((entry.stat().st_mtime, entry.path))
    except OSError:
        return []
    return [path for _, path in sorted(entries)]


def load(path: str) -> list[ev.Event]:
    with open(path, "rb") as file:
        raw = _json.loads(file.read())
    events = [ev.decode_checked(kind, data) for kind, data in raw["records"]]
    return [event for event in events if event is not None]


def forget(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        fsync_dir(os.path.dirname(path))


def deliver(store: TaskStore, records: Sequence[ev.Event]) -> str:
    """Write a supervisor's end as the store needs it now (decided on the task as it is
    when written: ``TaskStore.commit_against``; again after each refusal that says the
    task moved); what it became. Raises what the store raises when it cannot be reached
    or refuses for another reason."""
    settled = _settled(records)
    outcome: list[Any] = []  # (what the last decision made of it; with a RETRIED?)
    refused: list[RefusedError] = []  # (its retry's refusal: the end goes without it)

    def decide(current: Mapping[str, Task | None]) -> list[ev.Event]:
        found, writes = end_writes(current.get(settled.task), records,
                                   retry_refused=refused[0] if refused else None)  # fmt: skip
        outcome[:] = [found, any(isinstance(write, ev.Retried) for write in writes)]
        return writes

    for _ in range(RACE_TRIES):
        store.refresh()
        try:
            store.commit_against([settled.task], decide)
        except RefusedError as error:
            if error.code in MOVED_CODES:
                continue
            if outcome[1] and not refused:
                refused.append(error)
                continue
            raise
        return str(outcome[0])
    raise RefusedError(
        f"task {settled.task}: its end was refused {RACE_TRIES} times", code="task.stale_claim"
    )


def end_writes(
    current: Task | None,
    records: Sequence[ev.Event],
    *,
    retry_refused: RefusedError | None = None,
) -> tuple[str, list[ev.Event]]:
    """What a supervisor's end (``records``: its SETTLED, maybe after its SPAWNED) is,
    the task being ``current`` now: SETTLED, the records to write (its SPAWNED only if
    the task is still DISPATCHING; CANCELLED if a cancel was asked for meanwhile);
    LATE, a LATE_RESULT (the claim moved: recovery or another host decided); ALREADY,
    nothing (it is written, or kept as a late result, already); RELEASED, the task of a
    queue (not ``run``'s own) back to it, its command never started for want of
    resources or for a signal before its spawn (:func:`ferry.app.runner.not_started`;
    counted, up to ``--max-releases``; nothing to keep once the claim moved). A
    failure the task's
    ``--retries`` retry gets its RETRIED in the same write (``queueing.auto_retry``),
    unless the store refused that retry (``retry_refused``: its ``--key`` succeeded
    meanwhile, say): then the end goes alone, the refusal in its evidence
    (``not_retried``). An end is never dropped for its retry's sake."""
    settled = _settled(records)
    if current is None:
        return ALREADY, []
    ours = current.attempt == settled.attempt
    unstarted = not_started(settled)
    if ours and current.claim_token == settled.token and current.in_flight:
        if (
            unstarted is not None
            and current.claimed_by != "run"
            and current.releases < current.spec.max_releases
        ):  # (past them, it ends as it ended)
            end = unstarted_end(current, str(settled.token), unstarted, counted=True)
            return RELEASED, [] if end is None else [end]
        if _stopped_for_lost_lease(current, settled):
            if current.releases < current.spec.max_releases:
                return RELEASED, [_released_after(settled)]
            records = [_over_the_limit(r) for r in records]
        writes: list[ev.Event] = [r for r in records if not isinstance(r, ev.Spawned)]
        if current.state is State.DISPATCHING:
            writes = list(records)
        if current.cancel_requested:
            writes = [as_cancelled(r) if isinstance(r, ev.Settled) else r for r in writes]
        if retry_refused is not None:
            return SETTLED, [_not_retried(r, retry_refused) for r in writes]
        if not current.spec.retries:
            return SETTLED, writes
        from ferry.app.queueing import auto_retry  # (lazy: run's tasks have no --retries)

        retry = auto_retry(current, _settled(writes), time.time())
        return SETTLED, writes if retry is None else [*writes, retry]
    if (
        unstarted is not None
        or (ours and not current.in_flight and _same_end(current, settled))
        or _retried_after(current, settled)
        or _kept_late(current, settled)
    ):
        return ALREADY, []
    return LATE, [ev.LateResult(settled.task, settled.attempt, _result(settled))]


def _stopped_for_lost_lease(current: Task, settled: ev.Settled) -> bool:
    """An ``--idempotent`` task its worker stopped, FAILED, when that worker could not
    renew its host's lease (a cancel asked for meanwhile stands): what another host's
    recovery does with such a host's task, its end does too (queued again, bounded by
    ``--max-releases``; :func:`ferry.core.recovery._choose_host_lost`)."""
    return (
        settled.evidence.get("stopped_because") == "lease_lost"
        and settled.state is State.FAILED
        and current.spec.idempotent
        and not current.cancel_requested
    )


def _released_after(settled: ev.Settled) -> ev.Released:
    evidence = {**settled.evidence, "exit_code": settled.exit_code, "signal": settled.signal}
    return ev.Released(
        settled.task, settled.attempt, settled.token, Reason.RELEASED_TO_QUEUE, True, evidence
    )


def _over_the_limit(record: ev.Event) -> ev.Event:
    if not isinstance(record, ev.Settled):
        return record
    return ev.Settled(
        record.task, record.attempt, record.token, record.state, Reason.RELEASE_LIMIT_EXCEEDED,
        record.exit_code, record.signal, record.evidence, record.ended_at,
    )  # fmt: skip


def _not_retried(record: ev.Event, refusal: RefusedError) -> ev.Event:
    """The SETTLED of an end whose automatic retry was refused, that refusal in its
    evidence (other records as they are)."""
    if not isinstance(record, ev.Settled) or record.state is not State.FAILED:
        return record
    evidence = {
        **record.evidence,
        "not_retried": {"code": refusal.code, "message": refusal.message},
    }
    return ev.Settled(
        record.task, record.attempt, record.token, record.state, record.reason,
        record.exit_code, record.signal, evidence, record.ended_at,
    )  # fmt: skip


def _kept_late(current: Task, settled: ev.Settled) -> bool:
    return any(
        late.get("token") == settled.token and late.get("attempt") == settled.attempt
        for late in current.evidence.get("late_results", ())
    )


def _retried_after(current: Task, settled: ev.Settled) -> bool:
    """The end was written, with the automatic retry that followed it (the task is on
    its next attempt, whose previous one ended as this end says)."""
    previous = current.evidence.get("previous_attempt")
    if current.attempt != settled.attempt + 1 or not isinstance(previous, dict):
        return False
    return (
        previous.get("attempt") == settled.attempt
        and previous.get("exit_code") == settled.exit_code
        and (previous.get("evidence") or {}).get("ended_at") == settled.evidence.get("ended_at")
    )


def _same_end(current: Task, settled: ev.Settled) -> bool:
    """The task's end is this one (its commit went through; only the answer was lost)."""
    return (
        current.marker is not None
        and current.marker.endswith(f":{settled.token}")
        and current.ended_at == settled.ended_at
        and current.exit_code == settled.exit_code
        and current.signal == settled.signal
    )


def _result(settled: ev.Settled) -> dict[str, Any]:
    data = settled.encode()[1]
    result = {name: data[name] for name in ("token", "state", "reason", "exit_code", "signal")}
    result.update(ended_at=settled.ended_at, evidence=data["evidence"], host=this_host())
    return result


def _settled(records: Sequence[ev.Event]) -> ev.Settled:
    found = [record for record in records if isinstance(record, ev.Settled)]
    if len(found) != 1 or found[0].token is None:
        raise ValueError("an end is one SETTLED with its claim token")
    return found[0]


def deliver_pending(store: TaskStore, home: str) -> list[tuple[str, str]]:
    """``ferry recover``: deliver every end kept on this host; (task, what it became)
    for each delivered. One that cannot be delivered now stays for the next time; one
    refused for good is dropped (its task was decided; nothing left to say)."""
    done: list[tuple[str, str]] = []
    for path in pending(home):
        try:
            records = load(path)
        except (OSError, ValueError, FerryError):
            continue  # (a torn file: its supervisor died writing it; it never was kept)
        try:
            outcome = deliver(store, records)
        except RefusedError:
            outcome = "refused"
        done.append((_settled(records).task, outcome))
        forget(path)
    return done
