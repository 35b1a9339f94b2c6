"""The use cases behind the commands: run, submit, ls, show, logs, cancel, retry, kill,
lease, journal maintenance. The leader's use cases (claim, work, recover) are in
:mod:`ferry.app.leader`. Each method does one thing and returns values for ``render``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.app.intake import build_spec, parse_from_lines
from ferry.app.runner import log_paths
from ferry.cli import render
from ferry.core import events as ev
from ferry.core.errors import (
    FerryError,
    InternalError,
    NotFoundError,
    OperatorNeededError,
    RefusedError,
    UsageError,
)
from ferry.core.fold import MOVED_CODES, RACE_TRIES
from ferry.core.ids import new_claim_token, new_task_id
from ferry.core.model import IN_FLIGHT_STATES, Reason, State, Task
from ferry.core.spec import TaskSpec
from ferry.storage.local.statedir import ensure_home, resolve_home
from ferry.storage.local.store import Store

if TYPE_CHECKING:
    from ferry.proc.process import ProcessIdentity


class Service:
    def __init__(self, home: Path, verbosity: int = 0) -> None:
        self.home = home
        self.verbosity = verbosity
        self._store: Store | None = None

    @classmethod
    def open(cls, home: str | None, *, verbosity: int = 0) -> Service:
        return cls(ensure_home(resolve_home(home, os.environ)), verbosity)

    @property
    def store(self) -> Store:
        """Opened on first use: ``journal verify``/``repair`` must work without it,
        since opening replays the journal and refuses a corrupt one."""
        if self._store is None:
            self._store = Store.open(self.home, on_lock_wait=self._lock_wait_notice)
        return self._store

    def _lock_wait_notice(self) -> None:
        self.notice(
            "waiting for the journal's append lock: another ferry process holds it (one"
            " that was stopped holds it until it is continued or killed)"
        )

    def notice(self, message: str) -> None:
        if self.verbosity >= 0:
            render.notice(message)

    # ---- creating tasks ------------------------------------------------------------

    def _new_task(self, spec: TaskSpec) -> ev.Submitted:
        task_id = new_task_id(time.time_ns(), os.urandom(4))
        return ev.Submitted(task=task_id, spec=spec, created_at=time.time())

    def _succeeded_keys(self, keys: Sequence[str]) -> dict[str, str]:
        """The keys among ``keys`` that SUCCEEDED (or were resolved as succeeded), with
        the task that did it. A key found is made sure of before anything acts on it:
        skipping work because the table says it is done must not rest on a record a
        power cut can still take back (``Store.sync``)."""
        table = self.store.table
        if not any(table.succeeded_with_key(key) for key in keys):
            return {}
        self.store.sync()
        found = {key: table.succeeded_with_key(key) for key in keys}
        return {key: task_id for key, task_id in found.items() if task_id is not None}

    def submit(self, batch: Sequence[Mapping[str, Any]]) -> list[Task]:
        return self._queue([build_spec(opts, self.home) for opts in batch])

    def submit_many(self, data: bytes, *, source: str) -> list[Task]:
        lines = parse_from_lines(data, "stdin" if source == "<stdin>" else source)
        specs = []
        first_with: dict[str, int] = {}  # key -> the number of its first task
        for number, opts in enumerate(lines, start=1):
            try:
                spec = build_spec(opts, self.home)
            except FerryError as error:
                error.message = f"task {number} of {source}: {error.message}"
                raise
            if spec.key is not None and first_with.setdefault(spec.key, number) != number:
                raise UsageError(
                    f"tasks {first_with[spec.key]} and {number} of {source} have the same"
                    f" key {spec.key!r}: only one of them could ever run",
                    code="usage.duplicate_key",
                    details={"key": spec.key, "tasks": [first_with[spec.key], number]},
                )
            specs.append(spec)
        return self._queue(specs)

    def _queue(self, specs: Sequence[TaskSpec]) -> list[Task]:
        """Queue ``specs`` in one write, under the contract's --key rules, which the
        store checks under the journal's lock (``ferry.core.fold``): a task whose key
        SUCCEEDED is not queued (a notice; its place in the result goes to the task that
        did it); a key whose latest task ended unsafe is refused (exit 3), one in flight
        too (75). A key that succeeds between our read and our write: read again."""
        keys = [spec.key for spec in specs if spec.key is not None]
        for _ in range(RACE_TRIES):
            done = self._succeeded_keys(keys)
            events, ids = [], []
            for spec in specs:
                task_id = None if spec.key is None else done.get(spec.key)
                if task_id is None:
                    events.append(self._new_task(spec))
                    task_id = events[-1].task
                ids.append(task_id)
            try:
                if events:
                    self.store.commit(*events)
            except RefusedError as error:
                if error.code != "task.key_succeeded":
                    raise
                continue  # it succeeded meanwhile: skip it too
            for key, task_id in done.items():
                self.notice(f"key {key!r} already succeeded (task {task_id}); not queued")
            return [self._get(task_id) for task_id in ids]
        raise InternalError("the tasks' keys kept changing while they were queued")

    def run(self, opts: Mapping[str, Any], *, as_json: bool = False) -> int:
        """``ferry run``: SUBMITTED + CLAIMED + DISPATCHING in one durable write (the
        claim names the task's supervisor as its runner), then the child, then SETTLED.
        Returns the exit status to pass through."""
        spec = build_spec(opts, self.home)
        if spec.key is not None and self._already_succeeded(spec.key, as_json):
            return 0
        submitted = self._new_task(spec)
        token = new_claim_token(os.urandom(10))

        def lead(runner: ProcessIdentity) -> tuple[ev.Event, ...]:
            claimed = ev.Claimed(submitted.task, 1, token, runner.to_json(), "run")
            return submitted, claimed

        task = Task(id=submitted.task, spec=spec, state=State.CLAIMED, claim_token=token)
        try:
            return self.run_in_foreground(task, token, lead=lead, as_json=as_json)
        except RefusedError as error:
            # The key succeeded between our read and our write (refused under the lock).
            succeeded_meanwhile = error.code == "task.key_succeeded" and spec.key is not None
            if succeeded_meanwhile and self._already_succeeded(str(spec.key), as_json):
                return 0
            raise

    def _already_succeeded(self, key: str, as_json: bool) -> bool:
        done = self._succeeded_keys([key]).get(key)
        if done is None:
            return False
        self.notice(f"key {key!r} already succeeded (task {done}); not run again")
        if as_json:
            render.write_json(render.task_json(self._get(done)))
        return True

    def run_in_foreground(
        self,
        task: Task,
        token: str,
        *,
        lead: Callable[[ProcessIdentity], Sequence[ev.Event]],
        epoch: int = 0,
        on_claimed: Callable[[], None] = lambda: None,
        as_json: bool,
    ) -> int:
        """The foreground half shared by ``run`` and ``claim``: launch the task's
        supervisor, write ``lead`` (the claim, naming it) with the intent, pass the
        output through, compact if due, report, and return the exit status to pass
        through (or raise the error that kept the task from starting)."""
        from ferry.app.launch import run_foreground

        # Under --json ferry's stdout carries one JSON document: the task's stdout is
        # echoed to stderr instead (and kept byte-exact in its log as always).
        result = run_foreground(
            self.store, task, token, lead=lead, epoch=epoch, on_claimed=on_claimed,
            stdout_echo_fd=2 if as_json else 1, notice=self.notice,
        )  # fmt: skip
        self._compact_quietly()
        if result.error is not None:  # (--json: the error object is the one document)
            result.error.details.setdefault("task", result.task.id)
            raise result.error
        if as_json:
            render.write_json(render.task_json(result.task))
        return result.exit_status

    def _compact_quietly(self) -> None:
        """After a task settled: keep start-up cost bounded for journals only ever
        written by ``run`` (CI). A failure here must not change the task's exit status."""
        try:
            self.store.maybe_compact()
        except FerryError as error:
            self.notice(f"warning: compaction skipped: {error.message}")

    # ---- leading (ferry.app.leader) ----------------------------------------------------

    def claim(self, *, lease_ttl_s: float, as_json: bool) -> int:
        from ferry.app.leader import claim

        return claim(self, lease_ttl_s=lease_ttl_s, as_json=as_json)

    def work(self, **options: Any) -> int:
        from ferry.app.worker import work

        return work(self, **options)

    def recover(self, **options: Any) -> Any:
        from ferry.app.leader import recover

        return recover(self, **options)

    # ---- looking -------------------------------------------------------------------

    def _get(self, task_id: str) -> Task:
        task = self.store.get(task_id)
        if task is None:
            raise NotFoundError(f"no task {task_id}", details={"task": task_id})
        return self._with_heartbeat(task)

    def _with_heartbeat(self, task: Task) -> Task:
        """What the journal does not hold, for a task in flight: heartbeat_at from the
        heartbeat file (beats are not journaled), and whether its runner (the task's
        supervisor) is alive now, as a probe proves it (``runner.alive``: true, false,
        or null when it cannot be proven either way). A settled task's runner is done."""
        if task.runner is None:
            return task
        from dataclasses import replace

        if not task.in_flight:
            return replace(task, runner={**task.runner, "alive": False})
        from ferry.app.recoverer import runner_identity
        from ferry.app.runner import heartbeat_path
        from ferry.core.model import Liveness
        from ferry.proc.liveness import probe

        identity = runner_identity(task)
        seen = Liveness.UNKNOWN if identity is None else probe(identity)
        alive = None if seen is Liveness.UNKNOWN else seen is Liveness.ALIVE
        task = replace(task, runner={**task.runner, "alive": alive})
        try:
            beat = heartbeat_path(self.home, task.id, task.attempt).stat().st_mtime
        except OSError:
            return task
        return replace(task, heartbeat_at=beat)

    def ls(self, *, state: str | None, limit: int) -> list[Task]:
        return [self._with_heartbeat(t) for t in self.store.newest(limit, state)]

    def show(self, prefix: str) -> Task:
        return self._with_heartbeat(self.store.resolve(prefix))

    def logs(
        self,
        prefix: str,
        *,
        stream: str | None,
        tail: int | None,
        follow: bool,
        attempt: int | None,
        as_json: bool,
    ) -> None:
        from ferry.app.logs import print_logs

        task = self.store.resolve(prefix)
        which = attempt or task.attempt
        if which > task.attempt:
            raise NotFoundError(f"task {task.id} has no attempt {which}", code="task.no_attempt")
        paths = log_paths(self.home, task.id, which)

        def settled() -> bool:
            self.store.refresh()
            current = self.store.get(task.id)
            return current is None or current.terminal or current.attempt != which

        print_logs(paths, stream=stream, tail=tail, follow=follow, settled=settled, as_json=as_json)
        current = self.store.get(task.id) or task
        if current.attempt != which:
            return  # (an earlier attempt's evidence is not kept)
        lost = [path.name for path in paths if not path.exists()]
        if problem := current.evidence.get("log_error"):
            self.notice(f"warning: task {task.id}: its log is incomplete ({problem})")
        elif lost and current.started_at is not None:
            self.notice(f"warning: task {task.id}: log file(s) missing: {', '.join(lost)}")

    def lease_info(self) -> dict[str, Any]:
        from ferry.proc.liveness import probe
        from ferry.storage.local.lease import LeaseStore

        lease = LeaseStore(self.home / "lease.json", ttl_s=30.0).read()
        if lease is None:
            return {"epoch": self.store.max_epoch, "holder": None}
        info = lease.to_json()
        if lease.holder is not None:
            info["holder_liveness"] = str(probe(lease.holder))
            info["holder_alive"] = info["holder_liveness"] == "ALIVE"
        return info

    def lease_reset(self) -> str | None:
        from ferry.storage.local.lease import LeaseStore

        self.store.refresh()
        moved = LeaseStore(self.home / "lease.json", ttl_s=30.0).reset(
            min_epoch=self.store.wal.max_epoch
        )
        return None if moved is None else str(moved)

    # ---- acting on a task ----------------------------------------------------------

    def cancel(self, prefix: str) -> Task:
        task = self.store.resolve(prefix)
        for _ in range(RACE_TRIES):
            try:
                if task.state is State.QUEUED:
                    # Token-less: refused under the lock if a runner claimed it meanwhile.
                    self.store.commit(ev.Settled(task.id, task.attempt, None, State.CANCELLED,
                                                 Reason.CANCELLED_BY_USER))  # fmt: skip
                    return self._get(task.id)
                if task.state not in IN_FLIGHT_STATES:
                    raise RefusedError(
                        f"task {task.id} is {task.state}: nothing to cancel",
                        code="task.not_cancellable",
                        details={"task": task.id, "state": task.state.value},
                    )
                if not task.cancel_requested:
                    # Intent first: a runner polling the journal sees it even if our
                    # signal is lost (we crash right after this line).
                    self.store.commit(ev.CancelRequested(task.id, task.attempt, task.claim_token))
            except RefusedError as error:
                if error.code not in MOVED_CODES:
                    raise
                task = self._get(task.id)  # it moved meanwhile: decide again
                continue
            from ferry.app.recoverer import Recoverer

            return Recoverer(self).cancel_in_flight(self._get(task.id))
        raise InternalError(f"task {task.id} kept changing while it was being cancelled")

    def retry(self, prefix: str, *, force: bool) -> Task:
        task = self.store.resolve(prefix)
        self._refuse_beside_a_live_orphan(task, force, "retry")
        # The key rules (another task with this key unsafe, in flight, or succeeded) and
        # the attempt are checked under the journal's lock.
        self.store.commit(ev.Retried(task.id, task.attempt + 1))
        return self._get(task.id)

    def resolve(self, prefix: str, *, verdict: str, force: bool) -> Task:
        """``ferry resolve``: record the operator's verdict on a FAILED or CANCELLED task
        (what it really did); its key then follows the verdict."""
        task = self.store.resolve(prefix)
        if task.state is State.SUCCEEDED or not task.terminal:
            raise RefusedError(
                f"task {task.id} is {task.state}: only a FAILED or CANCELLED task is resolved",
                code="task.not_resolvable",
                details={"task": task.id, "state": task.state.value},
            )
        self._refuse_beside_a_live_orphan(task, force, "resolve")
        self.store.commit(ev.Resolved(task.id, task.attempt, verdict))
        return self._get(task.id)

    def _refuse_beside_a_live_orphan(self, task: Task, force: bool, action: str) -> None:
        """A quarantined task's orphan may still be doing the work: neither a new run of
        it nor a verdict on it, unless the operator insists."""
        quarantined = task.reason is Reason.QUARANTINED_ORPHAN_ALIVE and task.terminal
        if quarantined and not force and self._orphan_alive(task):
            raise OperatorNeededError(
                f"task {task.id}: its quarantined orphan is still alive; stop it with "
                f"'ferry kill {task.id}' or {action} with --force",
                code="task.orphan_alive",
                details={"task": task.id},
            )

    def _orphan_alive(self, task: Task) -> bool:
        from ferry.app.recoverer import task_liveness
        from ferry.core.model import Liveness

        return task_liveness(task, self.home) is not Liveness.DEAD

    def kill(self, prefix: str, signame: str) -> dict[str, Any]:
        from ferry.app.recoverer import kill_orphan

        sig = _parse_signal(signame)
        return kill_orphan(self, self.store.resolve(prefix), sig)

    # ---- the journal ---------------------------------------------------------------

    def journal_verify(self) -> dict[str, Any]:
        from ferry.storage.local.maintenance import verify

        return verify(self.home / "journal")

    def journal_repair(self) -> dict[str, Any]:
        from ferry.storage.local.maintenance import repair

        return repair(self.home / "journal")

    def journal_compact(self) -> dict[str, Any]:
        report = self.store.compact(on_lock_wait=self._compact_wait_notice)
        assert report is not None  # (it waits for the lock)
        return report

    def _compact_wait_notice(self) -> None:
        self.notice(
            "waiting for compact.lock: another compaction is in progress (one that was"
            " stopped holds it until it is continued or killed)"
        )

    def journal_dump(self, *, from_seq: int) -> None:
        from ferry.storage.local.maintenance import dump

        dump(self.store, from_seq, sys.stdout.buffer)


def _parse_signal(name: str) -> int:
    text = name.upper().removeprefix("SIG")
    if text.isdigit():
        number = int(text)
        if 0 < number < signal.NSIG:
            return number
    else:
        try:
            return int(signal.Signals["SIG" + text])
        except KeyError:
            pass
    raise UsageError(f"unknown signal {name!r}", code="usage.bad_signal")
