"""Process identity, verified signals and the environment-marker scan (no spawning here).

A pid alone names a process only until it exits: the kernel hands the number to the
next process that asks. ferry therefore names a process by :class:`ProcessIdentity`:
pid + start time (clock ticks since boot, field 22 of ``/proc/<pid>/stat``, exact) +
the kernel's boot id + host name (informative only: the boot id decides, and the host
name can change without a reboot) + the PID namespace the pid is a number of (a
``ferry run`` in a container records its own pids: 1 for itself, maybe; a ``ferry
recover`` on the host must translate them before it looks, see :func:`local_identity`).

Signals are never sent to a bare pid. :func:`signal_verified` opens a pidfd first,
then re-reads the start time: if it still matches, the pidfd is bound to the recorded
process (a pidfd cannot be re-pointed, and a dead process does not come back), and the
signal goes through the pidfd. For a process group the pidfd is used with
``PIDFD_SIGNAL_PROCESS_GROUP`` (Linux 6.9+), which names the group by the leader's
kernel ``struct pid``, not by its number: no reuse race at all. On older kernels it
falls back to ``killpg`` after the check; the remaining race needs, between two
system calls, the leader to exit and be reaped, *every* member of its group to exit
(the kernel does not reuse a number still used as a group id), the pid space to wrap
around (``pid_max`` is 4 million on 64-bit) and a new process to lead a group with that
very number.

Reading ``/proc`` directly keeps this module cheap to import; psutil is only imported
(lazily) where ``/proc`` does not exist, as a best-effort fallback.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import time
from collections.abc import Callable, Mapping

from ferry.core._value import Value, init
from ferry.failpoints import failpoint

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeGuard

__all__ = [
    "MARKER_ENV",
    "NotGroupLeaderError",
    "ProcStat",
    "ProcessIdentity",
    "ProcessScan",
    "boot_id",
    "find_by_marker",
    "identity_of",
    "local_identity",
    "make_marker",
    "marker_prefix",
    "parse_stat",
    "pid_absent",
    "pid_namespace",
    "read_stat",
    "same_clock",
    "scan_processes",
    "self_identity",
    "signal_task",
    "signal_verified",
    "time_namespace",
]

MARKER_ENV = "FERRY_TASK"
_PROC = "/proc"
# include/uapi/linux/pidfd.h; Python 3.11 has no constant for it.
_PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2
# States of a process that has exited: zombie, dead.
_EXITED_STATES = frozenset({"Z", "X", "x"})
_PF_KTHREAD = 0x00200000  # include/linux/sched.h: a kernel thread (stat field 9)


class ProcessIdentity(Value):
    """``pid`` is the number the process has in the PID namespace ``pid_ns`` (the inode
    of its ``/proc/<pid>/ns/pid``), and ``start_time`` as /proc reads it in the time
    namespace ``time_ns`` (the kernel offsets start times by the reader's; a container
    may have its own). Either None: not recorded (an older journal), taken to be the
    reader's own, as ferry always did."""

    __slots__ = ("boot_id", "host", "pid", "pid_ns", "start_time", "time_ns")
    _FIELDS = ("pid", "start_time", "boot_id", "host", "pid_ns", "time_ns")
    pid: int
    start_time: int  # clock ticks since boot (/proc/<pid>/stat field 22)
    boot_id: str
    host: str
    pid_ns: int | None
    time_ns: int | None

    def __init__(
        self,
        pid: int,
        start_time: int,
        boot_id: str,
        host: str,
        pid_ns: int | None = None,
        time_ns: int | None = None,
    ) -> None:
        init(self, "pid", pid)
        init(self, "start_time", start_time)
        init(self, "boot_id", boot_id)
        init(self, "host", host)
        init(self, "pid_ns", pid_ns)
        init(self, "time_ns", time_ns)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "pid": self.pid,
            "start_time": self.start_time,
            "boot_id": self.boot_id,
            "host": self.host,
        }
        if self.pid_ns is not None:
            data["pid_ns"] = self.pid_ns
        if self.time_ns is not None:
            data["time_ns"] = self.time_ns
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessIdentity:
        """Strict: raises ValueError on a missing field or a wrong type (``pid_ns`` and
        ``time_ns`` may be missing: an identity recorded before ferry recorded them)."""
        pid, start, boot, host = (data.get(k) for k in ("pid", "start_time", "boot_id", "host"))
        pid_ns, time_ns = data.get("pid_ns"), data.get("time_ns")
        if not (
            _is_int(pid) and _is_int(start) and isinstance(boot, str) and isinstance(host, str)
        ):
            raise ValueError(f"not a process identity: {dict(data)!r}")
        if pid <= 0 or start < 0 or not (_namespace_id(pid_ns) and _namespace_id(time_ns)):
            raise ValueError(f"not a process identity: {dict(data)!r}")
        return cls(pid, start, boot, host, pid_ns, time_ns)


def _namespace_id(value: object) -> bool:
    return value is None or (_is_int(value) and value > 0)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class ProcStat(Value):
    """The fields of /proc/<pid>/stat ferry uses."""

    __slots__ = ("flags", "pgrp", "pid", "ppid", "session", "start_time", "state")
    _FIELDS = ("pid", "state", "ppid", "pgrp", "session", "flags", "start_time")
    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    flags: int
    start_time: int

    def __init__(
        self, pid: int, state: str, ppid: int, pgrp: int, session: int, flags: int, start_time: int
    ) -> None:
        init(self, "pid", pid)
        init(self, "state", state)
        init(self, "ppid", ppid)
        init(self, "pgrp", pgrp)
        init(self, "session", session)
        init(self, "flags", flags)
        init(self, "start_time", start_time)

    @property
    def exited(self) -> bool:
        return self.state in _EXITED_STATES

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & _PF_KTHREAD)


def parse_stat(raw: bytes) -> ProcStat:
    """Parse /proc/<pid>/stat. The command name (field 2) may hold spaces and parentheses,
    so split at the *last* ')'. Raises ValueError on anything else."""
    head, sep, tail = raw.rpartition(b")")
    pid_text, _, _ = head.partition(b" (")
    fields = tail.split()
    if not sep or len(fields) < 20:
        raise ValueError(f"unparseable /proc stat: {raw[:200]!r}")
    # fields[0] is field 3 (state); field N is fields[N - 3].
    return ProcStat(
        pid=int(pid_text),
        state=fields[0].decode("ascii", "replace"),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        flags=int(fields[6]),
        start_time=int(fields[19]),
    )


def read_stat(pid: int) -> ProcStat | None:
    """The stat of ``pid``; None when /proc has no such process. Other errors raise
    (OSError, ValueError): the caller decides what an unclear answer means."""
    try:
        # os.open/os.read: half the system calls of open() (no fstat, no lseek), on
        # a path taken once per task spawned and once per process in every scan.
        fd = os.open(f"{_PROC}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        raw = os.read(fd, 4096)  # one line of well under 1 KiB
    except ProcessLookupError:  # (ESRCH: the process went away after the open)
        return None
    finally:
        os.close(fd)
    return parse_stat(raw)


def pid_absent(pid: int) -> bool:
    """Proof that no process has this pid: ``kill(pid, 0)`` fails with ESRCH.

    Signal 0 delivers nothing; it only asks the kernel, which (unlike a /proc mounted
    with ``hidepid``) sees every process. EPERM means the process exists.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def boot_clock() -> float:
    """Seconds since boot, counting suspend: comparable across processes of one boot."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@functools.cache
def boot_id() -> str:
    """This boot's id (/proc/sys/kernel/random/boot_id). Cached: it cannot change under us."""
    try:
        with open(f"{_PROC}/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip().decode("ascii")
    except FileNotFoundError:  # pragma: no cover - not Linux
        import psutil

        return f"boot-time-{int(psutil.boot_time())}"


def _namespace(kind: str) -> int | None:
    try:  # stat follows the magic link to the namespace's nsfs inode
        return os.stat(f"{_PROC}/self/ns/{kind}").st_ino
    except OSError:  # pragma: no cover - a kernel without this namespace, or no /proc
        return None


@functools.cache
def pid_namespace() -> int | None:
    """The inode of this process's PID namespace (None: the kernel has none): the
    namespace its pids, and those /proc shows it, are numbers in. Cached: a process
    cannot change its own."""
    return _namespace("pid")


@functools.cache
def time_namespace() -> int | None:
    """The inode of this process's time namespace (None: the kernel has none). Two
    processes read the same CLOCK_BOOTTIME, and the same start times in /proc, only in
    the same time namespace: it offsets both. Cached: a process cannot change its own."""
    return _namespace("time")


def _host() -> str:
    return os.uname().nodename


def identity_of(pid: int) -> ProcessIdentity | None:
    """The identity of the process ``pid`` now (a zombie too); None when there is none."""
    if not os.path.isdir(_PROC):  # pragma: no cover - not Linux
        return _psutil_identity(pid)
    st = read_stat(pid)
    if st is None:
        return None
    return ProcessIdentity(
        pid, st.start_time, boot_id(), _host(), pid_namespace(), time_namespace()
    )


def self_identity() -> ProcessIdentity:
    me = identity_of(os.getpid())
    assert me is not None
    return me


def _psutil_identity(pid: int) -> ProcessIdentity | None:  # pragma: no cover - not Linux
    import psutil

    try:
        created_s = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    # Milliseconds since the epoch: comparable on this platform, not with Linux ticks.
    return ProcessIdentity(pid, round(created_s * 1000), boot_id(), _host())


# --- PID namespaces ------------------------------------------------------------------


def local_identity(identity: ProcessIdentity) -> ProcessIdentity | None:
    """``identity`` as this process sees it: with the pid it has in our PID namespace.

    Recorded in our namespace (or with none recorded: an older journal, read as ferry
    always did): itself. Recorded in another one, say by a ``ferry run`` in a
    container: the process of that namespace whose ``NSpid`` (``/proc/<pid>/status``:
    its pid in each namespace, ours first, its own last) ends with the recorded pid,
    if one can be seen here (the namespace is then below ours, and /proc shows its
    processes), renamed with our pid; its start time is the caller's to compare (ticks
    since boot: the same from every PID namespace of a boot). None: no such process can
    be seen, and nothing is proven either way (a namespace we cannot see into, such as
    the host's from inside a container, or a sibling's; or the process is gone). A
    process whose pid could not be translated is never signalled.
    """
    ours = pid_namespace()
    if identity.pid_ns == ours:
        return identity
    pid = identity.pid if identity.pid_ns is None else _translate(identity.pid_ns, identity.pid)
    if pid is None:
        return None
    return ProcessIdentity(
        pid, identity.start_time, identity.boot_id, identity.host, ours, identity.time_ns
    )


def same_clock(identity: ProcessIdentity) -> bool:
    """Can ``identity``'s start time be compared with the ones /proc shows us? Only if it
    was read in our time namespace (or none was recorded: an older journal, as before):
    the kernel offsets start times by the reader's CLOCK_BOOTTIME offset. Elsewhere, a
    start time that differs proves nothing (not a reuse: maybe the offset)."""
    return identity.time_ns is None or identity.time_ns == time_namespace()


def _translate(pid_ns: int, pid: int) -> int | None:
    """Our pid of the process that has ``pid`` in the PID namespace ``pid_ns``; None
    when no process visible here is that one."""
    for name in os.listdir(_PROC):
        if not name.isdigit():
            continue
        try:
            # The namespace first: one stat, where status is some 50 lines to format.
            if os.stat(f"{_PROC}/{name}/ns/pid").st_ino != pid_ns:
                continue
            with open(f"{_PROC}/{name}/status", "rb", buffering=0) as f:
                status = f.read()
        except OSError:
            continue  # gone, or not ours to look at (then not ours to name either)
        for line in status.splitlines():
            if line.startswith(b"NSpid:"):
                # Its pid in each namespace from ours down: the last is in its own.
                if line.split()[-1] == b"%d" % pid:
                    return int(name)
                break
    return None


# --- markers -------------------------------------------------------------------------


def make_marker(task_id: str, attempt: int, token: str) -> str:
    """The value of ``FERRY_TASK`` in a task's environment: ``<id>:<attempt>:<token>``."""
    for part in (task_id, token):
        if not part or ":" in part or "\0" in part or "=" in part:
            raise ValueError(f"marker parts must be non-empty, without ':', '=', NUL: {part!r}")
    return f"{task_id}:{attempt}:{token}"


def marker_prefix(task_id: str, attempt: int | None = None) -> str:
    """A prefix matching every attempt of a task (or one attempt): ends at a ':'."""
    return f"{task_id}:" if attempt is None else f"{task_id}:{attempt}:"


class ProcessScan(Value):
    """What a scan of /proc found. ``complete`` is False when some process that could
    belong to the task could not be read (``unreadable``: their pids; -1 when the
    leader's session and group could not be looked for: its pid is one of a PID
    namespace we cannot translate, or its number is used and its start time, read in
    another time namespace, cannot tell whether by it), or could not be told
    (``unproven``: found only by the session or group id of a leader that is gone, a
    number that may be another program's now): the caller must then not conclude
    "none", and never signals those."""

    __slots__ = ("alive", "unproven", "unreadable", "zombies")
    _FIELDS = ("alive", "zombies", "unreadable", "unproven")
    alive: tuple[ProcessIdentity, ...]
    zombies: tuple[ProcessIdentity, ...]
    unreadable: tuple[int, ...]
    unproven: tuple[ProcessIdentity, ...]

    def __init__(
        self,
        alive: tuple[ProcessIdentity, ...],
        zombies: tuple[ProcessIdentity, ...],
        unreadable: tuple[int, ...],
        unproven: tuple[ProcessIdentity, ...] = (),
    ) -> None:
        init(self, "alive", alive)
        init(self, "zombies", zombies)
        init(self, "unreadable", unreadable)
        init(self, "unproven", unproven)

    @property
    def complete(self) -> bool:
        return not self.unreadable and not self.unproven


def find_by_marker(marker_prefix: str) -> ProcessScan:
    """Processes whose environment has ``FERRY_TASK`` starting with ``marker_prefix``
    (from :func:`marker_prefix`, ending in ':'), or equal to it (a whole marker).

    The environment seen is the one the process was exec'd with (later ``setenv`` calls
    are invisible; a child exec'd with a cleared environment escapes the marker).
    """
    return scan_processes(marker_prefix)


def scan_processes(
    marker_prefix: str | None,
    *,
    session_of: ProcessIdentity | None = None,
    not_before_ticks: int | None = None,
    holding: str | os.PathLike[str] | None = None,
) -> ProcessScan:
    """One pass over /proc: processes carrying the marker, or (``session_of``) members
    of the session or process group led by that identity (the leader may be gone), or
    (``holding``) holding that file open as a task's processes hold their inherited
    alive-lock (``_holds``): the trail of a process that left the session and cleared
    its environment.

    Never part of a task, so never looked at: pid 1, kernel threads, and processes that
    started before ``not_before_ticks`` (default: the leader's start time, if read in
    our time namespace; a task's processes all descend from its leader). Pass the
    runner's start time when the leader is unknown.

    An environment we may not read counts as unreadable only when the process runs as
    our own user: another user's process cannot carry our task's marker unless the task
    changed user (then it usually stays in the task's session, which stat shows).
    """
    if not os.path.isdir(_PROC):  # pragma: no cover - not Linux: fail closed
        return ProcessScan((), (), (-1,))
    needle = f"{MARKER_ENV}={marker_prefix}".encode() if marker_prefix else None
    me, ours, clock = boot_id(), pid_namespace(), time_namespace()
    alive: list[ProcessIdentity] = []
    zombies: list[ProcessIdentity] = []
    unreadable: list[int] = []
    unproven: list[ProcessIdentity] = []
    leader = None
    leader_gone = False  # (its number may be another's session or group id now)
    if session_of is not None and session_of.boot_id == me:
        # Session and group ids here are our pids: the leader's, translated.
        leader = local_identity(session_of)
        number = None if leader is None else _leader_number(leader)
        if number is None:
            unreadable.append(-1)  # its members cannot be told by number: not complete
        leader_gone = number == "gone"
        if number not in ("held", "gone"):
            leader = None
        if not_before_ticks is None and same_clock(session_of):
            not_before_ticks = session_of.start_time
    euid = os.geteuid()
    held_file = _file_key(holding) if holding is not None else None
    by_lock: set[int] = set()  # found only by the file they hold
    # Processes of the task (by its marker or lock) in the leader's session or group:
    # one holds the number, which is then the task's still (never reused while a
    # process has it as its session or group id).
    numbered: list[int] = []
    for name in os.listdir(_PROC):
        if not name.isdigit() or name == "1":
            continue
        pid = int(name)
        try:
            st = read_stat(pid)
        except (OSError, ValueError):
            if _owned_by(pid, euid):
                unreadable.append(pid)
            continue
        if st is None or st.kernel_thread:
            continue  # exited while we looked; or a kernel thread
        if not_before_ticks is not None and st.start_time < not_before_ticks:
            continue
        by_number = leader is not None and _in_session(st, leader)
        found: bool | None = by_number and not leader_gone
        if not found and needle is not None:
            found = _look(_environ_has, pid, needle, euid, unreadable)
        if found is False and held_file is not None and pid != os.getpid():
            found = _look(_holds, pid, held_file, euid, unreadable)
            if found:
                by_lock.add(pid)
        if found or (by_number and not st.exited):
            ident = ProcessIdentity(pid, st.start_time, me, _host(), ours, clock)
            (unproven if not found else zombies if st.exited else alive).append(ident)
            if found and by_number:
                numbered.append(pid)
    if by_lock and holding is not None and _file_key(holding) != held_file:
        # The name no longer names the file it named when we began: a ``work``
        # supervisor renamed it for its next task (``alivelock.hold``) as we looked,
        # whose processes may be those that held it. (By inode, not by the name /proc
        # shows for a descriptor: that is the opener's path, another through a bind.)
        alive = [i for i in alive if i.pid not in by_lock]
        zombies = [i for i in zombies if i.pid not in by_lock]
    if unproven and {i.pid for i in (*alive, *zombies)}.intersection(numbered):
        alive, unproven = alive + unproven, []
    return ProcessScan(tuple(alive), tuple(zombies), tuple(unreadable), tuple(unproven))


def _leader_number(leader: ProcessIdentity) -> str | None:
    """Whose is the leader's number, as a session and group id (``leader``: translated
    to our PID namespace, of this boot)?

    * "held": the leader still has it as its pid: its session and group are the task's;
    * "gone": no process has it as its pid (or it cannot be read): the members found by
      it may be the task's, or, once all of those died, an unrelated program's that took
      the number (a process given it by the kernel that called setsid, forked and
      exited): they prove nothing;
    * "taken": another process has it as its pid: the leader's session and group
      emptied out at some point (the kernel never reuses a number while a process has
      it as its group or session id), and whoever uses it is not ours;
    * None: cannot tell, its start time being of another time namespace."""
    try:
        st = read_stat(leader.pid)
    except (OSError, ValueError):
        return "gone"  # fail closed: members found by the number are looked at, unproven
    if st is None:
        return "gone"
    if st.start_time == leader.start_time:
        return "held"
    return "taken" if same_clock(leader) else None


def _in_session(st: ProcStat, leader: ProcessIdentity) -> bool:
    return st.session == leader.pid or st.pgrp == leader.pid


def _environ_has(pid: int, needle: bytes) -> bool:
    with open(f"{_PROC}/{pid}/environ", "rb", buffering=0) as f:
        env = f.read()
    if needle.endswith(b":"):  # a prefix: every attempt, or every token of one attempt
        return any(var.startswith(needle) for var in env.split(b"\0"))
    return needle in env.split(b"\0")  # a whole marker matches only itself


def _look(
    test: Callable[[int, Any], bool], pid: int, arg: Any, euid: int, unreadable: list[int]
) -> bool | None:
    """``test(pid, arg)``, or None when the process cannot be looked at: it exited
    meanwhile, or it is not ours to read (then noted in ``unreadable`` if it runs as our
    user: a process of the task may hide there)."""
    try:
        return test(pid, arg)
    except PermissionError:
        if _owned_by(pid, euid):
            unreadable.append(pid)
        return None
    except OSError:
        return None  # exited while we looked (ESRCH/ENOENT)


def _file_key(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # no file: nobody holds it
    return st.st_dev, st.st_ino


def _holds(pid: int, key: tuple[int, int] | None) -> bool:
    """Does ``pid`` hold the file ``key`` ((st_dev, st_ino)) open read-write on a
    descriptor that is not close-on-exec?  That is how a task's processes hold their
    alive-lock: inherited from the spawn (``ferry.proc.alivelock``).  The runner's own
    descriptor is close-on-exec, and ferry's probes of the lock open it read-only, so
    neither is taken for a process of the task."""
    if key is None:
        return False
    fds = f"{_PROC}/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            st = os.stat(f"{fds}/{fd}")
            if (st.st_dev, st.st_ino) != key:
                continue
            with open(f"{_PROC}/{pid}/fdinfo/{fd}", "rb", buffering=0) as f:
                info = f.read()
        except FileNotFoundError:
            continue  # closed while we looked
        flags = int(info.split(b"flags:", 1)[1].split(None, 1)[0], 8)
        if flags & os.O_ACCMODE == os.O_RDWR and not flags & os.O_CLOEXEC:
            return True
    return False


def _owned_by(pid: int, uid: int) -> bool:
    try:
        return os.stat(f"{_PROC}/{pid}").st_uid == uid or uid == 0
    except OSError:
        return False


# --- signals -------------------------------------------------------------------------


class NotGroupLeaderError(ValueError):
    """A group signal was asked for a process that does not lead its process group."""


def signal_verified(identity: ProcessIdentity, sig: int, *, group: bool) -> bool:
    """Send ``sig`` to the process ``identity`` names (``group``: to its process group).

    Returns True when sent; False when nothing was sent: the process is provably gone
    (no such pid, another start time, another boot; for a single process also a
    zombie), or cannot be told from another: its pid is one of another PID namespace
    that cannot be translated to ours (``local_identity``), or its start time, read in
    another time namespace, is not the one we read (``same_clock``). Raises PermissionError
    when we may not signal it, and :class:`NotGroupLeaderError` for ``group=True`` on a
    process that leads no group. Calls the ``before:signal`` / ``after:signal``
    failpoints around the send.
    """
    if identity.boot_id != boot_id():
        return False
    local = local_identity(identity)
    if local is None:
        return False
    identity = local
    if not os.path.isdir(_PROC):  # pragma: no cover - not Linux
        return _signal_psutil(identity, sig, group=group)
    try:
        pidfd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError) as e:  # pragma: no cover - kernel without pidfd
        if isinstance(e, OSError) and e.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        return _signal_checked_pid(identity, sig, group=group)
    try:
        st = read_stat(identity.pid)
        if st is None or st.start_time != identity.start_time:
            return False  # the pidfd names some later process with the same number
        if group:
            if st.pgrp != identity.pid:
                raise NotGroupLeaderError(f"pid {identity.pid} does not lead a process group")
            failpoint("before:signal")
            try:
                signal.pidfd_send_signal(pidfd, sig, None, _PIDFD_SIGNAL_PROCESS_GROUP)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                os.killpg(identity.pid, sig)  # kernel < 6.9: see the module docstring
        else:
            if st.exited:
                return False
            failpoint("before:signal")
            signal.pidfd_send_signal(pidfd, sig)
        failpoint("after:signal")
        return True
    except ProcessLookupError:
        return False  # it exited (and was reaped) between the check and the send
    finally:
        os.close(pidfd)


def _signal_checked_pid(
    identity: ProcessIdentity, sig: int, *, group: bool
) -> bool:  # pragma: no cover - kernels before 5.3
    st = read_stat(identity.pid)
    if st is None or st.start_time != identity.start_time or (st.exited and not group):
        return False
    if group and st.pgrp != identity.pid:
        raise NotGroupLeaderError(f"pid {identity.pid} does not lead a process group")
    return _send_by_number(identity.pid, sig, group=group)


def _signal_psutil(
    identity: ProcessIdentity, sig: int, *, group: bool
) -> bool:  # pragma: no cover - not Linux
    if _psutil_identity(identity.pid) != identity:
        return False
    return _send_by_number(identity.pid, sig, group=group)


def _send_by_number(pid: int, sig: int, *, group: bool) -> bool:  # pragma: no cover
    """The send of the fallbacks without a pidfd, the identity just checked."""
    failpoint("before:signal")
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except ProcessLookupError:
        return False
    failpoint("after:signal")
    return True


def signal_task(
    leader: ProcessIdentity | None,
    marker: str,
    sig: int,
    *,
    holding: str | os.PathLike[str] | None = None,
) -> int:
    """Signal a whole task: the leader's process group (if the leader is still there),
    then every process still carrying the marker or in the leader's session (children
    that called setsid, or a group whose leader already exited), or holding the task's
    alive-lock file ``holding`` as its processes do (see ``scan_processes``). Never
    this process.

    Returns how many signals were sent (0: nothing of the task was found).
    """
    sent = 0
    group_signalled = False
    if leader is not None and leader.boot_id == boot_id():
        leader = local_identity(leader)  # (None: another PID namespace, not translated)
    if leader is not None:
        try:
            group_signalled = signal_verified(leader, sig, group=True)
            sent += group_signalled
        except NotGroupLeaderError:
            sent += signal_verified(leader, sig, group=False)
    scan = scan_processes(marker, session_of=leader, holding=holding)
    for ident in scan.alive:
        if ident.pid == os.getpid() or (leader is not None and _same(ident, leader)):
            continue
        if group_signalled and leader is not None and _in_group(ident.pid, leader.pid):
            continue  # already reached through the group: one SIGINT must stay one
        sent += signal_verified(ident, sig, group=False)
    return sent


def _same(found: ProcessIdentity, leader: ProcessIdentity) -> bool:
    # (pid and start time: the namespaces a record has, or lacks, do not matter here.)
    return (found.pid, found.start_time) == (leader.pid, leader.start_time)


def _in_group(pid: int, pgrp: int) -> bool:
    try:
        st = read_stat(pid)
    except (OSError, ValueError):
        return False
    return st is not None and st.pgrp == pgrp
