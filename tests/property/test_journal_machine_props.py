"""A hypothesis state machine driving a real journal against a model.

The model is the list of committed records (seq = index + 1) and the latest snapshot's
seq. Steps: append, append a batch, rotate (tiny segment_bytes_max does it as a side
effect), crash (drop the handle; optionally leave a torn tail: part of the next line,
NUL bytes, garbage, or a whole next line that was written but never acknowledged),
repair, reopen, snapshot, compact, replay. After every step the journal on disk must
replay to exactly the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import journal
from journal import _codec

payloads = st.dictionaries(
    st.sampled_from(["a", "b", "task", "n"]),
    st.integers(-(2**63), 2**64 - 1) | st.text(max_size=30) | st.booleans() | st.none(),
    max_size=3,
)
TEAR_KINDS = ["none", "partial", "nul", "garbage", "unacked"]


def scratch_parent() -> str | None:
    """tmpfs when there is one: these properties are about bytes and classification,
    not durability (the power-cut tests cover fsync), and thousands of fsyncs on a
    shared disk would make the default run slow."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="journal-machine-", dir=scratch_parent()))
        self.directory = self.root / "j"
        self.model: list[tuple[str, dict[str, Any]]] = []
        self.snapshot_seq = 0
        self.torn_bytes = 0  # bytes of torn tail currently on disk (before the zero tail)
        self.j: journal.Journal | None = None
        self.segment_bytes_max = 512

    @initialize(segment_bytes_max=st.sampled_from([200, 512, 4096]))
    def open_journal(self, segment_bytes_max: int) -> None:
        self.segment_bytes_max = segment_bytes_max
        self.j = journal.Journal.open(self.directory, segment_bytes_max=segment_bytes_max)

    def teardown(self) -> None:
        if self.j is not None:
            self.j.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- steps

    @precondition(lambda self: self.j is not None)
    @rule(rtype=st.sampled_from(["a", "b"]), data=payloads)
    def append(self, rtype: str, data: dict[str, Any]) -> None:
        assert self.j is not None
        record = self.j.append(rtype, data)
        self.model.append((rtype, data))
        self.torn_bytes = 0  # an append cuts a torn tail first
        assert record.seq == len(self.model)
        assert (record.type, record.data) == (rtype, data)

    @precondition(lambda self: self.j is not None)
    @rule(items=st.lists(st.tuples(st.sampled_from(["a", "b"]), payloads), min_size=1, max_size=6))
    def append_batch(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        assert self.j is not None
        records = self.j.append_batch(items)
        start = len(self.model) + 1
        self.model.extend(items)
        self.torn_bytes = 0
        assert [r.seq for r in records] == list(range(start, start + len(items)))

    @precondition(lambda self: self.j is not None)
    @rule(
        tear=st.sampled_from(TEAR_KINDS),
        garbage=st.binary(min_size=1, max_size=40),
        frac=st.floats(0, 1),
    )
    def crash(self, tear: str, garbage: bytes, frac: float) -> None:
        """The process dies (between or in the middle of appends)."""
        assert self.j is not None
        self.j.close()  # nothing is buffered: closing is what the kernel does at exit
        self.j = None
        segments = sorted(self.directory.glob("*.jsonl"))
        event(f"crash: {tear}")
        if tear == "none" or not segments or (tear == "unacked" and self.torn_bytes):
            # (A writer cuts a torn tail before it writes: a whole line never follows one.)
            return
        seq = len(self.model) + 1
        line = _codec.encode_record(seq, 0, 1.0, "a", {"torn": True, "pad": "x" * 20})
        if tear == "partial":
            tail = line[: max(1, min(len(line) - 1, int(len(line) * frac)))]
        elif tear == "nul":
            tail = b"\0" * max(1, int(len(line) * frac))
        elif tear == "garbage":
            # No newline: a crash leaves no whole line that does not check (one is
            # corruption, never a torn tail: tests/unit/test_journal_reader.py).
            tail = garbage.replace(b"\n", b" ")
        else:
            # Written in full, power (or process) gone before fsync returned: the
            # record is valid on disk although nobody was told it committed.
            tail = line
            self.model.append(("a", {"torn": True, "pad": "x" * 20}))
        # A writer writes at the end of the records, over the segment's zero tail; a
        # torn tail an earlier crash left it cuts first (zeroes), so torn bytes never
        # pile up. (They did in this model: a record torn just before its newline, then
        # one byte of the next, read as a record whose newline is damaged: corruption.)
        with open(segments[-1], "r+b") as f:
            end = len(f.read().rstrip(b"\0")) - self.torn_bytes
            f.seek(end)
            f.write(b"\0" * self.torn_bytes)
            f.seek(end)
            f.write(tail)
        self.torn_bytes = 0 if tear == "unacked" else len(tail.rstrip(b"\0"))

    @precondition(lambda self: self.j is None)
    @rule()
    def repair(self) -> None:
        report = journal.repair(self.directory)
        event(f"repair: cut={report.repaired}")
        assert report.bytes_cut == self.torn_bytes
        assert report.repaired == (self.torn_bytes > 0)
        if report.repaired:
            assert report.broken_copy is not None and os.path.exists(report.broken_copy)
            assert os.stat(report.broken_copy).st_size == self.torn_bytes
        assert report.last_seq == len(self.model)
        self.torn_bytes = 0

    @precondition(lambda self: self.j is None)
    @rule()
    def reopen(self) -> None:
        # Possibly with a torn tail still there: the next append must cut it first.
        self.j = journal.Journal.open(self.directory, segment_bytes_max=self.segment_bytes_max)
        assert self.j.last_seq == len(self.model)

    @precondition(lambda self: self.j is not None)
    @rule()
    def snapshot(self) -> None:
        assert self.j is not None
        self.j.write_snapshot(len(self.model), orjson.dumps(self.model))
        self.snapshot_seq = len(self.model)

    @precondition(lambda self: self.j is not None)
    @rule()
    def compact(self) -> None:
        assert self.j is not None
        removed = self.j.compact()
        event(f"compact: removed {'some' if removed else 'none'}")
        for path in removed:
            assert not os.path.exists(path)
        segments = sorted(self.directory.glob("*.jsonl"))
        if segments:
            first_seq = int(segments[0].name.split(".")[0])
            assert first_seq <= self.snapshot_seq + 1, (
                "compaction removed records not in a snapshot"
            )

    @precondition(lambda self: self.j is not None)
    @rule()
    def replay(self) -> None:
        assert self.j is not None
        assert self.replayed(self.j) == self.model
        event(f"replay: rotated={len(list(self.directory.glob('*.jsonl'))) > 1}")

    # -- checks

    def replayed(self, j: journal.Journal) -> list[tuple[str, dict[str, Any]]]:
        snapshot = j.latest_snapshot()
        base: list[tuple[str, dict[str, Any]]] = []
        if snapshot is not None:
            base = [(t, d) for t, d in orjson.loads(snapshot.data)]
            assert snapshot.seq == len(base) == self.snapshot_seq
        tail = list(j.read(from_seq=len(base) + 1))
        assert [r.seq for r in tail] == list(range(len(base) + 1, len(base) + 1 + len(tail)))
        return base + [(r.type, r.data) for r in tail]

    @invariant()
    def disk_matches_model(self) -> None:
        if not self.directory.exists():
            return
        report = journal.verify(self.directory)
        if self.torn_bytes:
            assert (
                report.torn_tail is not None and report.torn_tail.tail_bytes == self.torn_bytes
            ), report
        else:
            assert report.clean, report
        assert report.last_seq == len(self.model)


JournalMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestJournalMachine = JournalMachine.TestCase
