"""``ferry wait [ID ...]``: until the tasks settle, or a timeout.

It only reads: a catch-up on the journal (``refresh``; a database is read as it is)
and a look at each task still awaited, every ``POLL_S``, asleep in between. Each task
that settles is told to the reporter at once (``Reporter.settled``); the result says
how each ended, or which had not settled by the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ferry.app.naming import resolve as resolve_task
from ferry.app.runner_state import GoneRunners, Outage, with_runner_state
from ferry.app.tally import WaitReport
from ferry.core.model import Task

TYPE_CHECKING = False  # (typing is not imported at run time: start-up)
if TYPE_CHECKING:
    from ferry.app.session import Session

# How often the store is looked at: a settle is seen within this, and an idle wait
# costs a catch-up (a stat of the journal's tail, for the local one) this often.
POLL_S = 0.1


def wait(
    session: Session, prefixes: Sequence[str], *, timeout_s: float | None = None
) -> WaitReport:
    """Wait for the tasks ``prefixes`` name (ids, or unique prefixes of them; none:
    every task not settled now) to settle, ``timeout_s`` at most (None: for ever)."""
    started = time.monotonic()
    store = session.store
    store.refresh()
    if prefixes:
        found = [resolve_task(store, prefix) for prefix in prefixes]
        tasks = list({task.id: task for task in found}.values())  # (named twice: once)
    else:
        tasks = sorted(store.live(), key=lambda task: task.submit_seq)
    count = len(tasks)
    session.reporter.detail(f"waiting for {count} task{'' if count == 1 else 's'}")
    latest: dict[str, Task] = {task.id: task for task in tasks}
    awaited = [task.id for task in tasks]
    deadline = None if timeout_s is None else started + timeout_s
    gone = GoneRunners(session.home, store, session.reporter.notice, session.led)
    outage = Outage(session.reporter.notice)
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        with outage:
            if not _look(session, awaited, latest, gone, left):
                break
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        time.sleep(POLL_S if left is None else min(POLL_S, left))
        with outage:
            store.refresh()
    result = [with_runner_state(latest[task.id], session.home, store) for task in tasks]
    return WaitReport(result, awaited, time.monotonic() - started)


def _look(
    session: Session, awaited: list[str], latest: dict[str, Task], gone: GoneRunners,
    left: float | None,
) -> bool:  # fmt: skip
    """One look at the tasks still ``awaited``: each that settled is told and taken out
    of it. False: nothing is left to wait for, or the lock an end is confirmed under
    was held past the deadline (``left``)."""
    store = session.store
    if any(_ended(store.get(task_id)) for task_id in awaited) and not store.sync(left):
        # An end is confirmed under the journal's lock before it is said: one read
        # without it may be taken back by its writer (its fdatasync failed). The
        # lock held past the deadline (a ferry stopped in its append): not said.
        return False
    for task_id in list(awaited):
        current = store.get(task_id)
        if current is None:  # settled and forgotten (ferry gc) between two looks
            awaited.remove(task_id)
            session.reporter.notice(
                f"task {task_id} was forgotten (ferry gc) before its end was seen"
            )
            continue
        latest[task_id] = current
        if current.terminal:
            awaited.remove(task_id)
            session.reporter.settled(with_runner_state(current, session.home, store))
    if not awaited:
        return False
    gone.look(latest[task_id] for task_id in awaited)
    return True


def _ended(task: Task | None) -> bool:
    """Settled, or forgotten (ferry gc)."""
    return task is None or task.terminal
