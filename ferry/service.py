"""The use cases behind the commands: run, submit, ls, show, logs, cancel, retry, kill,
lease, journal maintenance. The leader's use cases (claim, work, recover) are in
:mod:`ferry.leader`. Each method does one thing and returns values for ``render``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ferry import events as ev
from ferry import render
from ferry.errors import (
    FerryError,
    KeyInFlightError,
    NotFoundError,
    OperatorNeededError,
    RefusedError,
    UsageError,
)
from ferry.ids import new_claim_token, new_task_id
from ferry.intake import build_spec, parse_from_lines
from ferry.model import IN_FLIGHT_STATES, Reason, State, Task
from ferry.runner import Runner, log_paths
from ferry.spec import TaskSpec
from ferry.statedir import ensure_home, resolve_home
from ferry.store import Store

CANCEL_WAIT_MARGIN_S = 5.0


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

    def _refuse_key_beside_an_orphan(self, keys: Sequence[str | None], but: str = "") -> None:
        """A key whose quarantined task's orphan still runs is in flight: a new task with
        it would run the same work beside the orphan (as ``retry`` of that task may not).
        The fold's key rule sees only states; this looks at the quarantined tasks' lives
        (all but task ``but``)."""
        wanted = {key for key in keys if key is not None}
        if not wanted:
            return
        self.store.refresh()
        for task in self.store.table.quarantined():
            if task.spec.key in wanted and task.id != but and self._orphan_alive(task):
                raise KeyInFlightError(
                    f"key {task.spec.key!r} is in flight: the orphan of quarantined task"
                    f" {task.id} still runs; stop it with 'ferry kill {task.id}'",
                    details={"key": task.spec.key, "task": task.id, "state": task.state.value},
                )

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
        """Queue ``specs`` in one write, under the contract's --key rule: a task whose key
        SUCCEEDED is not queued (a notice; its place in the result goes to the task that
        did it), nor one whose key's quarantined orphan still runs (exit 75)."""
        keys = [spec.key for spec in specs if spec.key is not None]
        self._refuse_key_beside_an_orphan(keys)  # (and refresh)
        done = {key: self.store.table.succeeded_with_key(key) for key in keys}
        for key, task_id in done.items():
            if task_id is not None:
                self.notice(f"key {key!r} already succeeded (task {task_id}); not queued")
        events, ids = [], []
        for spec in specs:
            task_id = done[spec.key] if spec.key is not None else None
            if task_id is None:
                events.append(self._new_task(spec))
                task_id = events[-1].task
            ids.append(task_id)
        if events:
            self.store.commit(*events)
        return [self._get(task_id) for task_id in ids]

    def run(self, opts: Mapping[str, Any], *, as_json: bool = False) -> int:
        """``ferry run``: SUBMITTED + CLAIMED + DISPATCHING in one durable write, then the
        child, then SETTLED. Returns the exit status to pass through."""
        from ferry.process import self_identity

        spec = build_spec(opts, self.home)
        if spec.key is not None:
            self._refuse_key_beside_an_orphan([spec.key])  # (and refresh)
            done = self.store.table.succeeded_with_key(spec.key)
            if done is not None:
                self.notice(f"key {spec.key!r} already succeeded (task {done}); not run again")
                if as_json:
                    render.write_json(render.task_json(self._get(done)))
                return 0
        submitted = self._new_task(spec)
        token = new_claim_token(os.urandom(10))
        claimed = ev.Claimed(
            task=submitted.task, attempt=1, token=token, runner=self_identity().to_json(), by="run"
        )
        task = Task(id=submitted.task, spec=spec, state=State.CLAIMED, claim_token=token)
        return self.run_in_foreground(task, token, lead=(submitted, claimed), as_json=as_json)

    def run_in_foreground(
        self, task: Task, token: str, *, lead: Sequence[ev.Event] = (), as_json: bool
    ) -> int:
        """The foreground half shared by ``run`` and ``claim``: dispatch the claimed task
        with output passed through, compact if due, report, and return the exit status
        to pass through (or raise the error that kept the task from starting)."""
        runner = Runner(self.store, passthrough=True, warn=self.notice, stdout_to_stderr=as_json)
        result = runner.dispatch(task, token, lead=lead, trap_signals=True)
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

    # ---- leading (ferry.leader) ----------------------------------------------------

    def claim(self, *, lease_ttl_s: float, as_json: bool) -> int:
        from ferry.leader import claim

        return claim(self, lease_ttl_s=lease_ttl_s, as_json=as_json)

    def work(self, **options: Any) -> int:
        from ferry.leader import work

        return work(self, **options)

    def recover(self, **options: Any) -> Any:
        from ferry.leader import recover

        return recover(self, **options)

    # ---- looking -------------------------------------------------------------------

    def _get(self, task_id: str) -> Task:
        task = self.store.get(task_id)
        if task is None:
            raise NotFoundError(f"no task {task_id}", details={"task": task_id})
        return self._with_heartbeat(task)

    def _with_heartbeat(self, task: Task) -> Task:
        """heartbeat_at comes from the heartbeat file (beats are not journaled)."""
        if not task.in_flight:
            return task
        from dataclasses import replace

        from ferry.runner import heartbeat_path

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
        from ferry.logs import print_logs

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
        from ferry.lease import LeaseStore
        from ferry.liveness import probe

        lease = LeaseStore(self.home / "lease.json", ttl_s=30.0).read()
        if lease is None:
            return {"epoch": self.store.max_epoch, "holder": None}
        info = lease.to_json()
        if lease.holder is not None:
            info["holder_liveness"] = str(probe(lease.holder))
            info["holder_alive"] = info["holder_liveness"] == "ALIVE"
        return info

    def lease_reset(self) -> str | None:
        from ferry.lease import LeaseStore

        self.store.refresh()
        moved = LeaseStore(self.home / "lease.json", ttl_s=30.0).reset(
            min_epoch=self.store.wal.max_epoch
        )
        return None if moved is None else str(moved)

    # ---- acting on a task ----------------------------------------------------------

    def cancel(self, prefix: str) -> Task:
        task = self.store.resolve(prefix)
        if task.state is State.QUEUED:
            self.store.commit(
                ev.Settled(task.id, task.attempt, None, State.CANCELLED, Reason.CANCELLED_BY_USER)
            )
            return self._get(task.id)
        if task.state not in IN_FLIGHT_STATES:
            raise RefusedError(
                f"task {task.id} is {task.state}: nothing to cancel",
                code="task.not_cancellable",
                details={"task": task.id, "state": task.state.value},
            )
        if not task.cancel_requested:
            # Intent first: a runner polling the journal sees it even if our signal is
            # lost (we crash right after this line).
            self.store.commit(ev.CancelRequested(task.id, task.attempt))
        from ferry.recoverer import Recoverer

        return Recoverer(self).cancel_in_flight(task)

    def retry(self, prefix: str, *, force: bool) -> Task:
        task = self.store.resolve(prefix)
        quarantined = task.reason is Reason.QUARANTINED_ORPHAN_ALIVE
        if quarantined and not force and task.terminal and self._orphan_alive(task):
            raise OperatorNeededError(
                f"task {task.id}: its quarantined orphan is still alive; stop it with "
                f"'ferry kill {task.id}' or use --force",
                code="task.orphan_alive",
                details={"task": task.id},
            )
        self._refuse_key_beside_an_orphan([task.spec.key], but=task.id)
        self.store.commit(ev.Retried(task.id, task.attempt + 1))
        return self._get(task.id)

    def _orphan_alive(self, task: Task) -> bool:
        from ferry.model import Liveness
        from ferry.recoverer import task_liveness

        return task_liveness(task, self.home) is not Liveness.DEAD

    def kill(self, prefix: str, signame: str) -> dict[str, Any]:
        from ferry.recoverer import kill_orphan

        sig = _parse_signal(signame)
        return kill_orphan(self, self.store.resolve(prefix), sig)

    # ---- the journal ---------------------------------------------------------------

    def journal_verify(self) -> dict[str, Any]:
        from ferry.journal_ops import verify

        return verify(self.home / "journal")

    def journal_repair(self) -> dict[str, Any]:
        from ferry.journal_ops import repair

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
        from ferry.journal_ops import dump

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
