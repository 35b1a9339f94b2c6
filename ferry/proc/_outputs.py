"""Private files and the signal trap used by :mod:`ferry.proc.supervise` (no policy here).

Logs and the heartbeat file are created 0600 and never through a symlink; a log (and
its directory) only once it gets its first byte (:class:`LogFile`). A
:class:`SignalTrap` turns SIGINT/SIGTERM/SIGHUP into recorded numbers plus a readable
wakeup descriptor, so one poll loop can wait for output, the child's exit and signals
together.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import threading
from collections.abc import Iterable
from types import FrameType, TracebackType

# O_NOFOLLOW: a log path that is a symlink (planted by someone else) is refused instead
# of followed; O_APPEND: a re-run of the same log keeps the earlier bytes.
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def open_private(path: str, flags: int = _LOG_FLAGS) -> int:
    """Open (creating it 0600) ``path`` for appending, refusing a symlink and anything
    but a regular file: a FIFO put there (by the task itself: a log is made at its
    first byte) would block the open, and the supervisor with it, for ever. Opened
    ``O_NONBLOCK`` (nothing to a regular file), the FIFO fails or is refused."""
    fd = os.open(path, flags | os.O_NONBLOCK, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def create_private(path: str) -> None:
    """Create ``path`` 0600 if missing (a symlink there is refused), leave it as is."""
    os.close(os.open(path, _CREATE_FLAGS, 0o600))


def _refused(path: str, what: str) -> OSError:
    return OSError(errno.ELOOP, f"{what}, not followed", str(path))


class LogFile:
    """One stream's log, made at its first byte: a stream the task never writes leaves
    no file, and a task that writes nothing no directory. (Each file made is an inode
    allocated; ``work`` over many short silent tasks made four per task, and on a file
    system with many recent deletions each took hundreds of microseconds.)

    What is already there is checked when this is made, before the spawn, so that a
    task whose log cannot be kept does not start: a symlink in the log's place or in
    its directory's is refused, never followed (OSError), and so are a directory in
    the log's place and a file system with no inode left. A failure to make the log
    later (the disk filled since, a FIFO the task put there) is the caller's to
    report, as a failed write is.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.existed = False  # a file was there: an earlier run of the attempt wrote it
        self.size_at_start = self._check()
        self.made_directory = False  # this run made the log's directory
        self.created = False  # this run made the file (its name needs its directory synced)

    def _check(self) -> int:
        """The log's size now; raises OSError for what must not be used."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISLNK(st.st_mode):
                raise _refused(self.path, "a symlink")
            if stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EISDIR, "a directory", str(self.path))
            self.existed = True
            return st.st_size
        directory = os.path.dirname(self.path)
        try:
            if stat.S_ISLNK(os.lstat(directory).st_mode):
                raise _refused(directory, "a symlink")
        except FileNotFoundError:
            directory = os.path.dirname(directory)  # (made with the log: its file system is asked)
        with contextlib.suppress(FileNotFoundError):
            vfs = os.statvfs(directory)
            # (f_files 0: a file system that does not count its inodes, btrfs say)
            if vfs.f_files and not vfs.f_favail:
                raise OSError(errno.ENOSPC, "no inode left for the task's log", str(directory))
        return 0

    def open(self) -> int:
        """The log's descriptor, for appending; made (0600) on the first call."""
        if self.fd is None:
            directory = os.path.dirname(self.path)
            try:
                os.makedirs(directory, 0o700)  # (its parents: the default mode, as mkdir -p)
                self.made_directory = True
            except FileExistsError:
                # (A symlink planted there since the check: O_NOFOLLOW would follow it.)
                if stat.S_ISLNK(os.lstat(directory).st_mode):
                    raise _refused(directory, "a symlink") from None
            self.fd = open_private(self.path)
            self.created = not self.existed
        return self.fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def fsync_dirs(directories: Iterable[str]) -> str | None:
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

    The numbers come from the wakeup pipe, not from the Python-level handler: the C
    handler writes a signal's byte the moment it arrives, but the Python handler runs
    only later, at the interpreter's next check. A reader that drained the pipe and
    then read a list filled by the Python handler could drain the byte of a signal
    whose handler had not run yet, and never wake for it again (a second Ctrl-C lost).
    So ``received`` holds what ``drain`` read: drain, then read it.
    """

    def __init__(self) -> None:
        self.received: list[int] = []  # (filled by drain)
        self.wakeup_fd: int | None = None
        self._write_fd: int | None = None
        self._old_wakeup_fd = -1
        self._old_handlers: dict[int, signal.Handlers | object] = {}

    def _ignore(self, signum: int, frame: FrameType | None) -> None:
        """A Python-level handler must exist (else the default action runs); the number
        was already written to the wakeup pipe."""

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
            signal.signal(signum, self._ignore)
        return self

    def drain(self) -> None:
        """Empty the wakeup pipe into ``received`` (only the signals trapped here)."""
        if self.wakeup_fd is None:
            return
        try:
            while chunk := os.read(self.wakeup_fd, 4096):
                self.received.extend(n for n in chunk if n in self._old_handlers)
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


def fork_untrapped() -> int:
    """``os.fork``, the child without the parent's wakeup descriptor: trapped signals are
    blocked across the fork, so none reaches the child's copy of the parent's handler
    before it lets go of the parent's pipe (a byte there would count as the parent's
    signal; after the child closes its inherited descriptors, it would land in whatever
    file took that number). The child keeps the parent's handlers (a trap's ignores
    what it gets) until it sets its own."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, TRAPPED_SIGNALS)
    pid = os.fork()
    if pid == 0:
        with contextlib.suppress(ValueError):  # (not the main interpreter: none set)
            signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return pid
