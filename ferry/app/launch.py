"""Launching tasks: a supervisor per task, forked by the command that runs it.

``run``, ``claim`` and ``work`` (the launchers) never hold a task's child themselves:
each task gets a supervisor (:mod:`ferry.app.supervisor`), forked from the launcher, that
plans, spawns and watches it. The launcher writes the journal records, its own
(CLAIMED, naming the supervisor as the task's runner) and the supervisor's (SPAWNED,
SETTLED, handed over the control channel), so that they share its group commits; it
asks the supervisor to stop the task on a cancel request, and answers STALE marks.
When the launcher dies, the supervisor carries on alone (see its module).

Why a fork and not a new interpreter: 10 to 40 ms per task here. Why this is safe:
the launchers are single-threaded when they fork (``work``'s loop is one thread), so
no lock held by another thread is copied into the child held for ever; the child
drops every inherited descriptor but its channel and stdio at once.

:class:`Launch` is one supervisor seen from its launcher; :func:`run_foreground` is
the launcher of ``run`` and ``claim`` (one task, its output passed through).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType

from ferry import failpoints
from ferry.app import collector, outbox
from ferry.app.runner import (
    DEPOSED,
    RunResult,
    before_spawn_event,
    cancel_stands,
    child_environ,
    error_from_json,
    home_id,
    unstarted_end,
)
from ferry.core import events as ev
from ferry.core.errors import (
    EX_FERRY_FAILED,
    EX_TEMPFAIL,
    FerryError,
    InternalError,
    Interrupted,
    RefusedError,
    TaskFateUnknown,
)
from ferry.core.fold import fold_event, task_to_record
from ferry.core.model import State, Task
from ferry.core.spec import TaskSpec
from ferry.proc._control import (
    FRAME_BYTES,
    Channel,
    ChannelClosed,
    channel_pair,
    close_inherited_descriptors,
    encode,
)
from ferry.proc._outputs import SignalTrap, fork_untrapped
from ferry.proc.process import ProcessIdentity, boot_clock, identity_of
from ferry.storage.claiming import dispatching_with_claim

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ferry.app.session import Session
    from ferry.storage import TaskStore

    Record = tuple[str, dict[str, Any]]

_NO_SPEC = TaskSpec(argv=("-",), cwd="/")  # the task of an idle supervisor (none)
# A supervisor reaped this long after its channel ended, at most (it exits at once).
REAP_WAIT_S = 5.0
# On a shared database, how long a task of ``run`` may go unheard before its supervisor
# stops it (``claim`` and ``work``: their ``--lease-ttl``; the same default).
RUN_BEAT_TTL_S = 30.0


def beat_ttl(session: Session, ttl_s: float) -> float:
    """How long a task may go unheard before its supervisor stops it: ``ttl_s`` on a
    shared database (other hosts decide it after twice that); never on one host."""
    return ttl_s if session.database is not None else math.inf


def _wait_for_exit(pid: int, timeout_s: float) -> None:
    """Until our child ``pid`` has exited (not reaped), or ``timeout_s``: woken by its
    pidfd at once (a sleep of 5 ms between polls cost every ``ferry run`` 5 ms, as its
    supervisor is still exiting when run first looks); a poll where there is none."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # (not Linux 5.3+; or gone: reaped elsewhere)
        time.sleep(min(timeout_s, 0.005))
        return
    try:
        select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)


class SupervisorDied(FerryError):
    """The task's supervisor died before its plan, or before its go left (``kill -9``
    of it, or a crash): it started nothing (exit 125 for ``run``)."""

    code = "supervisor.died"
    exit_code = EX_FERRY_FAILED


class SupervisorDiedAfterGo(TaskFateUnknown):
    """The task's supervisor died after its go was sent, before the task's end was
    known: the task may have started, and recovery decides it (exit 3 for ``run``)."""

    code = "supervisor.died"


class Launch:
    """A supervisor, seen from its launcher, and the task it holds now: what it has
    said, and how to answer it. The launcher polls it (``poll``) when its channel is
    readable. Once its task's end is durable (``ack``), it may be given another
    (``assign``): ``work`` keeps one per slot."""

    def __init__(
        self,
        home: str,
        environ: dict[str, str],
        *,
        passthrough: bool = False,
        stdout_echo_fd: int = 1,
        beat_ttl_s: float = math.inf,
    ) -> None:
        """``beat_ttl_s``: on a shared database, how long its task may go unheard (no
        claim or beat of it taken) before the supervisor stops it; infinite: never."""
        self.home_id = home_id(home)  # (before the fork: an unreadable home raises here)
        ours, theirs = channel_pair()
        for stream in (sys.stdout, sys.stderr):  # our buffered bytes must not be copied
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        try:
            pid = fork_untrapped()
        except OSError:  # (EAGAIN: out of processes; ENOMEM)
            ours.close()
            theirs.close()
            raise
        if pid == 0:  # the supervisor: never returns into the launcher's code
            status = EX_FERRY_FAILED
            try:
                # Inherited state that is not ours first (the launcher's signal wakeup
                # descriptor went at the fork: fork_untrapped): its garbage (frozen: a
                # collection could close descriptors we reuse), its descriptors (a
                # launcher short of them would leave none to import with). Then the
                # supervisor's own modules: the child's to load, beside the launcher's
                # next steps, not before them.
                gc.freeze()
                close_inherited_descriptors({0, 1, 2, theirs.fileno()})
                from ferry.app import supervisor

                status = supervisor.main(
                    theirs, home, environ, passthrough=passthrough,
                    stdout_echo_fd=stdout_echo_fd, beat_ttl_s=beat_ttl_s,
                )  # fmt: skip
            finally:
                os._exit(status)
        theirs.close()
        collector.settle()  # (start-up is over; the supervisor's is once it has planned)
        failpoints.companion(pid)
        self.pid = pid
        self.reaped = False
        try:
            identity = identity_of(pid)
            if identity is None:  # (it exists: it is our unreaped child)
                raise InternalError(f"cannot read the new supervisor's identity (pid {pid})")
        except BaseException:  # (EMFILE, say) told nothing, it exits once our end closes
            ours.close()
            self.reap()
            raise
        self.identity: ProcessIdentity = identity
        self.channel = Channel(ours)
        self.beat_ttl_s = beat_ttl_s
        # (boot_clock) when the last write that showed its task alive was sent
        self.heard_sent: float | None = None
        self.gone = False  # its channel ended (it exited, or died)
        self.deposed = False  # it gave its claim back, unstarted: another leader leads
        self.claiming: str | None = None  # the token of a claim naming it, its outcome not told yet
        self.forget()

    def forget(self) -> None:
        """It holds no task any more (its end is durable, or it was told to drop it)."""
        self.task: Task = Task(id="", spec=_NO_SPEC)  # its task now (none: id "")
        self.token = ""
        self.plan: dict[str, Any] | None = None  # its "plan" message
        self.spawned: Record | None = None  # SPAWNED, until written
        self.spawned_due = False  # the task has run long enough: SPAWNED is to be written
        self.spawned_written = False
        self.beat = False  # it beat since the launcher last looked at the journal for it
        self.warned: list[str] = []  # warnings about its end (an incomplete log)
        self.ended: dict[str, Any] | None = None  # its "ended" message, until written
        self.retry_refused: RefusedError | None = None  # (its end then goes alone)
        self.stop_sent = False
        self.claimed = False  # its claim is in the journal
        self.dispatched = False  # its DISPATCHING too (written with the claim, or after)
        self.went = False  # told to spawn
        self.exit_status: int | None = None

    def expect(self, token: str, *, epoch: int = 0) -> None:
        """A claim naming it as the runner is about to be written with ``token`` (it is
        idle). Should the launcher die before telling it the outcome (``assign`` or
        ``unexpect``), it finds out itself, and releases the claim (nothing started).
        ``epoch``: the launcher's lease's, on one host: should another leader take the
        lease before its task is started, it releases the claim too (its launcher,
        stopped, would hold it for as long as it stays so)."""
        self.claiming = token
        self.heard_sent = boot_clock()  # (the claim is sent after this)
        epoch = epoch if math.isinf(self.beat_ttl_s) else 0  # (shared database: until)
        self.channel.send("claiming", token=token, epoch=epoch)

    def unexpect(self) -> None:
        """The claim it expected was not written (nothing to claim)."""
        self.claiming = None
        self.channel.send("unclaimed")

    def runner(self) -> dict[str, Any]:
        """The runner its claim names: the supervisor, and on a shared database the TTL
        it keeps to (``beat_ttl_s``: other hosts read it before deciding its task)."""
        identity = self.identity.to_json()
        if not math.isinf(self.beat_ttl_s):
            identity["beat_ttl_s"] = self.beat_ttl_s
        else:  # (one host's journal: the home it is in; a copy of it is another)
            identity["home_id"] = self.home_id
        return identity

    def until(self) -> float | None:
        """The supervisor's deadline: the TTL after the last write that showed its task
        alive (its claim, its DISPATCHING, a beat) was sent (``heard_sent``), so before
        the database's own time of it. None: no deadline (one host)."""
        if math.isinf(self.beat_ttl_s) or self.heard_sent is None:
            return None
        return self.heard_sent + self.beat_ttl_s

    def heard(self, sent: float) -> None:
        """A beat of its running task, sent at ``sent``, was taken: its new deadline."""
        self.heard_sent = sent
        until = self.until()
        if until is not None:
            self.channel.send("until", until=until)

    def assign(self, task: Task, token: str, *, go: bool = False) -> None:
        """Give it a task to plan (it is idle: its last task's end is durable). ``go``:
        told to spawn with it, once its plan is made, without waiting for ``go``: the
        task's DISPATCHING is durable with its claim and nothing is to be written
        between (its plan must equal that record, or it waits: ``poll`` then takes the
        ``go`` back). Not with a message that does not go out at once: ``went`` says
        whether it went. (The failpoint ``before:go`` is the caller's.)"""
        self.forget()
        self.claiming = None
        self.task, self.token = task, token
        fields = {"task": task_to_record(task), "token": token, "go": go, "until": self.until()}
        body = encode("task", **fields)
        if go and (len(body) > FRAME_BYTES or self.channel.pending):
            # A large task goes in frames as the supervisor reads them (never blocking on
            # it: the launcher has others to answer; its waits flush the rest): stopped
            # meanwhile, the launcher would hold the go back with them, past its last
            # look. Its go goes apart, once the caller has looked again (``go``).
            fields["go"] = go = False
            body = encode("task", **fields)
        self.went = go
        self.channel.send_encoded(body)
        if go:
            failpoints.failpoint("after:go")

    @property
    def idle(self) -> bool:
        return not self.task.id

    # -- what it says -------------------------------------------------------------------

    def fileno(self) -> int:
        return self.channel.fileno()

    def poll(self) -> None:
        """Take in every message that arrived; ``gone`` once the channel ended."""
        try:
            messages = self.channel.receive()
        except ChannelClosed:
            self.gone = True
            return
        for message in messages:
            kind = message["t"]
            if kind == "plan":
                self.plan = message
                if message.get("waits"):
                    self.went = False  # (told to go with its task, it did not: a bug)
            elif kind == "running":
                self.spawned = _record(message["record"])
                self.spawned_due = True
            elif kind == "beat":
                self.beat = True
            elif kind == "deposed":
                self.deposed = True
            elif kind == "ended":
                self.ended = message
                self.exit_status = int(message["exit_status"])
                self.warned = list(message.get("warnings", ()))

    def wait(self, timeout_s: float | None) -> None:
        """Block until a message arrives or the channel ends (or ``timeout_s``),
        sending what waits for it meanwhile."""
        if self.gone:
            return
        try:
            messages = self.channel.wait(timeout_s)
        except ChannelClosed:
            self.gone = True
            return
        self.channel.unread(messages)
        self.poll()

    @property
    def plan_record(self) -> Record | None:
        assert self.plan is not None
        record = self.plan["record"]
        return None if record is None else _record(record)

    @property
    def plan_error(self) -> FerryError | None:
        assert self.plan is not None
        return error_from_json(self.plan["error"])

    @property
    def warnings(self) -> list[str]:
        return [] if self.plan is None else list(self.plan["warnings"])

    def due_spawned(self) -> Record | None:
        """SPAWNED, if it is due and not yet written."""
        if self.spawned_due and self.spawned is not None and not self.spawned_written:
            return self.spawned
        return None

    def end_records(self, store: TaskStore) -> list[Record]:
        """The supervisor's end as the journal needs it now (read from ``store``'s
        table; :func:`ferry.app.outbox.end_writes`): SETTLED, after its SPAWNED if the
        task is still DISPATCHING; CANCELLED if its cancel was asked for meanwhile; a
        LATE_RESULT if recovery decided the task meanwhile; nothing if the supervisor
        wrote it itself."""
        return self.end_records_for(store.get(self.task.id))

    def end_records_for(self, current: Task | None) -> list[Record]:
        """``end_records``, the task being ``current`` (as read for the write)."""
        assert self.ended is not None
        _, writes = outbox.end_writes(current, self.end_events, retry_refused=self.retry_refused)
        return [event.encode() for event in writes]

    @property
    def end_events(self) -> list[ev.Event]:
        assert self.ended is not None
        events = [ev.decode_checked(*_record(raw)) for raw in self.ended["records"]]
        return [event for event in events if event is not None]

    @property
    def end_error(self) -> FerryError | None:
        return None if self.ended is None else error_from_json(self.ended["error"])

    # -- answers --------------------------------------------------------------------------

    def go(self) -> bool:
        """Tell it to spawn its task. False if the go never left: the channel was
        closed with it still queued (the supervisor gone; it spawns only on its go).
        (The failpoint ``before:go`` is its callers', before what they look at last.)"""
        self.channel.send("go", until=self.until())
        self.went = not (self.channel.closed and self.channel.pending)
        failpoints.failpoint("after:go")
        return self.went

    def last_words(self) -> None:
        """Take in what a supervisor whose channel closed said before it went: its
        messages, then the channel's end (two reads: bounded, the peer being gone)."""
        for _ in range(2):
            self.poll()

    def abort(self) -> None:
        self.channel.send("abort")

    def written(self, record_type: str) -> None:
        """A record of the supervisor's is durable."""
        if record_type == "SPAWNED":
            self.spawned_written = True
            self.channel.send("durable", type="SPAWNED")

    def ack(self) -> None:
        """Its task's end is durable: it may take another, or exit."""
        self.channel.send("ack")
        self.forget()

    def stop(
        self, sig: int, *, cancel: bool = False, evidence: dict[str, Any] | None = None
    ) -> None:
        """Ask it to stop the task (SIGTERM, then SIGKILL after the task's grace);
        ``evidence``: why, for the task's end (``work --halt now``)."""
        self.stop_sent = True
        self.channel.send("stop", signal=sig, cancel=cancel, evidence=evidence or {})

    def forward(self, sig: int) -> None:
        """A signal ferry got (SIGINT, SIGTERM, SIGHUP), for the task: relayed to the
        supervisor, which forwards it to the task's group. Relayed as a message, not
        sent again as a signal: one signal that reached both (systemd stopping a unit,
        ``pkill -f``, a cgroup's kill) is then one request to the supervisor, not two
        (a second means "now": SIGKILL). Sent as a signal only once the channel is
        gone."""
        failpoints.failpoint("before:relay")
        self.channel.send("signal", signal=sig)
        if self.channel.closed and not self.reaped:  # (unreaped: its pid is not reused)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
        failpoints.failpoint("after:relay")

    def reap(self, timeout_s: float = REAP_WAIT_S) -> None:
        """Wait for the supervisor to exit (its channel has ended, or is about to)."""
        if self.reaped:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            left = deadline - time.monotonic()
            if pid or left < 0:
                break
            _wait_for_exit(self.pid, min(left, 0.5))
        if pid:
            self.reaped = True
            failpoints.companion(self.pid, alive=False)

    def kill(self) -> None:
        """End a supervisor whose claim was never written: it has started nothing."""
        if not self.reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def release(self) -> None:
        """Let go without waiting: close our end (the supervisor, if it still runs,
        carries on alone and writes its own records)."""
        self.channel.close()
        self.gone = True


def _record(raw: Sequence[Any]) -> Record:
    record_type, data = raw
    return str(record_type), dict(data)


# ---- run and claim: one task, in the foreground --------------------------------------


def run_foreground(
    open_store: Callable[[], TaskStore],
    home: str,
    task: Task,
    token: str,
    *,
    lead: Callable[[dict[str, Any]], Sequence[ev.Event]] = lambda runner: (),
    epoch: int = 0,
    on_claimed: Callable[[], None] = lambda: None,
    stdout_echo_fd: int = 1,
    notice: Callable[[str], None] = lambda message: None,
    on_started: Callable[[Task], None] = lambda task: None,
    beat_ttl_s: float = math.inf,
) -> RunResult:
    """``run``: fork the task's supervisor, write the claim (``lead``'s records, which
    name the supervisor as the runner, then the plan's DISPATCHING) in one commit (then
    ``on_claimed``), let it spawn, write its records as they come, and return once its
    end is durable.

    The store is opened (``open_store``: the snapshot read, the records after it
    folded) after the fork, while the supervisor plans the task and imports what
    spawns it, on the other core: ``ferry run -- true`` 44.9 -> 42.6 ms (medians of 300
    runs each, interleaved, 2026-12-05). Nothing is written before both are done; a
    signal meanwhile ends ``run`` through the ``finally`` that kills the supervisor.

    SIGINT, SIGTERM and SIGHUP are trapped from just before the intent is written:
    before the spawn they settle the task without running it; after, they are forwarded
    to the supervisor (which forwards them to the task's group). Before that (while the
    supervisor hashes pinned inputs, say) a Ctrl-C just interrupts: nothing exists yet,
    and the supervisor, which has started nothing, is killed."""
    launch = Launch(
        home, child_environ(), passthrough=True, stdout_echo_fd=stdout_echo_fd,
        beat_ttl_s=beat_ttl_s,
    )  # fmt: skip
    killed = False
    try:
        launch.assign(task, token)
        with _interruptible():
            store = open_store()
            while launch.plan is None and not launch.gone:
                launch.wait(None)
        with SignalTrap() as trap:
            foreground = _Foreground(store, launch, trap, notice, on_started)
            return foreground.run(lead, epoch, on_claimed)
    except FerryError as error:
        if launch.claimed:  # (the task exists)
            _naming(error, task)
        raise
    finally:
        if not launch.claimed and not launch.idle:
            # Its claim was never written: it started nothing. (Idle: its end is
            # durable and acked, which forgot the task, its claim flag with it; it is
            # on its way out and must not be killed on the way.)
            launch.kill()
            killed = True
        launch.release()  # (done: it exits; an error: it carries on alone)
        # (Killed: it is gone in a moment, reaped, not left a zombie of a caller that
        # lives on.)
        with ended_quietly():
            launch.reap(timeout_s=REAP_WAIT_S if launch.idle or killed else 0)


def claim_foreground(
    store: TaskStore,
    home: str,
    claim: Callable[[dict[str, Any], str], Task | None],
    *,
    epoch: int,
    on_claimed: Callable[[], None] = lambda: None,
    stdout_echo_fd: int = 1,
    notice: Callable[[str], None] = lambda message: None,
    on_started: Callable[[Task], None] = lambda task: None,
    beat_ttl_s: float = math.inf,
    renew: Callable[[], None] = lambda: None,
    renew_every_s: float | None = None,
) -> RunResult | None:
    """``claim``: fork the supervisor, have ``claim`` write a claim naming it (the store
    chooses the task; None: nothing to claim), then as ``run_foreground``: the plan (a
    task with pinned inputs: its record written now, under ``epoch``), ``on_claimed``,
    the spawn, the end. While the supervisor plans (hashing pinned inputs may take
    long), ``renew`` is called at least every ``renew_every_s``: the epoch the intent is
    written under must stay the leader's. A claim whose task is not started (an error,
    an interrupt, a lease lost, before the spawn) goes back to the queue."""
    from ferry.core.ids import new_claim_token

    launch = Launch(
        home, child_environ(), passthrough=True, stdout_echo_fd=stdout_echo_fd,
        beat_ttl_s=beat_ttl_s,
    )  # fmt: skip
    try:
        token = new_claim_token(os.urandom(10))
        launch.expect(token, epoch=epoch)  # (should we die now, it releases the claim)
        with SignalTrap() as trap:  # (a signal does not cut the claim's write short)
            task = claim(launch.runner(), token)
            trap.drain()
        if task is None:
            launch.unexpect()
        else:
            launch.assign(task, token)
            launch.claimed = True
            launch.dispatched = task.state is State.DISPATCHING
        if trap.received:  # (its claim, if one was written, goes back below)
            signum = trap.received[0]
            raise Interrupted(f"interrupted by signal {signum}", exit_code=128 + signum)
        if task is None:
            return None
        with _interruptible():
            while launch.plan is None and not launch.gone:
                launch.wait(renew_every_s)
                renew()
        with SignalTrap() as trap:
            foreground = _Foreground(store, launch, trap, notice, on_started)
            return foreground.run_claimed(epoch, on_claimed)
    except BaseException as error:
        if launch.claimed and isinstance(error, FerryError):
            _naming(error, launch.task)
        if launch.claimed and not launch.went:
            try:
                give_back(store, launch.task, launch.token, "not started: " + _why())
            except Exception:  # (let go, it releases the claim itself once it can)
                pass
            else:  # (it started nothing; one still planning may hang on a dead disk)
                with contextlib.suppress(OSError):
                    launch.kill() if launch.plan is None else launch.abort()
        raise
    finally:
        launch.release()  # (done: it exits; an error: it carries on alone)
        with ended_quietly():
            launch.reap(timeout_s=REAP_WAIT_S if launch.idle else 0)


def _naming(error: FerryError, task: Task) -> None:
    """An error of ferry's about a task names it (``details.task``, and its message): a
    script that must ``show``, ``recover`` or ``kill`` it next, beside other runs, can
    tell which. (The error a task's end carries, its command's own, as a shell's
    ``command not found``, is named in its details only: ``foreground.run_task``.)"""
    if "task" not in error.details:
        error.details["task"] = task.id
        if task.id not in error.message:
            error.message = f"task {task.id}: {error.message}"


def _why() -> str:
    error = sys.exc_info()[1]
    return getattr(error, "message", None) or type(error).__name__


def give_back(store: TaskStore, task: Task, token: str, why: str) -> None:
    """A claim whose task was never started: back to the queue, not counted (CANCELLED
    if a cancel was asked for), decided on the task as it is when written."""

    def decide(current: Mapping[str, Task | None]) -> list[ev.Event]:
        end = unstarted_end(current.get(task.id), token, {"launcher": why})
        return [] if end is None else [end]

    store.commit_against([task.id], decide)


class _CutShort(Exception):
    """A signal came after the task's end was durable: what is left is dropped."""


@contextlib.contextmanager
def ended_quietly() -> Iterator[None]:
    """The task's end is durable: what is left (the supervisor's reap, a compaction,
    safe to stop anywhere) is dropped at SIGINT, SIGTERM or SIGHUP, and the exit
    status stays the task's (a CI job cancelled as its task ended made ``run`` say 143
    of a task that SUCCEEDED: a review). Elsewhere than in the main thread: as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cut(signum: int, frame: FrameType | None) -> None:
        raise _CutShort

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            old[sig] = signal.signal(sig, cut)
    try:
        yield
    except _CutShort:
        pass
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """While nothing exists yet (the supervisor plans): SIGTERM and SIGHUP end ferry as
    SIGINT does, through its ``finally`` blocks (which end the supervisor), not by
    their default action (which would leave it planning for nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"interrupted by signal {signum}", exit_code=128 + signum)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            old[sig] = signal.signal(sig, interrupted)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _Foreground:
    def __init__(
        self,
        store: TaskStore,
        launch: Launch,
        trap: SignalTrap,
        notice: Callable[[str], None],
        on_started: Callable[[Task], None],
    ) -> None:
        self.store, self.launch, self.trap, self.notice = store, launch, trap, notice
        self.on_started = on_started
        self.task = launch.task
        self.signals_seen = 0
        self.unwritten = False  # a write of ours failed (said once)

    def run(
        self,
        lead: Callable[[dict[str, Any]], Sequence[ev.Event]],
        epoch: int,
        on_claimed: Callable[[], None],
    ) -> RunResult:
        launch = self.launch
        record = self._plan()
        launch.heard_sent = boot_clock()
        try:
            self.store.commit(*lead(launch.runner()), record, epoch=epoch)
        except RefusedError as error:
            # (Only a claim written before, not with, this commit can have had a cancel
            # requested: _before_spawn settles it CANCELLED, the table caught up.)
            if error.code != "task.cancel_requested":
                launch.abort()
                raise
        except BaseException:
            launch.abort()
            raise
        launch.claimed = True
        return self._claimed(record, on_claimed)

    def run_claimed(self, epoch: int, on_claimed: Callable[[], None]) -> RunResult:
        """The claim is written: its DISPATCHING with it (checked against the plan), or,
        for a task with pinned inputs, the plan's record now."""
        launch = self.launch
        record = self._plan()
        if launch.dispatched:
            expected = dispatching_with_claim(launch.task, launch.token)
            if expected is None or record != expected.encode():  # (a bug)
                raise InternalError(
                    f"task {launch.task.id}: its plan ({record}) is not what its claim wrote"
                )
        else:
            launch.heard_sent = boot_clock()
            try:
                self.store.commit(record, epoch=epoch)
            except RefusedError as error:
                if error.code != "task.cancel_requested":
                    launch.abort()
                    raise
                # A cancel landed while it was planned: _before_spawn settles it CANCELLED
                # (the refused commit caught the table up).
            except BaseException:
                launch.abort()
                raise
        return self._claimed(record, on_claimed)

    def _plan(self) -> Record:
        launch = self.launch
        if launch.plan is None:
            raise SupervisorDied("the task's supervisor died before it started the task")
        for warning in launch.warnings:
            self.notice(warning)
        record = launch.plan_record
        if record is None:  # the plan itself failed: nothing to write
            error = launch.plan_error
            assert error is not None
            raise error
        return record

    def _claimed(self, record: Record, on_claimed: Callable[[], None]) -> RunResult:
        """``on_claimed`` (``claim``: the lease let go) once the task is given its go,
        or will never be: a supervisor of a leader's claim gives it back when another
        leader holds the lease before its go (``deposed``), and ``claim``'s own release
        let a ``recover`` take it meanwhile."""
        launch = self.launch
        if record[0] == "SETTLED":  # a pinned input changed: settled FAILED, not run
            on_claimed()
            return RunResult(self._task(), EX_FERRY_FAILED, launch.plan_error)
        failpoints.failpoint("before:go")
        if self._before_spawn():  # (looked at last: a signal until now starts nothing)
            on_claimed()
            return RunResult(self._task(), self.before_spawn_status)
        self.on_started(self._task())  # (before the go: it precedes the task's output)
        if not launch.go():
            # Nothing started. What it said before it went first: it may have given the
            # claim back itself (another leader took the lease: ``deposed``).
            launch.last_words()
            if launch.deposed:
                raise self._gone()
            with contextlib.suppress(RefusedError):  # (the task moved meanwhile)
                give_back(self.store, self.task, launch.token, "its supervisor died before its go")
            raise SupervisorDied("the task's supervisor died before it started the task")
        self._forward_signals()  # (one since the look: right behind the go, before the
        on_claimed()  # release of claim's lease, which may take a while)
        return self._watch()

    def _before_spawn(self) -> bool:
        """A cancel landed since the claim, or ``run`` was signalled: do not start the
        task. The journal is read again first: the commit just made caught the table
        up, but ``run`` may have been stopped since (Ctrl-Z, a frozen VM), and a cancel
        made meanwhile started the task it then killed."""
        self.store.refresh()
        current = self._task()
        cancelled = current.cancel_requested and current.claim_token == self.launch.token
        self.trap.drain()
        if not cancelled and not self.trap.received:
            return False
        signum = None if cancelled else self.trap.received[0]
        event: ev.Event | None
        if cancelled or current.claimed_by == "run":
            event = before_spawn_event(
                self.task, self.launch.token, cancelled=cancelled, signum=signum
            )
        else:  # (a task of the queue: back to it)
            why = f"not started: claim got signal {signum}"
            event = unstarted_end(current, self.launch.token, {"launcher": why})
        self.before_spawn_status = 128 + (signal.SIGTERM if signum is None else signum)
        try:
            if event is not None:  # (then the supervisor may go: a crash between leaves
                self.store.commit(event)  # it to find the task settled, and do nothing)
        except RefusedError as error:
            if cancelled or error.code != "task.cancel_requested":
                raise
            # A cancel landed since the table was read: the end is the cancel's.
            self.store.commit(before_spawn_event(self.task, self.launch.token, cancelled=True))
        self.launch.abort()
        return True

    def _watch(self) -> RunResult:
        launch, store = self.launch, self.store
        wakeup_fd = self.trap.wakeup_fd
        watched: list[Any] = [launch.channel.sock]
        if wakeup_fd is not None:
            watched.append(wakeup_fd)
        while True:
            writable = [launch.channel.sock] if launch.channel.pending else []
            ready, out, _ = select.select(watched, writable, [])
            if out:
                launch.channel.flush()
            if wakeup_fd is not None and wakeup_fd in ready:
                self._forward_signals()
            launch.poll()
            spawned = launch.due_spawned()
            if spawned is not None and launch.ended is None and self._write_started(spawned):
                launch.written("SPAWNED")
            if launch.ended is not None:
                return self._end()
            if launch.gone:
                raise self._gone()
            if launch.beat:  # (at the task's heartbeat)
                watch_journal(store, launch)

    def _gone(self) -> FerryError:
        """Its supervisor gone before the task's end was known: died (recovery decides
        the task); or it gave its claim back before the spawn (a supervisor of a
        leader's claim does once another leader took the lease: ``deposed``), as it said
        once that was written: nothing was started, the task went back to the queue
        (75), whatever became of it since."""
        if self.launch.deposed:
            return FerryError(
                f"task {self.task.id} went back to the queue before it started: {DEPOSED}",
                code="lease.lost",
                exit_code=EX_TEMPFAIL,
            )
        return SupervisorDiedAfterGo(
            "the task's supervisor died before the task ended; 'ferry recover' decides the task"
        )

    def _forward_signals(self) -> None:
        self.trap.drain()
        for sig in self.trap.received[self.signals_seen :]:
            self.launch.forward(sig)
        self.signals_seen = len(self.trap.received)

    def _end(self) -> RunResult:
        launch, store = self.launch, self.store
        error, status = launch.end_error, launch.exit_status
        for warning in launch.warned:
            self.notice(warning)
        assert status is not None
        try:
            write_end(store, launch)
        except FerryError as failed:
            return self._end_not_written(failed, status, error)
        task = self._task()
        launch.ack()
        return RunResult(task, status, error)

    def _write_started(self, spawned: Record) -> bool:
        """SPAWNED written (or refused: the supervisor wrote it, once we were silent):
        True, and the supervisor is told it is durable. Not written (a journal or a
        database that fails ``run`` now): False, and the supervisor keeps it, to write
        it with its end; the task runs on, and so does run's wait for it."""
        try:
            self.store.commit(spawned)
        except RefusedError:
            pass
        except FerryError as failed:
            if not self.unwritten:
                self.notice(f"could not write that task {self.task.id} started ({failed.message})")
            self.unwritten = True
            return False
        return True

    def _end_not_written(
        self, failed: FerryError, status: int, error: FerryError | None
    ) -> RunResult:
        """The task ran and ended, and its end could not be written here (the journal
        failed ``run``'s handle, the database is out of reach): its supervisor, let go
        unacknowledged, keeps the end and writes it itself. ``run`` passes the task's
        status through, with the task as that end makes it (125 or 75 would tell a
        script that retries on them to run the task again)."""
        self.notice(
            f"task {self.task.id} ended (exit {status}), but its end could not be written"
            f" here ({failed.message}): its supervisor keeps it and writes it"
        )
        # (the task as this process last knew it, its end folded on: what the end will
        # make it, as far as it is known here; its seq and times are this moment's)
        task = self.task
        with contextlib.suppress(FerryError, OSError):  # (a database read: out of reach)
            task = self.store.get(self.task.id) or task
        with contextlib.suppress(Exception):  # (folded already: the failed write's own)
            for event in self.launch.end_events if not task.terminal else ():
                if isinstance(event, ev.Spawned | ev.Settled):
                    task = fold_event(task, event, task.updated_seq, time.time())
        return RunResult(task, status, error)

    def _task(self) -> Task:
        task = self.store.get(self.task.id)
        assert task is not None
        return task


def watch_journal(store: TaskStore, launch: Launch, *, refresh: bool = True) -> None:
    """What the journal asks of a running task, looked at when its supervisor beats: its
    cancel (stop it), a STALE mark (RESUMED: it beats). The beat taken gives the
    supervisor its next deadline. Errors do not stop the task."""
    launch.beat = False
    with contextlib.suppress(FerryError, OSError):
        if refresh:
            store.refresh()
        current = store.get(launch.task.id)
        if current is None or current.claim_token != launch.token:
            return
        sent = boot_clock()
        if store.beat(current):
            launch.heard(sent)
        if current.cancel_requested and not launch.stop_sent:
            if cancel_stands(store, launch.task.id, launch.token):
                launch.stop(signal.SIGTERM, cancel=True)
        elif current.state is State.STALE:
            store.commit(ev.Resumed(launch.task.id, launch.task.attempt, launch.token))


def write_end(store: TaskStore, launch: Launch) -> None:
    """Write a supervisor's end, as the journal needs it after a catch-up (a cancel that
    landed meanwhile makes it CANCELLED; recovery having decided, a LATE_RESULT). A
    refusal for good changes nothing; the store out of reach is raised (the supervisor,
    let go, keeps the end and delivers it)."""
    with contextlib.suppress(RefusedError):
        outbox.deliver(store, launch.end_events)
