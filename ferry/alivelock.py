"""A pid-free liveness signal: a lock the task's processes inherit.

Before the spawn the runner opens the task's heartbeat file
``heartbeats/<id>.<attempt>`` (the same file it touches to beat: one file per attempt,
not two) and takes an exclusive ``flock`` on it; the descriptor is passed to the child (not close-on-exec), so
the child and every descendant that does not close it share that one open file, and
the lock stays held until the last of them exits (or closes it). After a runner crash,
recovery asks: can I take the lock? If not, some process of the task still runs, even
one that called ``setsid`` and replaced its environment (where the FERRY_TASK marker
scan is blind). Zombies hold no descriptors, so they do not count: as the contract says.

The same descriptor also leads to the processes: ``ferry.process.scan_processes``
(``holding=``) finds those that hold the file open read-write and inheritable, so that
``ferry kill`` can reach such an orphan (after checking its identity, as always).

It is one more proof of life, never a proof of death: a daemon that closed all its
descriptors is invisible here (the marker and the session scan still look for it).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


DIRECTORY = "heartbeats"  # in the state directory


def alive_name(task_id: str, attempt: int) -> str:
    """The heartbeat file's name in DIRECTORY."""
    return f"{task_id}.{attempt}"


def alive_path(home: Path, task_id: str, attempt: int) -> Path:
    """The heartbeat file, which also carries the lock."""
    return home / DIRECTORY / alive_name(task_id, attempt)


def hold(path: Path) -> int:
    """Create and lock the file; the caller passes the fd to the child (pass_fds)."""
    fd = os.open(path, _FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def release(fd: int) -> None:
    """The runner is done with the task: drop its hold (the file stays: it is the
    heartbeat, whose mtime is the task's last beat)."""
    os.close(fd)


def held(path: Path) -> bool | None:
    """True: some process still holds the lock (the task is alive). False: nobody
    does. None: no lock file (a task dispatched before this existed, or settled)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return True  # cannot tell: fail closed (counts as alive)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops our lock, if we took it
    return False
