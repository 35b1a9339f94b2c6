"""A task's process group, named safely: signal it, and ask whether any member lives.

The group is named through a pidfd of its leader. With ``PIDFD_SIGNAL_PROCESS_GROUP``
(Linux 6.9+) the kernel resolves the group from the leader's ``struct pid``, which the
pidfd pins: the signal cannot reach an unrelated group that reused the number, even
after the leader is reaped. On older kernels (EINVAL) we fall back to ``killpg``; the
caller only reaps the leader once it exited, and while any member lives the kernel
does not hand the group's number to a new process.
"""

from __future__ import annotations

import errno
import os
import signal

# include/uapi/linux/pidfd.h; Python 3.11 has no constant for it.
_PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2
_PROC = "/proc"


class TaskGroup:
    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.pidfd: int | None = None
        self._pidfd_group_signals = True
        try:
            # Safe: the leader is our unreaped child, so the number still names it.
            self.pidfd = os.pidfd_open(pgid)
        except (AttributeError, OSError):  # pragma: no cover - no pidfd support
            self.pidfd = None

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to every member; False when the group has no member left."""
        try:
            if self.pidfd is not None and self._pidfd_group_signals:
                try:
                    signal.pidfd_send_signal(self.pidfd, sig, None, _PIDFD_SIGNAL_PROCESS_GROUP)
                    return True
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    self._pidfd_group_signals = False  # kernel < 6.9
            os.killpg(self.pgid, sig)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            # A member we may not signal (it changed uid: setuid binary). It is alive;
            # nothing more we can do to it.
            return True

    def alive(self) -> bool:
        """Whether any member has not exited. Exited-but-unreaped members (zombies
        waiting for init, which may be slow or, in a container, never come) are gone."""
        if not self.signal(0):
            return False
        return _has_live_member(self.pgid)

    def leader_exited(self) -> bool:
        """Has the leader exited? (Does not reap it.) Without a pidfd, the only way to
        know; with one, a look that need not wait for the pidfd's event."""
        try:
            result = os.waitid(os.P_PID, self.pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return result is not None

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _has_live_member(pgid: int) -> bool:
    try:
        names = os.listdir(_PROC)
    except OSError:  # pragma: no cover - no /proc: trust the kernel's answer
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{_PROC}/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # exited while we looked
        # The command name may hold spaces and parentheses: fields start after the last ")".
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X", b"x"):
            return True
    return False
