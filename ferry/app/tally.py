"""What ``work`` and ``wait`` saw settle, counted by end state: the summary they end
with, the exit status the command line chooses from it, and ``work``'s progress.

A task counts as a failure when it settled FAILED (recovery's FAILED decisions
included); CANCELLED is counted apart. Only SUCCEEDED counts as success: a ``work
--drain`` or a ``wait`` exits 0 only when every task it counted SUCCEEDED.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ferry.core.model import State, Task


@dataclass
class Tally:
    """Tasks settled so far, by end state, since ``started`` (monotonic seconds)."""

    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    started: float = field(default_factory=time.monotonic)

    def add(self, task: Task) -> None:
        if task.state is State.SUCCEEDED:
            self.succeeded += 1
        elif task.state is State.FAILED:
            self.failed += 1
        else:
            self.cancelled += 1

    @property
    def settled(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def all_succeeded(self) -> bool:
        return self.settled == self.succeeded

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class WorkReport:
    """What a ``work`` did: the tasks it settled (its supervisors' ends and its
    recovery's decisions), how long it took, the failed task after which ``--halt``
    stopped it (None: it was not halted), and the signal that stopped it (None: none)
    with the tasks it left queued (None: not known, the database out of reach)."""

    succeeded: int
    failed: int
    cancelled: int
    elapsed_s: float
    halted_after: str | None = None
    stopped_by: int | None = None
    left_queued: int | None = None

    @property
    def all_succeeded(self) -> bool:
        return self.failed == 0 and self.cancelled == 0


@dataclass(frozen=True)
class Progress:
    """How far a ``work`` is: its settled tasks by end state, the tasks its supervisors
    run, the tasks queued, and the time since it started."""

    succeeded: int
    failed: int
    cancelled: int
    running: int
    queued: int
    elapsed_s: float

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def total(self) -> int:
        return self.done + self.running + self.queued

    @property
    def eta_s(self) -> float | None:
        """At the pace so far (tasks settled per second, every slot together): None
        before the first task settled."""
        if not self.done:
            return None
        return (self.running + self.queued) * self.elapsed_s / self.done


@dataclass(frozen=True)
class WaitReport:
    """What a ``wait`` saw: the tasks it waited for, as they are now (in the order
    asked), those that did not settle in time (by id), and how long it waited."""

    tasks: list[Task]
    unsettled: list[str]
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return bool(self.unsettled)

    @property
    def all_succeeded(self) -> bool:
        return all(task.state is State.SUCCEEDED for task in self.tasks)

    @property
    def succeeded(self) -> int:
        return self._count(State.SUCCEEDED)

    @property
    def failed(self) -> int:
        return self._count(State.FAILED)

    @property
    def cancelled(self) -> int:
        return self._count(State.CANCELLED)

    def _count(self, state: State) -> int:
        return sum(1 for task in self.tasks if task.state is state)
