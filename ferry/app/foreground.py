"""The foreground half shared by ``run`` and ``claim``: launch the task's supervisor
(:func:`ferry.app.launch.run_foreground`, :func:`~ferry.app.launch.claim_foreground`),
then compact if due, and hand back how the task ended or raise the error that kept it
from starting."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ferry.app.launch import (
    RUN_BEAT_TTL_S,
    beat_ttl,
    claim_foreground,
    ended_quietly,
    run_foreground,
)
from ferry.app.session import load_backend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ferry.app.runner import RunResult
    from ferry.app.session import Session
    from ferry.core import events as ev
    from ferry.core.model import Task


def run_task(
    session: Session,
    task: Task,
    token: str,
    *,
    lead: Callable[[dict[str, Any]], Sequence[ev.Event]],
    epoch: int = 0,
    on_claimed: Callable[[], None] = lambda: None,
    stdout_echo_fd: int = 1,
    on_started: Callable[[Task], None] = lambda task: None,
) -> RunResult:
    """Write ``lead`` (the claim, naming the supervisor) with the intent, pass the
    output through (the task's stdout to ``stdout_echo_fd``), and return once the end
    is durable (``on_started``: just before the spawn). Raises the error that kept the
    task from starting, naming the task.

    The local journal is opened after the supervisor's fork (``run_foreground``), its
    modules imported before it. A shared database is opened before: its connection
    may take seconds (a supervisor would plan, and a killed ``run`` leave it waiting
    for the database, for nothing), and its driver's modules are many (a supervisor
    left alone must not need to import them)."""
    if session.database is not None:
        session.store  # noqa: B018  (opened now)
    else:
        load_backend()
    result = run_foreground(
        lambda: session.store, session.home, task, token, lead=lead, epoch=epoch,
        on_claimed=on_claimed, stdout_echo_fd=stdout_echo_fd, notice=session.notice,
        on_started=on_started, beat_ttl_s=beat_ttl(session, RUN_BEAT_TTL_S),
    )  # fmt: skip
    with ended_quietly():
        session.compact_if_due()
    if result.error is not None:
        result.error.details.setdefault("task", result.task.id)
        raise result.error
    return result


def claim_task(
    session: Session,
    claim: Callable[[dict[str, Any], str], Task | None],
    *,
    epoch: int,
    lease_ttl_s: float,
    on_claimed: Callable[[], None] = lambda: None,
    stdout_echo_fd: int = 1,
    renew: Callable[[], None] = lambda: None,
    renew_every_s: float | None = None,
) -> RunResult | None:
    """``claim`` writes a claim naming the task's supervisor (the store chooses the
    task), then as ``run_task``; None: nothing to claim. ``renew`` keeps the lease
    while the supervisor plans (see ``claim_foreground``)."""
    result = claim_foreground(
        session.store, session.home, claim, epoch=epoch, on_claimed=on_claimed,
        stdout_echo_fd=stdout_echo_fd, notice=session.notice,
        beat_ttl_s=beat_ttl(session, lease_ttl_s), renew=renew, renew_every_s=renew_every_s,
    )  # fmt: skip
    if result is None:
        return None
    with ended_quietly():
        session.compact_if_due()
    if result.error is not None:
        result.error.details.setdefault("task", result.task.id)
        if not result.task.claim_token and not result.task.terminal:  # (never started)
            result.error.message += f"; task {result.task.id} is back in the queue"
        raise result.error
    return result
