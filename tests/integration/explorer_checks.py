"""The invariants the interleaving explorer checks after each case (``explorer.py``),
and what they read: the tasks' own record of their executions, the journal's records,
the table of tasks, ``journal verify``. Reading is in-process, through the functions
behind ``journal dump``, ``ls`` and ``journal verify`` (a ferry process costs 0.3-1 s
here, and a case reads the state directory five times).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

import journal
from ferry.core.model import task_to_json
from ferry.core.state import Table
from ferry.proc.process import find_by_marker, marker_prefix
from ferry.storage.local.maintenance import verify
from ferry.storage.local.store import Store

RUNNERS = frozenset({"run", "claim", "work"})
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# Decided by recovery without the task's runner: its orphan may live, its end is unknown.
UNSUPERVISED = frozenset({"QUARANTINED_ORPHAN_ALIVE", "MARKED_FAILED_MUTATION_UNSAFE"})


def name_tag(role_name: str, command: str) -> str:
    """The ``--name`` (prefix) a command of the case gives its tasks: ``A-run``."""
    return f"{role_name}-{command}"


# ---- what the tasks wrote ------------------------------------------------------------


@dataclass
class Execution:
    """One real start of a task (a line ``start`` in its key's file), and its end."""

    key: str
    marker: str  # FERRY_TASK: <id>:<attempt>:<token>
    ppid: int  # the ferry process that spawned it
    start_ns: int
    end: str | None = None  # "exit:N" or "signal"
    end_ns: int | None = None

    @property
    def task(self) -> str:
        return self.marker.split(":")[0]

    @property
    def attempt(self) -> int:
        return int(self.marker.split(":")[1])

    @property
    def token(self) -> str:
        return self.marker.split(":")[2]

    @property
    def exit_code(self) -> int | None:
        return int(self.end[5:]) if self.end and self.end.startswith("exit:") else None

    def overlaps(self, other: Execution) -> bool:
        inf = 1 << 80
        return self.start_ns < (other.end_ns or inf) and other.start_ns < (self.end_ns or inf)


def executions(marks: Path) -> list[Execution]:
    found: list[Execution] = []
    if not marks.is_dir():
        return found
    for path in sorted(marks.iterdir()):
        latest_by_marker: dict[str, Execution] = {}
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4 or not parts[3].isdigit():
                continue  # (a line being written)
            kind, marker, third, ns = parts
            if kind == "start" and third.isdigit():
                execution = Execution(path.name, marker, int(third), int(ns))
                found.append(execution)
                latest_by_marker[marker] = execution
            elif kind == "end" and marker in latest_by_marker:
                # (Its last end line: a TERM between the task's "end exit:N" and its
                # exit runs its trap, which writes "end signal": it died of that signal,
                # as its runner saw. Seen once in a soak: cancel|claim:end.)
                ended = latest_by_marker[marker]
                ended.end, ended.end_ns = third, int(ns)
    return found


# ---- reading the state directory (in-process: the functions behind the commands) ----


@dataclass
class Snapshot:
    """The journal's records (by seq) and, if taken, the table of tasks."""

    first_seq: int
    records: dict[int, dict[str, Any]]
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The table folded afresh from every record, when none was compacted away: what
    # the table (snapshot, archives, tail) must equal.
    replayed: dict[str, dict[str, Any]] | None = None


def read_records(home: Path) -> Snapshot:
    """Every record on disk, lock-free (as ``journal dump`` prints them)."""
    directory = home / "journal"
    for _ in range(5):
        start = 1
        try:
            records: dict[int, dict[str, Any]] = {}
            while True:
                try:
                    for record in journal.read_records(directory, start):
                        records[record.seq] = {
                            "seq": record.seq,
                            "epoch": record.epoch,
                            "type": record.type,
                            "data": record.data,
                        }
                    return Snapshot(start, records)
                except journal.CompactedError as error:
                    start = error.first_seq
        except FileNotFoundError:  # a segment compacted away under the read: again
            continue
    raise AssertionError(f"could not read the journal of {home}")


def read_state(home: Path) -> Snapshot:
    """The records and the table (``ls --limit 0``: snapshot, archives and tail)."""
    snap = read_records(home)
    store = Store.open(home)
    try:
        snap.tasks = {t.id: task_to_json(t) for t in store.newest(0)}
    finally:
        store.close()
    if snap.first_seq == 1:
        fresh = Table()
        for record in journal.read_records(home / "journal"):
            if record.seq <= max(snap.records, default=0):
                fresh.apply_record(record)
        snap.replayed = {t.id: task_to_json(t) for t in fresh.tasks()}
    return snap


def journal_report(home: Path) -> dict[str, Any]:
    return verify(home / "journal")


@dataclass(frozen=True)
class Violation:
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.message}"


@dataclass
class Ran:
    """A command of the case, as it ended."""

    command: str  # "run", "submit-from", ...
    name: str  # "A" or "B"
    args: list[str]
    pid: int
    pids: frozenset[int] = frozenset()  # the launcher and its supervisors (the runners)
    code: int | None = None
    out: bytes = b""
    err: str = ""

    def json(self) -> Any:
        try:
            return orjson.loads(self.out) if self.out.strip() else None
        except orjson.JSONDecodeError:
            return None

    def error_code(self) -> str | None:
        lines = [line for line in self.err.splitlines() if line.startswith("ferry: error[")]
        return lines[-1].split("[", 1)[1].split("]", 1)[0] if lines else None

    def __str__(self) -> str:
        code = self.error_code()
        return f"{self.name}=`{self.command}` exit {self.code}" + (f" ({code})" if code else "")


# ---- the invariants ------------------------------------------------------------------


def settled_but_alive(state: Snapshot) -> list[Violation]:
    """truth: a task the journal calls settled (or queued again) has no process alive,
    unless recovery quarantined it (its orphan may live: that is what it says)."""
    found = []
    for task in state.tasks.values():
        if task["state"] not in TERMINAL | {"QUEUED"} or task["reason"] in UNSUPERVISED:
            continue
        alive = find_by_marker(marker_prefix(task["id"], task["attempt"])).alive
        if alive:
            found.append(
                Violation(
                    "truth",
                    f"task {task['name']} is {task['state']} {task['reason'] or ''} in the"
                    f" journal while its attempt {task['attempt']} still runs"
                    f" (pid {alive[0].pid})",
                )
            )
    return found


def left_in_flight(state: Snapshot, recover_code: int) -> list[Violation]:
    if recover_code not in (0, 3):
        return [Violation("in-flight", f"the final `ferry recover` exited {recover_code}")]
    return [
        Violation("in-flight", f"task {t['name']} still {t['state']} after the final recover")
        for t in state.tasks.values()
        if t["state"] not in TERMINAL | {"QUEUED"}
    ]


def _expected_exit(settled: Mapping[str, Any]) -> int | None:
    """The status ``run``/``claim`` pass through for this SETTLED record."""
    data = settled["data"]
    if data["state"] == "SUCCEEDED":
        return 0
    if data.get("reason") == "TIMEOUT":
        return 124
    if data.get("signal") is not None:
        return 128 + int(data["signal"])
    if data.get("exit_code") is not None:
        return int(data["exit_code"])
    evidence = data.get("evidence") or {}
    if evidence.get("cancelled_before_spawn"):
        return 128 + signal.SIGTERM
    error = evidence.get("error") or {}
    return {"spawn.not_found": 127, "spawn.not_executable": 126}.get(error.get("code"), 125)


@dataclass
class Facts:
    """Everything seen in one case, for the checks."""

    records: dict[int, dict[str, Any]]  # every record seen at any time, by seq
    final: Snapshot
    runs: list[Execution]
    home: Path
    unsupervised: Set[str]

    def of_type(self, *types: str, task: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.records.values()
            if r["type"] in types and (task is None or r["data"].get("task") == task)
        ]

    def claims_by(self, pids: Set[int]) -> list[dict[str, Any]]:
        """The claims naming one of ``pids`` as the runner (a command's supervisors)."""
        return [r for r in self.of_type("CLAIMED") if r["data"]["runner"].get("pid") in pids]

    def settled_by_token(self, token: str) -> dict[str, Any] | None:
        found = [r for r in self.of_type("SETTLED") if r["data"].get("token") == token]
        return found[-1] if found else None

    def name_of(self, task_id: str) -> str:
        task = self.final.tasks.get(task_id)
        return str(task["name"]) if task else task_id


def check(
    home: Path,
    marks: Path,
    commands: Sequence[Ran],
    seen: Sequence[Snapshot],
    final: Snapshot,
    unsupervised: Set[str] = frozenset(),
) -> list[Violation]:
    """Every invariant but those checked on the way (settled_but_alive, left_in_flight).
    ``unsupervised``: markers of executions whose runner the setup killed."""
    records: dict[int, dict[str, Any]] = {}
    for snap in [*seen, final]:
        records.update(snap.records)
    facts = Facts(records, final, executions(marks), home, unsupervised)
    found = _lost(seen, final)
    found += _ran_twice(facts)
    found += _ended_untold(facts)
    found += _verify(home)
    found += [
        Violation("in-flight", f"task {t['name']} is {t['state']} after the final drain")
        for t in final.tasks.values()
        if t["state"] not in TERMINAL
    ]
    for ran in commands:
        same = [c for c in commands if c.command == ran.command]
        found += [Violation("exit", f"{ran}: {why}") for why in _exit_lies(ran, facts, len(same))]
    return found


def _lost(seen: Sequence[Snapshot], final: Snapshot) -> list[Violation]:
    """lost: each record seen is still there, byte for byte, or (compacted) its task is."""
    found = []
    for snap in seen:
        for seq, record in snap.records.items():
            if seq >= final.first_seq:
                now = final.records.get(seq)
                if now != record:
                    what = "gone" if now is None else f"now {now['type']} {now['data']}"
                    found.append(
                        Violation("lost", f"record {seq} {record['type']} {record['data']}: {what}")
                    )
                continue
            task_id = record["data"].get("task")
            if task_id is None:
                continue
            task = final.tasks.get(task_id)
            attempt = record["data"].get("attempt", 1)
            if task is None or task["attempt"] < attempt:
                found.append(
                    Violation("lost", f"task {task_id} of compacted record {seq}: not in the table")
                )
    if final.replayed is not None and final.replayed != final.tasks:
        for task_id in sorted(set(final.replayed) | set(final.tasks)):
            folded, loaded = final.replayed.get(task_id), final.tasks.get(task_id)
            if folded != loaded:
                differ = sorted(
                    k
                    for k in set(folded or {}) | set(loaded or {})
                    if (folded or {}).get(k) != (loaded or {}).get(k)
                )
                found.append(
                    Violation(
                        "lost",
                        f"task {task_id}: the table (snapshot, archives, tail) differs from"
                        f" the journal replayed from seq 1 in {differ}",
                    )
                )
    return list({v.message: v for v in found}.values())


def _ran_twice(facts: Facts) -> list[Violation]:
    found = []
    by_attempt: dict[tuple[str, int], list[Execution]] = {}
    for execution in facts.runs:
        by_attempt.setdefault((execution.task, execution.attempt), []).append(execution)
    for (task_id, attempt), runs in by_attempt.items():
        idempotent = facts.final.tasks.get(task_id, {}).get("idempotent", False)
        if len(runs) > 1 and not idempotent:  # (an --idempotent one may run again)
            found.append(
                Violation(
                    "ran-twice",
                    f"task {facts.name_of(task_id)} attempt {attempt} started {len(runs)} times",
                )
            )
    by_key: dict[str, list[Execution]] = {}
    for execution in facts.runs:
        by_key.setdefault(execution.key, []).append(execution)
    for key, runs in by_key.items():
        for i, first in enumerate(runs):
            for second in runs[i + 1 :]:
                same_attempt = (first.task, first.attempt) == (second.task, second.attempt)
                if not same_attempt and first.overlaps(second):
                    found.append(
                        Violation(
                            "ran-twice",
                            f"key {key}: {facts.name_of(first.task)} attempt {first.attempt}"
                            f" and {facts.name_of(second.task)} attempt {second.attempt}"
                            " ran at the same time",
                        )
                    )
    return found


def _ended_untold(facts: Facts) -> list[Violation]:
    """truth: an attempt that ran to its own end with status N under a live runner is
    journaled with N (unless recovery decided it without its runner)."""
    found = []
    for execution in facts.runs:
        code = execution.exit_code
        if code is None or execution.marker in facts.unsupervised:
            continue
        settles = [
            r
            for r in facts.of_type("SETTLED", task=execution.task)
            if r["data"]["attempt"] == execution.attempt
        ]
        if not settles:
            task = facts.final.tasks.get(execution.task)
            if task is None or task["attempt"] != execution.attempt:
                continue
            settles = [{"data": {**task, "token": "?"}}]
        settled = settles[-1]["data"]
        if settled.get("reason") in UNSUPERVISED and settled.get("token") is None:
            continue
        expected = _expected_exit({"data": settled})
        if expected != code:
            found.append(
                Violation(
                    "truth",
                    f"task {facts.name_of(execution.task)} attempt {execution.attempt} ran to"
                    f" its end with exit {code}, but the journal says {settled['state']}"
                    f" {settled.get('reason') or ''} exit {settled.get('exit_code')}"
                    f" (token {settled.get('token')})",
                )
            )
    return found


def _verify(home: Path) -> list[Violation]:
    report = journal_report(home)
    if report["status"] != "clean":
        return [Violation("verify", f"journal verify: {report['status']} {report.get('error')}")]
    if report.get("anomalies"):
        return [Violation("verify", f"journal verify lists skipped records {report['anomalies']}")]
    return []


def _printed_ids(ran: Ran) -> list[str]:
    doc = ran.json()
    if isinstance(doc, dict) and isinstance(doc.get("id"), str):
        return [doc["id"]]
    if isinstance(doc, list):
        return [d["id"] for d in doc if isinstance(d, dict) and "id" in d]
    return []


def _exit_lies(ran: Ran, facts: Facts, same: int) -> list[str]:
    """exit: what ``ran``'s exit status says, against the journal. ``same``: how many
    commands of this kind the case ran (2: some facts cannot be told apart)."""
    command, code = ran.command, ran.code
    if code is None:
        return []
    if code == 2:
        return [f"a usage error: the explorer's command line is wrong ({ran.err.strip()})"]
    found = [
        f"printed task {task_id}, which is not in the table"
        for task_id in _printed_ids(ran)
        if code == 0 and task_id not in facts.final.tasks
    ]
    if command in ("run", "submit", "submit-from") and ran.error_code() == "task.key_succeeded":
        # What the same command says without the race (and the contract): a key that
        # already succeeded is not run again, exit 0 with a notice.
        found.append("refused: its key succeeded meanwhile (expected: exit 0 and a notice)")
    if command in RUNNERS:
        found += _runner_lies(ran, facts)
    elif command in ("submit", "submit-from"):
        tag = name_tag(ran.name, command)
        queued = [
            r["data"]["task"]
            for r in facts.of_type("SUBMITTED")
            if (r["data"]["spec"].get("name") or "").startswith(tag)
        ]
        if code != 0 and queued:
            found.append(f"but its task(s) {queued} were queued")
        if code == 0 and not queued and not _printed_ids(ran):
            found.append("but nothing was queued and no task was named")
    elif command == "cancel" and same == 1:
        target = ran.args[-1]
        cancels = facts.of_type("CANCEL_REQUESTED", task=target) + [
            r
            for r in facts.of_type("SETTLED", task=target)
            if r["data"].get("reason") == "CANCELLED_BY_USER"
        ]
        if code == 0 and not cancels:
            found.append(f"but the journal has no cancel of {facts.name_of(target)}")
        if code in (1, 5) and cancels:
            found.append(f"but {facts.name_of(target)} was cancelled: {cancels[-1]['type']}")
    elif command == "retry" and same == 1:
        target = ran.args[-1]
        retried = facts.of_type("RETRIED", task=target)
        if code == 0 and not retried:
            found.append(f"but the journal has no RETRIED of {facts.name_of(target)}")
        if code != 0 and retried:
            found.append(f"but {facts.name_of(target)} was retried")
    elif command == "kill" and same == 1:
        signalled = facts.of_type("ORPHAN_SIGNALLED", task=ran.args[-1])
        doc = ran.json() or {}
        if code == 0 and doc.get("signalled") and not signalled:
            found.append("signalled the orphan without journaling ORPHAN_SIGNALLED first")
        if code not in (0, 125) and signalled:
            found.append("but ORPHAN_SIGNALLED was journaled")
    elif command == "recover" and code in (0, 3):
        found += _recover_lies(ran, facts)
    elif command == "resolve" and same == 1:
        resolved = facts.of_type("RESOLVED", task=ran.args[2])
        if (code == 0) != bool(resolved):
            found.append(f"but the journal has {len(resolved)} RESOLVED record(s)")
    elif command == "compact" and code == 0:
        doc = ran.json() or {}
        report = journal_report(facts.home)
        if (report.get("snapshot_seq") or 0) < doc.get("snapshot_seq", 0):
            found.append(f"reported snapshot {doc.get('snapshot_seq')}, journal has {report}")
    return found


def _runner_lies(ran: Ran, facts: Facts) -> list[str]:
    code, command = ran.code, ran.command
    claims = facts.claims_by(ran.pids or {ran.pid})
    if command == "work":
        if code != 0:
            return []
        return [
            f"but task {facts.name_of(c['data']['task'])} it claimed was not settled by it"
            f" (it is {facts.final.tasks.get(c['data']['task'], {}).get('state')})"
            for c in claims
            if facts.settled_by_token(c["data"]["token"]) is None
        ]
    if not claims:
        if code == 0 and command == "run" and not _printed_ids(ran):
            return ["but it ran no task and named none"]
        refusal = ran.error_code() or ""
        if command == "claim" and code == 125 and refusal.startswith("task."):
            # The task it picked (read outside the lock) moved meanwhile, and its claim
            # was refused: 125 says ferry failed, where the answer is the next queued
            # task, or exit 0 for an empty queue (what work does: it picks again).
            return [f"gave up: the claim of the task it picked was refused ({refusal})"]
        if code not in (0, 1, 2, 3, 75, 125):
            return ["but it never claimed a task"]
        return []
    token = claims[-1]["data"]["token"]
    task_name = facts.name_of(claims[-1]["data"]["task"])
    started = [e for e in facts.runs if e.token == token]
    settled = facts.settled_by_token(token)
    if code == 125:
        if started:
            ended = started[0].end or "still running"
            return [f"(ferry failed before the task started) but {task_name} started ({ended})"]
        return []
    if command == "claim" and code == 75 and ran.error_code() == "lease.lost":
        # Paused past its lease's TTL between its claim and the spawn, a new leader
        # meanwhile: a leader that wakes up late starts nothing, and gives its claim back
        # (RELEASED by its token, not counted: claim_foreground).
        given_back = [r for r in facts.of_type("RELEASED") if r["data"].get("token") == token]
        if started:
            return [f"(its lease lost before the spawn) but {task_name} started"]
        if not given_back or given_back[-1]["data"].get("counted"):
            return [f"(its lease lost before the spawn) but its claim of {task_name} stayed"]
        return []
    if code == 3 and ran.error_code() == "supervisor.died":
        return []  # (its supervisor died after its plan: the task may have started)
    if settled is None:
        state = facts.final.tasks.get(claims[-1]["data"]["task"], {})
        return [
            f"but its task {task_name} was never settled by it (journal: {state.get('state')}"
            f" {state.get('reason')})"
        ]
    expected = _expected_exit(settled)
    if expected != code:
        return [f"but the journal settled {task_name} {settled['data']['state']}: exit {expected}"]
    return []


def _recover_lies(ran: Ran, facts: Facts) -> list[str]:
    doc = ran.json() or {}
    found = []
    decision_types = ("SETTLED", "RELEASED", "STALE")
    for decision in doc.get("decisions", []):
        match = [
            r
            for r in facts.of_type(*decision_types, task=decision["task"])
            if r["epoch"] == doc.get("epoch")
        ]
        if not match:
            found.append(f"reported deciding {decision} but no such record at its epoch")
    if doc and doc.get("exit_code") != ran.code:
        found.append(f"its report says exit {doc.get('exit_code')}")
    return found
