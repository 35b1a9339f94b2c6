"""Is a recorded process alive? ALIVE, DEAD or UNKNOWN, and DEAD only with proof.

Proof of death, for a :class:`~ferry.process.ProcessIdentity`:

* it belongs to another boot (the boot id differs): every process of that boot is gone;
* no process has its pid (``kill(pid, 0)`` says ESRCH; /proc alone is not trusted,
  since ``hidepid`` can hide live processes);
* the pid belongs to a process with another start time (the pid was reused);
* it has exited and not yet been reaped (a zombie): it runs no code and writes nothing,
  so for the runner and for the task alike "a zombie is not alive" (contract). (The
  design notes first listed zombies as "unknown"; the contract and the issue settle it.)

Anything unclear (a permission error, an unparseable /proc file, an incomplete marker
scan) is UNKNOWN, and callers treat UNKNOWN as alive: recovery quarantines rather than
re-running something that may still be running.
"""

from __future__ import annotations

from ferry.model import Liveness
from ferry.process import (
    ProcessIdentity,
    boot_id,
    pid_absent,
    read_stat,
    scan_processes,
)

__all__ = ["Liveness", "probe", "probe_task"]


def probe(identity: ProcessIdentity) -> Liveness:
    """Liveness of one process (the runner, or a task's first process)."""
    try:
        if identity.boot_id != boot_id():
            return Liveness.DEAD
        st = read_stat(identity.pid)
    except (OSError, ValueError):
        return Liveness.UNKNOWN
    if st is None:
        try:
            return Liveness.DEAD if pid_absent(identity.pid) else Liveness.UNKNOWN
        except OSError:
            return Liveness.UNKNOWN
    if st.start_time != identity.start_time:
        return Liveness.DEAD
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
