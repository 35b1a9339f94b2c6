"""The interleaving explorer (issue "The guarantee under races").

For each ordered pair of commands that write (``run``, ``submit``, ``submit --from``,
``claim``, ``work``, ``recover``, ``cancel``, ``retry``, ``kill``, ``resolve``,
``journal compact``), the first (A) is paused with ``FERRY_FAILPOINTS=<point>=<hit>=stop``
at each failpoint it reaches, the second (B) runs until it is done, A is continued,
and the guarantee is checked: every record reported committed is still there; no
mutating task ran twice in one attempt, nor two tasks of one key at once (counted by
the tasks themselves); every command's exit status agrees with the journal; the
journal verifies clean; nothing is left in flight after ``ferry recover``; and the
journal never calls a task settled while it still runs. The machinery, the worlds each
pair is given and the invariants are described in ``explorer.py``.

The default run has the cases in :data:`DEFAULT_CASES` (11, about 25 s: bugs 2 and 4
and the races most likely to matter: cancel against the runners, key checks against
recover, compaction against a paused command); ``tox -e soak`` runs every pair at every
point (``test_every_pair_at_every_failpoint``: 838 cases, about 23 minutes on the shared
2-core machine). ``FERRY_EXPLORE_WORKERS`` sets how many cases run at once (default 2);
``FERRY_EXPLORE_LOG=FILE`` writes every outcome as a JSON line. The coverage table and
every failure are printed in pytest's terminal summary.

What it finds: on the code before issue 13's fixes, bugs 2 and 4 and two more of their
shape (docs/reliability.md, "The interleaving explorer"); on this code, nothing.

A case is named ``A[world]@point|B``: A paused at ``point`` (``#N``: its Nth hit), B run
until its task waits at the gate (``|B:end``: to its very end). A case that fails
is listed in :data:`KNOWN_BUGS` (empty today) until its bug is fixed: it still runs and
is reported, and a listed case that stops failing fails the test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import explorer as x
import orjson
import pytest
from clikit import Ferry

pytestmark = pytest.mark.timeout(900)

WORKERS = int(os.environ.get("FERRY_EXPLORE_WORKERS", "2"))


@dataclass(frozen=True)
class KnownBug:
    """A bug the explorer finds today: the cases that show it and what they break."""

    title: str
    cases: frozenset[str]
    invariants: frozenset[str]


# Every case holds on this code: the list is empty. A case that fails is listed here
# (with the bug's description) only while its bug is being fixed.
KNOWN_BUGS: dict[str, KnownBug] = {}

DEFAULT_CASES = (
    # bug 2: cancel read QUEUED, a runner claims and starts the task, cancel writes.
    "cancel[queued]@before:SETTLED|claim",
    "cancel[queued]@before:SETTLED|work",
    # bug 4: the key check passes, recover quarantines the key's task, the write lands.
    "run[ko]@before:SUBMITTED|recover",
    "submit[ko]@before:SUBMITTED|recover",
    "retry@before:RETRIED|recover",
    # the same shape elsewhere: a key that succeeds meanwhile; a claimed task cancelled.
    "run[kq]@before:SUBMITTED|claim:end",
    "claim[queued]@before:CLAIMED|cancel",
    # a paused runner's task is left alone by a leader's recovery, and settles after.
    "run[kx]@after:DISPATCHING|recover",
    # a paused leader, its lease waited out: B decides, A wakes up fenced.
    "recover@before:SETTLED|recover",
    # compaction while a runner and a leader are paused: nothing committed is lost.
    "run@after:SPAWNED|compact",
    "work@after:CLAIMED|compact",
    # supervisors: the end known but not handed over while a cancel lands; a paused
    # supervisor (its child spawned, SPAWNED not yet sent; a running task) under a
    # leader's recovery: its runner is alive, the task is left alone.
    "run@supervisor:before:SETTLED|cancel",
    "run[kx]@supervisor:after:spawn|recover",
    "work@supervisor:after:SPAWNED|recover",
)


def known_bug(outcome: x.Outcome) -> str | None:
    """The KNOWN_BUGS entry this failing outcome is, if any."""
    for name, bug in KNOWN_BUGS.items():
        if outcome.case.id in bug.cases and outcome.invariants <= bug.invariants:
            return name
    return None


def judge(outcomes: list[x.Outcome]) -> list[str]:
    """What is wrong with these outcomes: a failure no KNOWN_BUGS entry lists; a listed
    case that passed (its bug is fixed: take it off the list); a point not reached."""
    problems = []
    listed = {case for bug in KNOWN_BUGS.values() for case in bug.cases}
    for outcome in outcomes:
        if not outcome.reached:
            problems.append(f"A never paused at its point: {outcome.summary()}")
        elif outcome.violations and known_bug(outcome) is None:
            problems.append(f"NEW: {outcome.summary()}")
        elif not outcome.violations and outcome.case.id in listed:
            problems.append(f"{outcome.case.id} passes now: remove it from KNOWN_BUGS")
    return problems


class Report:
    """Every outcome of the module, printed as a coverage table at its end; each one
    also as a JSON line to the file FERRY_EXPLORE_LOG names, if set."""

    def __init__(self) -> None:
        self.outcomes: list[x.Outcome] = []
        self.skipped: list[str] = []
        self.log = os.environ.get("FERRY_EXPLORE_LOG")

    def add(self, outcomes: list[x.Outcome]) -> None:
        self.outcomes.extend(outcomes)
        if self.log:
            with open(self.log, "ab") as log:
                for o in outcomes:
                    line = {
                        "case": o.case.id,
                        "reached": o.reached,
                        "seconds": round(o.seconds, 1),
                        "commands": [str(c) for c in o.commands],
                        "violations": [str(v) for v in o.violations],
                    }
                    log.write(orjson.dumps(line) + b"\n")

    def lines(self) -> Iterator[str]:
        pairs: dict[tuple[str, str], list[x.Outcome]] = {}
        for outcome in self.outcomes:
            pairs.setdefault((outcome.case.a, outcome.case.b), []).append(outcome)
        total = len(self.outcomes)
        failing = [o for o in self.outcomes if o.violations]
        seconds = sum(o.seconds for o in self.outcomes)
        yield f"{total} (pair, failpoint) cases in {len(pairs)} pairs, {len(failing)} failing"
        yield f"({seconds:.0f} s of case time)"
        for (a, b), outcomes in sorted(pairs.items()):
            bad = [o for o in outcomes if o.violations]
            names = sorted({known_bug(o) or "NEW" for o in bad})
            note = f"  {len(bad)} failing ({', '.join(names)})" if bad else ""
            yield f"  {a:>11} paused, {b:<11} {len(outcomes):3d} cases{note}"
        for outcome in failing:
            yield f"{known_bug(outcome) or 'NEW'}: {outcome.summary()}"
        yield from self.skipped


class _Summary:
    """A plugin registered while the module runs: prints the report in pytest's
    terminal summary (where output is never captured)."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.report.outcomes or self.report.skipped:
            terminalreporter.write_sep("-", "interleaving explorer")
            for line in self.report.lines():
                terminalreporter.write_line(line)


@pytest.fixture(scope="module", autouse=True)
def compiled_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ferry's bytecode cached in a directory of the module's own (see CHILD_ENV)."""
    x.CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    yield
    x.CHILD_ENV.clear()


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> Report:
    collected = Report()
    request.config.pluginmanager.register(_Summary(collected), f"interleavings-{id(collected)}")
    return collected


def run(cases: list[x.Case], root: Path, report: Report) -> list[x.Outcome]:
    outcomes = x.run_cases(cases, root, workers=WORKERS)
    report.add(outcomes)
    return outcomes


def test_the_failpoint_trace_lists_every_point_a_command_reaches(ferry: Ferry) -> None:
    """The test-only FERRY_FAILPOINTS_TRACE writes each hit (pid, name, count) and each
    supervisor's start (pid, "supervisor", its launcher); a point armed ``=N=stop``
    pauses the Nth hit, in the scope it names."""
    trace_file = ferry.home.parent / "trace"
    ferry.env[x.TRACE_ENV] = str(trace_file)
    ferry.ok("submit", "--", "true")
    names = [line.split()[1:] for line in trace_file.read_text().splitlines()]
    assert [name for name in names if "replay" not in name[0]] == [
        ["before:SUBMITTED", "1"],
        ["after:SUBMITTED", "1"],
    ]
    trace_file.unlink()
    run = ferry.start("run", "--", "sleep", "0.3")
    assert run.wait(timeout=x.END_S) == 0
    del ferry.env[x.TRACE_ENV]
    lines = [line.split() for line in trace_file.read_text().splitlines()]
    supervisors = [int(pid) for pid, name, launcher in lines if name == "supervisor"]
    assert len(supervisors) == 1 and [run.pid] == [
        int(launcher) for _, name, launcher in lines if name == "supervisor"
    ]
    points = [str(p) for p in x.points_of([(int(a), b, int(c)) for a, b, c in lines], run.pid)]
    for point in ("before:SUBMITTED", "before:SPAWNED", "before:SETTLED", "after:SETTLED"):
        assert point in points, points
    for point in ("before:spawn", "after:spawn", "after:SPAWNED", "before:SETTLED"):
        assert f"supervisor:{point}" in points, points
    # claim on an empty queue writes lease.json twice: taking the lease, giving it back.
    proc = ferry.start("claim", failpoints="before:lease_write=2=stop")
    x.wait_until(lambda: x.stopped(proc.pid), what="the claim to pause")
    lease = orjson.loads((ferry.home / "lease.json").read_bytes())
    assert lease["holder"]["pid"] == proc.pid  # taken, not yet given back
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=x.END_S) == 0
    assert orjson.loads((ferry.home / "lease.json").read_bytes())["holder"] is None
    # a supervisor's point pauses the supervisor; its launcher waits for it.
    settled = settled_count(ferry)
    proc = ferry.start("run", "--", "true", failpoints="supervisor:before:SETTLED=stop")
    supervisor = x.wait_until(
        lambda: next((p for p in processes_of(proc.pid) if x.stopped(p)), None),
        what="the supervisor to pause",
    )
    assert proc.poll() is None and not x.stopped(proc.pid)
    assert settled_count(ferry) == settled
    os.kill(supervisor, signal.SIGCONT)
    assert proc.wait(timeout=x.END_S) == 0


def settled_count(ferry: Ferry) -> int:
    return [r["type"] for r in x.read_records(ferry.home).records.values()].count("SETTLED")


def processes_of(parent: int) -> list[int]:
    """The children of ``parent`` (from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = x.read_stat(int(name))
            if st is not None and st.ppid == parent:
                found.append(st.pid)
    return found


@pytest.mark.parametrize("round_no", range(3))
def test_a_paused_work_stops_at_its_point_not_after_it(ferry: Ferry, round_no: int) -> None:
    """``=stop`` must pause the process at its point, not after it: the explorer's
    cases rest on it. ``work`` writes SPAWNED itself (for its supervisor); paused at
    ``before:SPAWNED``, it has not written it and holds no lock. (With a thread per
    slot, a process-directed SIGSTOP was taken by the main thread while the slot's
    thread that reached the point ran on into the append. ``work`` is one thread now,
    which reaches its points itself: the main thread, which Linux gives a signal sent
    to its process first.)"""
    ferry.ok("submit", "--", "sleep", "0.3")
    proc = ferry.start(
        "work", "--drain", "--poll", "0.05", failpoints="launcher:before:SPAWNED=stop"
    )
    x.wait_until(lambda: x.stopped(proc.pid), what="work to pause")
    written = [r["type"] for r in x.read_records(ferry.home).records.values()]
    assert "SPAWNED" not in written, written
    assert not x.locks_held(proc.pid, ferry.home)


@pytest.mark.parametrize("command", ["run", "claim"])
def test_a_supervisor_whose_end_is_durable_is_not_killed(ferry: Ferry, command: str) -> None:
    """Found by the explorer (``run@supervisor:after:SETTLED``, never reached): once
    the launcher has acked its supervisor's end, it forgot the task (its ``claimed``
    flag included) and then SIGKILLed the supervisor as one "whose claim was never
    written". The supervisor, paused just after the ack, must still be alive when its
    launcher has exited, and exit 0 by itself once continued."""
    trace_file = ferry.home.parent / "trace"
    ferry.env[x.TRACE_ENV] = str(trace_file)
    argv = ("run", "--", "true") if command == "run" else ("claim",)
    if command == "claim":
        ferry.ok("submit", "--", "true")
    proc = ferry.start(*argv, failpoints="supervisor:after:SETTLED=stop")
    del ferry.env[x.TRACE_ENV]
    assert proc.wait(timeout=x.END_S) == 0
    lines = [line.split() for line in trace_file.read_text().splitlines()]
    [supervisor] = [int(pid) for pid, name, _ in lines if name == "supervisor"]
    assert [supervisor, "after:SETTLED"] in [[int(pid), name] for pid, name, _ in lines]
    assert x.stopped(supervisor), x.read_stat(supervisor)
    os.kill(supervisor, signal.SIGCONT)
    x.wait_until(lambda: x.read_stat(supervisor) is None, what="the supervisor to exit")


@pytest.mark.soak  # (24 s: the explorer's default schedule set; tox -e soak)
def test_default_interleavings(tmp_path: Path, report: Report) -> None:
    """The default subset: each KNOWN_BUGS case in it fails as listed (bugs 2 and 4
    among them), and nothing else fails."""
    outcomes = run([x.case(case_id) for case_id in DEFAULT_CASES], tmp_path, report)
    assert not judge(outcomes), "\n".join(judge(outcomes))


PAIRS = [(a, b) for a in x.COMMANDS for b in x.COMMANDS]


@pytest.mark.soak
@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}|{b}" for a, b in PAIRS])
def test_every_pair_at_every_failpoint(a: str, b: str, tmp_path: Path, report: Report) -> None:
    """Every point A reaches in the pair's world(s), against B run to its end."""
    cases = []
    for pair in x.plans(a, b):
        cases.extend(x.cases_of(pair, x.trace(tmp_path / f"trace{pair.variant}", pair)))
    if not cases:
        report.skipped.append(f"{a} paused, {b}: no case (A writes nothing in this world)")
        pytest.skip(f"`{a}` reaches no failpoint in this world")
    outcomes = run(cases, tmp_path / "cases", report)
    assert not judge(outcomes), "\n".join(judge(outcomes))
