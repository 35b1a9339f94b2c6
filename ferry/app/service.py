"""The use cases behind the commands: run, submit, ls, show, wait, logs, cancel, retry,
kill, lease, journal maintenance. The leader's use cases (claim, work, recover) are in
:mod:`ferry.app.leader` and :mod:`ferry.app.worker`; this facade hands them its
:class:`~ferry.app.session.Session`, never itself. Each method does one thing and
returns values; the command line renders them.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence

from ferry.app.runner import RunResult, log_paths
from ferry.app.session import Session
from ferry.core import events as ev
from ferry.core.errors import (
    FerryError,
    InternalError,
    NotFoundError,
    OperatorNeededError,
    RefusedError,
    StateDirMissingError,
    UsageError,
)
from ferry.core.fold import MAY_RUN_ON, MOVED_CODES, RACE_TRIES
from ferry.core.ids import id_time_ms, new_claim_token, new_task_id, shown
from ferry.core.model import IN_FLIGHT_STATES, Reason, State, Task
from ferry.core.spec import TaskSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ferry.app.gc import GcReport
    from ferry.app.tally import WaitReport, WorkReport
    from ferry.core.recovery import RecoverReport
    from ferry.core.state import States
    from ferry.storage import TaskStore


def resolve_task(store: TaskStore, reference: str) -> Task:
    """:func:`ferry.app.naming.resolve` (imported here: ``run`` never names a task)."""
    from ferry.app.naming import resolve

    return resolve(store, reference)


class Service:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.home: str = session.home

    @property
    def store(self) -> TaskStore:
        return self.session.store

    def notice(self, message: str) -> None:
        self.session.notice(message)

    # ---- creating tasks ------------------------------------------------------------

    def _new_task(
        self, spec: TaskSpec, task_id: str | None = None, wait_s: float | None = None
    ) -> ev.Submitted:
        """``wait_s``: its ``--not-before +SECONDS``, for the store to decide by its clock."""
        task_id = task_id or new_task_id(time.time_ns(), os.urandom(4))
        return ev.Submitted(task=task_id, spec=spec, created_at=time.time(), wait_s=wait_s)

    def _with_after(self, opts: Mapping[str, Any]) -> dict[str, Any]:
        """The options with ``after`` (--after: ids, prefixes, numbers, last) as task ids."""
        from ferry.app.queueing import resolve_after

        after = opts.get("after") or ()
        return {**opts, "after": resolve_after(self.store, after) if after else ()}

    def _succeeded_keys(self, keys: Sequence[str]) -> dict[str, str]:
        """The keys among ``keys`` that SUCCEEDED (or were resolved as succeeded), with
        the task that did it. A key found is made sure of before anything acts on it:
        skipping work because the table says it is done must not rest on a record a
        power cut can still take back (``Store.sync``)."""
        store = self.store
        if not any(store.succeeded_with_key(key) for key in keys):
            return {}
        store.sync()
        found = {key: store.succeeded_with_key(key) for key in keys}
        return {key: task_id for key, task_id in found.items() if task_id is not None}

    def submit(self, batch: Sequence[Mapping[str, Any]]) -> list[Task]:
        from ferry.app.intake import build_spec  # (lazy, as each use: not for ls, show)

        return self._queue(
            [build_spec(self._with_after(opts), self.home, queued=True) for opts in batch],
            waits=[_wait_of(opts) for opts in batch],
        )

    def submit_many(self, data: bytes, *, source: str) -> list[Task]:
        """``submit --from``: a line's ``after`` may name a task of the same batch by
        its line, ``"line:N"``, as well as any task queued before; the batch is written
        dependencies first, and a cycle among its lines is refused."""
        from ferry.app.intake import build_spec, parse_from_lines

        lines = parse_from_lines(data, source)
        specs, waits = [], []
        first_with: dict[str, int] = {}  # key -> the line of its first task
        planned = {number: new_task_id(time.time_ns(), os.urandom(4)) for number, _ in lines}
        for number, opts in lines:
            try:
                opts = self._line_after(opts, planned, number)
                spec = build_spec(opts, self.home, queued=True)
            except FerryError as error:
                if error.code == "usage.missing_command":  # (no "--" in a JSON line)
                    error.message = "argv is empty: give the command as a list of strings"
                error.message = f"line {number} of {source}: {error.message}"
                raise
            if spec.key is not None and first_with.setdefault(spec.key, number) != number:
                raise UsageError(
                    f"lines {first_with[spec.key]} and {number} of {source} have the same"
                    f" key {spec.key!r}: only one of them could ever run",
                    code="usage.duplicate_key",
                    details={"key": spec.key, "tasks": [first_with[spec.key], number]},
                )
            specs.append(spec)
            waits.append(_wait_of(opts))
        ids = [planned[number] for number, _ in lines]
        return self._queue(specs, ids=ids, source=source, waits=waits)

    def _line_after(
        self, opts: dict[str, Any], planned: Mapping[int, str], number: int
    ) -> dict[str, Any]:
        after = opts.get("after") or []
        if not all(isinstance(item, str) for item in after):
            raise UsageError("after must be a list of task ids (or \"line:N\")",
                             code="usage.bad_from_line", details={"line": number})  # fmt: skip
        local, references = [], []
        for item in after:
            if item.startswith("line:"):
                target = item[5:]
                numeric = target.isascii() and target.isdigit() and len(target) <= 19
                line = int(target) if numeric else None
                if line not in planned:
                    raise UsageError(f"after {item!r}: no task on that line",
                                     code="usage.bad_from_line", details={"line": number})  # fmt: skip
                local.append(planned[line])  # type: ignore[index]
            else:
                references.append(item)
        resolved = self._with_after({"after": references})["after"]
        return {**opts, "after": [*dict.fromkeys([*resolved, *local])]}

    def submit_lines(self, data: bytes, *, source: str, opts: Mapping[str, Any]) -> list[Task]:
        """``submit --lines``: one task per line that is not blank, each run by
        /bin/sh, with the same TASK OPTIONS, in one write (a bad line queues none)."""
        if opts.get("key") is not None:
            raise UsageError(
                "--key names one task: it cannot apply to every line of --lines",
                code="usage.key_with_lines",
            )
        from ferry.app.intake import build_spec, parse_shell_lines

        specs = []
        opts = self._with_after(opts)
        for number, line in parse_shell_lines(data, source):
            try:
                line_opts = {**opts, "argv": [line], "shell": True}
                specs.append(build_spec(line_opts, self.home))
            except FerryError as error:
                error.message = f"line {number} of {source}: {error.message}"
                raise
        return self._queue(specs, waits=[_wait_of(opts)] * len(specs))

    def _queue(
        self,
        specs: Sequence[TaskSpec],
        *,
        ids: Sequence[str] | None = None,
        source: str = "the batch",
        waits: Sequence[float | None] | None = None,
    ) -> list[Task]:
        """Queue ``specs`` in one write, under the contract's --key rules, which the
        store checks under the journal's lock (``ferry.core.fold``): a task whose key
        SUCCEEDED is not queued (a notice; its place in the result goes to the task that
        did it); a key whose latest task ended unsafe is refused (exit 3), one in flight
        too (75). A key that succeeds between our read and our write: read again.
        ``ids``: the ids the tasks get (``submit --from``: its lines may name each
        other in ``after``); they are written dependencies first. ``waits``: each one's
        ``--not-before +SECONDS`` (``ev.Submitted.wait_s``)."""
        keys = [spec.key for spec in specs if spec.key is not None]
        planned = list(ids) if ids is not None else [""] * len(specs)
        delays = list(waits) if waits is not None else [None] * len(specs)
        # A home fed only by submits keeps the tail every command folds bounded too (a
        # cron filling a queue that no worker drains yet), without merging archives (a
        # submit stays short: run, gc and work's merge beside it do that), and not
        # while a worker leads (it compacts between its turns, and learns there that a
        # merge its loop must not do is due: a submit's compaction hid that from it).
        # Before the write, not after: interrupted there, a submit has queued nothing
        # (after it, an interrupted compaction hid a queued task's id: a review).
        self.session.compact_if_due(merge=False, unless_led=True)
        for _ in range(RACE_TRIES):
            done = self._succeeded_keys(keys)
            events, result = {}, []
            skipped: dict[str, str] = {}  # planned id -> the task whose key succeeded
            for spec, planned_id, wait_s in zip(specs, planned, delays, strict=True):
                task_id = None if spec.key is None else done.get(spec.key)
                if task_id is None:
                    submitted = self._new_task(spec, planned_id or None, wait_s)
                    events[submitted.task] = submitted
                    task_id = submitted.task
                elif planned_id:
                    skipped[planned_id] = task_id
                result.append(task_id)
            ordered = _dependencies_first(events, skipped, source)
            try:
                if ordered:
                    self.store.commit(*ordered)
            except RefusedError as error:
                if error.code != "task.key_succeeded":
                    raise
                continue  # it succeeded meanwhile: skip it too
            for key, task_id in done.items():
                self.notice(f"key {key!r} already succeeded (task {task_id}); not queued")
            found = zip(result, specs, strict=True)
            return [self._get_or_forgotten(task_id, spec) for task_id, spec in found]
        raise InternalError("the tasks' keys kept changing while they were queued")

    def run(self, opts: Mapping[str, Any], *, stdout_echo_fd: int = 1) -> RunResult:
        """``ferry run``: SUBMITTED + CLAIMED + DISPATCHING in one durable write (the
        claim names the task's supervisor as its runner), then the child, then SETTLED.
        The result carries the exit status to pass through; a task whose key already
        succeeded is not run (that task, exit 0)."""
        from ferry.app.foreground import run_task
        from ferry.app.intake import build_spec
        from ferry.app.outbox import patience_s

        patience_s()  # (its supervisor's: a bad value refused before anything is written)
        spec = build_spec(opts, self.home)
        if spec.key is not None and (done := self._already_succeeded(spec.key, spec)):
            return done
        submitted = self._new_task(spec)
        token = new_claim_token(os.urandom(10))

        def lead(runner: dict[str, Any]) -> tuple[ev.Event, ...]:
            claimed = ev.Claimed(submitted.task, 1, token, runner, "run")
            return submitted, claimed

        task = Task(id=submitted.task, spec=spec, state=State.CLAIMED, claim_token=token)
        try:
            return run_task(self.session, task, token, lead=lead, stdout_echo_fd=stdout_echo_fd,
                            on_started=self.session.reporter.started)  # fmt: skip
        except RefusedError as error:
            # The key succeeded between our read and our write (refused under the lock).
            succeeded_meanwhile = error.code == "task.key_succeeded" and spec.key is not None
            if succeeded_meanwhile and (done := self._already_succeeded(str(spec.key), spec)):
                return done
            raise

    def _already_succeeded(self, key: str, spec: TaskSpec) -> RunResult | None:
        done = self._succeeded_keys([key]).get(key)
        if done is None:
            return None
        self.notice(f"key {key!r} already succeeded (task {done}); not run again")
        return RunResult(self._get_or_forgotten(done, spec), 0, skipped=True)

    def _get_or_forgotten(self, task_id: str, spec: TaskSpec) -> Task:
        """The task ``task_id``; if ``ferry gc`` forgot it (its key's success is all that
        is left of it), a stand-in saying so: that id, SUCCEEDED, the key, and the spec
        of the task not run in its place (the original one is gone)."""
        task = self.store.get(task_id)
        if task is not None:
            return self._with_heartbeat(task)
        return Task(id=task_id, spec=spec, state=State.SUCCEEDED,
                    created_at=id_time_ms(task_id) / 1000,
                    evidence={"forgotten": "ferry gc forgot this task; its key succeeded"})  # fmt: skip

    # ---- leading (ferry.app.leader) ----------------------------------------------------

    def claim(self, *, lease_ttl_s: float, stdout_echo_fd: int = 1) -> RunResult | None:
        from ferry.app.leader import claim

        return claim(self.session, lease_ttl_s=lease_ttl_s, stdout_echo_fd=stdout_echo_fd)

    def work(self, **options: Any) -> WorkReport:
        from ferry.app.worker import work

        return work(self.session, **options)

    def recover(self, **options: Any) -> RecoverReport:
        """(A missing state directory, opened with ``make=False``: nothing to recover, and
        nothing made; cron may run ``recover`` before anything was ever submitted.)"""
        from ferry.app.leader import recover

        if self.session.missing:
            from ferry.core.recovery import RecoverReport

            return RecoverReport(epoch=0, dry_run=bool(options.get("dry_run")))
        return recover(self.session, **options)

    # ---- looking -------------------------------------------------------------------

    def _get(self, task_id: str) -> Task:
        task = self.store.get(task_id)
        if task is None:
            raise NotFoundError(f"no task {task_id}", details={"task": task_id})
        return self._with_heartbeat(task)

    def _with_heartbeat(self, task: Task) -> Task:
        from ferry.app.runner_state import with_runner_state

        return with_runner_state(task, self.home, self.store)

    def ls(self, *, state: States, limit: int) -> tuple[list[Task], int]:
        """The last ``limit`` tasks submitted (0: all), in submission order, and how
        many there are in all (in ``state`` if given)."""
        tasks = [self._with_heartbeat(t) for t in self.store.newest(limit, state)]
        total = len(tasks) if not limit or len(tasks) < limit else self.store.count(state)
        return tasks, total

    def show(self, prefix: str) -> Task:
        return self._with_heartbeat(resolve_task(self.store, prefix))

    def wait(self, prefixes: Sequence[str], *, timeout_s: float | None) -> WaitReport:
        from ferry.app.waiting import wait

        return wait(self.session, prefixes, timeout_s=timeout_s)

    def logs(
        self,
        prefix: str,
        *,
        stream: str | None,
        tail: int | None,
        follow: bool,
        attempt: int | None,
        as_json: bool,
        merged: bool = False,
    ) -> bool:
        """Print the task's logs (see :mod:`ferry.app.logs`). True if the attempt shown
        SUCCEEDED (as far as is known when the logs are done: ``follow`` waits for it
        to settle)."""
        from ferry.app.logs import print_logs

        task = resolve_task(self.store, prefix)
        which = attempt or task.attempt
        if which > task.attempt:
            raise NotFoundError(f"task {task.id} has no attempt {which}", code="task.no_attempt")
        paths = log_paths(self.home, task.id, which)
        if self.store.host_lost(task, float("inf")) is not None and not os.path.exists(paths[0]):
            return self._logs_kept_elsewhere(task, which, stream=stream, tail=tail,
                                             as_json=as_json, merged=merged)  # fmt: skip

        if follow and self.session.damage() is not None:
            follow = False  # (past its damage the journal says no more: none will settle)

        from ferry.app.runner_state import GoneRunners, Outage

        seen = [task]  # the task as last seen in the table
        gone = GoneRunners(self.session.home, self.store, self.notice, self.session.led)
        outage = Outage(self.notice)

        def ended(current: Task | None) -> bool:
            return current is None or current.terminal or current.attempt != which

        def settled() -> bool:
            with outage:  # (the database out of reach: followed on, looked at again)
                return looked()
            return False

        def looked() -> bool:
            self.store.refresh()
            current = self.store.get(task.id)
            if follow and ended(current):
                self.store.sync()  # (confirmed under the lock before it is said: as wait)
                current = self.store.get(task.id)
            if current is None:
                return True  # forgotten (ferry gc): settled, whether or not its end was seen
            seen[0] = current
            if ended(current):
                return True
            if follow:
                gone.look([current])
            return False

        while True:
            unread = print_logs(paths, stream=stream, tail=tail, follow=follow, settled=settled,
                                as_json=as_json, merged=merged, task_id=task.id,
                                attempt=which)  # fmt: skip
            moved_on = seen[0].attempt > which and self.store.get(task.id) is not None
            if not (follow and attempt is None and moved_on):
                break
            # Retried (its --retries): each attempt in turn, whole, to the end of the
            # last, as ``wait`` waits for it; the exit by that end.
            which += 1
            self.notice(f"task {task.id} is retried: attempt {which}")
            paths, tail = log_paths(self.home, task.id, which), None
            if self.store.host_lost(seen[0], float("inf")) is not None and not os.path.exists(
                paths[0]
            ):  # (another host of the database runs it: what it keeps, from there on)
                return self._logs_kept_elsewhere(seen[0], which, stream=stream, tail=tail,
                                                 as_json=as_json, merged=merged)  # fmt: skip
        current = self.store.get(task.id)
        if current is not None and _lost_logs(paths, current):
            self.store.refresh()  # (gone: forgotten since the last look?)
            current = self.store.get(task.id)
        if current is None:
            return self._logs_forgotten(seen[0], which, unread)
        if current.attempt != which:
            # (An earlier attempt's evidence is not kept; it was retried: not a success.)
            return False
        lost = _lost_logs(paths, current)
        if problem := current.evidence.get("log_error"):
            self.notice(f"warning: task {task.id}: its log is incomplete ({problem})")
        elif lost:
            self.notice(f"warning: task {task.id}: log file(s) missing: {', '.join(lost)}")
        return current.state is State.SUCCEEDED

    def _logs_forgotten(self, seen: Task, attempt: int, unread: Sequence[str]) -> bool:
        """``ferry gc`` forgot the task (and removed its logs) while ``logs`` read them:
        what was open here was read to its end (a forgotten task is settled); say so, and
        which logs were removed before they could be read (``unread``: never found here).
        True if the end seen (``seen``: the task as last seen) is SUCCEEDED."""
        ended = seen.attempt == attempt and seen.terminal
        head = f"task {seen.id}{f' ({seen.state.value})' if ended else ''} was forgotten (ferry gc)"
        if seen.attempt == attempt and not ended:
            head += " before its end was seen: its outcome is not known"
        else:  # (or that attempt was retried: not a success)
            head += " as its logs were read"
        written = _written(seen) if ended else None
        gone = [name for name in unread if written is None or written[name]]
        if gone:
            maybe = "" if written is not None else ", if it wrote any,"
            verb = "was" if len(gone) == 1 else "were"
            self.notice(f"warning: {head}; its {' and '.join(gone)}{maybe} {verb} removed unread")
        else:
            self.notice(f"{'' if ended else 'warning: '}{head}; its logs were read whole")
        return ended and seen.state is State.SUCCEEDED

    def _logs_kept_elsewhere(
        self, task: Task, attempt: int, *, stream: str | None, tail: int | None,
        as_json: bool, merged: bool,
    ) -> bool:  # fmt: skip
        """The logs of a task another host ran: the tails its host kept in the database
        with the task's end, shown as a log is (the streams one after the other: their
        order is not kept), and where the whole log is. Not settled there yet: none."""
        import tempfile

        from ferry.app.logs import print_logs

        owner = None if task.runner is None else task.runner.get("host_id")
        tails = self.store.log_tails(task.id, attempt)
        written = _written(task) if task.attempt == attempt else None
        if not tails and written is not None and not any(written.values()):
            return task.state is State.SUCCEEDED  # (it wrote nothing: there is no log)
        if not tails:
            raise NotFoundError(
                f"task {task.id} ran on host {owner}: its log is there ('ferry logs' on it)",
                code="logs.other_host",
                details={"task": task.id, "host": owner},
            )
        with tempfile.TemporaryDirectory(prefix="ferry-logs-") as scratch:
            paths = log_paths(scratch, task.id, attempt)
            os.makedirs(os.path.dirname(paths[0]))
            kept = [tails.get(name, (b"", 0)) for name in ("stdout", "stderr")]
            for path, (data, _) in zip(paths, kept, strict=True):
                with open(path, "wb") as file:
                    file.write(data)
            # Each tail at its offset in its stream; what only its host keeps is said
            # dropped before it, as --log-max's hole is.
            (out, out_size), (err, err_size) = kept
            print_logs(paths, stream=stream, tail=tail, follow=False, settled=lambda: True,
                       as_json=as_json, merged=merged, task_id=task.id, attempt=attempt,
                       bases=(out_size - len(out), err_size - len(err)),
                       kept=f"the whole log is on host {owner}")  # fmt: skip
        cut = [f"the last {len(data):,} bytes of {name}'s {size:,}"
               for name, (data, size) in sorted(tails.items()) if len(data) < size]  # fmt: skip
        shown = f": shown, {' and '.join(cut)}" if cut else ""
        self.notice(f"task {task.id} ran on host {owner}, where its whole log is ('ferry logs'"
                    f" there); the database keeps the tail of each stream with its end{shown}")  # fmt: skip
        current = self.store.get(task.id) or task
        return current.attempt == attempt and current.state is State.SUCCEEDED

    def lease_info(self) -> dict[str, Any]:
        from ferry.proc.liveness import probe
        from ferry.storage import LEASE_TTL_S

        lease = self.session.leases(ttl_s=LEASE_TTL_S).read()
        if lease is None:
            return {"epoch": self.store.highest_epoch, "holder": None}
        info = lease.to_json()
        if lease.holder is not None:
            info["holder_liveness"] = str(probe(lease.holder))
            info["holder_alive"] = info["holder_liveness"] == "ALIVE"
        return info

    def lease_reset(self) -> str | None:
        from ferry.storage import LEASE_TTL_S

        self.store.refresh()
        moved = self.session.leases(ttl_s=LEASE_TTL_S).reset(min_epoch=self.store.highest_epoch)
        return None if moved is None else str(moved)

    # ---- acting on a task ----------------------------------------------------------

    def cancel(self, prefix: str, *, listed: State | None = None) -> Task:
        """``listed``: the state the task was selected by (``--state``): one that has
        left it when the cancel is decided is left alone (``task.moved``), not cancelled
        as ``cancel ID`` would (a task claimed after ``--state QUEUED`` listed it)."""
        task = resolve_task(self.store, prefix)
        for _ in range(RACE_TRIES):
            _refuse_moved(task, listed)
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
            current = self._get(task.id)
            if (current.attempt, current.claim_token) != (task.attempt, task.claim_token):
                # The claim the request was for has ended since (settled, and perhaps
                # retried: a new attempt nobody asked to cancel): nothing of it to stop.
                return current
            from ferry.app.recoverer import Recoverer

            return Recoverer(self.session).cancel_in_flight(current)
        raise InternalError(f"task {task.id} kept changing while it was being cancelled")

    def retry(self, prefix: str, *, force: bool, listed: State | None = None) -> Task:
        """``listed``: as for ``cancel`` (the attempt read is pinned by the write)."""
        task = resolve_task(self.store, prefix)
        _refuse_moved(task, listed)
        if not task.terminal:
            raise RefusedError(
                f"task {task.id} is {task.state}: only a settled task is retried",
                code="task.not_retryable",
                details={"task": task.id, "state": task.state.value},
            )
        if task.state is State.SUCCEEDED:  # (the code exit-codes.md has always named)
            raise RefusedError(
                f"task {task.id} SUCCEEDED: only a FAILED or CANCELLED task is retried",
                code="task.illegal_transition",
                details={"task": task.id, "state": task.state.value},
            )
        self._refuse_beside_a_live_orphan(task, force, "retry")
        # The key rules (another task with this key unsafe, in flight, or succeeded) and
        # the attempt are checked under the journal's lock.
        self.store.commit(ev.Retried(task.id, task.attempt + 1))
        return self._get(task.id)

    def resolve(self, prefix: str, *, verdict: str, force: bool) -> Task:
        """``ferry resolve``: record the operator's verdict on a FAILED or CANCELLED task
        (what it really did); its key then follows the verdict."""
        task = resolve_task(self.store, prefix)
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
        """A quarantined task's orphan may still be doing the work, and so may the
        process of one whose host was lost (its worker and supervisor killed together
        leave it running): neither a new run of it nor a verdict on it, unless the
        operator insists."""
        if force or not (task.reason in MAY_RUN_ON and task.terminal):
            return
        from ferry.app.recoverer import task_liveness
        from ferry.app.runner_state import other_host
        from ferry.core.model import Liveness

        owner = other_host(self.store, task)
        if owner is not None:  # (no probe here can see it: it may well be alive)
            orphan = (
                "its quarantined orphan ran"
                if task.reason is Reason.QUARANTINED_ORPHAN_ALIVE
                else "it was running when its host was lost, and may run on still,"
            )
            raise OperatorNeededError(
                f"task {task.id}: {orphan} on host {owner}, where only a ferry can see"
                f" whether it is still alive; {action} it there, or with --force",
                code="task.orphan_alive",
                details={"task": task.id, "host": owner},
            )
        if task_liveness(task, self.home) is not Liveness.DEAD:
            raise OperatorNeededError(
                f"task {task.id}: its orphan is still alive; stop it with "
                f"'ferry kill {task.id}' or {action} with --force",
                code="task.orphan_alive",
                details={"task": task.id},
            )

    def kill(self, prefix: str, signame: str) -> dict[str, Any]:
        from ferry.app.recoverer import kill_orphan

        sig = _parse_signal(signame)
        return kill_orphan(self.session, resolve_task(self.store, prefix), sig)

    def gc(self, *, older_than_s: float, states: Sequence[str], dry_run: bool) -> GcReport:
        """``ferry gc``: forget settled tasks ended before the cut-off (:mod:`ferry.app.gc`)."""
        from ferry.app.gc import GcReport, gc

        if self.session.missing:  # (nothing to forget; nothing made: see ``recover``)
            return GcReport(dry_run=dry_run, cutoff_s=time.time() - older_than_s, states=states)
        return gc(self.session, older_than_s=older_than_s, states=states, dry_run=dry_run)

    # ---- the queue's groups (ferry.app.queueing) --------------------------------------

    def groups(self) -> list[dict[str, Any]]:
        from ferry.app.queueing import groups

        return groups(self.store)

    def group_set(self, name: str, jobs: int) -> dict[str, Any]:
        from ferry.app.queueing import group_set

        return group_set(self.store, name, jobs)

    def pause(self, names: Sequence[str]) -> list[dict[str, Any]]:
        from ferry.app.queueing import pause

        return pause(self.store, names)

    def resume(self, names: Sequence[str]) -> list[dict[str, Any]]:
        from ferry.app.queueing import pause

        return pause(self.store, names, resume=True)

    # ---- the shared database ---------------------------------------------------------

    def db_init(self) -> dict[str, Any]:
        """``ferry db init``: create or upgrade the schema (idempotent)."""
        from ferry.storage.postgres import schema
        from ferry.storage.postgres.connect import Database

        url = self._database_url()
        db = Database(url)
        try:
            db.check_durable()
            with db.transaction() as conn:
                conn.execute("SELECT 1")
            with db.mapped():
                before, after = schema.migrate(db.connection())
        finally:
            db.close()
        return {"schema_version": after, "previous_version": before, "created": before == 0}

    def db_status(self) -> dict[str, Any]:
        from ferry.storage.postgres.store import PgStore

        self._database_url()
        store = self.store
        assert isinstance(store, PgStore)
        return store.status()

    def _database_url(self) -> str:
        if self.session.database is None:
            raise UsageError(
                "no database named: give --database URL or set FERRY_DATABASE_URL",
                code="usage.no_database",
            )
        return self.session.database.url

    # ---- the journal ---------------------------------------------------------------

    def journal_verify(self) -> dict[str, Any]:
        from ferry.storage.local.maintenance import verify

        self._refuse_missing("verify")
        return verify(os.path.join(self.home, "journal"))

    def journal_repair(self) -> dict[str, Any]:
        from ferry.storage.local.maintenance import repair

        self._refuse_missing("repair")
        return repair(os.path.join(self.home, "journal"))

    def journal_compact(self, *, wait: bool = True) -> dict[str, Any]:
        """``wait=False``: another compaction holding the lock does the work; say so."""
        self._refuse_missing("compact")
        skipped: dict[str, Any] = {
            "snapshot_seq": None,
            "removed": [],
            "skipped": "another compaction is running",
        }
        if not wait and self.session.database is None:
            from ferry.storage.local.store import compaction_running

            if compaction_running(self.home):
                return skipped  # (before opening the store: that alone costs)
        report = self.store.compact(wait=wait, on_lock_wait=self._compact_wait_notice)
        return skipped if report is None else report  # (None: only when not waiting)

    def _refuse_missing(self, what: str) -> None:
        if self.session.missing:
            raise StateDirMissingError(
                f"no state directory at {self.home}: nothing to {what}",
                details={"home": str(self.home)},
            )

    def _compact_wait_notice(self) -> None:
        self.notice(
            "waiting for compact.lock: another compaction is in progress (one that was"
            " stopped holds it until it is continued or killed)"
        )

    def journal_dump(self, *, from_seq: int) -> None:
        from ferry.storage.local.maintenance import dump

        self._local_journal("dump", "reads")
        self._refuse_missing("dump")
        dump(os.path.join(self.home, "journal"), from_seq, sys.stdout.buffer)

    def journal_salvage(self, *, dry_run: bool) -> dict[str, Any]:
        """``ferry journal salvage``: see :mod:`ferry.storage.local.salvage`."""
        from ferry.storage.local.salvage import salvage

        self._local_journal("salvage", "works on")
        return salvage(self.home, dry_run=dry_run, on_lock_wait=self.session._lock_wait_notice)

    def _local_journal(self, command: str, does: str) -> None:
        """The journal commands are the local backend's: a shared database has no
        journal files."""
        if self.session.database is not None:
            raise UsageError(f"'journal {command}' {does} a local journal; a database has none",
                             code="usage.not_local")  # fmt: skip


_STREAMS = ("stdout", "stderr")


def _written(task: Task) -> dict[str, bool] | None:
    """Which streams of the task's last attempt had a log, as its end's evidence says
    (a log is made at its stream's first byte): ``log_bytes`` from its supervisor, or
    the tails recovery salvaged (None: the file was not there). None: not known (still
    running, or an end that says neither: then nothing is called missing)."""
    if not task.terminal:
        return None
    evidence = task.evidence
    logged = evidence.get("log_bytes")
    if isinstance(logged, dict):
        return {stream: bool(logged.get(stream)) for stream in _STREAMS}
    salvage = evidence.get("salvage")
    if isinstance(salvage, dict) and "stdout_tail" in salvage:
        return {stream: salvage.get(f"{stream}_tail") is not None for stream in _STREAMS}
    return None


def _lost_logs(paths: tuple[str, str], task: Task) -> list[str]:
    """The logs of the task's settled attempt that were written and are not there."""
    written = _written(task)
    if written is None:
        return []
    return [
        os.path.basename(path)
        for path, stream in zip(paths, _STREAMS, strict=True)
        if written[stream] and not os.path.exists(path)
    ]


def _parse_signal(name: str) -> int:
    text = name.upper().removeprefix("SIG")
    if text.isascii() and text.isdigit():
        if len(text) <= 3 and 0 < int(text) < signal.NSIG:
            return int(text)
    else:
        try:
            return int(signal.Signals["SIG" + text])
        except KeyError:
            pass
    raise UsageError(f"unknown signal {shown(name)}", code="usage.bad_signal")


def _wait_of(opts: Mapping[str, Any]) -> float | None:
    """The seconds of a ``--not-before +SECONDS`` (checked by ``build_spec``), else None."""
    text = opts.get("not_before")
    if not isinstance(text, str):
        return None
    from ferry.app.queueing import not_before_wait

    return not_before_wait(text)


def _dependencies_first(
    events: Mapping[str, ev.Submitted], skipped: Mapping[str, str], source: str
) -> list[ev.Submitted]:
    """The batch's SUBMITTED records, each after those of its batch it comes after (a
    task of the batch not queued because its key succeeded: the one that did it stands
    in for it). A cycle: ``task.dependency_cycle``, nothing written."""
    from ferry.app.queueing import cycle_error
    from ferry.core._value import replace
    from ferry.core.queue import topological

    fixed = {}
    for task_id, event in events.items():
        after = tuple(dict.fromkeys(skipped.get(dep, dep) for dep in event.spec.after))
        spec = event.spec if after == event.spec.after else replace(event.spec, after=after)
        fixed[task_id] = ev.Submitted(task_id, spec, event.created_at, event.wait_s)
    order = topological((task_id, event.spec.after) for task_id, event in fixed.items())
    if order is None:
        raise cycle_error(source)
    return [fixed[task_id] for task_id in order]


def _refuse_moved(task: Task, listed: State | None) -> None:
    """A task selected by its state (``--state``) that is in another now is left alone."""
    if listed is not None and task.state is not listed:
        raise RefusedError(
            f"task {task.id} is {task.state} now, not {listed} as it was listed: left alone",
            code="task.moved",
            details={"task": task.id, "state": task.state.value, "listed": listed.value},
        )
