"""Is a recorded process alive? ALIVE, DEAD or UNKNOWN, and DEAD only with proof.

Proof of death, for a :class:`~ferry.proc.process.ProcessIdentity`:

* it belongs to another boot (the boot id differs): every process of that boot is gone;
* no process has its pid (``kill(pid, 0)`` says ESRCH; /proc alone is not trusted,
  since ``hidepid`` can hide live processes);
* the pid belongs to a process with another start time (the pid was reused), both
  read in one time namespace (the kernel offsets start times by the reader's);
* it has exited and not yet been reaped (a zombie): it runs no code and writes nothing,
  so for the runner and for the task alike "a zombie is not alive" (contract). (The
  design notes first listed zombies as "unknown"; the contract and the issue settle it.)

Anything unclear (a permission error, an unparseable /proc file, an incomplete marker
scan, a pid of another PID namespace that cannot be translated to ours) is UNKNOWN,
and callers treat UNKNOWN as alive: recovery quarantines rather than re-running
something that may still be running. A pid recorded in another PID namespace (a
container's) is judged by the pid it has in ours (``ferry.proc.process.local_identity``),
then as above.
"""

from __future__ import annotations

import os
import time

from ferry.core.model import Liveness
from ferry.proc.alivelock import read_beat
from ferry.proc.process import (
    ProcessIdentity,
    boot_id,
    local_identity,
    pid_absent,
    read_stat,
    same_clock,
    scan_processes,
    time_namespace,
)

__all__ = [
    "WALL_STEP_ENV",
    "Liveness",
    "heartbeat_age",
    "probe",
    "probe_task",
    "wall_clock",
]

# Test-only: the wall clock recovery judges by, stepped by this many seconds (as NTP or
# a manual `date` would step it), so that a test can step one ferry process's clock
# without touching the machine's. Read once, at import, like FERRY_FAILPOINTS; unset
# in production (then wall_clock() is time.time()).
WALL_STEP_ENV = "FERRY_TEST_WALL_STEP_S"


def _wall_step_s(text: str | None) -> float:
    """The step WALL_STEP_ENV asks for; 0 for anything but a finite number of seconds
    (a test's setting, read at import: a bad one must not fail every command)."""
    import math

    try:
        step = float(text or 0.0)
    except ValueError:
        return 0.0
    return step if math.isfinite(step) else 0.0


_WALL_STEP_S = _wall_step_s(os.environ.get(WALL_STEP_ENV))


def wall_clock() -> float:
    """Unix seconds, as recovery reads them (``time.time()``; see WALL_STEP_ENV)."""
    return time.time() + _WALL_STEP_S


def probe(identity: ProcessIdentity) -> Liveness:
    """Liveness of one process (the runner, or a task's first process). One recorded in
    another PID namespace (a container's) is probed by the pid it has in ours, if it
    can be translated; if not, UNKNOWN (``ferry.proc.process.local_identity``)."""
    try:
        if identity.boot_id != boot_id():
            return Liveness.DEAD
        local = local_identity(identity)
        if local is None:
            return Liveness.UNKNOWN
        identity = local
        st = read_stat(identity.pid)
    except (OSError, ValueError):
        return Liveness.UNKNOWN
    if st is None:
        try:
            return Liveness.DEAD if pid_absent(identity.pid) else Liveness.UNKNOWN
        except OSError:
            return Liveness.UNKNOWN
    if st.start_time != identity.start_time:
        # Reused, where start times are read on one clock; else the offset may be all.
        return Liveness.DEAD if same_clock(identity) else Liveness.UNKNOWN
    if st.exited:
        return Liveness.DEAD
    return Liveness.ALIVE


def probe_task(
    marker: str, leader: ProcessIdentity | None, *, not_before_ticks: int | None = None
) -> Liveness:
    """Liveness of a task: alive if any process of its session or process group, or
    carrying its environment marker, is alive (the first process may exit and leave
    children behind). ``leader`` is the task's first process as SPAWNED recorded it, or
    None when SPAWNED never reached the disk (then only the marker can find it; pass
    the runner's ``start_time`` as ``not_before_ticks`` to skip older processes).
    """
    leader_liveness = Liveness.DEAD if leader is None else probe(leader)
    if leader_liveness is Liveness.ALIVE:
        return Liveness.ALIVE
    try:
        scan = scan_processes(marker, session_of=leader, not_before_ticks=not_before_ticks)
    except OSError:
        return Liveness.UNKNOWN
    if scan.alive:
        return Liveness.ALIVE
    if leader_liveness is Liveness.UNKNOWN or not scan.complete:
        return Liveness.UNKNOWN
    return Liveness.DEAD


def heartbeat_age(path: str, wall_now: float) -> tuple[float, str] | None:
    """How long ago the runner beat (the file ``path``), and on which clock.

    ``"monotonic"``: on CLOCK_MONOTONIC, from the file's beat record when it is sound
    and was written in this boot and this time namespace; no step of the wall clock
    moves it, nor a suspend of the machine (nothing beats while it sleeps: on the boot
    clock, every task looked stale right after a resume). ``"boot"``: the same on
    CLOCK_BOOTTIME, for a record of an older ferry. ``"wall"``: ``wall_now`` minus the
    file's mtime, as ferry always did: for a file without a sound record of ours
    (written by an older ferry still, torn, from a container with its own time
    namespace). None: no such file. Raises OSError when the file cannot be read.
    """
    seen = read_beat(path)
    if seen is None:
        return None
    beat, mtime = seen
    if beat is None or (beat.boot_id, beat.time_namespace) != (boot_id(), time_namespace() or 0):
        return wall_now - mtime, "wall"
    return beat.age_s(), beat.clock
