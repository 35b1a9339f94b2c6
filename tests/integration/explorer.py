"""The interleaving explorer's machinery (its tests: ``test_interleavings.py``; the
invariants: ``explorer_checks.py``).

One *case*: two writing ferry commands, A and B, on one private state directory. A is
started with ``FERRY_FAILPOINTS=<scope>:<point>=<hit>=stop`` and pauses (SIGSTOP) there:
in its own process (scope ``launcher``, the default: every command), or in one of its
tasks' supervisors (scope ``supervisor``: ``run``, ``claim`` and ``work`` fork one per
task, :mod:`ferry.app.supervisor`). If its point comes after its own task's end, that
task's gate is opened for it. A leader A paused with the lease is waited out (1 s), so
that a leader B takes over. B runs until it is done: it ended, or each task it started
waits at the case's *gate* with its SPAWNED durable, or it waits for A (blocked on a
lock A holds, or ``work`` standing by while A's live launcher leads; a ``:end`` case
opens B's gates at once: B runs to its very end). A is continued until it is done too
(a second supervisor of A that reaches the point is continued at once); then the gate
opens, both end (every supervisor of theirs too), a final ``ferry recover`` (and
``ferry work --drain`` if anything is queued) runs, and the guarantee is checked
(``explorer_checks.check``):

* ``lost``: every record seen at any point (read while A was paused, after B, after A)
  is still in the journal byte for byte (or, compacted away, its task is in the table);
  the table (snapshot, archives, tail) equals the journal folded afresh from seq 1;
  every id a command printed is in the table.
* ``ran-twice``: no attempt of a mutating task started twice, and no two executions of
  one ``--key`` overlapped in time (tasks write their start and end to a file per key:
  ``start <FERRY_TASK> <runner pid> <ns>``, ``end <FERRY_TASK> exit:<N>|signal <ns>``;
  the runner is the task's supervisor).
* ``exit``: each command's exit status agrees with the journal afterwards (``run`` and
  ``claim`` pass their task's journaled status through, 125 only if it never started;
  ``work --drain`` exit 0 settled every task it claimed; ``cancel``/``retry``/``kill``/
  ``resolve`` exit 0 if and only if their record is there; ``recover``'s report matches
  its records; a key that succeeded meanwhile is the documented exit 0, not an error).
* ``truth``: while both were done and the gate still shut, no process of a task the
  journal calls settled (or queued) was alive, quarantined orphans aside; and a task
  that ran to its own end with status N under a live runner is journaled with N
  (unless recovery decided it without its runner).
* ``verify``: ``journal verify`` (the function behind the command) is clean, with no
  skipped records; ``in-flight``: after the final recover, nothing is in flight; after
  the drain, everything has settled.
* ``stuck``: B or A neither ended nor reached a waiting task within ``SETTLE_S``, or a
  process of theirs outlived them by ``END_S``; ``lock``: A paused holding the journal's
  lock (no failpoint is inside it) or the lease's (only ``lease_write`` is).

Each pair gets a small *world* (:func:`plans`; the parts are listed at PART_KEYS): the
tasks that make both commands mean something, and which of them each command aims at,
so that they meet (a cancel aims at the task a runner claims, ``run --key K`` at the
key of the orphan ``recover`` quarantines, ...); some pairs get two worlds. Where A may
pause is found by running it once alone, in the same world, with
``FERRY_FAILPOINTS_TRACE`` (:func:`trace`); every command of a case runs with a trace
file of its own too, which names its supervisors (``<pid> supervisor <launcher>``): a
task's runner, its ``$PPID`` and the journal's ``runner``, is one of them.

Every ferry process reaches its failpoints in its main thread (``work`` is one loop; a
supervisor is a fork of one thread), so ``=stop``'s ``kill(getpid(), SIGSTOP)`` stops
the very thread that reached the point before it goes on: Linux hands a signal sent to
a process to its main thread first when that thread can take it (it is running: it
sent it), and the stop takes effect on the return from ``kill``. (The first explorer
met ``work`` with a thread per slot: the kernel often chose the main thread while the
slot's thread ran on into the append; failpoints then stopped the calling thread with
``pthread_kill``. Single-threaded, that is not needed.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from clikit import Ferry, wait_until
from explorer_checks import (
    RUNNERS,
    Ran,
    Snapshot,
    Violation,
    check,
    executions,
    left_in_flight,
    name_tag,
    read_records,
    read_state,
    settled_but_alive,
)

from ferry.failpoints import TRACE_ENV
from ferry.proc.process import find_by_marker, marker_prefix, read_stat
from ferry.storage.local.lease import LeaseStore, boot_clock

CREATORS = ("run", "submit", "submit-from")
COMMANDS = (
    *CREATORS,
    "claim",
    "work",
    "recover",
    "cancel",
    "retry",
    "kill",
    "resolve",
    "compact",
)
LEADERS = frozenset({"claim", "work", "recover"})

# A leader paused while it holds the lease: its lease is waited out (1 s) before B
# starts, so a leader B takes over and A wakes up fenced (the deterministic choice; B
# finding the lease held is test_leader_races' subject).
A_LEASE_TTL_S = 1.0
# Tasks' --kill-grace: a cancel that waits for a paused runner gives up after it + 5 s.
KILL_GRACE_S = 1.0
# How long a command may take to be done (ended, or its task waiting at the gate). A
# supervisor whose launcher is paused writes its end itself after ACK_WAIT_S (10 s).
SETTLE_S = 45.0
END_S = 60.0

# Added to the environment of every ferry process of a case. The tests set a
# PYTHONPYCACHEPREFIX of their own: ferry's modules are then compiled once per session,
# not by each of the ~4,000 processes of a full run (0.2 s of CPU each on this machine).
CHILD_ENV: dict[str, str] = {}

# The world's tasks and their keys:
#   failed       FAILED (exit 3), a mutating task
#   quarantined  FAILED QUARANTINED_ORPHAN_ALIVE: its runner was killed, its task lingers
#   unsafe       FAILED MARKED_FAILED_MUTATION_UNSAFE: runner killed, task ended
#   orphan       RUNNING, runner killed, task lingers: recover will quarantine it
#   stranded     RUNNING, --idempotent, runner killed, task ended: recover will release
#                it to the queue (and when it runs again it waits at the gate)
#   queued       QUEUED, waits at the gate when it runs
# The failed task and the orphan share a key, so that a retry of the one meets the other
# (bug 4, by retry).
PART_KEYS = {
    "failed": "ko",
    "quarantined": "kz",
    "unsafe": "ku",
    "orphan": "ko",
    "stranded": "ks",
    "queued": "kq",
}

# The task every case runs: it writes its start, then (by mode) waits at the gate (the
# case's, or its runner's own: ``gate.<runner pid>``), holds 0.3 s (outliving
# SPAWNED_AFTER_S), lingers (an orphan), or ends at once; then its end. A TERM/INT/HUP
# is written down as its end too (a killed orphan's end).
TASK_SCRIPT = r"""
mark=$1 gate=$2 code=$3 mode=$4 child=
echo "start $FERRY_TASK $PPID $(date +%s%N)" >> "$mark"
trap '[ -n "$child" ] && kill $child 2>/dev/null; echo "end $FERRY_TASK signal $(date +%s%N)" >> "$mark"; exit 143' TERM INT HUP
trap '' PIPE
case $mode in
linger) sleep 300 & child=$!; wait $child ;;
hold) sleep 0.3 ;;
gate) while [ ! -e "$gate" ] && [ ! -e "$gate.$PPID" ]; do sleep 0.02; done ;;
esac
echo "end $FERRY_TASK exit:$code $(date +%s%N)" >> "$mark"
exit "$code"
"""


def table(home: Path) -> list[dict[str, Any]]:
    return sorted(read_state(home).tasks.values(), key=lambda t: t["created_at"] or "")


# ---- the world -----------------------------------------------------------------------


@dataclass
class World:
    ferry: Ferry
    root: Path
    ids: dict[str, str] = field(default_factory=dict)  # part -> task id
    # FERRY_TASK markers of the executions whose runner the setup killed: they ended (or
    # live on) unseen by any runner, so what the journal says of them cannot be their end.
    unsupervised: set[str] = field(default_factory=set)
    traced: bool = False  # gated tasks hold 0.3 s instead (a trace run opens no gate)

    @property
    def home(self) -> Path:
        return self.ferry.home

    @property
    def marks(self) -> Path:
        return self.root / "marks"

    @property
    def gate(self) -> Path:
        return self.root / "gate"

    def task(self, key: str, *, mode: str | None = None, code: int = 0) -> list[str]:
        mode = mode or ("hold" if self.traced else "gate")
        mark, gate = str(self.marks / key), str(self.gate)
        return ["/bin/sh", "-c", TASK_SCRIPT, "ferry-task", mark, gate, str(code), mode]

    def named(self, name: str) -> str | None:
        """The id of the newest task called ``name``."""
        found = [t for t in table(self.home) if t["name"] == name]
        return found[-1]["id"] if found else None


def _crashed_run(world: World, part: str, mode: str | None, *options: str) -> str:
    """A ``run`` SIGKILLed once its task is RUNNING: an in-flight task whose runner is
    dead. Its task lives on (``linger``), ends by itself (``hold``), or (gated) ends now
    but waits at the gate when it runs again."""
    name = f"setup-{part}"
    key = PART_KEYS[part]
    args = ("run", "--name", name, "--key", key, "--kill-grace", str(KILL_GRACE_S), *options)
    task = world.task(key, mode=mode)
    result = world.ferry(*args, "--", *task, failpoints="after:SPAWNED")
    assert result.code == -signal.SIGKILL, result
    task_id = world.named(name)
    assert task_id is not None
    # (SPAWNED is durable once the child exists, maybe before its shell has written its
    # first line: under load, read too soon, no gate was opened and the task waited at
    # it for ever; the soak's sweep timed out so once, 2026-12-05.)
    ran = wait_until(
        lambda: [e for e in executions(world.marks) if e.task == task_id],
        what=f"the {part} task's first line",
    )
    world.unsupervised.update(e.marker for e in ran)
    if mode != "linger":
        runner_gates = [world.root / f"gate.{e.ppid}" for e in ran]  # its dead runner's
        for gate in runner_gates:
            gate.touch()
        wait_until(
            lambda: not find_by_marker(marker_prefix(task_id)).alive,
            what=f"the {part} task to end",
        )
        for gate in runner_gates:  # (that pid may be reused by a runner of the case)
            gate.unlink()
    return task_id


def build_world(root: Path, parts: Iterable[str], *, traced: bool = False) -> World:
    """The tasks of ``parts``, in an order that lets each exist: the failed task before
    the orphan of its key; the quarantined and unsafe ones decided by a recover before
    the orphan and the stranded task are made (which that recover would decide too)."""
    root.mkdir(parents=True)
    world = World(Ferry(root / "home"), root, traced=traced)
    world.ferry.env.update(CHILD_ENV)
    if "PYTHONPYCACHEPREFIX" in CHILD_ENV:
        world.ferry.env.pop("PYTHONDONTWRITEBYTECODE", None)
    world.marks.mkdir()
    wanted = set(parts)
    try:
        if "failed" in wanted:
            key = PART_KEYS["failed"]
            args = ("run", "--name", "setup-failed", "--key", key, "--")
            world.ferry.ok(*args, *world.task(key, mode="quick", code=3), codes=(3,))
            world.ids["failed"] = str(world.named("setup-failed"))
        if wanted & {"quarantined", "unsafe"}:
            if "quarantined" in wanted:
                world.ids["quarantined"] = _crashed_run(world, "quarantined", "linger")
            if "unsafe" in wanted:
                world.ids["unsafe"] = _crashed_run(world, "unsafe", "hold")
            code, report = world.ferry.recover()
            assert code == 3, (code, report)  # (0 or 75 once, under CI's load: say which)
        if "orphan" in wanted:
            world.ids["orphan"] = _crashed_run(world, "orphan", "linger")
        if "stranded" in wanted:
            world.ids["stranded"] = _crashed_run(world, "stranded", None, "--idempotent")
        if "queued" in wanted:
            key = PART_KEYS["queued"]
            args = ("submit", "--name", "setup-queued", "--key", key)
            grace = ("--kill-grace", str(KILL_GRACE_S), "--")
            world.ferry.ok(*args, *grace, *world.task(key))
            world.ids["queued"] = str(world.named("setup-queued"))
    except BaseException:
        world.ferry.close()
        raise
    return world


# ---- the commands and how a pair meets ----------------------------------------------


@dataclass(frozen=True)
class Role:
    """One command of a pair, and what it aims at: a world part, ``peer`` (the task
    the other command made, else the queued one), or for creators the key they use."""

    command: str
    target: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class PairPlan:
    a: Role
    b: Role
    parts: frozenset[str]
    variant: str = ""  # when a pair has several plans: the creator's key, cancel's target


# What each command needs to mean something, and the key(s) a creator uses next to it:
# the first meets the other command's task (a key rule race), "kx" is a key of its own
# (the creator's whole path explored against the other command).
_OWN_TARGET = {
    "claim": "queued",
    "work": "queued",
    "recover": "orphan",
    "retry": "failed",
    "resolve": "unsafe",
}
_CREATOR_KEYS = {
    "claim": ("kq", "kx"),
    "work": ("kq", "kx"),
    "recover": ("ko", "kx"),
    "retry": ("ko",),
    "kill": ("kz",),
    "resolve": ("ku",),
}


def _roles(command: str, other: str) -> list[Role]:
    if command in CREATORS:
        return [Role(command, key=key) for key in _CREATOR_KEYS.get(other, ("kx",))]
    if command == "cancel":
        aims = {
            "claim": ("queued", "stranded"),
            "work": ("queued", "stranded"),
            "recover": ("orphan", "stranded"),
            "retry": ("failed",),
            "kill": ("orphan",),
        }
        default = ("peer",) if other in CREATORS else ("queued",)
        return [Role(command, target) for target in aims.get(other, default)]
    if command == "kill":
        return [Role(command, "orphan" if other in ("recover", "cancel") else "quarantined")]
    return [Role(command, _OWN_TARGET.get(command))]


def _parts(role: Role, other: Role) -> set[str]:
    parts: set[str] = set()
    if role.target in PART_KEYS:
        parts.add(role.target)
    if role.target == "peer":
        parts.add("queued")
    if role.command in CREATORS:
        by_other = {"kq": "queued", "kz": "quarantined", "ku": "unsafe"}
        if role.key in by_other:
            parts.add(by_other[role.key])
        elif role.key == "ko":
            parts.add("orphan" if other.command == "recover" else "failed")
    if role.command == "retry" and other.command == "recover":
        parts.add("orphan")  # retry's key in flight, quarantined meanwhile: bug 4
    if role.command == "recover" and other.command in ("claim", "work", "recover"):
        parts.add("stranded")  # a decision both leaders' recoveries want to write
    if role.command == "compact":
        parts.add("failed")  # something settled for the snapshot to archive
    return parts


def plans(a: str, b: str) -> list[PairPlan]:
    """The worlds of pair (A, B): one, or one per key a creator tries or per task a
    cancel aims at."""
    found = []
    for role_a in _roles(a, b):
        for role_b in _roles(b, a):
            parts = _parts(role_a, role_b) | _parts(role_b, role_a)
            if "stranded" in (role_a.target, role_b.target):
                parts.discard("queued")  # the runner must claim the stranded task
            found.append(PairPlan(role_a, role_b, frozenset(parts)))
    if len(found) > 1:  # named by what differs: the creator's key or cancel's target
        varies = "a" if len({(p.a.key, p.a.target) for p in found}) > 1 else "b"
        found = [
            PairPlan(p.a, p.b, p.parts, variant=str(role.key or role.target))
            for p in found
            for role in [getattr(p, varies)]
        ]
    return found


def plan(a: str, b: str, variant: str = "") -> PairPlan:
    for found in plans(a, b):
        if found.variant == variant:
            return found
    raise KeyError((a, b, variant))


def argv(role: Role, role_name: str, world: World) -> list[str]:
    """The command line of ``role`` (``A`` or ``B``) in ``world``; a ``peer`` target is
    chosen now: the newest task the other command made, else the queued task."""
    name = name_tag(role_name, role.command)
    grace = ["--kill-grace", str(KILL_GRACE_S)]
    ttl = ["--lease-ttl", str(A_LEASE_TTL_S if role_name == "A" else 30.0)]
    command = role.command
    if command in ("run", "submit"):
        assert role.key is not None
        options = ["--name", name, "--key", role.key, *grace]
        return ["--json", command, *options, "--", *world.task(role.key)]
    if command == "submit-from":
        assert role.key is not None
        lines = [
            {"argv": world.task(key), "key": key, "name": f"{name}-{n}", "kill_grace": KILL_GRACE_S}
            for n, key in enumerate((role.key, f"{role.key}-{role_name}"), start=1)
        ]
        path = world.root / f"{name}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
        return ["--json", "submit", "--from", str(path)]
    if command == "claim":
        return ["--json", "claim", *ttl]
    if command == "work":
        return ["--json", "work", "--drain", "-j", "1", "--poll", "0.05", *ttl]
    if command == "recover":
        return ["--json", "recover", *ttl]
    if command == "compact":
        return ["--json", "journal", "compact"]
    target = _target(role, role_name, world)
    if command == "resolve":
        return ["--json", "resolve", target, "--as", "succeeded"]
    return ["--json", command, target]


def _target(role: Role, role_name: str, world: World) -> str:
    if role.target == "peer":
        other = "B" if role_name == "A" else "A"
        made = [t for t in table(world.home) if (t["name"] or "").startswith(f"{other}-")]
        if made:
            return str(made[-1]["id"])
        return world.ids["queued"]
    assert role.target is not None
    return world.ids[role.target]


# ---- the processes of a command (its trace) -----------------------------------------


@dataclass
class Command:
    """One ferry command of a case: its launcher process and the file its trace goes
    to (which names its supervisors as they start, and every point they reach)."""

    name: str  # "run", "submit-from", ...
    proc: subprocess.Popen[bytes]
    trace_file: Path
    # pid -> start time (ticks) when first seen alive; None: first seen dead.
    _seen: dict[int, int | None] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self) -> list[tuple[int, str, int]]:
        """The trace: ``(pid, name, hit)``; ``(pid, "supervisor", launcher)``."""
        try:
            text = self.trace_file.read_text()
        except FileNotFoundError:
            return []
        found = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
                found.append((int(parts[0]), parts[1], int(parts[2])))
        return found

    def supervisors(self) -> list[int]:
        return [pid for pid, name, _ in self.lines() if name == "supervisor"]

    def pids(self) -> set[int]:
        """Its launcher and every supervisor it started so far."""
        return {self.pid, *self.supervisors()}

    def alive(self, pid: int) -> bool:
        """Is ``pid`` (of this command) alive: not exited, not a zombie, not reused?"""
        st = read_stat(pid)
        if pid not in self._seen:
            self._seen[pid] = None if st is None or st.state in "ZX" else st.start_time
        first = self._seen[pid]
        return (
            first is not None and st is not None and st.start_time == first and st.state not in "ZX"
        )

    def stopped(self) -> list[int]:
        """Its processes paused now (SIGSTOP)."""
        found = []
        for pid in sorted(self.pids()):
            st = read_stat(pid)
            if st is not None and st.state == "T" and self.alive(pid):
                found.append(pid)
        return found

    def supervisors_alive(self) -> list[int]:
        return [pid for pid in self.supervisors() if self.alive(pid)]


def start(
    world: World, name: str, args: Sequence[str], trace_file: Path, failpoints: str | None = None
) -> Command:
    """Command ``name`` (``ferry ARGS``) in the background, traced to ``trace_file``."""
    world.ferry.env[TRACE_ENV] = str(trace_file)
    try:
        proc = world.ferry.start(*args, failpoints=failpoints)
    finally:
        del world.ferry.env[TRACE_ENV]
    command = Command(name, proc, trace_file)
    command.alive(proc.pid)  # (its start time, while it surely lives)
    return command


# ---- stop points ---------------------------------------------------------------------

SCOPES = ("launcher", "supervisor")


@dataclass(frozen=True)
class Point:
    """The ``hit``-th time a process of ``scope`` reaches failpoint ``name`` (each
    supervisor counts its own hits)."""

    name: str
    hit: int = 1
    scope: str = "launcher"

    @property
    def armed(self) -> str:
        return f"{self.scope}:{self.name}={self.hit}=stop"

    def __str__(self) -> str:
        name = self.name if self.scope == "launcher" else f"{self.scope}:{self.name}"
        return name if self.hit == 1 else f"{name}#{self.hit}"

    @classmethod
    def parse(cls, text: str) -> Point:
        """The point :meth:`__str__` names."""
        name, _, hit = text.partition("#")
        scope = "launcher"
        if name.startswith("supervisor:"):
            scope, name = "supervisor", name[len("supervisor:") :]
        return cls(name, int(hit or 1), scope)


def _event_point(name: str) -> tuple[str, str] | None:
    """("before", "SETTLED") for "before:SETTLED"; None for side-effect points."""
    when, _, what = name.partition(":")
    return (when, what) if what.isupper() else None


def distinct_points(hits: Sequence[Point]) -> list[Point]:
    """One process's hits in order, less those where it cannot be told apart from the
    hit before: the ``before:``/``after:`` points of one batch's events are called one
    after another around one write (``before:SUBMITTED``, ``before:CLAIMED``,
    ``before:DISPATCHING`` of ``run``), so only the first of each run of them is kept.
    Of the lease writes only the first (taking the lease) is kept: the later ones are
    renewals on a timer, whose number and order vary from run to run."""
    kept: list[Point] = []
    previous: tuple[str, str] | None = None
    for point in hits:
        if point.name.endswith(":lease_write") and point.hit > 1:
            continue
        event = _event_point(point.name)
        same_batch = event is not None and previous is not None and event[0] == previous[0]
        if not same_batch:
            kept.append(point)
        previous = event
    return kept


def points_of(lines: Sequence[tuple[int, str, int]], launcher: int) -> list[Point]:
    """Where a command may pause, from its trace: its launcher's points, then its
    supervisors' (each supervisor's distinct points, the same ones once)."""
    supervisors = [pid for pid, name, _ in lines if name == "supervisor"]
    own = [Point(name, hit) for pid, name, hit in lines if pid == launcher]
    found = distinct_points(own)
    for supervisor in supervisors:
        hits = [
            Point(name, hit, "supervisor")
            for pid, name, hit in lines
            if pid == supervisor and name != "supervisor"
        ]
        found.extend(p for p in distinct_points(hits) if p not in found)
    return found


def trace(root: Path, pair: PairPlan) -> list[Point]:
    """Where A may pause in this pair's world: run it once alone with the trace on."""
    world = build_world(root, pair.parts, traced=True)
    try:
        command = start(world, pair.a.command, argv(pair.a, "A", world), root / "trace")
        _, err = command.proc.communicate(timeout=END_S)
        assert command.proc.returncode != 2, f"the explorer's command line is wrong: {err!r}"
        wait_until(
            lambda: not command.supervisors_alive(), what="A's supervisors to exit", timeout_s=END_S
        )
        lines = command.lines()
    finally:
        world.ferry.close()
    return points_of(lines, command.pid)


# ---- one case ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A paused at ``point`` while B runs, in the world of ``pair``."""

    pair: PairPlan
    point: Point
    b_ends: bool = False  # B's tasks do not wait at the gate: B runs to its very end

    @property
    def a(self) -> str:
        return self.pair.a.command

    @property
    def b(self) -> str:
        return self.pair.b.command

    @property
    def id(self) -> str:
        """``A[variant]@point|B``, e.g. ``run[ko]@before:SUBMITTED|recover`` or
        ``run@supervisor:before:SETTLED|cancel``; ``|B:end`` when B runs to its very
        end."""
        variant = f"[{self.pair.variant}]" if self.pair.variant else ""
        return f"{self.a}{variant}@{self.point}|{self.b}" + (":end" if self.b_ends else "")


def case(case_id: str) -> Case:
    """The case named by :attr:`Case.id`."""
    head, b_part = case_id.split("|")
    a_part, point_text = head.split("@")
    a, _, variant = a_part.partition("[")
    b, _, ends = b_part.partition(":")
    return Case(plan(a, b, variant.rstrip("]")), Point.parse(point_text), ends == "end")


def cases_of(pair: PairPlan, points: Iterable[Point]) -> list[Case]:
    """A paused at each point; a runner B both ways: its task waiting at the gate while
    A goes on, and run to its very end."""
    ends = (False, True) if pair.b.command in RUNNERS else (False,)
    return [Case(pair, point, b_ends) for point in points for b_ends in ends]


@dataclass
class Outcome:
    case: Case
    reached: bool = True
    violations: list[Violation] = field(default_factory=list)
    commands: list[Ran] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def invariants(self) -> frozenset[str]:
        return frozenset(v.invariant for v in self.violations)

    def summary(self) -> str:
        head = f"{self.case.id}: " + ", ".join(str(c) for c in self.commands)
        if not self.reached:
            head += " (A never reached its point)"
        return "\n    ".join([head, *(str(v) for v in self.violations)])


def stopped(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.state == "T"


def _lease_holder(home: Path) -> tuple[int, float] | None:
    """The pid holding the lease and its expiry (CLOCK_BOOTTIME), if one holds it."""
    lease = LeaseStore(home / "lease.json", ttl_s=A_LEASE_TTL_S).read()
    if lease is None or lease.holder is None:
        return None
    return lease.holder.pid, lease.expires_boot_s


def _wait_lease_out(home: Path, pid: int) -> None:
    """If paused ``pid`` holds the lease, wait until it has expired (CLOCK_BOOTTIME)."""
    held = _lease_holder(home)
    if held is not None and held[0] == pid:
        wait_until(lambda: boot_clock() >= held[1], what="A's lease to expire")


def _waiting(command: Command, world: World) -> list[Any]:
    """The executions of ``command``'s tasks that started and have not ended."""
    pids = command.pids()
    return [e for e in executions(world.marks) if e.ppid in pids and e.end is None]


def _stops_now(point: Point, command: Command, world: World) -> bool:
    """Is ``point`` the one right after the SPAWNED of a task ``command`` now has
    waiting at the gate? (A's stop follows that write at once: its gate must stay
    shut.) The launcher's ``after:SPAWNED`` follows its write; a supervisor's follows
    the launcher's word that it is durable."""
    if point.name != "after:SPAWNED":
        return False
    started = [e for e in executions(world.marks) if e.ppid in command.pids()]
    if point.scope == "launcher":
        return point.hit == len(started)
    return any(sum(e.ppid == pid for e in started) == point.hit for pid in command.supervisors())


def _open_gates(command: Command, world: World) -> None:
    """Let ``command``'s waiting tasks end (each waits for ``gate.<its runner>`` too)."""
    for execution in _waiting(command, world):
        (world.root / f"gate.{execution.ppid}").touch()


def _blocked_on(command: Command, other: Command | None, home: Path) -> str | None:
    """Why ``command`` waits for ``other`` (paused, or with its tasks at the gate), if
    it does: it waits for a lock
    (``flock``: the journal's, compaction's) a paused process of ``other`` holds; or
    it is ``work``, standing by while ``other`` holds the lease's lock or leads (its
    supervisor is paused, not it: it renews the lease), or with its slot taken by a
    task ``other`` runs."""
    if other is None:
        return None
    if locks_waited(command.pids(), set(other.stopped())):
        return "a lock"
    if command.name == "work":
        if any("lease lock" in locks_held(pid, home) for pid in other.stopped()):
            # (lease.json's lock is taken by polling: no waiter in /proc/locks; claim
            # and recover give up after 10 s, work stands by for ever)
            return "the lease's lock"
        held = _lease_holder(home)
        leads = held is not None and held[0] == other.pid and boot_clock() < held[1]
        if leads and other.alive(other.pid) and not stopped(other.pid):
            return "the lease"
        if _runs_a_task(other, home):
            # A task in flight under a live runner when work took the lead counts
            # against its -j (a "survivor", whoever launched it): work -j 1 waits.
            return "a slot"
    return None


def _runs_a_task(command: Command, home: Path) -> bool:
    """Has one of ``command``'s supervisors, alive, a claim not yet ended?"""
    records = read_records(home).records.values()
    ended = {r["data"].get("token") for r in records if r["type"] in ("SETTLED", "RELEASED")}
    runners = {pid for pid in command.supervisors() if command.alive(pid)}
    return any(
        r["type"] == "CLAIMED"
        and r["data"]["runner"].get("pid") in runners
        and r["data"]["token"] not in ended
        for r in records
    )


def _done(command: Command, world: World, waits_for: Command | None = None) -> bool:
    """Ended (and so did its supervisors, or each task of theirs waits at the gate with
    its SPAWNED durable), or each task it started waits at the gate with its SPAWNED
    durable (so it has nothing left to write until the gate opens), or it waits for
    ``waits_for``, paused."""
    waiting = _waiting(command, world)
    if not waiting:
        if command.proc.poll() is None:
            return _blocked_on(command, waits_for, world.home) is not None
        return not command.supervisors_alive()
    records = read_records(world.home).records.values()
    spawned = {r["data"].get("token") for r in records if r["type"] == "SPAWNED"}
    if all(e.token in spawned for e in waiting):
        return True
    return _blocked_on(command, waits_for, world.home) is not None


def _wait_done(
    command: Command,
    world: World,
    who: str,
    *,
    waits_for: Command | None = None,
    each_turn: Callable[[], None] = lambda: None,
) -> Violation | None:
    def done() -> bool:
        each_turn()
        return _done(command, world, waits_for)

    try:
        wait_until(done, what=who, timeout_s=SETTLE_S)
    except AssertionError:
        return Violation("stuck", f"{who}: neither ended nor reached a waiting task in {SETTLE_S}s")
    return None


def _finish(command: Command, ran: Ran) -> Violation | None:
    proc = command.proc
    try:
        out, err = proc.communicate(timeout=END_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        ran.code, ran.out, ran.err = proc.returncode, out, err.decode("utf-8", "replace")
        return Violation("stuck", f"{ran}: did not end {END_S}s after the gate opened")
    ran.code, ran.out, ran.err = proc.returncode, out, err.decode("utf-8", "replace")
    if "Traceback" in ran.err:
        return Violation("exit", f"{ran}: a traceback: {ran.err[-400:]!r}")
    return None


def _supervisors_end(command: Command, ran: Ran) -> Violation | None:
    """Its supervisors exit once their tasks' ends are durable (an orphaned one after
    writing its end itself)."""
    try:
        wait_until(
            lambda: not command.supervisors_alive(), what="supervisors to exit", timeout_s=END_S
        )
    except AssertionError:
        left = command.supervisors_alive()
        return Violation("stuck", f"{ran}: its supervisor(s) {left} outlived it by {END_S}s")
    return None


def locks_held(pid: int, home: Path) -> set[str]:
    """Which of ferry's lock files ``pid`` holds exclusively (from /proc/locks)."""
    files = {"journal lock": home / "journal" / ".lock", "lease lock": home / "lease.json.lock"}
    inodes = {}
    for name, path in files.items():
        with contextlib.suppress(OSError):
            inodes[str(path.stat().st_ino)] = name
    held = set()
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) < 6 or fields[1] == "->" or fields[3] != "WRITE":
                continue  # (a waiter, or a shared lock: a segment pin)
            if fields[4] == str(pid) and fields[5].rsplit(":", 1)[-1] in inodes:
                held.add(inodes[fields[5].rsplit(":", 1)[-1]])
    return held


def locks_waited(waiters: set[int], holders: set[int]) -> bool:
    """Does one of ``waiters`` wait for a file lock one of ``holders`` holds? In
    /proc/locks a waiter is a ``->`` line (its pid, then its file), after the holder's."""
    held: dict[str, set[int]] = {}  # file (dev:inode) -> pids holding it
    waited: list[tuple[int, str]] = []
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) > 6 and fields[1] == "->":
                waited.append((int(fields[5]), fields[6]))
            elif len(fields) > 5 and fields[4].isdigit():
                held.setdefault(fields[5], set()).add(int(fields[4]))
    return any(pid in waiters and held.get(file, set()) & holders for pid, file in waited)


def run_case(case: Case, root: Path) -> Outcome:
    started = time.monotonic()
    outcome = Outcome(case)
    _run_case(case, root, outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


def _run_case(case: Case, root: Path, outcome: Outcome) -> None:
    pair, point = case.pair, case.point
    world = build_world(root, pair.parts)
    seen: list[Snapshot] = []
    problems: list[Violation | None] = []
    done = threading.Event()
    try:
        a_args = argv(pair.a, "A", world)
        a_cmd = start(world, pair.a.command, a_args, root / "trace.A", point.armed)
        a = Ran(pair.a.command, "A", a_args, a_cmd.pid)
        outcome.commands.append(a)

        def paused() -> bool:
            if a_cmd.stopped():
                return True
            if a_cmd.proc.poll() is not None and not a_cmd.supervisors_alive():
                return True  # (ended without reaching its point)
            if not _stops_now(point, a_cmd, world) and _done(a_cmd, world):
                _open_gates(a_cmd, world)  # its point follows its task's end
            return False

        wait_until(paused, what=f"A to pause at {point}", timeout_s=SETTLE_S)
        paused_pids = a_cmd.stopped()
        outcome.reached = bool(paused_pids)
        for pid in paused_pids:
            by_design = {"lease lock"} if point.name.endswith(":lease_write") else set()
            unexpected = locks_held(pid, world.home) - by_design
            if unexpected:
                problems.append(
                    Violation("lock", f"A paused at {point} holds {', '.join(sorted(unexpected))}")
                )
        seen.append(read_records(world.home))
        if a_cmd.pid in paused_pids and pair.a.command in LEADERS:
            _wait_lease_out(world.home, a_cmd.pid)
        b_args = argv(pair.b, "B", world)
        b_cmd = start(world, pair.b.command, b_args, root / "trace.B")
        b = Ran(pair.b.command, "B", b_args, b_cmd.pid)
        outcome.commands.append(b)
        b_gates = (lambda: _open_gates(b_cmd, world)) if case.b_ends else (lambda: None)
        problems.append(
            _wait_done(
                b_cmd, world, f"B `{pair.b.command}` with A paused",
                waits_for=a_cmd, each_turn=b_gates,
            )
        )  # fmt: skip
        seen.append(read_records(world.home))

        def continue_a() -> None:  # (and any other supervisor of A reaching the point)
            for pid in a_cmd.stopped():
                os.kill(pid, signal.SIGCONT)
            b_gates()

        # From now on, a process of A that reaches the point (another supervisor of a
        # work, given a later task) is continued at once, until the case ends.
        continuer = threading.Thread(target=_keep_doing, args=(continue_a, done), daemon=True)
        continuer.start()
        # (A may wait for B in turn: a work A counts B's task, waiting at the gate, as
        # one of its slots; or B leads)
        problems.append(
            _wait_done(
                a_cmd, world, f"A `{pair.a.command}` continued",
                waits_for=b_cmd, each_turn=continue_a,
            )
        )  # fmt: skip
        middle = read_state(world.home)
        seen.append(middle)
        # (A work just continued may write a claim and spawn its task between this read
        # and the scan of processes: seen once in a soak, work[kx]@before:CLAIMED|run,
        # a task QUEUED "while it runs". A true one stays so, the gate shut: looked at
        # again.)
        if settled_but_alive(middle):
            problems.extend(settled_but_alive(read_state(world.home)))
        world.gate.touch()
        problems.append(_finish(a_cmd, a))
        problems.append(_finish(b_cmd, b))
        problems.append(_supervisors_end(a_cmd, a))
        problems.append(_supervisors_end(b_cmd, b))
        a.pids, b.pids = frozenset(a_cmd.pids()), frozenset(b_cmd.pids())
        seen.append(read_records(world.home))
        recovered = world.ferry("--json", "recover")
        after_recover = read_state(world.home)
        seen.append(after_recover)
        problems.extend(left_in_flight(after_recover, recovered.code))
        if any(t["state"] == "QUEUED" for t in after_recover.tasks.values()):
            drained = world.ferry("work", "--drain", "--poll", "0.05")
            if drained.code not in (0, 1):
                problems.append(Violation("exit", f"final work --drain exit {drained.code}"))
        final = read_state(world.home)
        problems.extend(
            check(world.home, world.marks, outcome.commands, seen, final, world.unsupervised)
        )
        outcome.violations = [p for p in problems if p is not None]
    finally:
        done.set()
        world.ferry.close()


def _keep_doing(action: Callable[[], None], until: threading.Event) -> None:
    while not until.wait(0.02):
        action()


# ---- running many cases --------------------------------------------------------------


def run_cases(
    cases: Sequence[Case],
    root: Path,
    *,
    workers: int = 2,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Run ``cases`` on ``workers`` threads (each case is processes and waits)."""
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()

    def one(index: int, case: Case) -> Outcome:
        outcome = run_case(case, root / f"c{index:04d}")
        if on_outcome is not None:
            with lock:
                on_outcome(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(len(cases)), cases))
