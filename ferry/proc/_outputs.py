"""Private files and the signal trap used by :mod:`ferry.proc.supervise` (no policy here).

Logs and the heartbeat file are created 0600 and never through a symlink. A
:class:`SignalTrap` turns SIGINT/SIGTERM/SIGHUP into recorded numbers plus a readable
wakeup descriptor, so one poll loop can wait for output, the child's exit and signals
together.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType

# O_NOFOLLOW: a log path that is a symlink (planted by someone else) is refused instead
# of followed; O_APPEND: a re-run of the same log keeps the earlier bytes.
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def open_private(path: Path, flags: int = _LOG_FLAGS) -> int:
    """Open (creating it 0600) ``path`` for appending, refusing a symlink."""
    return os.open(path, flags, 0o600)


_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def create_private(path: Path) -> None:
    """Create ``path`` 0600 if missing (a symlink there is refused), leave it as is."""
    os.close(os.open(path, _CREATE_FLAGS, 0o600))


def fsync_dirs(directories: Iterable[Path]) -> str | None:
    """fsync each directory (a newly created log's name must survive a crash as well as
    its bytes). Returns an error message, or None."""
    for directory in directories:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            return f"fsync of {directory} failed: {e}"
    return None


def descriptor_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


TRAPPED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalTrap:
    """Record SIGINT/SIGTERM/SIGHUP and make a descriptor readable when one arrives.

    Only the main thread may install signal handlers: elsewhere the trap stays inactive
    (``wakeup_fd`` is None) and the caller must stop the task through ``should_stop``.
    A signal that ferry inherited as ignored (``nohup``, a background job of a
    non-interactive shell) stays ignored, for ferry and for the task: that is what the
    user who started ferry that way asked for.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.wakeup_fd: int | None = None
        self._write_fd: int | None = None
        self._old_wakeup_fd = -1
        self._old_handlers: dict[int, signal.Handlers | object] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)

    def __enter__(self) -> SignalTrap:
        if threading.current_thread() is not threading.main_thread():
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        try:
            self._old_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # the main thread of another interpreter
            os.close(read_fd)
            os.close(write_fd)
            return self
        self.wakeup_fd, self._write_fd = read_fd, write_fd
        for signum in TRAPPED_SIGNALS:
            old = signal.getsignal(signum)
            if old == signal.SIG_IGN:
                continue
            self._old_handlers[signum] = old
            signal.signal(signum, self._record)
        return self

    def drain(self) -> None:
        """Empty the wakeup pipe (the numbers are recorded by the handler)."""
        if self.wakeup_fd is None:
            return
        try:
            while os.read(self.wakeup_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.wakeup_fd is None or self._write_fd is None:
            return
        for signum, old in self._old_handlers.items():
            # None: the old handler was not installed from Python; SIG_DFL is the best
            # restoration we can make.
            signal.signal(signum, old if callable(old) or isinstance(old, int) else signal.SIG_DFL)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        os.close(self.wakeup_fd)
        os.close(self._write_fd)
        self.wakeup_fd = self._write_fd = None
