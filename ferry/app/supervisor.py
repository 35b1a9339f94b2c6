"""A task's supervisor: the small process that holds one task and nothing else.

Forked by the launcher (``run``, ``claim`` or ``work``: :mod:`ferry.app.launch`), never
exec'd: it costs a fork, not an interpreter start; and once a task is over (its end
durable), it may be given the next one (``work`` keeps a supervisor per slot: a fork
costs 4 to 8 ms here, more than most of a short task's life). It holds one task at a
time, never more. For each, it plans the task, waits for the
launcher to make the intent durable, spawns the child, captures its output (the log,
and the live passthrough for ``run``), beats the heartbeat, forwards signals, applies
``--timeout`` and ``--kill-grace``, and produces the task's SPAWNED and SETTLED.

It is a session of its own (the terminal's Ctrl-C reaches ``ferry run``, which
forwards it here) and the child holds only its pipes: so the death of its launcher
(kill -9, OOM) neither signals, pauses nor cuts off the task.

The conversation with the launcher (:mod:`ferry.proc._control`; S: supervisor, L: launcher)::

    L -> S  claiming {token}                        a claim naming S is being written
    L -> S  unclaimed                               ... it was not (nothing to claim)
    L -> S  task     {task, token, go, until}       the task (its snapshot record),
                                                    claimed (``work``, ``claim``) or
                                                    not yet (``run``: with its intent)
    S -> L  plan     {record, error, warnings}     the DISPATCHING (or SETTLED FAILED):
                                                    written with the claim already, for
                                                    a task without pinned inputs
    L -> S  go {until} | abort                      the intent is durable / do not run
    S -> L  running  {record}                       SPAWNED is due: L writes it (a
                                                    task that ends sooner: its SPAWNED
                                                    comes with its end)
    S -> L  beat                                    at each heartbeat: L looks at the
                                                    journal (a cancel, a STALE mark)
    L -> S  until    {until}                        L's beat of the task was taken
    L -> S  durable  {type}                         (L wrote a record of ours)
    L -> S  stop     {signal, cancel, evidence}     a cancel request; work stopping
    S -> L  ended    {records, exit_status, error}  the end, for L's group commit
    L -> S  ack                                     durable: S waits for its next task
                                                    (the channel's end: it exits)

Without its launcher (the channel ends) the supervisor writes its own records, as the
owner of the claim token: it opens the store itself (only then, or on a shared
database to beat for a late launcher: a supervisor whose launcher lives never reads
the local journal), catches up on what the launcher may have
written before it died (a record the journal already holds is not written twice: the
token fences it), and from then on polls the journal at each heartbeat for a cancel
request and a STALE mark, as a runner did. Ended before the launcher wrote the intent
(or while it was the last thing written): nothing was started, and the claim goes back
to the queue (RELEASED, not counted). Ended while a claim naming it was being written
(``claiming``), before it was told the outcome: it looks the claim up by its token
(once no connection of the launcher's may still be writing it), and releases it so.

On a shared database, ``until`` is the supervisor's deadline (CLOCK_BOOTTIME): the
TTL after the last write that showed its task alive to the other hosts was sent (the
claim, the intent, a beat; ``Launch.until``). Its launcher late by half the TTL, it
beats the task itself; past the deadline (the database out of reach), it stops the
task, or does not start it: the other hosts may decide it once it has gone unheard for
twice the TTL and its kill grace (docs/postgres.md, "A task's beats are its own"). On
one host there is no deadline (``until`` is null).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import time

from ferry.app import collector, outbox
from ferry.app.runner import (
    DEPOSED,
    SPAWNED_AFTER_S,
    Plan,
    before_spawn_event,
    cancel_stands,
    error_to_json,
    exit_status_of,
    heartbeat_path,
    log_paths,
    plan_task,
    settle_event,
    spawn_failed_event,
    stop_escapees,
    unstarted_end,
)
from ferry.core import events as ev
from ferry.core.errors import EX_FERRY_FAILED, DatabaseUnavailableError, FerryError, RefusedError
from ferry.core.fold import task_from_record
from ferry.core.model import State, Task
from ferry.failpoints import failpoint, supervisor_armed
from ferry.proc import alivelock
from ferry.proc._control import Channel, ChannelClosed, Socket
from ferry.proc._outputs import SignalTrap, descriptor_open
from ferry.proc.logorder import order_path
from ferry.proc.process import boot_clock, identity_of
from ferry.storage.claiming import dispatching_with_claim

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Why a task was stopped, or not started, on a shared database (its evidence).
UNHEARD = "no beat of the task reached the database for its TTL: other hosts could take it over"
# While a supervisor of a leader's claim (one host) waits for its task or its go, it
# looks at the lease this often: another leader took it, and the claim goes back,
# nothing started (``deposed``; its evidence: runner.DEPOSED).
LEASE_LOOK_S = 1.0
# How long a supervisor waits for its launcher to confirm that its end is durable,
# before it writes the end itself (a launcher stopped with SIGSTOP, a frozen
# container). A record the launcher then writes too is refused by the token.
ACK_WAIT_S = 10.0
# Without its launcher, a supervisor that cannot open the store (no descriptor left, a
# stopped process holding the journal's lock) tries again this often, for this long,
# before an end (or a release) is given up to recovery.
STORE_OPEN_RETRY_S = 1.0
STORE_OPEN_PATIENCE_S = 300.0
# An end the store cannot take now (the database out of reach): kept on this host,
# and tried again after OUTBOX_RETRY_S, doubling up to OUTBOX_RETRY_MAX_S, for
# OUTBOX_PATIENCE_S; then the supervisor exits and ``ferry recover`` delivers it.
OUTBOX_RETRY_S = 0.2
OUTBOX_RETRY_MAX_S = 5.0
OUTBOX_PATIENCE_S = outbox.patience_s()  # (its launcher checked it before the fork)


def main(
    sock: Socket,
    home: str,
    environ: dict[str, str],
    *,
    passthrough: bool,
    stdout_echo_fd: int,
    beat_ttl_s: float,
) -> int:
    """The supervisor's whole life, in the forked child (the caller ``os._exit``s with
    the returned status: the launcher's stack, copied by the fork, is never unwound;
    it has frozen the inherited garbage and closed the inherited descriptors). It
    serves the tasks its launcher gives it, one at a time, until the launcher has no
    more for it (the channel ends) or is gone."""
    os.setsid()  # not in the launcher's group: the terminal's signals are for it
    supervisor_armed()  # failpoints armed for supervisors only, from here on
    channel = Channel(sock)
    launcher = os.getppid()
    given: str | None = None  # the heartbeat file of our last task, its end durable
    with SignalTrap() as trap:
        while True:
            assignment = _next_task(channel, home, launcher)
            if assignment is None:
                return 0  # no more tasks for us (or the launcher is gone)
            task, token, go, until, epoch = assignment
            trap.drain()
            trap.received.clear()  # (a signal between tasks was for none of them)
            supervisor = Supervisor(
                channel, home, task, token, environ, trap, told_to_go=go,
                passthrough=passthrough, stdout_echo_fd=stdout_echo_fd, beat_ttl_s=beat_ttl_s,
                given=given, epoch=epoch,
            )  # fmt: skip
            supervisor.heard(until)
            supervisor.run()
            if supervisor.orphaned:
                return 0
            given = supervisor.held  # (acked: the next task gets it, if nothing holds it)


def _next_task(
    channel: Channel, home: str, launcher: int
) -> tuple[Task, str, bool, float | None, int] | None:
    """The next task, its claim token, whether it may be spawned once planned (``go``
    with the task: its DISPATCHING was written with its claim), its deadline as of
    its claim (``Launch.until``) and the epoch of the lease its launcher claimed it
    under (0: none, or a shared database); None: no more."""
    claiming: str | None = None  # a claim naming us is being written with this token
    epoch = 0
    while True:
        try:
            wait_s = LEASE_LOOK_S if claiming is not None and epoch > 0 else None
            message = channel.wait_for(("task", "claiming", "unclaimed"), wait_s)
        except ChannelClosed:
            if claiming is not None:
                _release_unstarted(home, claiming, launcher)
            return None
        if message is None:  # (a claim of a leader's, and no task yet: still its leader?)
            if claiming is not None and deposed(home, epoch):
                _release_unstarted(home, claiming, launcher, why=DEPOSED)
                return None
            continue
        if message["t"] == "task":
            task, token = task_from_record(message["task"]), str(message["token"])
            return task, token, bool(message.get("go")), message.get("until"), epoch
        claiming = str(message["token"]) if message["t"] == "claiming" else None
        epoch = int(message.get("epoch") or 0) if claiming is not None else 0


def deposed(home: str, epoch: int) -> bool:
    """Has another leader taken the lease since the launcher claimed under ``epoch``
    (one host)? Its launcher then writes nothing more (fenced), and a claim of its
    not yet started would hold a slot for as long as it stays stopped (Ctrl-Z)."""
    if epoch <= 0:
        return False
    from ferry.storage.local.lease import epoch_at

    return epoch_at(os.path.join(home, "lease.json")) > epoch


def _release_unstarted(
    home: str,
    token: str,
    launcher: int,
    why: str = "its launcher died before it was given the task: nothing was started",
) -> None:
    """The launcher died while (or just after) writing a claim naming us, before it told
    us which task (or another leader took its lease meanwhile: ``why``): if the claim
    was written, nothing was started under it; it goes back to the queue (cancelled, if
    a cancel was asked for meanwhile). Looked up once none of the launcher's
    connections may still be writing it (``claimed_with``)."""
    store = open_store_patiently(home, STORE_OPEN_PATIENCE_S)
    if store is None:
        return  # (recovery decides the claim, if it was written)
    deadline = time.monotonic() + STORE_OPEN_PATIENCE_S
    while True:
        try:
            current = store.claimed_with(token, writer_pid=launcher)
            break
        except DatabaseUnavailableError:
            if time.monotonic() >= deadline:
                return
            time.sleep(STORE_OPEN_RETRY_S)
        except (FerryError, OSError):
            return
    event = unstarted_end(current, token, {"supervisor": why})
    if event is not None:
        with contextlib.suppress(FerryError, OSError):
            store.commit(event)


def open_store_patiently(home: str, patience_s: float) -> Any:
    """The store (None if it cannot be opened within ``patience_s``: descriptors short,
    the journal locked by a stopped process...)."""
    from ferry.app.session import open_store

    deadline = time.monotonic() + patience_s
    while True:
        try:
            return open_store(home)
        except (FerryError, OSError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(STORE_OPEN_RETRY_S)


def _open_devnull(terminal: list[int]) -> int | None:
    """/dev/null, opened to replace the ``terminal`` descriptors with. Short of
    descriptors (EMFILE), in the place of one of them (the lowest: a lack of
    descriptors is a lack of free numbers below the limit, and the lowest free one is
    taken). None if it cannot be opened even so: the descriptors are then all held
    still (the one freed, a copy of another), for no number of 0, 1 and 2 may be left
    free for a later open to take (a journal's descriptor written to as stderr)."""
    try:
        return os.open(os.devnull, os.O_RDWR)
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            return None  # (no /dev/null here: a descriptor freed would not make one)
    held = [fd for fd in terminal if descriptor_open(fd)]
    if len(held) < 2:
        return None  # (nothing to hold the freed one's number with, if the open fails)
    freed, other = held[0], held[1]
    with contextlib.suppress(OSError):
        os.close(freed)
    try:
        return os.open(os.devnull, os.O_RDWR)
    except OSError:
        with contextlib.suppress(OSError):
            os.dup2(other, freed)
        return None


def _is_claimed_intent(plan: Plan, task: Task, token: str) -> bool:
    expected = dispatching_with_claim(task, token)
    return (
        plan.env is not None and plan.error is None and expected is not None
        and plan.event.encode() == expected.encode()
    )  # fmt: skip


class Supervisor:
    def __init__(
        self,
        channel: Channel,
        home: str,
        task: Task,
        token: str,
        environ: dict[str, str],
        trap: SignalTrap,
        *,
        passthrough: bool,
        stdout_echo_fd: int,
        told_to_go: bool = False,
        beat_ttl_s: float = math.inf,
        given: str | None = None,
        epoch: int = 0,
    ) -> None:
        self.channel, self.home, self.task, self.token = channel, home, task, token
        self.epoch = epoch  # its launcher's lease's, at the claim (see deposed)
        self.environ, self.trap = environ, trap
        self.passthrough, self.stdout_echo_fd = passthrough, stdout_echo_fd
        # Opened only once the launcher is gone, or late with a beat on a shared
        # database (ferry.app.session.open_store).
        self.store: Any = None
        self.orphaned = False  # the launcher is gone: this supervisor writes its records
        # On a shared database: the task goes unheard by the other hosts (no claim or
        # beat of it taken) for beat_ttl_s after this (CLOCK_BOOTTIME), when they may
        # soon decide it. It is stopped then. Told by the launcher (Launch.until), or
        # from its own beats; infinite on one host.
        self.beat_ttl_s = beat_ttl_s
        self.beat_deadline = math.inf
        self.child = 0, 0  # its pid and group, once spawned
        self.exit_start_time = 0  # the child's start time, read as it exited
        self.spawned: ev.Spawned | None = None  # due, not yet known durable
        self.spawned_due = False  # it has run SPAWNED_AFTER_S
        self.cancelled = False  # its cancel was asked for (by the launcher, or seen here)
        self.relayed: list[int] = []  # signals its launcher got, for the task (forward)
        self.stopped_because: dict[str, Any] = {}  # the launcher's why, for the evidence
        self.warnings: list[str] = []  # for the launcher to print (an incomplete log)
        self.spawn_at = 0.0  # wall clock, just before the spawn
        self.told_to_go = told_to_go  # "go" came with the task: its claim wrote DISPATCHING
        # The heartbeat file of the task this supervisor ran before (its end durable),
        # named this task's rather than a new one made (alivelock.hold); and the one
        # this task held.
        self.given = given
        self.held: str | None = None

    # -- the life -----------------------------------------------------------------------

    def run(self) -> int:
        try:
            plan = plan_task(self.task, self.token, self.environ)
        except FerryError as failed:  # (an unreadable pinned input, say)
            self.channel.send(
                "plan", record=None, error=error_to_json(failed), warnings=[], waits=True
            )
            return EX_FERRY_FAILED
        # Told to go with the task, it goes only if its plan is the DISPATCHING its
        # claim wrote (anything else is a bug: it waits, and its launcher decides).
        goes = self.told_to_go and _is_claimed_intent(plan, self.task, self.token)
        self.channel.send(
            "plan", record=list(plan.event.encode()), error=error_to_json(plan.error),
            warnings=list(plan.warnings), waits=not goes,
        )  # fmt: skip
        if plan.env is None:
            return 0  # settled FAILED in the launcher's write of the claim
        # What spawns and watches the task (subprocess among it) is imported now, while
        # the launcher writes the intent (an fsync), not before the plan it waits for;
        # with it, the supervisor's start-up is over (collector.settle).
        import ferry.proc.supervise  # noqa: F401

        collector.settle()

        if goes:
            # Its plan out before the spawn: a launcher that never got it gives the task
            # back as not started. (One gone meanwhile reads nothing and gives nothing
            # back: this supervisor runs the task alone, as told.)
            self.channel.drain()
        if not goes and not self._wait_for_go():
            return 0
        records, exit_status, error = self._run(plan)
        self._hand_over(records, exit_status, error)
        return 0

    def _wait_for_go(self) -> bool:
        """True once the launcher says the intent is durable. Its death before that, or
        another leader's lease (``deposed``): nothing was started; the claim is
        released if it was written, and this supervisor ends (no go is taken after)."""
        wait_s = LEASE_LOOK_S if self.epoch > 0 else None
        while True:
            try:
                message = self.channel.wait_for(("go", "abort"), wait_s)
            except ChannelClosed:
                self._orphaned_before_the_spawn()
                return False
            if message is not None:
                break
            if deposed(self.home, self.epoch):
                if self._orphaned_before_the_spawn(DEPOSED):
                    self.channel.send("deposed")  # (its launcher, continued, says so)
                return False
        if message["t"] != "go":
            return False
        self.heard(message.get("until"))
        return True

    def heard(self, until: float | None) -> None:
        """Its task was heard: unheard from now, it may run until ``until`` (a later
        deadline than the one it has; the first one it is told)."""
        if until is not None and (self.beat_deadline == math.inf or until > self.beat_deadline):
            self.beat_deadline = float(until)

    def _orphaned_before_the_spawn(
        self, why: str = "its launcher died before the spawn: nothing was started"
    ) -> bool:
        """The claim given back, nothing started: True once that is written."""
        self.orphaned = True
        store = self._open_store(patiently=True)
        if store is None:
            return False  # (nothing was started: recovery decides the claim, if written)
        current = store.get(self.task.id)
        # (None: the launcher never wrote the claim, or it is decided already)
        event = unstarted_end(current, self.token, {"supervisor": why})
        if event is None:
            return False
        try:
            store.commit(event)
        except FerryError:
            return False
        return True

    def _run(self, plan: Plan) -> tuple[list[ev.Event], int, FerryError | None]:
        """Spawn and watch the task; its end's records, exit status and error."""
        from ferry.proc.supervise import SpawnFailed, SuperviseSpec, supervise

        task, token = self.task, self.token
        assert plan.env is not None
        stdout_log, stderr_log = log_paths(self.home, task.id, task.attempt)
        failpoint("before:spawn")  # DISPATCHING is durable, no child exists yet
        signum = self._signalled()
        if signum is not None:  # (for a task that does not exist yet: it starts nothing)
            event = before_spawn_event(task, token, cancelled=False, signum=signum)
            return [event], 128 + signum, None
        try:
            if self._unheard() and not self._heard_again():
                # This host was frozen or cut off since the claim, and cannot make its
                # task heard again: another host may have taken it over.
                raise SpawnFailed("other", f"not started: {UNHEARD} ({self.beat_ttl_s:g} s)")
            lock_path = heartbeat_path(self.home, task.id, task.attempt)
            try:
                lock_fd = alivelock.hold(lock_path, self.given)
                self.held = lock_path
            except OSError as e:
                message = f"cannot create the task's alive-lock: {e}"
                raise SpawnFailed("other", message, errno_=e.errno) from e
            spec = task.spec
            sup = SuperviseSpec(
                argv=spec.argv, cwd=spec.cwd, env=plan.env, timeout_s=spec.timeout_s,
                kill_grace_s=spec.kill_grace_s,
                # (heard at least three times in each TTL: one beat lost costs nothing)
                heartbeat_s=min(spec.heartbeat_s, self.beat_ttl_s / 3),
                stdout_log=stdout_log, stderr_log=stderr_log, heartbeat_path=lock_path,
                passthrough=self.passthrough, stdout_echo_fd=self.stdout_echo_fd,
                shell=spec.shell, pass_fds=(lock_fd,), order_log=order_path(stdout_log),
                pty=spec.pty, log_max_bytes=spec.log_max_bytes,
            )  # fmt: skip
            self.spawn_at = time.time()  # (a bound on the spawn from below: the task's start)
            try:
                outcome = supervise(
                    sup, on_spawned=self._on_spawned, should_stop=self._should_stop,
                    on_running=self._on_running, running_after_s=SPAWNED_AFTER_S,
                    on_exit=self._on_exit, control=_Control(self), trap=self.trap,
                )  # fmt: skip
            finally:
                alivelock.release(lock_fd)
        except SpawnFailed as failed:
            return [spawn_failed_event(task, token, failed)], failed.exit_code, failed
        stopped = outcome.timed_out or outcome.forwarded_signal or outcome.stop_signal
        cancelled = self.cancelled or self._cancel_seen()
        marker = plan.env["FERRY_TASK"]
        escaped = bool(stopped or cancelled) and stop_escapees(marker, spec.kill_grace_s)
        settled = settle_event(task, token, outcome, cancelled, escapees_stopped=escaped,
                               stopped_because=self.stopped_because)  # fmt: skip
        if outcome.log_error:
            self.warnings.append(
                f"warning: task {task.id}: its log is incomplete ({outcome.log_error})"
            )
        records: list[ev.Event] = [settled]
        if not self.spawned_due:  # it ended within SPAWNED_AFTER_S: SPAWNED goes with it
            records.insert(0, self._spawned_event(self.exit_start_time))
        elif self.spawned is not None:  # (due, not yet known durable)
            records.insert(0, self.spawned)
        return records, exit_status_of(outcome), None

    # -- the task's running -----------------------------------------------------------

    def _on_spawned(self, pid: int, pgid: int) -> None:
        # The child exists (exec'd) and SPAWNED is not yet durable: a crash here leaves
        # DISPATCHING alone, and the marker scan and the alive-lock find it.
        failpoint("after:spawn")
        self.child = pid, pgid

    def _spawned_event(self, start_time: int) -> ev.Spawned:
        pid, pgid = self.child
        task, started_at = self.task, self.spawn_at
        return ev.Spawned(task.id, task.attempt, self.token, pid, pgid, start_time, started_at)

    def _start_time(self) -> int:
        """The child's start time (its identity with its pid), read from /proc: not
        right after the spawn, where the read waits for the loader's mappings (half a
        millisecond of every short task), but once SPAWNED is due or the child exited
        (unreaped, its entry is still there). 0: unknown (also when /proc cannot be read:
        descriptors short, say; the task runs on, and ends as it ends)."""
        try:
            identity = identity_of(self.child[0])
        except (OSError, ValueError):
            return 0
        return identity.start_time if identity is not None else 0

    def _on_running(self) -> None:
        """Still running SPAWNED_AFTER_S after the spawn: SPAWNED is due."""
        self.spawned_due = True
        self.spawned = self._spawned_event(self._start_time())
        if self.orphaned:
            self._write_spawned()
        else:
            self.channel.send("running", record=list(self.spawned.encode()))

    def _on_exit(self) -> None:
        """The child exited, not yet reaped: its start time, if SPAWNED is still to
        come (with its end)."""
        if not self.spawned_due:
            self.exit_start_time = self._start_time()

    def _signalled(self) -> int | None:
        """The first signal for the task that came before its spawn: to this supervisor
        (its trap), or to its launcher (relayed). Other messages are left to the task's
        loop."""
        self.trap.drain()
        with contextlib.suppress(ChannelClosed):
            messages = self.channel.receive()
            self.channel.unread([m for m in messages if m["t"] != "signal"])
            self.relayed += [int(m["signal"]) for m in messages if m["t"] == "signal"]
        signals = [*self.trap.received, *self.relayed]
        return signals[0] if signals else None

    def _on_message(self, message: dict[str, Any]) -> int | None:
        kind = message["t"]
        if kind == "signal":  # (relayed by the launcher: _Control.take_relayed)
            self.relayed.append(int(message["signal"]))
            return None
        if kind == "stop":
            self.cancelled = self.cancelled or bool(message.get("cancel"))
            self.stopped_because.update(message.get("evidence") or {})
            return int(message["signal"])
        if kind == "durable" and message.get("type") == "SPAWNED":
            self.spawned = None
            failpoint("after:SPAWNED")
        elif kind == "until":
            self.heard(message["until"])
        return None

    def _launcher_gone(self) -> int | None:
        """The channel ended: from now on this supervisor writes its own records (the
        store opened now, or at a later heartbeat if it cannot be now: the task runs
        on whatever the journal's trouble)."""
        self.orphaned = True
        return self._should_stop()

    def _should_stop(self) -> int | None:
        """At each heartbeat: a cancel request stops the task; a STALE mark is answered
        by RESUMED. While the launcher lives it looks (told of each beat: it answers a
        STALE mark only while we beat); once it is gone, we do. On a shared database,
        a task unheard past its deadline is stopped (other hosts may decide it once it
        has been unheard for twice the TTL and its kill grace, twice), and a launcher
        late with its beats (paused, busy with a long pass) is stood in for: only a
        database out of reach stops the task."""
        if self._unheard():
            return self._stop_unheard()
        if not self.orphaned:
            if not self.channel.pending:  # (a silent launcher: one unread beat is enough)
                self.channel.send("beat")
            self.channel.flush()
            if not self._launcher_late():
                return None
        return self._on_its_own()

    def _launcher_late(self) -> bool:
        """On a shared database: half the TTL gone since the task was last heard."""
        if self.beat_deadline == math.inf:
            return False  # (one host: no deadline, no clock read)
        return boot_clock() >= self.beat_deadline - self.beat_ttl_s / 2

    def _heard_again(self) -> bool:
        """Past its deadline: heard again, by a beat of our own (its claim still ours)."""
        return self._on_its_own() is None and not self._unheard()

    def _on_its_own(self) -> int | None:
        """Beat the task ourselves, fenced by our claim token, and do what the store asks
        of it (a cancel, a STALE mark): once the launcher is gone (its SPAWNED too), or
        while it is late. Nothing that fails here may kill a running task or stop its
        beats (the database out of reach, a refused RESUMED, a journal hiccup, a lack of
        descriptors, a driver error): its deadline decides. Every call is bounded
        (``bound_calls``: a lock wait too), so that none outlasts the deadline."""
        try:
            if self._open_store() is None:
                return self._stop_unheard() if self._unheard() else None
            if self.orphaned and self.spawned_due:
                self._write_spawned()
            self.store.refresh()
            current = self.store.get(self.task.id)
            if current is None or current.claim_token != self.token:
                return None  # not our claim any more: its end will be refused
            sent = boot_clock()
            if not self.store.beat(current):
                self.stopped_because.setdefault("decided", "its beat was refused: decided")
                return signal.SIGTERM
            self.heard(sent + self.beat_ttl_s)
            if cancel_stands(self.store, self.task.id, self.token):
                self.cancelled = True
                return signal.SIGTERM
            if current.state is State.STALE:
                self.store.commit(ev.Resumed(self.task.id, self.task.attempt, self.token))
        except Exception:
            return self._stop_unheard() if self._unheard() else None
        finally:
            if not self.orphaned and self.store is not None:
                # (its launcher writes the rest: a connection kept by each supervisor
                # of a late worker would add up)
                with contextlib.suppress(Exception):
                    self.store.close()
                self.store = None
        return None

    def _unheard(self) -> bool:
        """Past the deadline (on a shared database)."""
        return self.beat_deadline != math.inf and boot_clock() >= self.beat_deadline

    def _stop_unheard(self) -> int:
        self.stopped_because.setdefault("unheard", f"{UNHEARD} ({self.beat_ttl_s:g} s)")
        return signal.SIGTERM

    def _cancel_seen(self) -> bool:
        """At the end, without a launcher: was a cancel asked for meanwhile?"""
        if not self.orphaned or self._open_store() is None:
            return False  # (the launcher looks, when it writes the end)
        with contextlib.suppress(FerryError, OSError):
            self.store.refresh()
            return cancel_stands(self.store, self.task.id, self.token)
        return False

    def _write_spawned(self) -> None:
        if self.spawned is None or self.store is None:
            return
        with contextlib.suppress(FerryError, OSError):  # already written, or decided
            current = self.store.get(self.task.id)
            ours = current is not None and current.claim_token == self.token
            if ours and current.state is State.DISPATCHING:
                self.store.commit(self.spawned)
                failpoint("after:SPAWNED")
        self.spawned = None

    # -- the end ----------------------------------------------------------------------

    def _hand_over(
        self, records: list[ev.Event], exit_status: int, error: FerryError | None
    ) -> None:
        """The end to the launcher, for its group commit, and its word that it is
        durable; failing that (gone, or silent for ACK_WAIT_S), written here."""
        failpoint("before:SETTLED")
        if not self.orphaned:
            self.channel.send(
                "ended", records=[list(r.encode()) for r in records],
                exit_status=exit_status, error=error_to_json(error), warnings=self.warnings,
            )  # fmt: skip
            try:
                acked = self.channel.wait_for(("ack",), ACK_WAIT_S)
            except ChannelClosed:
                acked = None
            if acked is not None:
                failpoint("after:SETTLED")
                return
            self.orphaned = True
        self._write_end(records)

    def _write_end(self, records: list[ev.Event]) -> None:
        """Write the end itself (the launcher is gone or silent). When the store cannot
        take it now (the database out of reach, the disk full), the end is kept on this
        host first, durably, and delivered once the store answers again: by this
        supervisor, trying for OUTBOX_PATIENCE_S, else by the next ``ferry recover``
        here. A refusal for good (the task was decided and the result kept, or never
        ours) ends it."""
        if self._delivered(records):
            return
        self._let_go_of_the_terminal()
        failpoint("before:outbox")
        try:
            kept = outbox.keep(self.home, records)
        except OSError:
            kept = None  # (nowhere to keep it either: recovery decides the task)
        failpoint("after:outbox")
        delay_s, deadline = OUTBOX_RETRY_S, time.monotonic() + OUTBOX_PATIENCE_S
        while time.monotonic() < deadline:
            time.sleep(min(delay_s, max(0.0, deadline - time.monotonic())))
            delay_s = min(2 * delay_s, OUTBOX_RETRY_MAX_S)
            if self._delivered(records):
                if kept is not None:
                    outbox.forget(kept)
                return

    def _let_go_of_the_terminal(self) -> None:
        """Before a long wait: the task's output is all passed through; the stdio the
        supervisor shares with ``ferry run`` (a pipe into ``tee``, a CI log) is let go,
        so that whoever reads it sees its end when ``run`` ends, not minutes later.
        Never fails: short of descriptors, it lets go as best it can, or not at all
        (the end is what matters now)."""
        terminal = sorted({0, 1, 2, self.stdout_echo_fd})
        devnull = _open_devnull(terminal)
        if devnull is None:
            return
        for fd in terminal:
            if fd != devnull:
                with contextlib.suppress(OSError):
                    os.dup2(devnull, fd)
        if devnull not in terminal:  # (else it is one of them now: /dev/null is kept)
            with contextlib.suppress(OSError):
                os.close(devnull)

    def _delivered(self, records: list[ev.Event]) -> bool:
        """True once the end is written (or refused for good); False if the store
        cannot be reached or written now."""
        store = self._open_store()
        if store is None:
            return False
        try:
            outbox.deliver(store, records)
        except RefusedError:
            return True  # (not the task's any more, and no late result to keep)
        except (FerryError, OSError):
            with contextlib.suppress(Exception):
                store.close()
            self.store = None  # (opened again next time: a connection may be broken)
            return False
        failpoint("after:SETTLED")
        return True

    def _open_store(self, *, patiently: bool = False) -> Any:
        """The store, opened on first use (None if it cannot be now: descriptors short,
        the journal locked by a stopped process...). ``patiently``: keep trying for
        STORE_OPEN_PATIENCE_S, as when an end waits to be written."""
        if self.store is None:
            patience_s = STORE_OPEN_PATIENCE_S if patiently else 0.0
            self.store = open_store_patiently(self.home, patience_s)
            if self.store is not None and self.beat_deadline != math.inf:
                self.store.bound_calls()
        return self.store


class _Control:
    """The channel as the task loop's control descriptor."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.fd = supervisor.channel.fileno()
        self.done = False

    def on_readable(self) -> int | None:
        supervisor = self.supervisor
        try:
            messages = supervisor.channel.receive()
        except ChannelClosed:
            self.done = True
            return supervisor._launcher_gone()
        stop = None
        for message in messages:
            stop = supervisor._on_message(message) or stop
        return stop

    def take_relayed(self) -> list[int]:
        """The signals the launcher relayed since the last call (its own, for the task)."""
        relayed, self.supervisor.relayed = self.supervisor.relayed, []
        return relayed
