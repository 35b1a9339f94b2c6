"""One child stream's destinations: the task's log file, and (passthrough) ferry's fd.

The log gets every byte at once, in order (a full log is the evidence). Passthrough
to a pipe (ferry's stdout read by ``less``, a log shipper, a CI runner) must not be
able to freeze the supervisor: a reader that stops reading would otherwise block
ferry inside ``write`` where no timeout fires and no signal is forwarded. So for a
pipe each chunk is written with ``RWF_NOWAIT`` (never blocks); what the pipe does not
take now waits in a backlog that is written when the pipe is writable again, and
while the backlog is over ``ECHO_BACKLOG_BYTES`` the loop stops reading this stream
(the task then blocks on its own pipe, as it would writing to the stalled reader
directly). Terminals, files and kernels without ``RWF_NOWAIT`` for pipes get plain
blocking writes, as ``tee`` does.

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


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


class Sink:
    """Where one child stream goes. ``write`` never blocks on a piped passthrough."""

    def __init__(self, log: LogFile, echo_fd: int | None, cap_bytes: int | None = None) -> None:
        self.log = log  # made at the stream's first byte
        # --log-max: the log keeps the stream's head and tail (ferry.proc._logcap). The
        # zero-copy path is not used then: it would splice every byte into the log.
        self.cap_bytes = cap_bytes
        self.cap: LogCap | None = None
        self.echo_fd = echo_fd
        self.bytes_total = 0
        self.log_error: str | None = None
        self.echo_error: str | None = None
        self.backlog_bytes = 0
        self._backlog: deque[bytes] = deque()
        self._head_done = 0  # bytes of _backlog[0] already written
        self._nowait = bool(_RWF_NOWAIT) and echo_fd is not None and _is_pipe(echo_fd)
        self._zero_copy = self._nowait and _splice.available() and cap_bytes is None
        self._log_unappended = False
        self._writeback_at = _splice.WRITEBACK_EVERY_BYTES
        # Called before each chunk is logged (the order index: ferry.proc.logorder).
        self.before_log: Callable[[], None] | None = None
        if self._nowait:
            assert echo_fd is not None
            # A 64 KiB pipe takes 1 MiB in 16 rounds through the loop; 1 MiB in one. (It
            # only adds buffering to the pipe ferry's caller gave it.)
            widen_pipe(echo_fd, ECHO_PIPE_BYTES)

    @property
    def wants_write(self) -> bool:
        """Passthrough bytes wait for ferry's fd to become writable."""
        return self.echo_fd is not None and self.backlog_bytes > 0

    @property
    def backlogged(self) -> bool:
        """Enough is waiting: stop reading the task's pipe until the reader catches up."""
        return self.backlog_bytes >= ECHO_BACKLOG_BYTES

    def splice_from(self, src_fd: int, max_bytes: int) -> int | None:
        """Pass up to ``max_bytes`` from the task's pipe ``src_fd`` to ferry's pipe and
        the log without copying them through ferry. Returns the byte count (0: end of
        stream), or None: use the classic read-and-write path for this chunk (ferry's
        pipe is full, something waits in the backlog, the stream is still small...)."""
        log_fd = self.log.fd  # (open: the stream's first bytes took the classic path)
        if (
            not self._zero_copy
            or self.echo_fd is None
            or self._backlog
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
            moved = tee(src_fd, self.echo_fd, max_bytes)
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
        if self.echo_fd is None:
            return
        if self._backlog:
            self._queue(data)  # behind what already waits: order is kept
            return
        rest = self._echo(data)
        if rest is not None:
            self._queue(rest)

    def flush(self) -> None:
        """Write what the backlog holds, as far as ferry's fd takes it now."""
        while self._backlog and self.echo_fd is not None:
            head = self._backlog[0]
            rest = self._echo(memoryview(head)[self._head_done :])
            if self.echo_fd is None:
                return  # the passthrough ended (and the backlog went with it)
            if rest is not None:
                self.backlog_bytes -= len(head) - self._head_done - len(rest)
                self._head_done = len(head) - len(rest)
                return
            self.backlog_bytes -= len(head) - self._head_done
            self._backlog.popleft()
            self._head_done = 0

    def drop_echo(self, reason: str) -> None:
        """Stop the passthrough of this stream (the log keeps every byte)."""
        if self.backlog_bytes:
            reason = f"{reason} ({self.backlog_bytes} bytes not shown)"
        self.echo_fd = None
        self.echo_error = reason
        self._backlog.clear()
        self.backlog_bytes = self._head_done = 0

    def _queue(self, data: bytes | memoryview) -> None:
        self._backlog.append(bytes(data))  # a copy: the loop reuses its read buffer
        self.backlog_bytes += len(data)

    def _echo(self, data: bytes | memoryview) -> memoryview | None:
        """Write what ferry's fd takes now; return the rest (None: all written, or the
        passthrough ended). Blocks only where RWF_NOWAIT is not available."""
        assert self.echo_fd is not None
        view = memoryview(data)
        if not self._nowait:
            try:
                write_all(self.echo_fd, view)
            except OSError as e:
                self.drop_echo(str(e))
            return None
        done = 0
        while done < len(view):
            try:
                done += os.pwritev(self.echo_fd, [view[done:]], -1, _RWF_NOWAIT)
            except BlockingIOError:
                return view[done:]
            except OSError as e:
                if e.errno in _NOWAIT_UNSUPPORTED:
                    self._nowait = False  # an older kernel: blocking writes, like tee
                    try:
                        write_all(self.echo_fd, view[done:])
                    except OSError as e2:
                        self.drop_echo(str(e2))
                    return None
                # EPIPE (the reader of ferry's stdout went away), EBADF, EIO (terminal
                # hung up): stop echoing this stream, keep logging it in full.
                self.drop_echo(str(e))
                return None
        return None

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
