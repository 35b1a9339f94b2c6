"""The data of :mod:`ferry.proc.supervise`: what to run (:class:`SuperviseSpec`) and how it
ended (:class:`Outcome`). Kept apart so the loop and the spawner share them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SuperviseSpec:
    """What :func:`ferry.proc.supervise.supervise` runs: the command, its environment,
    where its output and heartbeat go, and how long and how hard to wait for it."""

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
    stdout_echo_fd: int = 1  # where passthrough sends the task's stdout (2 under --json)
    shell: bool = False
    stdin: int | None = None  # None: inherit ferry's stdin
    pass_fds: tuple[int, ...] = ()  # descriptors the child inherits (the alive-lock)
    # The caller made the logs' directory for this run: once a log holds bytes, that
    # directory's own name (in its parent) is synced too, like a new log's.
    log_dir_new: bool = False
    # Where the order of the two streams is recorded (ferry.proc.logorder); None: not.
    order_log: Path | None = None
    # The task's stdout and stderr are one pseudo-terminal held by the supervisor (its
    # output is logged, and passed through, as stdout); stdin stays as given.
    pty: bool = False
    # Each stream's log keeps its first and last log_max_bytes/2 (ferry.proc._logcap);
    # None: every byte.
    log_max_bytes: int | None = None


@dataclass(frozen=True)
class Outcome:
    """How a supervised task ended: its status, the signals and kills on the way, its
    timing, and what could not be logged or passed through."""

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
    drain_timed_out: bool = False  # pipes still open the drain bound after the group died
    group_survived: bool = False  # a member outlived SIGKILL and the wait after it
    passthrough_error: str | None = None  # why (part of) a stream was not passed through
    # With log_max_bytes: the bytes of (stdout, stderr) not kept in their logs.
    log_dropped: tuple[int, int] | None = None
