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
* Passthrough (:mod:`ferry.proc._sink`). When ferry's fd 1/2 is a pipe, it is grown
  to 1 MiB and written without blocking (``RWF_NOWAIT``); a terminal is written
  through a non-blocking description of its own. What the reader has not taken yet
  waits in a backlog, and while that backlog is over 4 MiB the task's pipe is not read
  (the task blocks, as it would writing to that reader directly). So a reader that
  stops reading never stops timeouts, heartbeats or forwarded signals; after the task
  ended, ferry waits for the reader to take the rest (like ``tee``) until a signal
  tells it to give up (``passthrough_error``). Files and sockets get plain blocking
  writes (known limit: a stuck socket reader holds the loop). EPIPE/EBADF/EIO on
  ferry's fd stop the passthrough there; the log keeps every byte. A log
  write error does not stop the task (its pipe must keep draining); it is reported in
  ``log_error``. Buffered ``sys.stdout``/``sys.stderr`` are flushed before the task
  starts, so ferry's own earlier output comes first.
* Logs. A stream's log, and the logs' directory, are made at its first byte
  (:class:`ferry.proc._outputs.LogFile`): a task that prints nothing gets no file, and
  costs no fsync here. What is there is checked before the spawn (a symlink is refused,
  a file system with no inode left too: ``SpawnFailed``); a log that cannot be made
  later is a ``log_error``, as a failed write is. Before returning, every log that
  received bytes is fdatasync'ed, and the directory of a log this call made is
  fsync'ed (and that directory's parent, when this call made the directory). Logs
  are opened ``O_APPEND|O_NOFOLLOW``, created 0600; the heartbeat file too.
  ``Outcome.log_bytes``: what the task wrote to each stream. With ``order_log``, the order of the two
  streams is recorded beside them (:mod:`ferry.proc.logorder`: an entry at each switch
  between the streams, before the chunk that switches is logged), and synced with them.
* A cap. With ``log_max_bytes`` each log keeps the stream's first and last
  ``log_max_bytes/2`` (:mod:`ferry.proc._logcap`: the middle becomes a hole in the
  file, so a crash at any point leaves the head and the latest bytes); the passthrough
  still gets every byte; ``Outcome.log_dropped`` says how many were not kept.
* A terminal. With ``pty`` the task's stdout and stderr are one pseudo-terminal, whose
  master this process reads as the task's stdout (the stderr log stays empty); its
  EIO, once no process holds the terminal, is the end of the stream.
* Heartbeats. A beat record (``ferry.proc.alivelock.beat``: the boot clock, in place, which
  also sets the mtime; not through a symlink, and re-created if removed) is written to
  ``heartbeat_path`` every ``heartbeat_s`` on the monotonic clock, whatever the task
  prints; a missed beat is not caught up in a burst. Errors are ignored: a heartbeat
  is evidence, not a reason to stop the task.
* Spawn failures. ``not_found`` (127) is ENOENT (or ENOTDIR for a bare name searched in
  PATH); ``not_executable`` (126) is EACCES/EPERM/ENOEXEC/EISDIR/ENOTDIR/ETXTBSY, as a
  shell decides; anything else, a missing ``cwd`` and unopenable log files included,
  is ``other`` (125).
* ``shell=True`` runs ``["/bin/sh", "-c", *argv]`` (Python's convention: ``argv[0]`` is
  the script, ``argv[1]`` becomes ``$0``, the rest ``$1``...).
* Signal handlers can only be installed from the main thread; elsewhere ferry does not
  trap signals and the caller stops tasks through ``should_stop``. A signal ferry
  inherited as ignored (``nohup``) stays ignored and is not forwarded.
* ``should_stop`` is polled at every heartbeat; ``control`` (a supervisor's channel to
  its launcher) is read whenever it is readable and may ask for a stop too. Their
  signal is sent like a forwarded one and reported in ``stop_signal``, not in
  ``forwarded_signal``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

from ferry.core._value import replace
from ferry.proc._outputs import LogFile, SignalTrap, create_private, descriptor_open, fsync_dirs
from ferry.proc._sink import Sink, echoes
from ferry.proc._spawn import SpawnFailed, kill_unsupervised, spawn
from ferry.proc._supervise_types import Outcome, SuperviseSpec
from ferry.proc._taskloop import DRAIN_TIMEOUT_S, SIGKILL_WAIT_S, Control, TaskLoop
from ferry.proc.logorder import OrderWriter

__all__ = [
    "DRAIN_TIMEOUT_S",
    "SIGKILL_WAIT_S",
    "Control",
    "Outcome",
    "SpawnFailed",
    "SuperviseSpec",
    "supervise",
]


def _check(spec: SuperviseSpec) -> None:
    if not spec.argv:
        raise ValueError("supervise: empty argv")
    if not spec.heartbeat_s > 0:
        raise ValueError(f"supervise: heartbeat_s must be > 0, not {spec.heartbeat_s}")
    if not spec.kill_grace_s >= 0:
        raise ValueError(f"supervise: kill_grace_s must be >= 0, not {spec.kill_grace_s}")
    if spec.timeout_s is not None and not spec.timeout_s >= 0:
        raise ValueError(f"supervise: timeout_s must be >= 0 or None, not {spec.timeout_s}")


def _cannot_supervise(spec: SuperviseSpec, error: OSError) -> SpawnFailed:
    message = f"cannot supervise {spec.argv[0]!r} ({error}); it was killed at once"
    return SpawnFailed("other", message, errno_=error.errno, spawned=True)


def supervise(
    spec: SuperviseSpec,
    *,
    on_spawned: Callable[[int, int], None],
    should_stop: Callable[[], int | None] | None = None,
    on_running: Callable[[], None] | None = None,
    running_after_s: float = 0.0,
    on_exit: Callable[[], None] | None = None,
    control: Control | None = None,
    trap: SignalTrap | None = None,
) -> Outcome:
    """Run ``spec`` to its end and say how it ended (see the module docstring).

    ``on_spawned(pid, pgid)`` is called once the child exists; ``on_running()`` once
    the leader has run for ``running_after_s`` (if it exits sooner, never);
    ``on_exit()`` when the leader exited, before it is reaped (its /proc entry is
    still there).
    ``should_stop`` is asked at every heartbeat; ``control`` whenever it is readable.

    Raises ValueError for a nonsensical spec (empty argv, heartbeat_s <= 0...) and
    :class:`SpawnFailed` when the command cannot start (kind ``other`` also when the
    log or heartbeat files cannot be opened). If ``on_spawned``, ``on_running`` or
    ``should_stop`` raises, the group is killed and reaped, and the error re-raised.
    """
    _check(spec)
    # Bytes ferry itself buffered must reach fd 1/2 before the task's own.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    try:
        # (Checked now, made at their first byte: a task that prints nothing has none.)
        logs = [LogFile(spec.stdout_log), LogFile(spec.stderr_log)]
        create_private(spec.heartbeat_path)
    except OSError as e:
        raise SpawnFailed("other", f"cannot open the task's files: {e}", errno_=e.errno) from e
    order = None if spec.order_log is None else OrderWriter(spec.order_log, logs)
    passthrough = spec.passthrough
    out_echo, err_echo = echoes(
        spec.stdout_echo_fd if passthrough and descriptor_open(spec.stdout_echo_fd) else None,
        2 if passthrough and descriptor_open(2) else None,
    )
    sinks = [
        Sink(logs[0], out_echo, spec.log_max_bytes),
        Sink(logs[1], err_echo, spec.log_max_bytes),
    ]
    log_error: str | None = None
    spawned = False
    try:
        # The trap goes in before the spawn: a SIGTERM in between must not kill ferry
        # and leave the fresh child running unsupervised. (``trap``: the caller's,
        # installed earlier still, before the intent was written.)
        with contextlib.nullcontext(trap) if trap is not None else SignalTrap() as trap:
            started_at = time.time()  # just before: the task's start is not earlier
            proc = spawn(spec)
            spawned = True
            try:
                run = TaskLoop(
                    spec, proc, sinks, trap, should_stop, started_at,
                    on_running, running_after_s, control, order, on_exit,
                )  # fmt: skip
            except BaseException as e:
                # No pidfd or selector (EMFILE, say): the child must not run on alone.
                kill_unsupervised(proc, SIGKILL_WAIT_S)
                if isinstance(e, OSError):
                    raise _cannot_supervise(spec, e) from e
                raise
            try:
                on_spawned(proc.pid, proc.pid)
            except BaseException as e:
                # The caller could not take the child in (its /proc entry unreadable:
                # EMFILE, say): it must not run on unsupervised.
                run.abort()
                if isinstance(e, OSError):
                    raise _cannot_supervise(spec, e) from e
                raise
            try:
                outcome = run.loop()
            except BaseException:
                # Whatever went wrong (on_running failed to journal SPAWNED, a bug),
                # the task must not outlive its supervision: kill, reap, re-raise.
                run.abort()
                raise
    except OSError as e:
        if spawned:
            raise
        # The trap's pipe could not be made (EMFILE): nothing was started.
        raise SpawnFailed("other", f"cannot start {spec.argv[0]!r}: {e}", errno_=e.errno) from e
    finally:
        for sink in sinks:
            sink.sync_and_close()
            log_error = log_error or sink.log_error
        if order is not None:
            order.sync_and_close()
    # A log this call made must keep its name through a crash too, and so must its
    # directory, if this call made it (and the order index's).
    new_logs = [log.path for log in logs if log.created]
    if order is not None and order.created and order.wrote:
        new_logs.append(order.path)
    directories = {os.path.dirname(p) for p in new_logs}
    if any(log.made_directory for log in logs):
        directories.add(os.path.dirname(os.path.dirname(spec.stdout_log)))
    log_error = log_error or fsync_dirs(directories)
    if spec.log_max_bytes is not None:
        caps = [sink.cap for sink in sinks]
        dropped = tuple(0 if cap is None else cap.dropped for cap in caps)
        outcome = replace(outcome, log_dropped=(dropped[0], dropped[1]))
        log_error = log_error or next((cap.error for cap in caps if cap and cap.error), None)
    outcome = replace(outcome, log_bytes=(sinks[0].bytes_total, sinks[1].bytes_total))
    if log_error is not None:
        outcome = replace(outcome, log_error=log_error)
    return outcome
