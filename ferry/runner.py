"""One task's life, from a claim to SETTLED, with the write-ahead order:

    CLAIMED (ours, with a token)          already durable when we start
    pointers re-hashed                    (may settle FAILED POINTER_STALE: nothing runs)
    DISPATCHING  -- durable -->           then, and only then:
    spawn (new session, FERRY_TASK marker in the environment)
    SPAWNED (pid, pgid, start time)       once it has run SPAWNED_AFTER_S; a task
                                          that ended sooner: in SETTLED's write
    capture output, heartbeats, signals   (ferry.supervise)
    SETTLED  -- durable -->               before ferry returns the exit status

A crash between any two lines leaves a journal that ``ferry recover`` can decide:
DISPATCHING without SPAWNED is found by the marker and the alive-lock, SPAWNED without
SETTLED by the pid and start time too. Every event about the task carries the claim token, so a runner that
recovery already gave up on cannot settle (the store refuses ``task.stale_claim``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ferry import alivelock
from ferry import events as ev
from ferry._outputs import SignalTrap
from ferry._value import Value, init
from ferry.alivelock import alive_path
from ferry.errors import EX_FERRY_FAILED, EX_TIMEOUT, FerryError
from ferry.failpoints import failpoint
from ferry.model import Reason, State, Task
from ferry.process import find_by_marker, identity_of, make_marker, signal_task
from ferry.store import Store
from ferry.supervise import Outcome, SpawnFailed, SuperviseSpec, supervise


def log_paths(home: Path, task_id: str, attempt: int) -> tuple[Path, Path]:
    directory = home / "logs" / task_id
    return directory / f"{attempt}.stdout", directory / f"{attempt}.stderr"


# The heartbeat file is also the alive-lock (ferry.alivelock): one file per attempt.
heartbeat_path = alive_path


class Plan(Value):
    """A task about to be dispatched: ``event`` is DISPATCHING (then ``env`` is the
    child's environment) or SETTLED FAILED (``env`` None, ``error`` says why)."""

    __slots__ = ("env", "error", "event", "task", "token")
    _FIELDS = ("task", "token", "event", "env", "error")
    task: Task
    token: str
    event: ev.Dispatching | ev.Settled
    env: dict[str, str] | None
    error: FerryError | None

    def __init__(
        self,
        task: Task,
        token: str,
        event: ev.Dispatching | ev.Settled,
        env: dict[str, str] | None,
        error: FerryError | None,
    ) -> None:
        init(self, "task", task)
        init(self, "token", token)
        init(self, "event", event)
        init(self, "env", env)
        init(self, "error", error)


class Ending(Value):
    """A task's end, not yet journaled: ``events`` (its SETTLED, after its SPAWNED if
    that was not written yet; empty if nothing is left to write) and the exit status
    ``run``/``claim`` pass through."""

    __slots__ = ("error", "events", "exit_status")
    _FIELDS = ("events", "exit_status", "error")
    events: tuple[ev.Event, ...]
    exit_status: int
    error: FerryError | None

    def __init__(
        self, events: tuple[ev.Event, ...], exit_status: int, error: FerryError | None = None
    ) -> None:
        init(self, "events", events)
        init(self, "exit_status", exit_status)
        init(self, "error", error)


class RunResult(Value):
    """How the task ended, and the exit status ``run``/``claim`` pass through."""

    __slots__ = ("error", "exit_status", "task")
    _FIELDS = ("task", "exit_status", "error")
    task: Task
    exit_status: int
    error: FerryError | None  # a failure before the task could start

    def __init__(self, task: Task, exit_status: int, error: FerryError | None = None) -> None:
        init(self, "task", task)
        init(self, "exit_status", exit_status)
        init(self, "error", error)


def exit_status_of(outcome: Outcome) -> int:
    """The contract's exit status: the task's own, 124 on timeout, 128+N on signal N."""
    if outcome.timed_out:
        return EX_TIMEOUT
    if outcome.signal is not None:
        return 128 + outcome.signal
    return outcome.exit_code if outcome.exit_code is not None else EX_FERRY_FAILED


def settle_event(
    task: Task, token: str, outcome: Outcome, cancelled: bool, *, escapees_stopped: bool = False
) -> ev.Settled:
    evidence: dict[str, Any] = {
        "pid": outcome.pid,
        "started_at": outcome.started_at,
        "ended_at": outcome.ended_at,
    }
    if outcome.forwarded_signal is not None:
        evidence["forwarded_signal"] = outcome.forwarded_signal
    if outcome.killed_after_grace:
        evidence["killed_after_grace"] = True
    if outcome.leftover_killed:
        evidence["leftover_killed"] = True
    if outcome.log_error:
        evidence["log_error"] = outcome.log_error
    if escapees_stopped:
        evidence["escapees_stopped"] = True
    if cancelled:
        state, reason = State.CANCELLED, Reason.CANCELLED_BY_USER
    elif outcome.timed_out:
        state, reason = State.FAILED, Reason.TIMEOUT
    elif outcome.signal is not None:
        state, reason = State.FAILED, Reason.SIGNALLED
    elif outcome.exit_code == 0:
        state, reason = State.SUCCEEDED, None
    else:
        state, reason = State.FAILED, Reason.EXIT_NONZERO
    return ev.Settled(
        task=task.id,
        attempt=task.attempt,
        token=token,
        state=state,
        reason=reason,
        exit_code=outcome.exit_code,
        signal=outcome.signal,
        evidence=evidence,
    )


ESCAPEE_POLL_S = 0.05
# SPAWNED is journaled once the task has run this long; a task that ends sooner gets
# SPAWNED in the write of its SETTLED (one fsync less for every short task). Until
# then recovery finds the child by its marker and its alive-lock, as it must anyway
# for a crash between the spawn and SPAWNED's fsync.
SPAWNED_AFTER_S = 0.05


def stop_escapees(marker: str, grace_s: float) -> bool:
    """After ferry stopped a task (timeout, cancel, a signal), end what left its process
    group with setsid (a daemon): it still carries the task's marker. SIGTERM, up to
    ``grace_s`` to exit, then SIGKILL, as for the group. True if any was found.
    A task that exits by itself keeps its deliberately detached daemons."""
    if not signal_task(None, marker, signal.SIGTERM):
        return False
    deadline = time.monotonic() + grace_s
    while find_by_marker(marker).alive and time.monotonic() < deadline:
        time.sleep(ESCAPEE_POLL_S)
    if find_by_marker(marker).alive:
        signal_task(None, marker, signal.SIGKILL)
    return True


class Runner:
    """Runs one claimed task. ``passthrough``: echo output to ferry's own stdout/stderr
    (``run``, ``claim``); ``work`` keeps output in the logs only."""

    def __init__(
        self, store: Store, *, passthrough: bool, warn: Any = None, stdout_to_stderr: bool = False
    ) -> None:
        self.store = store
        self.home = store.home
        self.passthrough = passthrough
        # Under --json ferry's stdout carries one JSON document: the task's stdout is
        # echoed to stderr instead (and kept byte-exact in its log as always).
        self.stdout_echo_fd = 2 if stdout_to_stderr else 1
        self.warn = warn or (lambda message: None)
        # ``run``/``claim``: their SignalTrap, installed before the intent is written. A
        # signal recorded there before the spawn: nothing is started (``finish``).
        self.trap: SignalTrap | None = None
        # ferry's environment, decoded once (os.environ decodes every key and value on
        # each read: 16 us a task for `work`). A ferry nested inside the task must not
        # crash at our test failpoints.
        self._environ = {k: v for k, v in os.environ.items() if k != "FERRY_FAILPOINTS"}

    def plan(self, task: Task, token: str) -> Plan:
        """Everything decided before the intent is written: the pointer verdict, the
        child's environment, and the record to commit (DISPATCHING, or SETTLED FAILED
        when a pinned input changed)."""
        spec = task.spec
        marker = make_marker(task.id, task.attempt, token)
        env = dict(self._environ)
        env.update(spec.env)
        evidence: dict[str, Any] = {}
        if spec.pointers:
            verdict = self._check_pointers(task)
            if not verdict.run:
                settled = ev.Settled(
                    task=task.id, attempt=task.attempt, token=token, state=State.FAILED,
                    reason=Reason(verdict.reason), evidence=dict(verdict.evidence),
                )  # fmt: skip
                return Plan(task, token, settled, None, verdict.error())
            env.update(verdict.env)
            evidence.update(verdict.evidence)
            if verdict.warning:
                self.warn(verdict.warning)
        env["FERRY_TASK"] = marker
        env["FERRY_TASK_ID"] = task.id
        env["FERRY_ATTEMPT"] = str(task.attempt)
        dispatching = ev.Dispatching(
            task=task.id, attempt=task.attempt, token=token, marker=marker, evidence=evidence
        )
        return Plan(task, token, dispatching, env, None)

    def launch(self, plan: Plan, stop: Callable[[], int | None] | None = None) -> RunResult:
        """Run a planned task whose record (``plan.event``) is already durable, and
        journal its end."""
        ending = self.finish(plan, stop)
        if ending.events:
            self.store.commit(*ending.events)
        return RunResult(self._task(plan.task.id), ending.exit_status, ending.error)

    def finish(
        self,
        plan: Plan,
        stop: Callable[[], int | None] | None = None,
        stop_fd: int | None = None,
    ) -> Ending:
        """Run a planned task whose record is already durable, up to its end; return
        the SETTLED record without writing it (``work`` writes it together with its
        next claim: one fsync). The caller must commit ``events`` at once. ``stop`` is
        asked at every heartbeat, and at once when ``stop_fd`` becomes readable."""
        if plan.env is None:  # settled FAILED in the plan's own write
            return Ending((), EX_FERRY_FAILED, plan.error)
        task = plan.task
        # A `ferry cancel` may have landed since the claim: do not start what the user
        # asked to stop. (The table is current: the commit of plan.event, just before
        # this call, caught up on the journal under its lock.)
        current = self.store.get(task.id)
        if current is not None and current.cancel_requested and current.claim_token == plan.token:
            cancelled = ev.Settled(
                task=task.id,
                attempt=task.attempt,
                token=plan.token,
                state=State.CANCELLED,
                reason=Reason.CANCELLED_BY_USER,
                evidence={"cancelled_before_spawn": True},
            )
            return Ending((cancelled,), 128 + signal.SIGTERM)
        if self.trap is not None and self.trap.received:
            # SIGINT/SIGTERM/SIGHUP came after the intent and before the spawn: start
            # nothing, and end as a task killed by it would (the user asked ferry to stop).
            signum = self.trap.received[0]
            settled = ev.Settled(
                task=task.id, attempt=task.attempt, token=plan.token, state=State.FAILED,
                reason=Reason.SIGNALLED, signal=signum,
                evidence={"signalled_before_spawn": True},
            )  # fmt: skip
            return Ending((settled,), 128 + signum)
        return self._supervise(task, plan.token, plan.env, stop, stop_fd)

    def dispatch(
        self,
        task: Task,
        token: str,
        *,
        lead: Sequence[ev.Event] = (),
        epoch: int = 0,
        stop: Callable[[], int | None] | None = None,
        trap_signals: bool = False,
    ) -> RunResult:
        """Plan, commit (the ``lead`` events, e.g. SUBMITTED + CLAIMED, go in the same
        write), launch. The intent is durable before the side effect: only after this
        commit returns (write + fsync) may the child exist.

        ``trap_signals`` (``run``, ``claim``: the main thread): from just before the
        intent is written until the end is, SIGINT/SIGTERM/SIGHUP are ferry's to handle
        (no spawn after one; forwarded to a running task), never a death that leaves
        the task DISPATCHING or its end unwritten. (Not during the planning: a Ctrl-C
        while pinned inputs are hashed still just interrupts, before anything exists.)"""
        plan = self.plan(task, token)
        if not trap_signals:
            self.store.commit(*lead, plan.event, epoch=epoch)
            return self.launch(plan, stop)
        with SignalTrap() as trap:
            self.trap = trap
            try:
                self.store.commit(*lead, plan.event, epoch=epoch)
                return self.launch(plan, stop)
            finally:
                self.trap = None

    def _check_pointers(self, task: Task) -> Any:
        from ferry.pointers import check_before_dispatch, pointers_from_spec

        spec = task.spec
        pointers = pointers_from_spec(spec.pointers, spec.cwd)
        return check_before_dispatch(pointers, idempotent=spec.idempotent, patch=spec.patch)

    def _supervise(
        self,
        task: Task,
        token: str,
        env: dict[str, str],
        stop: Callable[[], int | None] | None,
        stop_fd: int | None,
    ) -> Ending:
        spec = task.spec
        stdout_log, stderr_log = log_paths(self.home, task.id, task.attempt)
        sup = SuperviseSpec(
            argv=spec.argv,
            cwd=spec.cwd,
            env=env,
            timeout_s=spec.timeout_s,
            kill_grace_s=spec.kill_grace_s,
            heartbeat_s=spec.heartbeat_s,
            stdout_log=stdout_log,
            stderr_log=stderr_log,
            heartbeat_path=heartbeat_path(self.home, task.id, task.attempt),
            passthrough=self.passthrough,
            stdout_echo_fd=self.stdout_echo_fd,
            shell=spec.shell,
        )

        unrecorded: list[ev.Spawned] = []  # SPAWNED, until it is written

        def on_spawned(pid: int, pgid: int) -> None:
            # The child exists (exec'd) and SPAWNED is not yet durable: a crash here
            # leaves DISPATCHING alone, and the marker scan and the alive-lock find it.
            failpoint("after:spawn")
            identity = identity_of(pid)
            start_time = identity.start_time if identity is not None else 0
            unrecorded.append(
                ev.Spawned(
                    task=task.id,
                    attempt=task.attempt,
                    token=token,
                    pid=pid,
                    pgid=pgid,
                    start_time=start_time,
                )
            )

        def on_running() -> None:
            # Still running SPAWNED_AFTER_S after its spawn: journal SPAWNED now.
            self.store.commit(*unrecorded)
            unrecorded.clear()

        failpoint("before:spawn")  # DISPATCHING is durable, no child exists yet
        try:
            try:
                try:
                    stdout_log.parent.mkdir(mode=0o700, parents=True)
                    new_dir = True
                except FileExistsError:
                    new_dir = False
                    # logs/<id>/ exists from an earlier attempt: a symlink planted there
                    # in its place must not redirect the logs (O_NOFOLLOW follows it).
                    if stat.S_ISLNK(os.lstat(stdout_log.parent).st_mode):
                        raise OSError(
                            errno.ELOOP, "a symlink, not followed", str(stdout_log.parent)
                        ) from None
            except OSError as e:
                # A full disk (or inodes) must settle the task SPAWN_FAILED, not leave
                # it DISPATCHING for recovery to mark unsafe: nothing has run.
                message = f"cannot create the task's log directory: {e}"
                raise SpawnFailed("other", message, errno_=e.errno) from e
            lock_path = alive_path(self.home, task.id, task.attempt)
            try:
                lock_fd = alivelock.hold(lock_path)
            except OSError as e:
                raise SpawnFailed("other", f"cannot create the task's alive-lock: {e}") from e
            try:
                outcome = supervise(
                    replace(sup, pass_fds=(lock_fd,), log_dir_new=new_dir),
                    on_spawned=on_spawned,
                    should_stop=self._stopper(task, token, stop),
                    on_running=on_running,
                    running_after_s=SPAWNED_AFTER_S,
                    stop_fd=stop_fd,
                    trap=self.trap,
                )
            finally:
                alivelock.release(lock_fd)
        except SpawnFailed as error:
            settled = ev.Settled(
                task=task.id, attempt=task.attempt, token=token, state=State.FAILED,
                reason=Reason.SPAWN_FAILED, evidence={"error": error.to_json()},
            )  # fmt: skip
            return Ending((settled,), error.exit_code, error)
        # A `ferry cancel` from another process is only in the journal: catch up first,
        # or a cancelled task would settle FAILED SIGNALLED. (commit() re-validates
        # under the lock anyway; a failed refresh just leaves the cancel unseen.)
        with contextlib.suppress(FerryError):
            self.store.refresh()
        current = self._task(task.id)
        cancelled = current.cancel_requested and current.claim_token == token
        stopped = outcome.timed_out or outcome.forwarded_signal or outcome.stop_signal
        escaped = bool(stopped or cancelled) and stop_escapees(env["FERRY_TASK"], spec.kill_grace_s)
        settled = settle_event(task, token, outcome, cancelled, escapees_stopped=escaped)
        if outcome.log_error:
            self.warn(f"warning: task {task.id}: its log is incomplete ({outcome.log_error})")
        # A task that ended within SPAWNED_AFTER_S gets SPAWNED in the same write.
        return Ending((*unrecorded, settled), exit_status_of(outcome))

    def _stopper(self, task: Task, token: str, stop: Callable[[], int | None] | None) -> Any:
        """Polled at heartbeat time: the caller's ``stop`` (``work`` shutting down);
        then catch up on the journal: a cancel request stops the task (SIGTERM to its
        group); a STALE mark is answered by RESUMED (we are beating)."""
        store = self.store

        def should_stop() -> int | None:
            wanted = stop() if stop is not None else None
            if wanted is not None:
                return wanted
            try:
                store.refresh()
                current = store.get(task.id)
                if current is None or current.claim_token != token:
                    return None  # not our claim any more: its end will be refused
                if current.cancel_requested:
                    return signal.SIGTERM
                if current.state is State.STALE:
                    store.commit(ev.Resumed(task=task.id, attempt=task.attempt, token=token))
            except (FerryError, OSError):
                # A refused RESUMED (recovery moved first), a journal hiccup or a lack of
                # descriptors must not kill a running task, nor stop its beats: the
                # settle at the end reports what is true.
                return None
            return None

        return should_stop

    def _task(self, task_id: str) -> Task:
        task = self.store.get(task_id)
        assert task is not None
        return task
