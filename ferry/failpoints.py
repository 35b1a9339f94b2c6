"""Named crash points: ``failpoint(name)`` kills ferry right there when armed.

Tests arm failpoints through the environment, so they reach a ferry started as a
subprocess::

    FERRY_FAILPOINTS="after:DISPATCHING"          # crash at the first hit
    FERRY_FAILPOINTS="before:SETTLED=3,after:spawn"  # the 3rd hit of one, 1st of the other
    FERRY_FAILPOINTS="after:DISPATCHING=stop"     # SIGSTOP instead, at the first hit: the
                                                  # test signals the paused process there
    FERRY_FAILPOINTS="before:SETTLED=2=stop"      # SIGSTOP at the 2nd hit
    FERRY_FAILPOINTS="after:SPAWNED=self"         # SIGKILL this process only (see below)
    FERRY_FAILPOINTS="supervisor:after:spawn=self"  # ... armed in supervisors only

A command that runs tasks (``run``, ``claim``, ``work``: the *launcher*) forks one
supervisor per task (``ferry.app.supervisor``), which inherits the armed failpoints. A
plain name is armed in both, each counting its own hits; ``supervisor:NAME`` only in
supervisors, ``launcher:NAME`` only in the launcher. What a hit does:

* by default, SIGKILL the whole command: this process, and the launcher's supervisors
  (from the launcher) or the launcher (from a supervisor). That is a crash of ferry at
  that point, as the OOM killer of a cgroup or a power cut would make it (and as it was
  when one process did it all);
* ``=self``: SIGKILL this process only (``kill -9`` of ``ferry run``: its supervisor
  goes on; of a supervisor: its launcher goes on);
* ``=stop``: SIGSTOP this process only, for a test that acts while it is paused.

The variable is parsed once, at import. When it is unset (always, in production) a
call costs one frozenset membership test: no string building, no lock.

Test-only tracing: ``FERRY_FAILPOINTS_TRACE=FILE`` appends one line per failpoint this
process reaches, ``<pid> <name> <hit>`` (``hit``: 1 for the first time ``name`` is
reached, 2 for the second...), before acting on an armed one; and a supervisor, as it
starts, ``<pid> supervisor <launcher pid>`` (its hits are counted from there: a
supervisor's points are told from its launcher's by the pid). Supervisors inherit the
file, so it lists every process of one command. Read once at import like
``FERRY_FAILPOINTS``; when it is unset the untraced :func:`failpoint` is the one
defined, so it costs nothing.

Naming convention (the registry :data:`FAILPOINTS` lists every name):

* ``before:<EVENT>`` / ``after:<EVENT>``: around the journal append of an event type
  (``before`` = nothing written yet; ``after`` = the record is durable, its side effect
  not yet done). The store calls these; ``<EVENT>`` is the journal event type. A
  supervisor also reaches ``after:SPAWNED``, ``before:SETTLED`` and ``after:SETTLED``
  for its own records when its launcher writes them (when it learns they are durable,
  and before it hands its end over).
* ``before:spawn`` / ``after:spawn``: around starting a task's child process (in the
  supervisor).
* ``before:go`` / ``after:go``: around a launcher telling a task's supervisor to spawn
  it (its ``go``; for ``work``, usually the task itself, sent with its ``go`` when it
  is one packet sent at once, the go apart otherwise): the
  intent is durable; ``after``: the supervisor will spawn without its launcher.
* ``before:relay`` / ``after:relay``: around a launcher relaying a signal it got to
  its task's supervisor (``after``: the supervisor can read it).
* ``before:signal`` / ``after:signal``: around sending a verified signal
  (:func:`ferry.proc.process.signal_verified` calls them itself).
* ``before:lease_write`` / ``after:lease_write``: around the atomic replace of
  ``lease.json`` (:mod:`ferry.storage.local.lease` calls them itself).
* ``before:archive_index`` / ``after:archive_index``: around writing the index of a
  compaction's new settled-task archive, with ``compact.lock`` held (``before``: the
  archive is written, its index not; ``after``: both, the snapshot naming them not).
* ``before:snapshot_write`` / ``after:snapshot_write``: around a compaction's journal
  snapshot, with ``compact.lock`` held (``before``: its archive is written, the snapshot
  not; ``after``: the snapshot is written, nothing pruned yet).
* ``before:outbox`` / ``after:outbox``: around a supervisor keeping its task's end on
  this host (``<home>/outbox/``, durable) because the store could not take it
  (``before``: nothing kept yet; ``after``: kept, not yet tried again;
  :mod:`ferry.app.outbox`).
* ``before:replay`` / ``after:replay``: around the store's replay of the records after
  the snapshot it read, when it opens (``before``: the snapshot is read, nothing more).
* ``before:log_order`` / ``after:log_order``: around a supervisor's entry in a task's
  log order index (:mod:`ferry.proc.logorder`), when the task switched streams
  (``before``: one stream's run is logged, not yet recorded; ``after``: recorded, the
  other stream's chunk not yet logged).
* ``before:gc_remove`` / ``after:gc_remove``: around ``ferry gc``'s removal of one
  forgotten task's files (its FORGOTTEN is durable) (:mod:`ferry.app.gc`).
* ``before:salvage_segment`` / ``after:salvage_segment`` and ``before:salvage_swap`` /
  ``after:salvage_swap``: ``ferry journal salvage`` (``journal._salvage`` calls them
  through its hook), with the journal's lock held: around writing the new journal's
  segments in its build directory (``before``: the snapshot is there, no segment),
  and around the swap of the two directories (``before``: the new journal is complete
  and durable, not in use; ``after``: it is in use, and the damaged one sits under the
  build's name, not yet renamed ``journal.damaged-*``).

Why SIGKILL and not an exception: a crash must not run ``finally`` blocks, flush
buffers or release locks politely; SIGKILL is what the OOM killer and ``kill -9`` do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable, Mapping

from ferry.core.events import EventType

__all__ = [
    "ENV",
    "EVENT_TYPES",
    "FAILPOINTS",
    "SIDE_EFFECT_POINTS",
    "TRACE_ENV",
    "Armed",
    "armed",
    "companion",
    "event_points",
    "failpoint",
    "parse",
    "supervisor_armed",
]

ENV = "FERRY_FAILPOINTS"
TRACE_ENV = "FERRY_FAILPOINTS_TRACE"  # test-only: see the module docstring

# The journal event types ferry appends (the store calls the before:/after: points).
EVENT_TYPES: tuple[str, ...] = tuple(t.value for t in EventType)

SIDE_EFFECT_POINTS: tuple[str, ...] = (
    "before:spawn",
    "after:spawn",
    "before:go",
    "after:go",
    "before:relay",
    "after:relay",
    "before:signal",
    "after:signal",
    "before:lease_write",
    "after:lease_write",
    "before:archive_index",
    "after:archive_index",
    "before:snapshot_write",
    "after:snapshot_write",
    "before:replay",
    "after:replay",
    "before:outbox",
    "after:outbox",
    "before:log_order",
    "after:log_order",
    "before:gc_remove",
    "after:gc_remove",
    "before:salvage_segment",
    "after:salvage_segment",
    "before:salvage_swap",
    "after:salvage_swap",
)


def event_points(event_types: Iterable[str]) -> tuple[str, ...]:
    """``before:<T>`` and ``after:<T>`` for every event type, in order."""
    return tuple(f"{when}:{t}" for t in event_types for when in ("before", "after"))


# Every known failpoint name: crash-matrix tests iterate this.
FAILPOINTS: frozenset[str] = frozenset(event_points(EVENT_TYPES) + SIDE_EFFECT_POINTS)


SCOPES = ("supervisor:", "launcher:")
ACTIONS = ("kill", "self", "stop")


class Armed:
    """One armed point: which hit triggers it, and what it does."""

    __slots__ = ("action", "nth", "scope")

    def __init__(self, nth: int, action: str, scope: str | None) -> None:
        self.nth, self.action, self.scope = nth, action, scope


def parse(text: str | None) -> Mapping[str, Armed]:
    """``"a,b=3,c=stop,d=2=self,supervisor:e"`` -> each name's :class:`Armed` (``scope``:
    "supervisor", "launcher" or None for both). Bad counts or actions raise ValueError."""
    points: dict[str, Armed] = {}
    for item in (text or "").split(","):
        name, *values = (part.strip() for part in item.strip().split("="))
        scope = None
        for prefix in SCOPES:
            if name.startswith(prefix):
                scope, name = prefix[:-1], name[len(prefix) :]
        if not name:
            continue
        nth, action = 1, "kill"
        for value in values:
            if value in ACTIONS:
                action = value
            else:
                nth = int(value)
                if nth < 1:
                    raise ValueError(f"{ENV}: hit count must be >= 1 in {item}")
        points[name] = Armed(nth, action, scope)
    return points


def _in_scope(points: Mapping[str, Armed], scope: str) -> dict[str, Armed]:
    return {name: point for name, point in points.items() if point.scope in (None, scope)}


_PARSED: Mapping[str, Armed] = parse(os.environ.get(ENV))
_POINTS: dict[str, Armed] = _in_scope(_PARSED, "launcher")
_ARMED: frozenset[str] = frozenset(_POINTS)
_hits: dict[str, int] = {}
_hits_lock = threading.Lock()
_TRACE_PATH: str | None = os.environ.get(TRACE_ENV) or None
# The other processes of this command, killed with it: a launcher's supervisors (its
# unreaped children: their numbers cannot be reused), or a supervisor's launcher.
_companions: set[int] = set()
_launcher: int | None = None


def armed() -> frozenset[str]:
    """The names armed in this process (for tests and diagnostics)."""
    return _ARMED


def supervisor_armed() -> None:
    """Called in a freshly forked supervisor: from now on, the points armed for
    supervisors; a crash also kills its launcher (its parent, while it lives)."""
    global _POINTS, _ARMED, _launcher
    _POINTS = _in_scope(_PARSED, "supervisor")
    _ARMED = frozenset(_POINTS)
    _hits.clear()
    _companions.clear()
    _launcher = os.getppid()
    if _TRACE_PATH is not None:
        _trace(_TRACE_PATH, f"{os.getpid()} supervisor {_launcher}\n")


def companion(pid: int, *, alive: bool = True) -> None:
    """A launcher's supervisor started (``alive``) or was reaped."""
    if alive:
        _companions.add(pid)
    else:
        _companions.discard(pid)


if _TRACE_PATH is None:

    def failpoint(name: str) -> None:
        """Crash here if ``name`` is armed and this is its Nth hit (see the docstring)."""
        if name in _ARMED:
            _hit(name)

else:

    def failpoint(name: str) -> None:
        """Traced (test-only): every hit is written down; then as the untraced one."""
        _hit(name)


def _hit(name: str) -> None:
    with _hits_lock:
        count = _hits.get(name, 0) + 1
        _hits[name] = count
        if _TRACE_PATH is not None:
            _trace(_TRACE_PATH, f"{os.getpid()} {name} {count}\n")
    point = _POINTS.get(name)
    if point is None or count != point.nth:
        return
    if point.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if point.action == "kill":
        others = set(_companions)
        if _launcher is not None and os.getppid() == _launcher:
            others.add(_launcher)
        for pid in others:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _trace(path: str, line: str) -> None:
    # One O_APPEND write per line: lines of several processes never interleave. Written
    # before an armed point acts, so the point the process stops or dies at is listed.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
