"""The data of :mod:`ferry.proc.supervise`: what to run (:class:`SuperviseSpec`) and how it
ended (:class:`Outcome`). Kept apart so the loop and the spawner share them. Frozen
values written by hand (``ferry.core._value``: no dataclass code generation, and no
``dataclasses`` import, on the start-up path of ``ferry run``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ferry.core._value import Value, init


class SuperviseSpec(Value):
    """What :func:`ferry.proc.supervise.supervise` runs: the command, its environment,
    where its output and heartbeat go, and how long and how hard to wait for it."""

    __slots__ = (
        "argv", "cwd", "env", "heartbeat_path", "heartbeat_s", "kill_grace_s", "log_max_bytes",
        "order_log", "pass_fds", "passthrough", "pty", "shell", "stderr_log", "stdin",
        "stdout_echo_fd", "stdout_log", "timeout_s",
    )  # fmt: skip
    _FIELDS = (
        "argv", "cwd", "env", "timeout_s", "kill_grace_s", "heartbeat_s", "stdout_log",
        "stderr_log", "heartbeat_path", "passthrough", "stdout_echo_fd", "shell", "stdin",
        "pass_fds", "order_log", "pty", "log_max_bytes",
    )  # fmt: skip
    argv: Sequence[str]
    cwd: str
    env: Mapping[str, str]  # the child's whole environment, marker included
    timeout_s: float | None
    kill_grace_s: float
    heartbeat_s: float
    stdout_log: str
    stderr_log: str
    heartbeat_path: str
    passthrough: bool
    stdout_echo_fd: int  # where passthrough sends the task's stdout (2 under --json)
    shell: bool
    stdin: int | None  # None: inherit ferry's stdin
    pass_fds: tuple[int, ...]  # descriptors the child inherits (the alive-lock)
    # Where the order of the two streams is recorded (ferry.proc.logorder); None: not.
    order_log: str | None
    # The task's stdout and stderr are one pseudo-terminal held by the supervisor (its
    # output is logged, and passed through, as stdout); stdin stays as given.
    pty: bool
    # Each stream's log keeps its first and last log_max_bytes/2 (ferry.proc._logcap);
    # None: every byte.
    log_max_bytes: int | None

    def __init__(
        self,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        timeout_s: float | None,
        kill_grace_s: float,
        heartbeat_s: float,
        stdout_log: str,
        stderr_log: str,
        heartbeat_path: str,
        passthrough: bool = True,
        stdout_echo_fd: int = 1,
        shell: bool = False,
        stdin: int | None = None,
        pass_fds: tuple[int, ...] = (),
        order_log: str | None = None,
        pty: bool = False,
        log_max_bytes: int | None = None,
    ) -> None:
        init(self, "argv", argv)
        init(self, "cwd", cwd)
        init(self, "env", env)
        init(self, "timeout_s", timeout_s)
        init(self, "kill_grace_s", kill_grace_s)
        init(self, "heartbeat_s", heartbeat_s)
        init(self, "stdout_log", stdout_log)
        init(self, "stderr_log", stderr_log)
        init(self, "heartbeat_path", heartbeat_path)
        init(self, "passthrough", passthrough)
        init(self, "stdout_echo_fd", stdout_echo_fd)
        init(self, "shell", shell)
        init(self, "stdin", stdin)
        init(self, "pass_fds", pass_fds)
        init(self, "order_log", order_log)
        init(self, "pty", pty)
        init(self, "log_max_bytes", log_max_bytes)


class Outcome(Value):
    """How a supervised task ended: its status, the signals and kills on the way, its
    timing, and what could not be logged or passed through."""

    __slots__ = (
        "drain_timed_out", "ended_at", "exit_code", "forwarded_signal", "group_survived",
        "killed_after_grace", "leftover_killed", "log_bytes", "log_dropped", "log_error",
        "passthrough_error", "pgid", "pid", "signal", "started_at", "stop_signal", "timed_out",
    )  # fmt: skip
    _FIELDS = (
        "exit_code", "signal", "timed_out", "forwarded_signal", "killed_after_grace",
        "started_at", "ended_at", "pid", "pgid", "leftover_killed", "stop_signal", "log_error",
        "drain_timed_out", "group_survived", "passthrough_error", "log_dropped", "log_bytes",
    )  # fmt: skip
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
    stop_signal: int | None  # the signal should_stop asked for, if it did
    log_error: str | None  # some output could not be logged or synced
    drain_timed_out: bool  # pipes still open the drain bound after the group died
    group_survived: bool  # a member outlived SIGKILL and the wait after it
    passthrough_error: str | None  # why (part of) a stream was not passed through
    # With log_max_bytes: the bytes of (stdout, stderr) not kept in their logs.
    log_dropped: tuple[int, int] | None
    # The bytes the task wrote to (stdout, stderr), logged or not.
    log_bytes: tuple[int, int]

    def __init__(
        self,
        exit_code: int | None,
        signal: int | None,
        timed_out: bool,
        forwarded_signal: int | None,
        killed_after_grace: bool,
        started_at: float,
        ended_at: float,
        pid: int,
        pgid: int,
        leftover_killed: bool,
        stop_signal: int | None = None,
        log_error: str | None = None,
        drain_timed_out: bool = False,
        group_survived: bool = False,
        passthrough_error: str | None = None,
        log_dropped: tuple[int, int] | None = None,
        log_bytes: tuple[int, int] = (0, 0),
    ) -> None:
        init(self, "exit_code", exit_code)
        init(self, "signal", signal)
        init(self, "timed_out", timed_out)
        init(self, "forwarded_signal", forwarded_signal)
        init(self, "killed_after_grace", killed_after_grace)
        init(self, "started_at", started_at)
        init(self, "ended_at", ended_at)
        init(self, "pid", pid)
        init(self, "pgid", pgid)
        init(self, "leftover_killed", leftover_killed)
        init(self, "stop_signal", stop_signal)
        init(self, "log_error", log_error)
        init(self, "drain_timed_out", drain_timed_out)
        init(self, "group_survived", group_survived)
        init(self, "passthrough_error", passthrough_error)
        init(self, "log_dropped", log_dropped)
        init(self, "log_bytes", log_bytes)
