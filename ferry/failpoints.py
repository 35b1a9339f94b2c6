"""Named crash points: ``failpoint(name)`` SIGKILLs this process when armed.

Tests arm failpoints through the environment, so they reach a ferry started as a
subprocess::

    FERRY_FAILPOINTS="after:DISPATCHING"          # crash at the first hit
    FERRY_FAILPOINTS="before:SETTLED=3,after:spawn"  # the 3rd hit of one, 1st of the other
    FERRY_FAILPOINTS="after:DISPATCHING=stop"     # SIGSTOP instead, at the first hit: the
                                                  # test signals the paused process there

The variable is parsed once, at import. When it is unset (always, in production) a
call costs one frozenset membership test: no string building, no lock.

Naming convention (the registry :data:`FAILPOINTS` lists every name):

* ``before:<EVENT>`` / ``after:<EVENT>``: around the journal append of an event type
  (``before`` = nothing written yet; ``after`` = the record is durable, its side effect
  not yet done). The store calls these; ``<EVENT>`` is the journal event type.
* ``before:spawn`` / ``after:spawn``: around starting a task's child process.
* ``before:signal`` / ``after:signal``: around sending a verified signal
  (:func:`ferry.process.signal_verified` calls them itself).
* ``before:lease_write`` / ``after:lease_write``: around the atomic replace of
  ``lease.json`` (:mod:`ferry.lease` calls them itself).
* ``before:snapshot_write`` / ``after:snapshot_write``: around a compaction's journal
  snapshot, with ``compact.lock`` held (``before``: its archive is written, the snapshot
  not; ``after``: the snapshot is written, nothing pruned yet).
* ``before:replay`` / ``after:replay``: around the store's replay of the records after
  the snapshot it read, when it opens (``before``: the snapshot is read, nothing more).

Why SIGKILL and not an exception: a crash must not run ``finally`` blocks, flush
buffers or release locks politely; SIGKILL is what the OOM killer and ``kill -9`` do.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable, Iterator, Mapping

from ferry.events import EventType

__all__ = [
    "ENV",
    "EVENT_TYPES",
    "FAILPOINTS",
    "SIDE_EFFECT_POINTS",
    "armed",
    "event_points",
    "failpoint",
    "parse",
]

ENV = "FERRY_FAILPOINTS"

# The journal event types ferry appends (the store calls the before:/after: points).
EVENT_TYPES: tuple[str, ...] = tuple(t.value for t in EventType)

SIDE_EFFECT_POINTS: tuple[str, ...] = (
    "before:spawn",
    "after:spawn",
    "before:signal",
    "after:signal",
    "before:lease_write",
    "after:lease_write",
    "before:snapshot_write",
    "after:snapshot_write",
    "before:replay",
    "after:replay",
)


def event_points(event_types: Iterable[str]) -> tuple[str, ...]:
    """``before:<T>`` and ``after:<T>`` for every event type, in order."""
    return tuple(f"{when}:{t}" for t in event_types for when in ("before", "after"))


# Every known failpoint name: crash-matrix tests iterate this.
FAILPOINTS: frozenset[str] = frozenset(event_points(EVENT_TYPES) + SIDE_EFFECT_POINTS)


def _items(text: str | None) -> Iterator[tuple[str, str | None]]:
    """``"a,b=3"`` -> ("a", None), ("b", "3")."""
    for item in (text or "").split(","):
        name, sep, value = item.strip().partition("=")
        if name:
            yield name.strip(), value.strip() if sep else None


def parse(text: str | None) -> Mapping[str, int]:
    """``"a,b=3,c=stop"`` -> ``{"a": 1, "b": 3, "c": 1}`` (crash on the Nth hit; ``stop``:
    the 1st, see :data:`STOPS`). Bad counts raise ValueError."""
    points: dict[str, int] = {}
    for name, value in _items(text):
        nth = 1 if value is None or value == "stop" else int(value)
        if nth < 1:
            raise ValueError(f"{ENV}: hit count must be >= 1 in {name}={value}")
        points[name] = nth
    return points


def stops(text: str | None) -> frozenset[str]:
    """The names armed with ``=stop``: they SIGSTOP this process instead of killing it."""
    return frozenset(name for name, value in _items(text) if value == "stop")


_NTH: Mapping[str, int] = parse(os.environ.get(ENV))
STOPS: frozenset[str] = stops(os.environ.get(ENV))
_ARMED: frozenset[str] = frozenset(_NTH)
_hits: dict[str, int] = {}
_hits_lock = threading.Lock()


def armed() -> frozenset[str]:
    """The names armed in this process (for tests and diagnostics)."""
    return _ARMED


def failpoint(name: str) -> None:
    """Crash this process with SIGKILL right here if ``name`` is armed (and this is the Nth hit)."""
    if name in _ARMED:
        _hit(name)


def _hit(name: str) -> None:
    with _hits_lock:
        count = _hits.get(name, 0) + 1
        _hits[name] = count
    if count == _NTH[name]:
        os.kill(os.getpid(), signal.SIGSTOP if name in STOPS else signal.SIGKILL)
