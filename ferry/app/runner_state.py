"""What the journal does not hold about a task in flight, read when it is shown: its
runner's liveness (a probe) and its last heartbeat (the heartbeat file's time). Kept
apart from the recoverer, which decides tasks: ``ls``, ``show`` and ``wait`` only
look."""

from __future__ import annotations

import os
import time

from ferry.app.runner import heartbeat_path, home_id
from ferry.core._value import replace
from ferry.core.errors import DatabaseUnavailableError, FerryError
from ferry.core.model import Liveness, State, Task
from ferry.proc.liveness import probe
from ferry.proc.process import ProcessIdentity

TYPE_CHECKING = False  # (typing is not imported at run time: start-up)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from ferry.storage import TaskStore


def runner_identity(task: Task) -> ProcessIdentity | None:
    try:
        return None if task.runner is None else ProcessIdentity.from_json(task.runner)
    except ValueError:
        return None


def of_another_home(task: Task, home: str | os.PathLike[str]) -> bool:
    """Was the task's claim made from another state directory than ``home``: this one
    a copy of it (``cp -a``), or moved to it from another file system (a new inode)?
    Its processes, if alive, are never signalled from here (a copy's ``cancel`` killed
    the original's task). Liveness is still probed, never assumed: a home moved across
    file systems is the same home, and its live task must not be decided dead. (A claim
    on one host's journal names its home, ``runner.home_id``; a shared database's claims
    are its host's, decided by host: they name none.)"""
    said = (task.runner or {}).get("home_id")
    if not isinstance(said, str):
        return False
    try:
        return said != home_id(home)
    except OSError:
        return False


def other_host(store: TaskStore, task: Task) -> str | None:
    """The host that runs ``task``, if it is another's (a shared database): only a
    ferry on that host can probe or signal its processes (a probe here of a process of
    another machine answers DEAD: another boot). One of this host id but another boot
    is named so (this machine before a reboot, or another machine given its id)."""
    if store.host_lost(task, float("inf")) is None:
        return None
    owner = str((task.runner or {}).get("host_id"))
    if owner == getattr(store, "host", None):
        owner += " (another boot of this host id: this machine before a reboot, or another"
        owner += " machine given its id)"
    return owner


def with_runner_state(task: Task, home: str | os.PathLike[str], store: TaskStore) -> Task:
    """What the journal does not hold, for a task in flight: heartbeat_at from the
    heartbeat file (beats are not journaled), and whether its runner (the task's
    supervisor) is alive now, as a probe proves it (``runner.alive``: true, false, or
    null when it cannot be proven either way: another host's, say). A settled task's
    runner is done."""
    if task.runner is None:
        return task
    if not task.in_flight:
        return replace(task, runner={**task.runner, "alive": False})
    if other_host(store, task) is not None:  # (its heartbeat file is on that host too)
        return replace(task, runner={**task.runner, "alive": None})
    identity = runner_identity(task)
    seen = Liveness.UNKNOWN if identity is None else probe(identity)
    alive = None if seen is Liveness.UNKNOWN else seen is Liveness.ALIVE
    task = replace(task, runner={**task.runner, "alive": alive})
    try:
        beat = os.stat(heartbeat_path(home, task.id, task.attempt)).st_mtime
    except OSError:
        return task
    return replace(task, heartbeat_at=beat)


class GoneRunners:
    """For a command that waits on tasks (``wait``, ``logs -f``): says once for each in
    flight that its runner is gone, so that it does not wait for ever without a word:
    such a task stays in flight until recovery decides it (``ferry recover``, or a
    running ``work``'s next pass); and once that queued tasks wait with no leader
    (``led``) to start them. Looked at every ``LOOK_S`` at most (a probe reads /proc);
    the first look at once."""

    LOOK_S = 5.0
    LEADERLESS_S = 5.0

    def __init__(
        self, home: str | os.PathLike[str], store: TaskStore, notice: Any,
        led: Callable[[], bool] = lambda: True,
    ) -> None:  # fmt: skip
        self.home, self.store, self.notice, self.led = home, store, notice, led
        self.told: set[str] = set()
        self.queue_told = False
        self.leaderless_since: float | None = None  # (no leader seen since)
        self.next_look = self.next_lead_look = 0.0

    def look(self, tasks: Iterable[Task]) -> None:
        now = time.monotonic()
        tasks = list(tasks)
        self._no_leader([task.id for task in tasks if task.state is State.QUEUED], now)
        if now < self.next_look:
            return
        self.next_look = now + self.LOOK_S
        for task in tasks:
            if not task.in_flight or task.id in self.told:
                continue
            runner = with_runner_state(task, self.home, self.store).runner or {}
            if runner.get("alive") is not False:
                continue
            # Dead: but a runner exits once its task's end is durable, and that end may
            # have come after ``task`` was read. Read again before saying anything.
            self.store.refresh()
            current = self.store.get(task.id)
            if current is not None and current.in_flight and current.runner == task.runner:
                self.told.add(task.id)
                self.notice(
                    f"task {task.id}: its runner (pid {runner.get('pid')}) is gone: it stays"
                    f" {task.state.value} until 'ferry recover' (or a running 'ferry work')"
                    " decides it"
                )

    def _no_leader(self, queued: list[str], now: float) -> None:
        """Said once no leader was seen for ``LEADERLESS_S`` (a ``work`` just started
        leads within it), looking once a second."""
        if not queued or self.queue_told or now < self.next_lead_look:
            return
        self.next_lead_look = now + 1.0
        try:
            led = self.led()
        except (FerryError, OSError, ValueError):  # (the lease unreadable, the database
            return  # away, a holder that does not parse: not said)
        if led or self.leaderless_since is None:
            self.leaderless_since = None if led else now
            return
        if now - self.leaderless_since < self.LEADERLESS_S:
            return
        self.queue_told = True
        which = f"task {queued[0]} is" if len(queued) == 1 else f"{len(queued)} tasks are"
        self.notice(
            f"{which} queued and no 'ferry work' is running to start "
            f"{'it' if len(queued) == 1 else 'them'} ('ferry work' runs the queue, "
            "'ferry claim' its next task)"
        )


class Outage:
    """Around each look of a command that waits (``wait``, ``logs -f``): the database
    out of reach (``db.unavailable``: a restart, a failover) is said once and waited
    out, as ``work`` does; the look is made again at the next turn. (A local journal
    never raises it.)"""

    def __init__(self, notice: Any) -> None:
        self.notice = notice
        self.said = False

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, trace: Any) -> bool:
        if not isinstance(error, DatabaseUnavailableError):
            return False
        if not self.said:
            self.said = True
            self.notice(f"warning: {error.message}; waiting for it")
        return True
