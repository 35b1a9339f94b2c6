"""One task's life, from a claim to SETTLED, with the write-ahead order:

    CLAIMED (by the launcher, naming the supervisor as the runner, with a token)
    pointers re-hashed                    (may settle FAILED POINTER_STALE: nothing runs)
    DISPATCHING  -- durable -->           then, and only then:
    spawn (by the supervisor: new session, FERRY_TASK marker in the environment)
    SPAWNED (pid, pgid, start time)       once it has run SPAWNED_AFTER_S; a task
                                          that ended sooner: in SETTLED's write
    capture output, heartbeats, signals   (the supervisor: ferry.proc.supervise)
    SETTLED  -- durable -->               before the supervisor exits

Who does what (``docs/architecture.md``, "A task's processes"): ``run``, ``claim`` and
``work`` (the *launcher*) fork one small supervisor per task (:mod:`ferry.app.supervisor`)
and write the records; the supervisor holds the child and plans, spawns, watches and
ends it. While its launcher lives, the supervisor hands its records (SPAWNED,
SETTLED) to it, so that they ride in the launcher's group commit; once the launcher
is gone (kill -9, OOM), the supervisor writes them itself. Either way every record
about the task carries the claim token: the store refuses one whose claim no longer
owns the task, so a record is never written twice, nor after recovery decided.

This module holds what both sides share: the plan, the end's records, the paths.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Mapping

from ferry.core import events as ev
from ferry.core._value import Value, init
from ferry.core.errors import EX_FERRY_FAILED, EX_TIMEOUT, FerryError
from ferry.core.model import Reason, State, Task
from ferry.proc.alivelock import alive_path
from ferry.proc.process import find_by_marker, make_marker, signal_task

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ferry.proc.supervise import Outcome
    from ferry.storage import TaskStore

# Why a supervisor of a leader's claim gave it back (its evidence): another leader
# took the lease while it waited for its task or its go (``supervisor.deposed``).
DEPOSED = "another leader took its launcher's lease before the spawn: nothing was started"
ESCAPEE_POLL_S = 0.05
# SPAWNED is journaled once the task has run this long; a task that ends sooner gets
# SPAWNED in the write of its SETTLED (one fsync less for every short task). Until
# then recovery finds the child by its marker and its alive-lock, as it must anyway
# for a crash between the spawn and SPAWNED's fsync.
SPAWNED_AFTER_S = 0.05


def log_paths(home: str | os.PathLike[str], task_id: str, attempt: int) -> tuple[str, str]:
    directory = os.path.join(home, "logs", task_id)
    stdout, stderr = f"{attempt}.stdout", f"{attempt}.stderr"
    return os.path.join(directory, stdout), os.path.join(directory, stderr)


# The heartbeat file is also the alive-lock (ferry.proc.alivelock): one file per attempt.
heartbeat_path = alive_path


class Plan(Value):
    """A task about to be dispatched: ``event`` is DISPATCHING (then ``env`` is the
    child's environment) or SETTLED FAILED (``env`` None, ``error`` says why)."""

    __slots__ = ("env", "error", "event", "task", "token", "warnings")
    _FIELDS = ("task", "token", "event", "env", "error", "warnings")
    task: Task
    token: str
    event: ev.Dispatching | ev.Settled
    env: dict[str, str] | None
    error: FerryError | None
    warnings: tuple[str, ...]

    def __init__(
        self,
        task: Task,
        token: str,
        event: ev.Dispatching | ev.Settled,
        env: dict[str, str] | None,
        error: FerryError | None,
        warnings: tuple[str, ...] = (),
    ) -> None:
        init(self, "task", task)
        init(self, "token", token)
        init(self, "event", event)
        init(self, "env", env)
        init(self, "error", error)
        init(self, "warnings", warnings)


class RunResult(Value):
    """How the task ended, and the exit status ``run``/``claim`` pass through."""

    __slots__ = ("error", "exit_status", "skipped", "task")
    _FIELDS = ("task", "exit_status", "error", "skipped")
    task: Task
    exit_status: int
    error: FerryError | None  # a failure before the task could start
    skipped: bool  # not run: its --key succeeded (``task`` is the task that did it)

    def __init__(
        self,
        task: Task,
        exit_status: int,
        error: FerryError | None = None,
        *,
        skipped: bool = False,
    ) -> None:
        init(self, "task", task)
        init(self, "exit_status", exit_status)
        init(self, "error", error)
        init(self, "skipped", skipped)


def child_environ() -> dict[str, str]:
    """ferry's environment, decoded once (os.environ decodes every key and value on
    each read). A ferry nested inside the task must not crash at our test failpoints."""
    return {k: v for k, v in os.environ.items() if k != "FERRY_FAILPOINTS"}


def plan_task(task: Task, token: str, environ: dict[str, str]) -> Plan:
    """Everything decided before the intent is written: the pointer verdict, the
    child's environment, and the record to commit (DISPATCHING, or SETTLED FAILED
    when a pinned input changed)."""
    spec = task.spec
    marker = make_marker(task.id, task.attempt, token)
    env = dict(environ)
    env.update(spec.env)
    evidence: dict[str, Any] = {}
    warnings: tuple[str, ...] = ()
    if spec.pointers:
        from ferry.app.pointers import check_before_dispatch, pointers_from_spec

        pointers = pointers_from_spec(spec.pointers, spec.cwd)
        verdict = check_before_dispatch(pointers, idempotent=spec.idempotent, patch=spec.patch)
        if not verdict.run:
            settled = ev.Settled(
                task=task.id, attempt=task.attempt, token=token, state=State.FAILED,
                reason=Reason(str(verdict.reason)), evidence=dict(verdict.evidence),
            )  # fmt: skip
            return Plan(task, token, settled, None, verdict.error())
        env.update(verdict.env)
        evidence.update(verdict.evidence)
        warnings = (verdict.warning,) if verdict.warning else ()
    env["FERRY_TASK"] = marker
    env["FERRY_TASK_ID"] = task.id
    env["FERRY_ATTEMPT"] = str(task.attempt)
    dispatching = ev.Dispatching(
        task=task.id, attempt=task.attempt, token=token, marker=marker, evidence=evidence
    )
    return Plan(task, token, dispatching, env, None, warnings)


def error_to_json(error: FerryError | None) -> dict[str, Any] | None:
    """An error as the control channel carries it (``error_from_json`` reads it)."""
    if error is None:
        return None
    return {**error.to_json(), "exit_code": error.exit_code}


def error_from_json(data: dict[str, Any] | None) -> FerryError | None:
    if data is None:
        return None
    return FerryError(
        data["message"], code=data["code"], details=data["details"], exit_code=data["exit_code"]
    )


def exit_status_of(outcome: Outcome) -> int:
    """The contract's exit status: the task's own, 124 on timeout, 128+N on signal N."""
    if outcome.timed_out:
        return EX_TIMEOUT
    if outcome.signal is not None:
        return 128 + outcome.signal
    return outcome.exit_code if outcome.exit_code is not None else EX_FERRY_FAILED


def settle_event(
    task: Task,
    token: str,
    outcome: Outcome,
    cancelled: bool,
    *,
    escapees_stopped: bool = False,
    stopped_because: Mapping[str, Any] | None = None,
) -> ev.Settled:
    """``stopped_because``: why the launcher stopped the task, for its evidence
    (``work --halt now``: ``halted_after``, the failed task)."""
    evidence: dict[str, Any] = {
        "pid": outcome.pid,
        "started_at": outcome.started_at,
        "ended_at": outcome.ended_at,
        **(stopped_because or {}),
    }
    if outcome.forwarded_signal is not None:
        evidence["forwarded_signal"] = outcome.forwarded_signal
    if outcome.killed_after_grace:
        evidence["killed_after_grace"] = True
    if outcome.leftover_killed:
        evidence["leftover_killed"] = True
    # What each stream wrote: a log is made at its first byte, so a stream that wrote
    # nothing has no file, and one that wrote but has none was lost (``ferry logs``).
    evidence["log_bytes"] = {"stdout": outcome.log_bytes[0], "stderr": outcome.log_bytes[1]}
    if outcome.log_error:
        evidence["log_error"] = outcome.log_error
    if outcome.log_dropped is not None:  # (--log-max)
        stdout, stderr = outcome.log_dropped
        evidence["log_dropped_bytes"] = {"stdout": stdout, "stderr": stderr}
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
        ended_at=outcome.ended_at,
    )


# A start that failed for want of these (descriptors, processes, memory) may succeed
# once they are back.
SHORT_OF_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})


def spawn_failed_event(task: Task, token: str, error: FerryError) -> ev.Settled:
    return ev.Settled(
        task=task.id, attempt=task.attempt, token=token, state=State.FAILED,
        reason=Reason.SPAWN_FAILED, evidence={"error": error.to_json()},
    )  # fmt: skip


def not_started(settled: ev.Settled) -> dict[str, Any] | None:
    """Why an end says its task's command never started, for a reason that was not the
    task's (None for any other end): a start that failed for want of descriptors,
    processes or memory (its child not made, or its exec refused; not one spawned,
    then killed at once for want of a descriptor to watch it with: it may have
    begun), or a signal to its supervisor or launcher before the spawn. Such a claim
    of a queued task goes back to the queue rather than ending FAILED: nothing of it
    ran, and it may start once the resources are back. Counted against
    ``--max-releases``: a task whose own start always fails so must not hold the head
    of the queue for ever."""
    if settled.evidence.get("signalled_before_spawn"):
        return {"supervisor": f"not started: signal {settled.signal} before the spawn"}
    if settled.reason is not Reason.SPAWN_FAILED:
        return None
    error = settled.evidence.get("error")
    details = error.get("details") if isinstance(error, dict) else None
    if not isinstance(details, dict) or details.get("spawned"):
        return None
    return {"not_started": error} if details.get("errno") in SHORT_OF_ERRNOS else None


def before_spawn_event(
    task: Task, token: str, *, cancelled: bool, signum: int | None = None
) -> ev.Settled:
    """The end of a task stopped after its DISPATCHING and before its spawn: a cancel
    landed since the claim, or ``run`` got SIGINT/SIGTERM/SIGHUP (the user asked ferry
    to stop). Nothing was started."""
    if cancelled:
        return ev.Settled(
            task=task.id, attempt=task.attempt, token=token, state=State.CANCELLED,
            reason=Reason.CANCELLED_BY_USER, evidence={"cancelled_before_spawn": True},
        )  # fmt: skip
    return ev.Settled(
        task=task.id, attempt=task.attempt, token=token, state=State.FAILED,
        reason=Reason.SIGNALLED, signal=signum, evidence={"signalled_before_spawn": True},
    )  # fmt: skip


def unstarted_end(
    current: Task | None, token: str, evidence: Mapping[str, Any], *, counted: bool = False
) -> ev.Settled | ev.Released | None:
    """What a claim whose task was never started becomes (its launcher, or its
    supervisor, gone before the spawn), the task being ``current``: None if the claim
    ``token`` no longer owns it; CANCELLED if a cancel was asked for; ``run``'s own task
    FAILED ``SPAWN_FAILED`` (no one queued it: ``run`` said 125, or died, and a script
    may run it again; queued, the next ``work`` would run it too); else back to the
    queue, not counted unless ``counted`` (``evidence``: why)."""
    if current is None or current.claim_token != token or not current.in_flight:
        return None
    if current.cancel_requested:
        return ev.Settled(
            current.id, current.attempt, token, State.CANCELLED, Reason.CANCELLED_BY_USER,
            evidence={"cancelled_before_spawn": True},
        )  # fmt: skip
    if current.claimed_by == "run":
        return ev.Settled(
            current.id, current.attempt, token, State.FAILED, Reason.SPAWN_FAILED,
            evidence=dict(evidence),
        )  # fmt: skip
    return ev.Released(
        current.id, current.attempt, token, Reason.RELEASED_TO_QUEUE, counted, dict(evidence)
    )


def home_id(home: str | os.PathLike[str]) -> str:
    """The state directory's identity: its device and inode. A copy of the home
    (``cp -a``) is another one, with a journal of its own; a move (``mv``) keeps it
    within a file system, not across (``runner_state.of_another_home`` says why)."""
    st = os.stat(home)
    return f"{st.st_dev}:{st.st_ino}"


def cancel_stands(store: TaskStore, task_id: str, token: str) -> bool:
    """Was a cancel of this claim asked for, durably? What the store last read may say
    so (a catch-up without the journal's lock reads what is written, synced or not);
    then it is confirmed under the lock, made durable (``sync``), before the task is
    stopped for it: one its writer took back since (its fdatasync failed: it exited
    125) is not there then. Nothing asked: no lock taken."""

    def asked() -> bool:
        current = store.get(task_id)
        return bool(current and current.claim_token == token and current.cancel_requested)

    if not asked():
        return False
    try:
        store.sync()
    except FerryError:
        return False  # (looked at again at the next beat)
    return asked()


def as_cancelled(settled: ev.Settled) -> ev.Settled:
    """A task's end once its cancel is known: CANCELLED, whatever it would have been
    (the user asked for it to stop; what it did is in the evidence and exit status)."""
    return ev.Settled(
        settled.task, settled.attempt, settled.token, State.CANCELLED,
        Reason.CANCELLED_BY_USER, settled.exit_code, settled.signal,
        settled.evidence, settled.ended_at,
    )  # fmt: skip


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
