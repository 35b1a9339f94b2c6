"""Queue control's use cases: groups (``group``, ``group set``, ``pause``, ``resume``),
the ``--not-before`` and ``--after`` of ``submit``, the automatic retries of
``--retries``, and the cancels of tasks whose dependency failed.

The rules themselves live in the core (``ferry.core.queue``, checked by the table under
the journal's lock, or in the database's transaction): this module decides what to
write and writes it through the store, which refuses what is no longer legal.

Who cancels a dependant (``DEPENDENCY_FAILED``): whichever leader looks at the queue
next (``work`` at each poll and recovery pass, ``claim`` and ``recover`` in their
recovery pass: :func:`settle_doomed`), so that it happens without a running ``work``
too; the cancel is legal only while one of the task's dependencies really ended other
than SUCCEEDED (a fold rule), so a dependency retried meanwhile (``ferry retry``, or
its own ``--retries``, written with its end) saves its dependants. A dependant once
cancelled stays so: retry it too (its dependencies are checked again).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from ferry.core import events as ev
from ferry.core.errors import InternalError, NotFoundError, RefusedError, UsageError
from ferry.core.fold import MOVED_CODES, RACE_TRIES, RETRIED_REASONS
from ferry.core.ids import shown
from ferry.core.model import Reason, State, Task
from ferry.core.spec import NOT_BEFORE_MAX, SECONDS_MAX, check_group

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ferry.storage import TaskStore

# A retry's delay: --retry-delay doubled for each automatic retry before it, times a
# random factor in [1, 1 + JITTER) (tasks that failed together do not all come back in
# the same second; never sooner than the stated delay), at most a day.
RETRY_JITTER = 0.5
RETRY_DELAY_MAX_S = 24 * 3600.0


# ---- --retries ----------------------------------------------------------------------


def retry_delay_s(delay_s: float, used: int, rng: Callable[[], float] | None = None) -> float:
    """The delay before automatic retry number ``used + 1`` (``rng``: random.random).
    (``random`` and ``datetime`` are imported where they are used: ``submit`` loads this
    module, and needs neither for a plain task.)"""
    if rng is None:
        import random

        rng = random.random
    nominal = min(RETRY_DELAY_MAX_S, delay_s * 2.0 ** min(used, 64))
    return min(RETRY_DELAY_MAX_S, nominal * (1.0 + RETRY_JITTER * rng()))


def auto_retry(task: Task, end: ev.Settled, now: float) -> ev.Retried | None:
    """The RETRIED that goes with ``end`` (the SETTLED about to be written for ``task``'s
    current attempt) when the task's ``--retries`` ask for one: its own failure
    (``EXIT_NONZERO``, ``TIMEOUT``), retries left. Written in the same commit as the end,
    so that a crash cannot lose the retry nor make two of it; the store checks it again
    (``task.no_retry_due``). Crashes, refused spawns, cancels are never retried here."""
    spec = task.spec
    if end.state is not State.FAILED or end.reason not in RETRIED_REASONS:
        return None
    if task.retries_used >= spec.retries:
        return None
    delay = retry_delay_s(spec.retry_delay_s, task.retries_used)
    # (wait_s: a shared database makes not_before its own time plus the delay)
    return ev.Retried(
        task.id, task.attempt + 1, not_before=now + delay, automatic=True, wait_s=delay
    )


# ---- --not-before and --after -----------------------------------------------------------


def parse_not_before(text: str, now: float) -> float:
    """``--not-before``: ``+SECONDS`` from now, or an RFC 3339 time with its zone
    (``2026-05-01T02:00:00Z``, ``...+02:00``): Unix seconds."""
    value = text.strip()
    if value.startswith("+"):
        # Digits and one point only: float() also takes spaces, "_", exponents, "inf"
        # and other scripts' digits, none of which is "+SECONDS".
        digits = value[1:].replace(".", "", 1)
        plain = digits.isascii() and digits.isdigit()
        seconds = float(value[1:]) if plain else math.nan
        if not 0 <= seconds <= SECONDS_MAX:
            raise UsageError(
                f"--not-before {shown(text)}: +SECONDS must be a number of seconds from now,"
                f" at most {SECONDS_MAX:.0f} (ten years)",
                code="usage.bad_time",
            )
        return now + seconds
    import datetime

    try:  # (RFC 3339 allows "t" and "z" in lower case)
        moment = datetime.datetime.fromisoformat(value.upper())
    except ValueError:
        moment = None
    if moment is None or "T" not in value.upper() or moment.tzinfo is None:
        raise UsageError(
            f"--not-before {shown(text)}: give an RFC 3339 time with its zone"
            " (2026-05-01T02:00:00Z) or +SECONDS",
            code="usage.bad_time",
        )
    if not 0 <= moment.timestamp() <= NOT_BEFORE_MAX:
        raise UsageError(
            f"--not-before {shown(text)}: give a time between 1970 and 2400", code="usage.bad_time"
        )
    return moment.timestamp()


def not_before_wait(text: str) -> float | None:
    """The seconds of ``--not-before +SECONDS`` (as ``parse_not_before`` took them; a
    store whose clock is not this host's adds them to its own: ``ev.resolve_waits``),
    None for an RFC 3339 time, which stays as given."""
    value = text.strip()
    return float(value[1:]) if value.startswith("+") else None


def resolve_after(store: TaskStore, references: Iterable[str]) -> tuple[str, ...]:
    """``--after`` references (ids, unique prefixes, numbers, ``last``) as task ids, in
    the order given, each once. One that names no task: ``task.unknown_dependency``
    (exit 5); an ambiguous prefix: ``task.ambiguous``, as everywhere."""
    found: list[str] = []
    for reference in references:
        try:
            task_id = store.resolve(reference).id
        except NotFoundError:
            raise NotFoundError(
                f"--after {shown(reference)}: no such task",
                code="task.unknown_dependency",
                details={"task": reference},
            ) from None
        if task_id not in found:
            found.append(task_id)
    return tuple(found)


def cycle_error(where: str) -> UsageError:
    return UsageError(
        f"{where}: the tasks' --after form a cycle: none of them could ever run",
        code="task.dependency_cycle",
    )


# ---- DEPENDENCY_FAILED ----------------------------------------------------------------


def settle_doomed(store: TaskStore, commit: Callable[..., object] | None) -> list[dict[str, Any]]:
    """Cancel (``DEPENDENCY_FAILED``) every queued task one of whose dependencies ended
    other than SUCCEEDED, in one write; the decisions (for a report). ``commit``: the
    leader's (its epoch); None: a dry run. A cancel no longer legal (the dependency was
    retried meanwhile, the task claimed or cancelled) refuses the write: read again."""
    for _ in range(RACE_TRIES):
        store.refresh()
        doomed = store.doomed()
        if not doomed:
            return []
        cancelled = {task.id for task, _ in doomed}
        events = [_cancel(task, cause, store, cancelled) for task, cause in doomed]
        if commit is not None:
            try:
                commit(*events)
            except RefusedError as error:
                if error.code not in MOVED_CODES | {"task.dependency_not_failed"}:
                    raise
                continue
        return [
            {"task": task.id, "decision": "dependency_failed", "state": State.CANCELLED.value,
             "reason": Reason.DEPENDENCY_FAILED.value, "after": cause}
            for task, cause in doomed
        ]  # fmt: skip
    raise InternalError("the queue kept changing while dependants were cancelled")


def _cancel(task: Task, cause: str, store: TaskStore, cancelled: set[str]) -> ev.Settled:
    """The cancel, its evidence naming the dependency and how it ended (CANCELLED: a
    dependant cancelled in the same write; null: no such task)."""
    dependency = None if cause in cancelled else store.get(cause)
    state = State.CANCELLED.value if cause in cancelled else None
    if dependency is not None:
        state = dependency.state.value
    return ev.Settled(
        task.id, task.attempt, None, State.CANCELLED, Reason.DEPENDENCY_FAILED,
        evidence={"dependency": {"task": cause, "state": state}},
    )  # fmt: skip


# ---- groups -----------------------------------------------------------------------------


def group_set(store: TaskStore, name: str, jobs: int) -> dict[str, Any]:
    """``ferry group set NAME --jobs N`` (0: no limit of its own): journaled; a running
    ``work`` applies it at its next look at the queue (``--poll``)."""
    check_group(name)
    if not 0 <= jobs <= ev.GROUP_JOBS_MAX:
        raise UsageError(f"--jobs must be 0..{ev.GROUP_JOBS_MAX}", code="usage.bad_number")
    store.commit(ev.GroupSet(name, jobs))
    return _group(store, name)


def pause(store: TaskStore, names: Sequence[str], *, resume: bool = False) -> list[dict[str, Any]]:
    """``ferry pause [GROUP...]`` / ``ferry resume [GROUP...]`` (none: every group):
    journaled in one write; the groups as they are then."""
    for name in names:
        check_group(name)
    kind = ev.GroupResumed if resume else ev.GroupPaused
    events = [kind(name) for name in dict.fromkeys(names)] or [kind(None)]
    store.commit(*events)
    listed = store.groups()
    return [g for g in listed if g["group"] in names] if names else listed


def groups(store: TaskStore) -> list[dict[str, Any]]:
    store.refresh()
    return store.groups()


def _group(store: TaskStore, name: str) -> dict[str, Any]:
    found = [info for info in store.groups() if info["group"] == name]
    if not found:  # (a group set is always listed)
        raise InternalError(f"group {name} is not listed after its write")
    return found[0]
