"""One child stream's destinations: the task's log file, and (passthrough) ferry's fd.

The log gets every byte at once, in order (a full log is the evidence). Passthrough
must not be able to freeze the supervisor: a reader that stops reading ferry's stdout
(``less``, a log shipper, a CI runner, a terminal stopped by ^S or whose window is not
drained) would otherwise block ferry inside ``write``, where no timeout fires, no
heartbeat is written and no signal is forwarded. So each destination (:class:`Echo`)
is written without blocking: a pipe with ``RWF_NOWAIT``, a terminal through a
description of its own opened with ``O_NONBLOCK`` (the one ferry inherited is shared
with the user's shell, whose flags must not change). What the destination does not
take now waits in a backlog that is written when it is writable again, and while the
backlog is over ``ECHO_BACKLOG_BYTES`` the loop stops reading the streams that go
there (the task then blocks on its own pipe, as it would writing to the stalled
reader directly). Files, sockets (a socket cannot be opened again, and
``RWF_NOWAIT`` does not apply to it) and what cannot be written that way (kernels
without ``RWF_NOWAIT`` for pipes, a terminal that cannot be opened again, a
terminal's master side) get plain blocking writes, as ``tee`` does. Streams that go to
one destination (``2>&1``, a terminal) share its Echo: one backlog keeps their chunks
in the order they were read.

Once a piped stream has passed ``_splice.TEE_AFTER_BYTES``, :meth:`Sink.splice_from`
takes over while nothing waits in the backlog: ``tee(2)`` into ferry's pipe, then
``splice(2)`` of the same bytes into the log, without copying them through ferry
(see :mod:`ferry.proc._splice`). When ferry's pipe is full, the chunk takes the classic
path above (read, log, backlog), so a stalled reader is handled exactly as before.
"""

from __future__ import annotations

import errno
import os
import select
import stat
from collections import deque
from collections.abc import Callable

from ferry.proc import _splice

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ferry.proc._logcap import LogCap  # loaded by the supervisor only for --log-max
    from ferry.proc._outputs import LogFile

ECHO_BACKLOG_BYTES = 4 << 20
ECHO_PIPE_BYTES = 1 << 20
_RWF_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)
_sync_data = getattr(os, "fdatasync", os.fsync)
# Kernels whose pipes do not support RWF_NOWAIT answer one of these.
_NOWAIT_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ESPIPE})


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``fd``, looping on short writes.

    A descriptor someone left non-blocking (a shared terminal or pipe) raises
    BlockingIOError when full: wait until it is writable instead of losing bytes.
    """
    view = memoryview(data)
    done = 0
    while done < len(view):
        try:
            done += os.write(fd, view[done:])
        except BlockingIOError:
            select.select([], [fd], [])


def widen_pipe(fd: int, size_bytes: int) -> None:
    """Grow the pipe behind ``fd`` to ``size_bytes`` if it is smaller (best effort: over
    the user's pipe quota, or off Linux, the pipe keeps its size and still works)."""
    try:
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < size_bytes:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size_bytes)
    except (ImportError, AttributeError, OSError):
        pass


def _is_master(st: os.stat_result) -> bool:
    """A pseudo-terminal's master side: every one is /dev/ptmx (character device 5,2),
    which opened again is a new terminal, not this one."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(5, 2)


def _destination(fd: int) -> tuple[int, int] | None:
    """What ``fd`` writes to, for a pipe, socket or terminal (where streams sent to the
    same one must share an order); None for files, masters (all one inode) and the
    unknown."""
    st = _stat(fd)
    if st is None or _is_master(st):
        return None
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return st.st_dev, st.st_ino
    return None


def _own_description(fd: int) -> int | None:
    """A non-blocking description of the terminal behind ``fd``, ferry's own (opened
    again by its name: O_NONBLOCK on the inherited one would reach the user's shell).
    None if it cannot be opened (another mount namespace, a hung-up terminal)."""
    try:
        return os.open(
            f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return None


class Echo:
    """One of ferry's descriptors as a passthrough destination. ``write`` never blocks
    on a pipe or a terminal: what it cannot take now waits in the backlog."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd  # written and waited on; None once passthrough ended
        self.error: str | None = None
        self.reader_gone = False  # it ended as its reader went (EPIPE)
        self.backlog_bytes = 0
        self._backlog: deque[bytes] = deque()
        self._head_done = 0  # bytes of _backlog[0] already written
        self._own: int | None = None  # ferry's own description of a terminal
        st = _stat(fd)
        self.pipe = bool(_RWF_NOWAIT) and st is not None and stat.S_ISFIFO(st.st_mode)
        if self.pipe:
            # A 64 KiB pipe takes 1 MiB in 16 rounds through the loop; 1 MiB in one. (It
            # only adds buffering to the pipe ferry's caller gave it.)
            widen_pipe(fd, ECHO_PIPE_BYTES)
        elif st is not None and not _is_master(st) and os.isatty(fd):
            self._own = _own_description(fd)
            if self._own is not None:
                self.fd = self._own

    @property
    def wants_write(self) -> bool:
        """Bytes wait for the descriptor to become writable."""
        return self.fd is not None and self.backlog_bytes > 0

    @property
    def backlogged(self) -> bool:
        """Enough is waiting: stop reading the task's pipes until the reader catches up."""
        return self.backlog_bytes >= ECHO_BACKLOG_BYTES

    def write(self, data: bytes | memoryview) -> None:
        if self.fd is None:
            return
        if self._backlog:
            self._queue(data)  # behind what already waits: order is kept
            return
        rest = self._write_now(data)
        if rest is not None:
            self._queue(rest)

    def flush(self) -> None:
        """Write what the backlog holds, as far as the descriptor takes it now."""
        while self._backlog and self.fd is not None:
            head = self._backlog[0]
            rest = self._write_now(memoryview(head)[self._head_done :])
            if self.fd is None:
                return  # the passthrough ended (and the backlog went with it)
            if rest is not None:
                self.backlog_bytes -= len(head) - self._head_done - len(rest)
                self._head_done = len(head) - len(rest)
                return
            self.backlog_bytes -= len(head) - self._head_done
            self._backlog.popleft()
            self._head_done = 0

    def drop(self, reason: str) -> None:
        """End the passthrough (the logs keep every byte). The descriptor stays open
        until :meth:`close`: the loop may still be waiting on its number."""
        if self.fd is None:
            return
        if self.backlog_bytes:
            reason = f"{reason} ({self.backlog_bytes} bytes not shown)"
        self.fd = None
        self.error = reason
        self._backlog.clear()
        self.backlog_bytes = self._head_done = 0

    def close(self) -> None:
        if self._own is not None:
            os.close(self._own)
            self._own = None

    def _queue(self, data: bytes | memoryview) -> None:
        self._backlog.append(bytes(data))  # a copy: the loop reuses its read buffer
        self.backlog_bytes += len(data)

    def _write_now(self, data: bytes | memoryview) -> memoryview | None:
        """Write what the descriptor takes now; return the rest (None: all written, or
        the passthrough ended). Blocks only on files and where nothing else works."""
        fd = self.fd
        assert fd is not None
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                if self.pipe:
                    done += os.pwritev(fd, [view[done:]], -1, _RWF_NOWAIT)
                elif self._own is not None:
                    done += os.write(fd, view[done:])
                else:
                    write_all(fd, view[done:])
                    break
        except BlockingIOError:
            return view[done:]
        except OSError as e:
            if self.pipe and e.errno in _NOWAIT_UNSUPPORTED:
                self.pipe = False  # an older kernel: blocking writes, like tee
                return self._write_now(view[done:])
            # EPIPE (the reader of ferry's stdout went away), EBADF, EIO (terminal
            # hung up): stop echoing there, keep logging in full.
            self.reader_gone = e.errno == errno.EPIPE
            self.drop(str(e))
        return None


def _stat(fd: int) -> os.stat_result | None:
    try:
        return os.fstat(fd)
    except OSError:
        return None


def echoes(stdout_fd: int | None, stderr_fd: int | None) -> tuple[Echo | None, Echo | None]:
    """The passthrough destinations of the task's stdout and stderr: one Echo for both
    when they go to the same pipe, socket or terminal."""
    out = None if stdout_fd is None else Echo(stdout_fd)
    if stderr_fd is None:
        return out, None
    if out is not None and stdout_fd is not None:
        where = _destination(stdout_fd)
        if stdout_fd == stderr_fd or (where is not None and where == _destination(stderr_fd)):
            return out, out
    return out, Echo(stderr_fd)


class Sink:
    """Where one child stream goes: its log, and its passthrough :class:`Echo` (shared
    with the other stream when both go to one place)."""

    def __init__(self, log: LogFile, echo: Echo | None, cap_bytes: int | None = None) -> None:
        self.log = log  # made at the stream's first byte
        # --log-max: the log keeps the stream's head and tail (ferry.proc._logcap). The
        # zero-copy path is not used then: it would splice every byte into the log.
        self.cap_bytes = cap_bytes
        self.cap: LogCap | None = None
        self.echo = echo
        self.bytes_total = 0
        self.log_error: str | None = None
        self._zero_copy = echo is not None and echo.pipe and _splice.available()
        self._zero_copy = self._zero_copy and cap_bytes is None
        self._log_unappended = False
        self._writeback_at = _splice.WRITEBACK_EVERY_BYTES
        # Called before each chunk is logged (the order index: ferry.proc.logorder).
        self.before_log: Callable[[], None] | None = None

    @property
    def echo_fd(self) -> int | None:
        """Where passthrough bytes go now (None: nowhere, or no longer)."""
        return None if self.echo is None else self.echo.fd

    @property
    def echo_error(self) -> str | None:
        return None if self.echo is None else self.echo.error

    @property
    def reader_gone(self) -> bool:
        """Its passthrough ended as its reader went (EPIPE)."""
        return self.echo is not None and self.echo.reader_gone

    @property
    def backlog_bytes(self) -> int:
        return 0 if self.echo is None else self.echo.backlog_bytes

    @property
    def wants_write(self) -> bool:
        """Passthrough bytes wait for ferry's fd to become writable."""
        return self.echo is not None and self.echo.wants_write

    @property
    def backlogged(self) -> bool:
        """Enough is waiting: stop reading the task's pipe until the reader catches up."""
        return self.echo is not None and self.echo.backlogged

    def flush(self) -> None:
        if self.echo is not None:
            self.echo.flush()

    def drop_echo(self, reason: str) -> None:
        """Stop the passthrough of this stream (and of the other, if it goes there too:
        the log keeps every byte)."""
        if self.echo is not None:
            self.echo.drop(reason)

    def splice_from(self, src_fd: int, max_bytes: int) -> int | None:
        """Pass up to ``max_bytes`` from the task's pipe ``src_fd`` to ferry's pipe and
        the log without copying them through ferry. Returns the byte count (0: end of
        stream), or None: use the classic read-and-write path for this chunk (ferry's
        pipe is full, something waits in the backlog, the stream is still small...)."""
        log_fd = self.log.fd  # (open: the stream's first bytes took the classic path)
        echo_fd = self.echo_fd
        if (
            not self._zero_copy
            or echo_fd is None
            or self.backlog_bytes
            or log_fd is None
            or self.log_error is not None
            or self.bytes_total < _splice.TEE_AFTER_BYTES
        ):
            return None
        tee = _splice.load_tee()
        if tee is None:
            self._zero_copy = False
            return None
        try:
            if not self._log_unappended:
                _splice.unappend(log_fd)
                self._log_unappended = True
            moved = tee(src_fd, echo_fd, max_bytes)
        except BlockingIOError:
            # ferry's pipe is full (the task's pipe is readable: the loop said so).
            return None
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                self._zero_copy = False
            return None  # EPIPE and the like: the classic path reports them
        if moved:
            if self.before_log is not None:
                self.before_log()
            error, spliced = _splice.move_to_log(src_fd, log_fd, moved)
            self._zero_copy = spliced
            self.bytes_total += moved
            if error is not None:
                self.log_error = f"writing the log failed: {error}"
            self._maybe_writeback()
        return moved

    def _maybe_writeback(self) -> None:
        # A big log: let the disk start on it now, so the fdatasync before SETTLED
        # finds little left to write (durability still comes from that fdatasync).
        if self.bytes_total >= self._writeback_at and self.log.fd is not None:
            self._writeback_at = self.bytes_total + _splice.WRITEBACK_EVERY_BYTES
            _splice.start_writeback(self.log.fd)

    def _log_fd(self) -> int:
        """The log's descriptor (the log, and its cap, are made at the first byte)."""
        fd = self.log.fd
        if fd is None:
            fd = self.log.open()
            if self.cap_bytes is not None:
                from ferry.proc._logcap import LogCap

                self.cap = LogCap(fd, self.cap_bytes)
        return fd

    def write(self, data: bytes | memoryview) -> None:
        if self.before_log is not None:
            self.before_log()
        self.bytes_total += len(data)
        if self.log_error is None:
            try:
                fd = self._log_fd()
                if self.cap is None:
                    write_all(fd, data)
                    self._maybe_writeback()
                else:
                    self.cap.write(data)
            except OSError as e:
                # ENOSPC/EIO on the log: keep the task running and the pipe drained (a
                # full pipe would block the task), report the lost evidence instead.
                self.log_error = f"writing the log failed: {e}"
        if self.echo is not None:
            self.echo.write(data)

    def sync_and_close(self) -> None:
        """fdatasync the log (the evidence must survive a crash after SETTLED), close it.

        A stream that wrote nothing has no log made by this run, and is not synced: its
        earlier bytes (an appended log) were synced by the run that wrote them. That
        keeps ``run -- true`` free of fsyncs here (each costs milliseconds).
        """
        try:
            if self.cap is not None and self.log_error is None:
                try:
                    self.cap.finish()
                except OSError as e:
                    self.log_error = f"dropping the middle of the log failed: {e}"
            if self.log_error is None and self.log.fd is not None:
                try:
                    _sync_data(self.log.fd)
                except OSError as e:
                    self.log_error = f"fdatasync of the log failed: {e}"
        finally:
            self.log.close()
            if self.echo is not None:
                self.echo.close()
