"""Power cuts over the journal's real sequence of file operations (see simdisk.py).

The workload runs once, for real, with `journal._fsutil.os` replaced by a SimDisk that
traces every change. Then, for every event boundary of the trace, every state the disk
may come back with is materialised into a real directory, where the real library (real
`os`) repairs, opens and reads it. The check, for a cut after event k:

* every record whose append (or append_batch) had returned before event k is there, in
  order, exactly once (replay = the snapshot's records + the segments after it);
* nothing is invented: what is there is a prefix of what was appended, and no longer
  than what had been handed to the library before the cut;
* after repair the journal verifies clean, and a new append gets the next seq.

The last test removes one fsync from the library and shows that this harness notices.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import simdisk

import journal
from journal import _fsutil

History = list[tuple[str, dict[str, Any]]]


@dataclass
class Run:
    """One traced run of a workload."""

    sim: simdisk.SimDisk
    directory: Path
    history: History = field(default_factory=list)  # every record appended, in seq order
    # (number of events when the call returned, records committed by then)
    committed: list[tuple[int, int]] = field(default_factory=list)
    # (number of events when the call started, records handed over by then)
    started: list[tuple[int, int]] = field(default_factory=list)

    def committed_at(self, k: int) -> int:
        return max((n for at, n in self.committed if at <= k), default=0)

    def handed_over_at(self, k: int) -> int:
        return max((n for at, n in self.started if at < k), default=0)


class Driver:
    """Calls the real library and notes, in event counts, when each commit returned."""

    def __init__(self, run: Run, segment_bytes_max: int) -> None:
        self.run = run
        self.segment_bytes_max = segment_bytes_max
        self.j = journal.Journal.open(run.directory, segment_bytes_max=segment_bytes_max)

    def _events(self) -> int:
        return len(self.run.sim.events)

    def append(self, i: int) -> None:
        self.batch([i])

    def batch(self, items: list[int]) -> None:
        history = self.run.history
        records = [("rec", {"i": i, "pad": "p" * (i % 7) * 5}) for i in items]
        self.run.started.append((self._events(), len(history) + len(records)))
        history.extend(records)
        got = [self.j.append(*records[0])] if len(records) == 1 else self.j.append_batch(records)
        assert [r.seq for r in got] == list(range(len(history) - len(got) + 1, len(history) + 1))
        self.run.committed.append((self._events(), len(history)))

    def snapshot(self) -> None:
        # The snapshot carries the records it covers, so a check can rebuild the history.
        seq = len(self.run.history)
        self.j.write_snapshot(seq, orjson.dumps(self.run.history))

    def compact(self) -> None:
        self.j.compact()

    def reopen(self) -> None:
        self.j.close()
        self.j = journal.Journal.open(self.run.directory, segment_bytes_max=self.segment_bytes_max)

    def crash_with_torn_tail(self, garbage: bytes) -> None:
        """A crash of an earlier writer left garbage at the end of the last segment
        (durably: it is the starting point here), then the library repairs it."""
        self.j.close()
        sim = self.run.sim
        last = sorted(self.run.directory.glob("*.jsonl"))[-1]
        fd = sim.open(last, _fsutil.APPEND_FLAGS)
        sim.write(fd, garbage)
        sim.fsync(fd)
        sim.close(fd)
        journal.repair(self.run.directory)
        self.j = journal.Journal.open(self.run.directory, segment_bytes_max=self.segment_bytes_max)

    def close(self) -> None:
        self.j.close()


Workload = Callable[[Driver], None]


def standard_workload(d: Driver) -> None:
    """Append, batch, rotate (tiny segments), snapshot, compact, reopen, repair."""
    for i in range(4):
        d.append(i)
    d.batch([4, 5, 6])
    d.append(7)
    d.snapshot()
    d.compact()
    d.append(8)
    d.reopen()
    d.batch([9, 10])
    d.crash_with_torn_tail(b'{"v":1,"seq":12,"ep')
    d.append(11)
    d.snapshot()
    d.append(12)
    d.compact()
    d.append(13)


def trace(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    workload: Workload,
    segment_bytes_max: int,
    skip_sync: Callable[[int | str], bool] | None = None,
) -> Run:
    root = tmp / "disk"
    root.mkdir()
    sim = simdisk.SimDisk(root)
    sim.skip_sync = skip_sync
    run = Run(sim, root / "journal")
    with monkeypatch.context() as patch:
        patch.setattr(_fsutil, "os", sim)
        driver = Driver(run, segment_bytes_max)
        workload(driver)
        driver.close()
    assert sim.check_in_step() == [], "the trace does not match the real files"
    return run


@dataclass(frozen=True)
class Recovered:
    records: History | None  # None: the library refused the state
    problem: str = ""


def recover(directory: Path) -> Recovered:
    """What the real library makes of a surviving state: repair, open, replay, verify."""
    if not directory.exists():
        return Recovered([])
    try:
        journal.repair(directory)
        j = journal.Journal.open(directory)
        try:
            snapshot = j.latest_snapshot()
            base: History = []
            if snapshot is not None:
                base = [(t, d) for t, d in orjson.loads(snapshot.data)]
                assert len(base) == snapshot.seq, "snapshot seq and content disagree"
            tail = list(j.read(from_seq=len(base) + 1))
            assert [r.seq for r in tail] == list(range(len(base) + 1, len(base) + len(tail) + 1))
            records = base + [(r.type, r.data) for r in tail]
            assert j.last_seq == len(records)
            report = journal.verify(directory)
            assert report.clean, f"not clean after repair: {report}"
            after = j.append("after", {})
            assert after.seq == len(records) + 1
        finally:
            j.close()
    except (journal.JournalError, AssertionError) as exc:
        return Recovered(None, f"{type(exc).__name__}: {exc}")
    return Recovered(records)


@dataclass
class Verdict:
    cuts: int = 0
    states: int = 0
    distinct_states: int = 0
    violations: list[str] = field(default_factory=list)


def check_power_cuts(
    run: Run, scratch: Path, *, max_states_per_cut: int = 48, stop_at_first: bool = False
) -> Verdict:
    verdict = Verdict()
    cache: dict[str, Recovered] = {}
    rel = run.directory.relative_to(run.sim.root)
    for cut in simdisk.power_cuts(run.sim, max_states_per_cut=max_states_per_cut):
        verdict.cuts += 1
        must, may = run.committed_at(cut.k), run.handed_over_at(cut.k)
        for state in cut.states:
            verdict.states += 1
            digest = simdisk.state_digest(state)
            if digest not in cache:
                target = scratch / f"s{len(cache)}"
                simdisk.materialise(state, target)
                cache[digest] = recover(target / rel)
                shutil.rmtree(target)
            got = cache[digest]
            where = f"cut after event {cut.k} ({describe(run, cut.k)})"
            if got.records is None:
                verdict.violations.append(f"{where}: refused: {got.problem}")
                continue
            n = len(got.records)
            if n < must:
                verdict.violations.append(f"{where}: lost committed records: {n} < {must}")
            if got.records != run.history[:n]:
                verdict.violations.append(f"{where}: records differ from what was appended")
            if n > may:
                verdict.violations.append(f"{where}: {n} records but only {may} handed over")
        if stop_at_first and verdict.violations:
            break
    verdict.distinct_states = len(cache)
    return verdict


def describe(run: Run, k: int) -> str:
    return "start" if k == 0 else type(run.sim.events[k - 1]).__name__


@pytest.fixture
def states_dir(tmp_path: Path) -> Iterator[Path]:
    """Where surviving states are materialised and checked: tmpfs when there is one.

    Only the traced run needs real fsync (it is the library's real sequence); checking a
    surviving state is reading, and thousands of them fsyncing a real disk only make
    the test slow on a shared machine."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(prefix="powercut-", dir=shm) as tmp:
            yield Path(tmp)
    else:
        yield tmp_path / "states"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def test_no_committed_record_is_lost_at_any_power_cut(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trace(workdir, monkeypatch, standard_workload, segment_bytes_max=300)
    segments_seen = {e.name for e in run.sim.events if isinstance(e, simdisk.Create)}
    assert sum(name.endswith(".jsonl") for name in segments_seen) >= 3, "rotation exercised"
    assert any(isinstance(e, simdisk.Unlink) for e in run.sim.events), "compaction exercised"
    verdict = check_power_cuts(run, states_dir)
    assert verdict.violations == [], "\n".join(verdict.violations[:20])
    assert verdict.cuts == len(run.sim.events) + 1
    assert verdict.distinct_states > verdict.cuts, "torn and dropped writes enumerated"


def called_from(site: str) -> bool:
    """True if a function named `site` in the journal package is on the call stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == site and frame.f_globals.get("__name__", "").startswith(
            "journal"
        ):
            return True
        frame = frame.f_back
    return False


# (call site, what it syncs): each one, deleted, must make the harness report a loss.
FSYNC_SITES = [
    ("_flush", "file"),  # the commit's fdatasync of the appended lines
    ("_new_segment", "dir"),  # the directory fsync that makes a new segment's name durable
    ("atomic_replace", "file"),  # the snapshot's data, before its rename
    ("makedirs", "dir"),  # the parent's fsync that makes the journal directory durable
]


@pytest.mark.parametrize(("site", "kind"), FSYNC_SITES)
def test_harness_catches_one_removed_fsync(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch, site: str, kind: str
) -> None:
    """Meta-test: it passes BECAUSE the harness notices the loss a missing fsync causes."""

    def skip(target: int | str) -> bool:
        return isinstance(target, int) == (kind == "file") and called_from(site)

    run = trace(workdir, monkeypatch, standard_workload, segment_bytes_max=300, skip_sync=skip)
    verdict = check_power_cuts(run, states_dir, stop_at_first=True)
    lost = [v for v in verdict.violations if "lost committed records" in v or "refused" in v]
    assert lost, f"removing the {kind} fsync in {site} went unnoticed: the model is too kind"
