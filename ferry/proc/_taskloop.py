"""The poll loop that watches one spawned task until it and its group are gone.

One epoll loop waits on the two output pipes, a pidfd of the leader (readable
when it exits) and the signal trap's wakeup descriptor; its timeout is the time to the
next heartbeat, timeout, grace or poll deadline. The policy is in
:mod:`ferry.proc.supervise`'s docstring.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable

from ferry.proc._outputs import SignalTrap
from ferry.proc._sink import ECHO_BACKLOG_BYTES, Sink
from ferry.proc._spawn import Child, WaitTimeout
from ferry.proc._supervise_types import Outcome, SuperviseSpec
from ferry.proc._tasktree import TaskGroup
from ferry.proc.alivelock import beat
from ferry.proc.logorder import OrderWriter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol
else:
    Protocol = object  # (the protocols below are for the type checker)

CHUNK_BYTES = 1 << 20
DRAIN_TIMEOUT_S = 2.0  # read the pipes this long after the group died, at most
SIGKILL_WAIT_S = 5.0  # wait this long for the group to die after SIGKILL, at most
GROUP_POLL_S = 0.02  # how often to look for surviving members once the leader exited
LEADER_POLL_S = 0.05  # only without pidfd support
DRAIN_BACKLOG_BYTES = 4 * ECHO_BACKLOG_BYTES  # passthrough held for a stalled reader, at most
SHRINK_TRIES = 100  # a pipe whose reader went: read, then made a page, this often at most


_local = threading.local()


class _Epoll:
    """``select.epoll`` as ``selectors.EpollSelector`` uses it, without importing
    ``selectors`` (0.4 ms of a supervisor's start, on ``run``'s critical path:
    docs/architecture.md, start-up): an fd already closed is unregistered quietly (the
    kernel dropped it from the set when it was closed)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()

    def register(self, fd: int, events: int) -> None:
        self._epoll.register(fd, events)

    def unregister(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            self._epoll.unregister(fd)

    def poll(self, timeout: float | None) -> list[tuple[int, int]]:
        return self._epoll.poll(timeout)

    def close(self) -> None:
        self._epoll.close()


def _read_buffer() -> tuple[bytearray, memoryview]:
    """This thread's read buffer, made at its first read: a task that prints nothing
    (and ``work``'s next task in the same slot) pays nothing for it."""
    found: tuple[bytearray, memoryview] | None = getattr(_local, "buffer", None)
    if found is None:
        buffer = bytearray(CHUNK_BYTES)
        found = _local.buffer = (buffer, memoryview(buffer))
    return found


class Control(Protocol):
    """A descriptor the loop also waits on (a supervisor's channel to its launcher):
    ``on_readable`` is called each time it is readable and may ask for the task to be
    stopped (a signal number); ``take_relayed`` then gives the signals it relayed (its
    launcher's, for the task: as if trapped here); once ``done`` it is no longer waited
    on."""

    @property
    def fd(self) -> int: ...
    @property
    def done(self) -> bool: ...
    def on_readable(self) -> int | None: ...
    def take_relayed(self) -> list[int]: ...


class TaskLoop:
    """The poll loop over the two pipes, the leader's pidfd, the signal wakeup fd and
    the control descriptor."""

    def __init__(
        self,
        spec: SuperviseSpec,
        proc: Child,
        sinks: list[Sink],
        trap: SignalTrap,
        should_stop: Callable[[], int | None] | None,
        started_at: float,
        on_running: Callable[[], None] | None = None,
        running_after_s: float = 0.0,
        control: Control | None = None,
        order: OrderWriter | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self.spec, self.proc, self.trap, self.should_stop = spec, proc, trap, should_stop
        self.on_running, self.on_exit = on_running, on_exit
        self.control = control
        self.watches_launcher = control is not None  # (its end: the launcher is gone)
        self.started_at = started_at
        self.group = TaskGroup(proc.pid)
        self.sel = _Epoll()
        self.streams: dict[int, Sink] = {}  # the task's pipes not yet at EOF
        self.pipes: dict[int, Any] = {}  # the same, as files (to close one early)
        self.sinks = list(sinks)
        self.paused: set[int] = set()  # pipes not read while their passthrough lags
        self.echo_fds: dict[int, Sink] = {}  # ferry's fds waited on for writability
        # (On a pseudo-terminal there is no stderr pipe: the terminal merges the two.)
        for index, (stream, sink) in enumerate(zip((proc.stdout, proc.stderr), sinks, strict=True)):
            if stream is None:
                continue
            self.streams[stream.fileno()] = sink
            self.pipes[stream.fileno()] = stream
            if order is not None:
                # Before each chunk reaches its log: where the other stream's run ended.
                sink.before_log = functools.partial(order.before_chunk, index)
            self.sel.register(stream.fileno(), select.EPOLLIN)
        if self.group.pidfd is not None:
            self.sel.register(self.group.pidfd, select.EPOLLIN)
        if trap.wakeup_fd is not None:
            self.sel.register(trap.wakeup_fd, select.EPOLLIN)
        if control is not None and not control.done:
            self.sel.register(control.fd, select.EPOLLIN)
        now = time.monotonic()
        # on_running is due then, unless the leader exited first (then never).
        self.running_at = None if on_running is None else now + running_after_s
        self.next_beat = now + spec.heartbeat_s
        self.timeout_at = None if spec.timeout_s is None else now + spec.timeout_s
        self.grace_at: float | None = None  # SIGKILL the group at this time
        self.kill_wait_at: float | None = None  # give up waiting for the group then
        self.drain_at: float | None = None  # stop reading the pipes then
        self.signals_seen = 0
        self.stopping = False
        self.leader_exited = False
        self.returncode: int | None = None
        self.group_gone = False
        self.next_group_check = 0.0
        self.ended_at = 0.0
        self.timed_out = self.killed = self.leftover_killed = False
        self.drain_timed_out = self.group_survived = False
        self.forwarded_signal: int | None = None
        self.stop_signal: int | None = None
        self.heard = [0, 0]  # signals for the task: trapped here, relayed (_asked)
        self.requests = 0  # what they asked, counted once however heard

    # -- stopping -------------------------------------------------------------------

    def _stop(self, sig: int, now: float) -> None:
        """Send ``sig`` (then SIGCONT) to the group; SIGKILL after the grace."""
        self.stopping = True
        self.group.signal(sig)
        self.group.signal(signal.SIGCONT)
        self.grace_at = now + self.spec.kill_grace_s

    def _kill(self, now: float) -> None:
        if not self.killed:
            self.killed = True
            self.group.signal(signal.SIGKILL)
            self.kill_wait_at = now + SIGKILL_WAIT_S

    def _on_signals(self, now: float) -> None:
        self.trap.drain()
        new = self.trap.received[self.signals_seen :]
        self.signals_seen = len(self.trap.received)
        self._asked(new, now, relayed=False)

    def _asked(self, signals: list[int], now: float, *, relayed: bool) -> None:
        """Signals for the task: trapped here, or ``relayed`` (the control's: those
        its launcher got). The first stops the task, a second means "now" (SIGKILL).
        One signal that reached both (systemd stopping a unit, ``pkill -f``, a
        cgroup's kill) is one request: the n-th request is the n-th signal of either
        source. (Was: counted twice, and the task SIGKILLed at once.)"""
        if signals and not self.leader_exited and self.group.leader_exited():
            # The leader exited, but its event waits behind this one (epoll gives no
            # order within a batch) or the next poll (no pidfd): a signal sent once the
            # task ended must find it ended, so that it gives up a stalled passthrough
            # instead of being spent on a SIGKILL to nobody.
            self._leader_exit_seen(now)
        for sig in signals:
            self.heard[relayed] += 1
            if self.heard[relayed] <= self.requests:
                continue  # (the same one, heard the other way too)
            self.requests += 1
            if self.forwarded_signal is None:
                self.forwarded_signal = sig
            if self.group_gone:
                # Only passthrough bytes for a stalled reader can still hold us: the
                # user wants ferry to finish, so give them up (the log has them).
                for sink in self.sinks:
                    if sink.wants_write:
                        sink.drop_echo(f"ferry got signal {sig} while its output reader stalled")
                continue
            if self.stopping or self.leader_exited:
                self._kill(now)  # a second signal, or leftovers already being ended
            else:
                self._stop(sig, now)

    def _on_time(self, now: float) -> None:
        if self.running_at is not None and now >= self.running_at:
            self.running_at = None  # (set only with on_running, cleared at the exit)
            if self.on_running is not None:
                self.on_running()
        if now >= self.next_beat:
            beat(self.spec.heartbeat_path)
            self.next_beat += self.spec.heartbeat_s
            if self.next_beat <= now:  # fell behind (a stalled passthrough): no burst
                self.next_beat = now + self.spec.heartbeat_s
            self._ask_should_stop(now)
        timeout_due = self.timeout_at is not None and now >= self.timeout_at
        if timeout_due and not self.stopping and not self.leader_exited:
            self.timed_out = True
            self._stop(signal.SIGTERM, now)
        if self.grace_at is not None and now >= self.grace_at and not self.group_gone:
            self._kill(now)

    def _ask_should_stop(self, now: float) -> None:
        if self.should_stop is not None and not self.stopping and not self.leader_exited:
            self._stop_for(self.should_stop(), now)

    def _stop_for(self, sig: int | None, now: float) -> None:
        """Stop the task with ``sig`` (if any) at the caller's request, once."""
        if sig and not self.stopping and not self.leader_exited:
            self.stop_signal = sig
            self._stop(sig, now)

    def _on_control(self, now: float) -> None:
        assert self.control is not None
        sig = self.control.on_readable()
        relayed = self.control.take_relayed()
        if self.control.done:
            self.sel.unregister(self.control.fd)
            self.control = None
        self._stop_for(sig, now)
        self._asked(relayed, now, relayed=True)

    # -- the leader and the group ------------------------------------------------------

    def _leader_exit_seen(self, now: float) -> None:
        if self.group.pidfd is not None:
            self.sel.unregister(self.group.pidfd)
        self._on_leader_exit(now)

    def _on_leader_exit(self, now: float) -> None:
        self.leader_exited = True
        self.running_at = None
        self.ended_at = time.time()
        if self.on_exit is not None:
            self.on_exit()  # (unreaped: its /proc entry is still there)
        self.returncode = self.proc.wait()  # reaps; the pidfd keeps naming the group
        if not self.group.alive():
            self._on_group_gone(now)
        elif not self.stopping:
            self.next_group_check = now + GROUP_POLL_S
            self.leftover_killed = True
            self._stop(signal.SIGTERM, now)

    def _check_group(self, now: float) -> None:
        if now < self.next_group_check:
            return
        self.next_group_check = now + GROUP_POLL_S
        if not self.group.alive():
            self._on_group_gone(now)
        elif self.kill_wait_at is not None and now >= self.kill_wait_at:
            self.group_survived = True
            self._on_group_gone(now)

    def _on_group_gone(self, now: float) -> None:
        self.group_gone = True
        self.drain_at = now + DRAIN_TIMEOUT_S

    # -- the loop ------------------------------------------------------------------

    def _next_wakeup(self, now: float) -> float:
        times = [self.next_beat]
        if self.running_at is not None:
            times.append(self.running_at)
        if self.timeout_at is not None and not self.stopping and not self.leader_exited:
            times.append(self.timeout_at)
        if self.grace_at is not None and not self.killed:
            times.append(self.grace_at)
        if self.leader_exited and not self.group_gone:
            times.append(self.next_group_check)
        if not self.leader_exited and self.group.pidfd is None:
            times.append(now + LEADER_POLL_S)
        if self.drain_at is not None and self.streams:
            times.append(self.drain_at)
        return max(0.0, min(times) - now)

    def _read(self, fd: int) -> None:
        sink = self.streams[fd]
        # Zero-copy (tee + splice) when ferry's fd is a pipe and the stream is large.
        n = sink.splice_from(fd, CHUNK_BYTES)
        if n is not None:
            if n == 0:  # EOF
                self.sel.unregister(fd)
                del self.streams[fd]
            return
        # readv into one reused buffer: a fresh 1 MiB bytes object per read costs about
        # three times the CPU (allocation and page faults), measured on 1 GiB.
        buffer, view = _read_buffer()
        try:
            n = os.readv(fd, [buffer])
        except OSError as e:
            # A pseudo-terminal's master says EIO, not EOF, once no process holds the
            # terminal (what was written before is read first).
            if e.errno != errno.EIO:
                raise
            n = 0
        if n:
            sink.write(view[:n])
            if self.group_gone and sink.backlog_bytes > DRAIN_BACKLOG_BYTES:
                # Only a process that left the group can still be writing: do not let
                # it fill ferry's memory behind a stalled reader.
                sink.drop_echo("passthrough reader stalled after the task ended")
        else:  # EOF: every writer of this pipe has closed it
            self.sel.unregister(fd)
            del self.streams[fd]

    def _hang_up_gone_readers(self) -> None:
        """A stream whose passthrough reader went (EPIPE: ``ferry run -- yes | head
        -1``) while the launcher lives: what its pipe holds is logged, and the pipe is
        closed, so that the task's next write to it fails as it would have without
        ferry (SIGPIPE; under ``--pty`` the terminal's master is closed: EIO). Its log
        holds every byte written until then (but what it writes in the moment between
        that last read and the close, a page at most, which a shell pipe loses alike:
        ``_log_what_is_there``). (Was: read and
        logged for ever, gigabytes a second, the task RUNNING.) Once the launcher is
        gone (``kill -9`` of ``run``, its terminal closed after it) the task runs on
        alone and no write of it fails: its output is logged in full."""
        if not any(sink.reader_gone for sink in self.streams.values()):
            return
        control = self.control
        if control is not None and not control.done and select.select([control.fd], [], [], 0)[0]:
            self._on_control(time.monotonic())  # (the launcher's end may be in this batch)
        if self.watches_launcher and (self.control is None or self.control.done):
            return
        for fd, sink in list(self.streams.items()):
            if sink.reader_gone:
                if fd not in self.paused:
                    self.sel.unregister(fd)
                self.paused.discard(fd)
                del self.streams[fd]
                _log_what_is_there(fd, sink)
                self.pipes[fd].close()

    def _stop_reading(self) -> None:
        for fd in self.streams:
            if fd not in self.paused:
                self.sel.unregister(fd)
        self.streams.clear()
        self.paused.clear()

    def _sync_interest(self) -> None:
        """Wait on a pipe unless its passthrough backlog is full (only while the task
        runs: after that the log must get everything), and on ferry's fd 1/2 while
        passthrough bytes wait for them."""
        if not self.paused and not self.echo_fds and not any(s.wants_write for s in self.sinks):
            return  # the common case: nothing lags
        for fd, sink in self.streams.items():
            pause = sink.backlogged and not self.group_gone
            if pause and fd not in self.paused:
                self.sel.unregister(fd)
                self.paused.add(fd)
            elif not pause and fd in self.paused:
                self.sel.register(fd, select.EPOLLIN)
                self.paused.discard(fd)
        for fd, sink in list(self.echo_fds.items()):
            if not (sink.wants_write and sink.echo_fd == fd):
                self.sel.unregister(fd)
                del self.echo_fds[fd]
        for sink in self.sinks:
            if sink.wants_write and sink.echo_fd is not None and sink.echo_fd not in self.echo_fds:
                self.sel.register(sink.echo_fd, select.EPOLLOUT)
                self.echo_fds[sink.echo_fd] = sink

    def loop(self) -> Outcome:
        pidfd, wakeup_fd = self.group.pidfd, self.trap.wakeup_fd
        self._on_signals(time.monotonic())  # (any arrived between trap and spawn)
        while True:
            now = time.monotonic()
            self._on_time(now)
            if not self.leader_exited and pidfd is None and self.group.leader_exited():
                self._on_leader_exit(now)
            if self.leader_exited and not self.group_gone:
                self._check_group(now)
            if self.group_gone:
                assert self.drain_at is not None
                if self.streams and now >= self.drain_at:
                    self.drain_timed_out = True
                    self._stop_reading()
                if not self.streams and not any(s.wants_write for s in self.sinks):
                    break
            self._sync_interest()
            for fd, _ in self.sel.poll(self._next_wakeup(now)):
                if fd in self.streams:
                    self._read(fd)
                elif fd in self.echo_fds:
                    self.echo_fds[fd].flush()
                elif fd == pidfd:
                    if not self.leader_exited:  # (else seen by a signal in this batch)
                        self._leader_exit_seen(time.monotonic())
                elif fd == wakeup_fd:
                    self._on_signals(time.monotonic())
                elif self.control is not None and fd == self.control.fd:
                    self._on_control(time.monotonic())
            self._hang_up_gone_readers()
        self._close()
        return self._outcome()

    def _outcome(self) -> Outcome:
        rc = self.returncode
        assert rc is not None
        return Outcome(
            exit_code=rc if rc >= 0 else None,
            signal=-rc if rc < 0 else None,
            timed_out=self.timed_out,
            forwarded_signal=self.forwarded_signal,
            killed_after_grace=self.killed,
            started_at=self.started_at,
            ended_at=self.ended_at,
            pid=self.proc.pid,
            pgid=self.proc.pid,
            leftover_killed=self.leftover_killed,
            stop_signal=self.stop_signal,
            drain_timed_out=self.drain_timed_out,
            group_survived=self.group_survived,
            passthrough_error=self._passthrough_error(),
        )

    def _passthrough_error(self) -> str | None:
        """Why passthrough ended early, per destination (one for both streams when
        they went to the same place)."""
        out, err = self.sinks
        if out.echo is not None and out.echo is err.echo:
            return None if out.echo_error is None else f"stdout and stderr: {out.echo_error}"
        found = [f"{name}: {sink.echo_error}" for name, sink in (("stdout", out), ("stderr", err))
                 if sink.echo_error]  # fmt: skip
        return "; ".join(found) or None

    def _close(self) -> None:
        self.sel.close()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.group.close()

    def abort(self) -> None:
        """Kill the whole group and reap the leader; used when the caller raised."""
        self.group.signal(signal.SIGKILL)
        deadline = time.monotonic() + SIGKILL_WAIT_S
        # WaitTimeout: unkillable (uninterruptible sleep); nothing more we can do.
        with contextlib.suppress(WaitTimeout):
            self.proc.wait(timeout=SIGKILL_WAIT_S)
        while self.group.alive() and time.monotonic() < deadline:
            time.sleep(GROUP_POLL_S)  # members die moments after SIGKILL
        self._close()


def _log_what_is_there(fd: int, sink: Sink) -> None:
    """Read what the task's pipe holds now into its log (its passthrough is gone), up
    to its end or to what would block. The pipe is made a page first (its size may be
    1 MiB: ``PIPE_BYTES``): what the task writes between that last read and the close
    is a page at most. (A pipe holding more refuses to shrink: read, tried again.)"""
    os.set_blocking(fd, False)
    for _ in range(SHRINK_TRIES):
        if not _read_what_is_there(fd, sink):
            return  # (its end)
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, resource.getpagesize())
            break
        except OSError as e:
            if e.errno != errno.EBUSY:
                break  # (not a pipe: a terminal's master)
    _read_what_is_there(fd, sink)


def _read_what_is_there(fd: int, sink: Sink) -> bool:
    """Read the pipe into the log up to what would block (True) or its end (False)."""
    buffer, view = _read_buffer()
    while True:
        try:
            n = os.readv(fd, [buffer])
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as e:
            if e.errno == errno.EIO:  # (a pseudo-terminal's master, its slave closed)
                return False
            raise
        if not n:
            return False
        sink.write(view[:n])
