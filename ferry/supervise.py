"""Supervise one task's process: spawn, capture, forward signals, time out, heartbeat.

This is the process-and-bytes part of running a task; it never touches the journal.
The runner journals DISPATCHING before calling :func:`supervise`, SPAWNED from
``on_spawned`` and SETTLED from the returned :class:`Outcome`.

The task is its process group. The child starts in a new session (so its own group,
``pgid == pid``), and every signal ferry sends goes to the whole group, through a pidfd
with ``PIDFD_SIGNAL_PROCESS_GROUP`` where the kernel has it (Linux 6.9+: the group is
named by the leader's kernel ``struct pid``, so no pid-reuse race exists even after the
leader is reaped), else with ``killpg`` while the leader is still unreaped or members
are known to be alive (the kernel does not reuse a number still used as a group id).

Choices where the brief is silent (the contract of this module):

* Stopping. The first SIGINT/SIGTERM/SIGHUP ferry receives is forwarded to the group,
  followed by SIGCONT (as ``timeout(1)`` does: a stopped process could not act on it);
  ``kill_grace_s`` later the group gets SIGKILL. A signal that arrives while the group
  is already being stopped (by a signal, the timeout or ``should_stop``) escalates to
  SIGKILL at once: the second Ctrl-C means "now". At ``timeout_s`` the group gets
  SIGTERM (+ SIGCONT), then SIGKILL after the grace. The grace covers the whole group:
  when the leader dies first, its children keep the rest of the grace to clean up.
* Leftovers. When the leader exits by itself and other members of its group are still
  alive (background children, often holding the output pipes), they get SIGTERM, the
  grace, then SIGKILL, and ``leftover_killed`` is set: a CI wrapper must neither hang
  on nor leak children of its task. A zombie is not alive: a member that has exited
  but waits for init to reap it counts as gone (checked in ``/proc``).
* After any return, no process of the group is alive, except one that even SIGKILL
  cannot end within ``SIGKILL_WAIT_S`` (uninterruptible sleep): then we return anyway
  and ``group_survived`` says so. Output still in the pipes is read to EOF, for at most
  ``DRAIN_TIMEOUT_S`` after the group is gone (a process that left the group with
  ``setsid`` may hold the pipes open forever); ``drain_timed_out`` says when that bound
  cut the read.
* Passthrough. Writes to ferry's fd 1/2 block like ``tee``: a reader that stops reading
  ferry's output stalls the task just as it would stall the task writing there
  directly. EPIPE/EBADF/EIO on ferry's fd stop the passthrough of that stream; the log
  keeps every byte. A log write error does not stop the task (its pipe must keep
  draining); it is reported in ``log_error``.
* ``shell=True`` runs ``["/bin/sh", "-c", *argv]`` (Python's convention: ``argv[0]`` is
  the script, ``argv[1]`` becomes ``$0``, the rest ``$1``...).
* Signal handlers can only be installed from the main thread; elsewhere ferry does not
  trap signals and the caller stops tasks through ``should_stop``. A signal ferry
  inherited as ignored (``nohup``) stays ignored and is not forwarded.
* ``should_stop`` is polled at every heartbeat; its signal is sent like a forwarded one
  and reported in ``stop_signal``, not in ``forwarded_signal``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ferry._outputs import SignalTrap, Sink, descriptor_open, fsync_dirs, open_private
from ferry._tasktree import TaskGroup
from ferry.errors import EX_FERRY_FAILED, EX_NOT_EXECUTABLE, EX_NOT_FOUND_CMD, SpawnError

__all__ = ["Outcome", "SpawnFailed", "SuperviseSpec", "supervise"]

CHUNK_BYTES = 1 << 20
PIPE_BYTES = 1 << 20  # the unprivileged maximum (/proc/sys/fs/pipe-max-size) by default
DRAIN_TIMEOUT_S = 2.0
SIGKILL_WAIT_S = 5.0
GROUP_POLL_S = 0.02
LEADER_POLL_S = 0.05  # only without pidfd support

_HEARTBEAT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True)
class SuperviseSpec:
    argv: Sequence[str]
    cwd: str
    env: Mapping[str, str]  # the child's whole environment, marker included
    timeout_s: float | None
    kill_grace_s: float
    heartbeat_s: float
    stdout_log: Path
    stderr_log: Path
    heartbeat_path: Path
    passthrough: bool = True
    shell: bool = False
    stdin: int | None = None  # None: inherit ferry's stdin


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None  # exactly one of exit_code / signal is set
    signal: int | None
    timed_out: bool
    forwarded_signal: int | None  # the first SIGINT/SIGTERM/SIGHUP ferry received
    killed_after_grace: bool  # ferry sent SIGKILL to the group (grace over, or escalated)
    started_at: float  # wall clock (time.time()), right after the spawn
    ended_at: float  # wall clock, when the leader's exit was seen
    pid: int
    pgid: int
    leftover_killed: bool  # members outlived a leader that exited by itself: ended
    stop_signal: int | None = None  # the signal should_stop asked for, if it did
    log_error: str | None = None  # some output could not be logged or synced
    drain_timed_out: bool = False  # pipes still open DRAIN_TIMEOUT_S after the group died
    group_survived: bool = False  # a member outlived SIGKILL + SIGKILL_WAIT_S


_KIND_EXIT = {"not_found": EX_NOT_FOUND_CMD, "not_executable": EX_NOT_EXECUTABLE}
_NOT_EXECUTABLE_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ETXTBSY}
)


class SpawnFailed(SpawnError):
    """The command could not be started. ``kind``: not_found (127), not_executable
    (126, a directory too), other (125: a bad cwd, fork failure, E2BIG...)."""

    def __init__(self, kind: str, message: str, *, errno_: int | None = None) -> None:
        super().__init__(
            message,
            code=f"spawn.{kind}",
            details={"kind": kind, "errno": errno_},
            exit_code=_KIND_EXIT.get(kind, EX_FERRY_FAILED),
        )
        self.kind = kind
        self.errno = errno_


def _spawn_failed(e: OSError | ValueError, spec: SuperviseSpec, program: str) -> SpawnFailed:
    if isinstance(e, ValueError):  # an env key with "=" or a NUL byte somewhere
        return SpawnFailed("other", f"cannot start {program!r}: {e}")
    code = e.errno
    filename = None if e.filename is None else os.fspath(e.filename)
    # subprocess names the cwd when chdir failed, the program when exec did; when they
    # are the same string, whether the directory can be entered tells them apart.
    chdir_failed = filename == spec.cwd and (
        filename != program or not (os.path.isdir(filename) and os.access(filename, os.X_OK))
    )
    if chdir_failed:
        return SpawnFailed("other", f"cannot enter {spec.cwd!r}: {e.strerror}", errno_=code)
    bare_name = "/" not in program
    if code == errno.ENOENT or (bare_name and code == errno.ENOTDIR):
        return SpawnFailed("not_found", f"{program}: command not found", errno_=code)
    if code in _NOT_EXECUTABLE_ERRNOS:
        return SpawnFailed("not_executable", f"{program}: {e.strerror}", errno_=code)
    return SpawnFailed("other", f"cannot start {program!r}: {e}", errno_=code)


def _spawn(spec: SuperviseSpec) -> subprocess.Popen[bytes]:
    args = ["/bin/sh", "-c", *spec.argv] if spec.shell else list(spec.argv)
    try:
        proc = subprocess.Popen(
            args,
            cwd=spec.cwd,
            env=dict(spec.env),
            stdin=spec.stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own session and group: signals reach the tree
            close_fds=True,
            bufsize=0,
        )
    except (OSError, ValueError) as e:
        raise _spawn_failed(e, spec, args[0]) from e
    _widen_pipes(proc)
    return proc


def _widen_pipes(proc: subprocess.Popen[bytes]) -> None:
    # Bigger pipes mean fewer wakeups and 1 MiB reads: the 1 GB throughput target.
    try:
        import fcntl

        setsz = fcntl.F_SETPIPE_SZ
    except (ImportError, AttributeError):  # pragma: no cover - not Linux
        return
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            # Over the user's pipe quota: the default size still works.
            with contextlib.suppress(OSError):
                fcntl.fcntl(stream.fileno(), setsz, PIPE_BYTES)


def _check(spec: SuperviseSpec) -> None:
    if not spec.argv:
        raise ValueError("supervise: empty argv")
    if not spec.heartbeat_s > 0:
        raise ValueError(f"supervise: heartbeat_s must be > 0, not {spec.heartbeat_s}")
    if not spec.kill_grace_s >= 0:
        raise ValueError(f"supervise: kill_grace_s must be >= 0, not {spec.kill_grace_s}")
    if spec.timeout_s is not None and not spec.timeout_s >= 0:
        raise ValueError(f"supervise: timeout_s must be >= 0 or None, not {spec.timeout_s}")


def _touch(path: Path) -> None:
    # A heartbeat is evidence, not a reason to stop the task: errors are ignored.
    try:
        os.utime(path, follow_symlinks=False)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            os.close(os.open(path, _HEARTBEAT_FLAGS, 0o600))
    except OSError:
        pass


def supervise(
    spec: SuperviseSpec,
    *,
    on_spawned: Callable[[int, int], None],
    should_stop: Callable[[], int | None] | None = None,
) -> Outcome:
    """Run ``spec`` to its end and say how it ended (see the module docstring).

    Raises :class:`SpawnFailed` when the command cannot start. If ``on_spawned`` or
    ``should_stop`` raises, the group is killed and reaped, and the error re-raised.
    """
    _check(spec)
    # Bytes ferry itself buffered must reach fd 1/2 before the task's own.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    paths = [spec.stdout_log, spec.stderr_log]
    log_fds: list[int] = []
    try:
        for path in paths:
            log_fds.append(open_private(path))
        os.close(os.open(spec.heartbeat_path, _HEARTBEAT_FLAGS, 0o600))
    except OSError as e:
        for fd in log_fds:
            os.close(fd)
        raise SpawnFailed("other", f"cannot open the task's files: {e}", errno_=e.errno) from e
    sinks = [
        Sink(log_fds[0], 1 if spec.passthrough and descriptor_open(1) else None),
        Sink(log_fds[1], 2 if spec.passthrough and descriptor_open(2) else None),
    ]
    log_error: str | None = None
    try:
        # The trap goes in before the spawn: a SIGTERM in between must not kill ferry
        # and leave the fresh child running unsupervised.
        with SignalTrap() as trap:
            proc = _spawn(spec)
            started_at = time.time()
            run = _Run(spec, proc, sinks, trap, should_stop, started_at)
            try:
                on_spawned(proc.pid, proc.pid)
                outcome = run.loop()
            except BaseException:
                # Whatever went wrong (on_spawned failed to journal SPAWNED, a bug),
                # the task must not outlive its supervision: kill, reap, re-raise.
                run.abort()
                raise
    finally:
        for sink in sinks:
            sink.sync_and_close()
            log_error = log_error or sink.log_error
    log_error = log_error or fsync_dirs(paths)
    if log_error is not None:
        outcome = _replace_log_error(outcome, log_error)
    return outcome


def _replace_log_error(outcome: Outcome, log_error: str) -> Outcome:
    from dataclasses import replace

    return replace(outcome, log_error=log_error)


class _Run:
    """The poll loop over the two pipes, the leader's pidfd and the signal wakeup fd."""

    def __init__(
        self,
        spec: SuperviseSpec,
        proc: subprocess.Popen[bytes],
        sinks: list[Sink],
        trap: SignalTrap,
        should_stop: Callable[[], int | None] | None,
        started_at: float,
    ) -> None:
        self.spec, self.proc, self.trap, self.should_stop = spec, proc, trap, should_stop
        self.started_at = started_at
        self.group = TaskGroup(proc.pid)
        self.sel = selectors.DefaultSelector()
        self.streams: dict[int, Sink] = {}
        self.buffer = bytearray(CHUNK_BYTES)
        self.view = memoryview(self.buffer)
        for stream, sink in zip((proc.stdout, proc.stderr), sinks, strict=True):
            assert stream is not None
            self.streams[stream.fileno()] = sink
            self.sel.register(stream.fileno(), selectors.EVENT_READ)
        if self.group.pidfd is not None:
            self.sel.register(self.group.pidfd, selectors.EVENT_READ)
        if trap.wakeup_fd is not None:
            self.sel.register(trap.wakeup_fd, selectors.EVENT_READ)
        now = time.monotonic()
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
        for sig in new:
            if self.forwarded_signal is None:
                self.forwarded_signal = sig
            if self.group_gone:
                continue
            if self.stopping or self.leader_exited:
                self._kill(now)  # a second signal, or leftovers already being ended
            else:
                self._stop(sig, now)

    def _on_time(self, now: float) -> None:
        if now >= self.next_beat:
            _touch(self.spec.heartbeat_path)
            self.next_beat += self.spec.heartbeat_s
            if self.next_beat <= now:  # fell behind (a stalled passthrough): no burst
                self.next_beat = now + self.spec.heartbeat_s
            if self.should_stop is not None and not self.stopping and not self.leader_exited:
                sig = self.should_stop()
                if sig:
                    self.stop_signal = sig
                    self._stop(sig, now)
        timeout_due = self.timeout_at is not None and now >= self.timeout_at
        if timeout_due and not self.stopping and not self.leader_exited:
            self.timed_out = True
            self._stop(signal.SIGTERM, now)
        if self.grace_at is not None and now >= self.grace_at and not self.group_gone:
            self._kill(now)

    # -- the leader and the group ------------------------------------------------------

    def _on_leader_exit(self, now: float) -> None:
        self.leader_exited = True
        self.ended_at = time.time()
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
        if self.timeout_at is not None and not self.stopping and not self.leader_exited:
            times.append(self.timeout_at)
        if self.grace_at is not None and not self.killed:
            times.append(self.grace_at)
        if self.leader_exited and not self.group_gone:
            times.append(self.next_group_check)
        if not self.leader_exited and self.group.pidfd is None:
            times.append(now + LEADER_POLL_S)
        if self.drain_at is not None:
            times.append(self.drain_at)
        return max(0.0, min(times) - now)

    def _read(self, fd: int) -> None:
        # readv into one reused buffer: a fresh 1 MiB bytes object per read costs about
        # three times the CPU (allocation and page faults), measured on 1 GiB.
        n = os.readv(fd, [self.buffer])
        if n:
            self.streams[fd].write(self.view[:n])
        else:  # EOF: every writer of this pipe has closed it
            self.sel.unregister(fd)
            del self.streams[fd]

    def loop(self) -> Outcome:
        pidfd, wakeup_fd = self.group.pidfd, self.trap.wakeup_fd
        if self.trap.received:  # arrived between trap and spawn
            self._on_signals(time.monotonic())
        while True:
            now = time.monotonic()
            self._on_time(now)
            if not self.leader_exited and pidfd is None and self.group.leader_exited():
                self._on_leader_exit(now)
            if self.leader_exited and not self.group_gone:
                self._check_group(now)
            if self.group_gone:
                assert self.drain_at is not None
                if not self.streams:
                    break
                if now >= self.drain_at:
                    self.drain_timed_out = True
                    break
            for key, _ in self.sel.select(self._next_wakeup(now)):
                fd = key.fd
                if fd in self.streams:
                    self._read(fd)
                elif fd == pidfd:
                    self.sel.unregister(fd)
                    self._on_leader_exit(time.monotonic())
                elif fd == wakeup_fd:
                    self._on_signals(time.monotonic())
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
        )

    def _close(self) -> None:
        self.sel.close()
        self.view.release()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.group.close()

    def abort(self) -> None:
        """Kill the whole group and reap the leader; used when the caller raised."""
        self.group.signal(signal.SIGKILL)
        deadline = time.monotonic() + SIGKILL_WAIT_S
        # TimeoutExpired: unkillable (uninterruptible sleep); nothing more we can do.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=SIGKILL_WAIT_S)
        while self.group.alive() and time.monotonic() < deadline:
            time.sleep(GROUP_POLL_S)  # members die moments after SIGKILL
        self._close()
