"""Power cuts over the journal's real sequence of file operations (see simdisk.py).

The workload runs once, for real, with `journal._fsutil.os` replaced by a SimDisk that
traces every change. Then, for every event boundary of the trace, every state the disk
may come back with is materialised into a real directory, where the real library (real
`os`) repairs, opens and reads it. The check, for a cut after event k:

* every record whose append (or append_batch) had returned before event k is there, in
  order, exactly once (replay = the snapshot's records + the segments after it);
* nothing is invented: what is there is a prefix of what was appended, and no longer
  than what had been handed to the library before the cut;
* after repair the journal verifies clean, and a new append gets the next seq (a state
  the library refuses to open counts as a violation too).

Workloads: one handle (append, batch, rotation, snapshot, compaction, reopen, torn tails
cut by repair and by append); two handles taking turns (as two processes would); a
process dying inside an append at each delicate point while another goes on; and, under
the `crash` mark, long seeded mixes of all of these. The meta-tests delete one fsync
call site from the library at a time and show that this harness reports the loss.
"""

from __future__ import annotations

import os
import random
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
from journal._segment import SALVAGE_MARKER

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
    """Calls the real library and notes, in event counts, when each commit returned.

    Several handles may be open on the journal at once (as several processes would):
    `h` picks the one a step goes through."""

    def __init__(self, run: Run, segment_bytes_max: int, handles: int = 1) -> None:
        self.run = run
        self.segment_bytes_max = segment_bytes_max
        self.handles = [self._open() for _ in range(handles)]

    def _open(self) -> journal.Journal:
        return journal.Journal.open(self.run.directory, segment_bytes_max=self.segment_bytes_max)

    def _events(self) -> int:
        return len(self.run.sim.events)

    def append(self, i: int, h: int = 0) -> None:
        self.batch([i], h)

    def batch(self, items: list[int], h: int = 0) -> None:
        history = self.run.history
        records = [("rec", {"i": i, "pad": "p" * (i % 7) * 5}) for i in items]
        self.run.started.append((self._events(), len(history) + len(records)))
        history.extend(records)
        j = self.handles[h]
        got = [j.append(*records[0])] if len(records) == 1 else j.append_batch(records)
        assert [r.seq for r in got] == list(range(len(history) - len(got) + 1, len(history) + 1))
        self.run.committed.append((self._events(), len(history)))

    def snapshot(self, h: int = 0) -> None:
        # The snapshot carries the records it covers, so a check can rebuild the history.
        # (Another handle's appends are caught up first: the snapshot is of everything.)
        self.handles[h].refresh()
        seq = len(self.run.history)
        self.handles[h].write_snapshot(seq, orjson.dumps(self.run.history))

    def compact(self, h: int = 0) -> None:
        self.handles[h].compact()

    def reopen(self, h: int = 0) -> None:
        self.handles[h].close()
        self.handles[h] = self._open()

    def crash_with_torn_tail(self, garbage: bytes, *, repair: bool) -> None:
        """Every handle dies; the last one left garbage after the records of the last
        segment, over its zero tail (durably: it is the starting point here). Then
        either repair runs, or a fresh handle's next append has to cut the tail itself."""
        for j in self.handles:
            j.close()
        sim = self.run.sim
        segments = sorted(self.run.directory.glob("*.jsonl"))
        if segments:  # (no segment before the first append: nothing to tear)
            records_end = len(segments[-1].read_bytes().rstrip(b"\0"))
            fd = sim.open(segments[-1], _fsutil.RDWR_FLAGS)
            sim.pwrite(fd, garbage, records_end)
            sim.fsync(fd)
            sim.close(fd)
        if repair:
            journal.repair(self.run.directory)
        self.handles = [self._open() for _ in self.handles]

    def die_mid_append(
        self,
        items: list[int],
        h: int,
        at: str,
        kind: str,
        *,
        after_write: bool = False,
        required: bool = True,
    ) -> None:
        """Handle h's process dies inside an append, just before its first `at` call
        on a `kind` target ("file", "dir" or "path") (`after_write`: the first one after
        its records were written); a new process takes its place.

        Only a process dies: the page cache keeps what it wrote. Its records, if they
        were written, are visible to the others (and a later commit may build on them)."""
        history = self.run.history
        records = [("rec", {"i": i, "pad": "p" * (i % 7) * 5}) for i in items]
        self.run.started.append((self._events(), len(history) + len(records)))
        wrote = False

        def before(name: str, target: object) -> None:
            nonlocal wrote
            if name == at and kind == target_kind(name, target) and (wrote or not after_write):
                raise ProcessDied(f"{name} {target}")
            if name == "pwrite" and target in self._segment_inodes():
                wrote = True

        self.run.sim.before = before
        try:
            self.handles[h].append_batch(records)
        except ProcessDied:
            pass
        else:
            # It never reached that call (no rotation this time, say): it committed.
            assert not required, f"the append never reached {at} on a {kind}"
            history.extend(records)
            self.run.committed.append((self._events(), len(history)))
            return
        finally:
            self.run.sim.before = None
        self.handles[h].close()  # the kernel closes a dead process's descriptors
        # What the others will see: its records are there in full, or not at all.
        beyond = list(journal.read_records(self.run.directory, len(history) + 1))
        assert [(r.type, r.data) for r in beyond] in ([], records), beyond
        assert bool(beyond) == wrote, "the trace and the files disagree"
        if after_write:
            assert wrote, "died after writing its records"
        history.extend(records if beyond else [])
        self.handles[h] = self._open()

    def _segment_inodes(self) -> set[int]:
        return {
            e.ino
            for e in self.run.sim.events
            if isinstance(e, simdisk.Create) and e.name.endswith(".jsonl")
        }

    def close(self) -> None:
        for j in self.handles:
            j.close()


class ProcessDied(BaseException):
    """Raised from inside the library's file operations: the process is gone."""


def target_kind(name: str, target: object) -> str:
    """What a call works on: a file (its inode), a directory (its fsync), or a path (the
    name ``open`` creates: the journal's paths are str, as the sim's directories are)."""
    return "file" if isinstance(target, int) else "path" if name == "open" else "dir"


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
    d.crash_with_torn_tail(b'{"v":1,"seq":12,"ep', repair=True)
    d.append(11)
    d.snapshot()
    d.append(12)
    d.compact()
    d.append(13)
    d.crash_with_torn_tail(b"\0" * 40 + b"torn", repair=False)
    d.append(14)  # cuts the tail first (its NULs first: not mistaken for the zero tail)
    d.batch(list(range(15, 22)))  # one batch bigger than a segment


def two_handles_workload(d: Driver) -> None:
    """Two handles (as two processes would) take turns; each follows the other's
    rotations; one snapshots and compacts under the other's feet."""
    for i in range(12):
        d.append(i, h=i % 2)
    d.snapshot(h=1)
    d.compact(h=1)
    d.batch([12, 13, 14], h=0)
    d.append(15, h=1)
    d.snapshot(h=0)
    d.append(16, h=1)
    d.compact(h=0)
    d.append(17, h=1)
    d.append(18, h=0)


def process_deaths_workload(d: Driver) -> None:
    """Two processes; one dies inside an append at each delicate point, the other goes
    on (one record per segment: every append rotates). Committed records of the
    survivor must not depend on anything the dead one left unsynced."""
    for i in range(3):
        d.append(i, h=i % 2)
    # Written, never synced; the other process catches it up and rotates past it.
    d.die_mid_append([3], h=0, at="fdatasync", kind="file", after_write=True)
    d.append(4, h=1)
    d.append(5, h=0)
    # Segment created, its name never made durable; the other appends into it.
    d.die_mid_append([6], h=1, at="fsync", kind="dir")
    d.append(7, h=0)
    d.append(8, h=1)
    # Counted in the lock file, never created.
    d.die_mid_append([9], h=0, at="open", kind="path")
    d.append(10, h=1)
    d.append(11, h=0)
    # Written into a fresh segment and never synced; a snapshot covers it.
    d.die_mid_append([12], h=1, at="fdatasync", kind="file", after_write=True)
    d.snapshot(h=0)
    d.compact(h=0)
    d.append(13, h=0)


def sectors_workload(d: Driver) -> None:
    """Batches whose one write spans several 512-byte sectors: a power cut may lose a
    sector inside it while later ones land (NULs inside a whole line, then records of
    the same, uncommitted, write)."""
    d.append(0)
    d.batch(list(range(1, 31)))
    d.append(31)
    d.batch(list(range(32, 62)))


# Where a process may die inside an append: (call, target kind, after its write).
DEATH_POINTS = [
    ("pwrite", "file", False),  # nothing written
    ("fdatasync", "file", True),  # written, never synced
    ("fsync", "dir", False),  # a new segment's name not yet durable
    ("open", "path", False),  # counted in the lock file, segment not created
]


def random_workload(seed: int, steps: int) -> Workload:
    """A long seeded mix of every step (for the exhaustive, crash-marked run)."""

    def workload(d: Driver) -> None:
        rng = random.Random(seed)
        i = 0
        for _ in range(steps):
            roll = rng.random()
            h = rng.randrange(len(d.handles))
            if roll < 0.45:
                d.append(i, h)
                i += 1
            elif roll < 0.65:
                size = rng.randint(2, 9)
                d.batch(list(range(i, i + size)), h)
                i += size
            elif roll < 0.75:
                d.snapshot(h)
            elif roll < 0.85:
                d.compact(h)
            elif roll < 0.9:
                d.reopen(h)
            elif roll < 0.95:
                at, kind, after_write = rng.choice(DEATH_POINTS)
                d.die_mid_append([i], h, at, kind, after_write=after_write, required=False)
                i += 1
            else:
                # (What a crash mid-write leaves: no whole line, since a whole line
                # that does not check is corruption, never a torn tail.)
                garbage = rng.randbytes(50).replace(b"\n", b" ")
                tear = rng.choice([b'{"v":1,"seq', b"\0" * rng.randint(1, 300), garbage])
                d.crash_with_torn_tail(tear, repair=rng.random() < 0.5)
        d.append(i)

    return workload


def trace(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    workload: Workload,
    segment_bytes_max: int,
    skip_sync: Callable[[int | str], bool] | None = None,
    handles: int = 1,
    make_directory: Callable[[simdisk.SimDisk, Path, pytest.MonkeyPatch], Path] | None = None,
) -> Run:
    """``make_directory(sim, root, patch)``: makes the journal's directory (traced) and
    returns it, before the first handle opens (default: ``root/journal``, made by
    ``Journal.open``)."""
    root = tmp / "disk"
    root.mkdir()
    sim = simdisk.SimDisk(root, content_irrelevant=frozenset({".lock"}))
    sim.skip_sync = skip_sync
    run = Run(sim, root / "journal")
    with monkeypatch.context() as patch:
        patch.setattr(_fsutil, "os", sim)
        if make_directory is not None:
            run.directory = make_directory(sim, root, patch)
        driver = Driver(run, segment_bytes_max, handles)
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


def assert_no_loss(run: Run, states_dir: Path, max_states_per_cut: int = 48) -> Verdict:
    verdict = check_power_cuts(run, states_dir, max_states_per_cut=max_states_per_cut)
    assert verdict.violations == [], "\n".join(verdict.violations[:20])
    assert verdict.cuts == len(run.sim.events) + 1
    assert verdict.distinct_states > verdict.cuts, "torn and dropped writes enumerated"
    return verdict


def test_no_committed_record_is_lost_at_any_power_cut(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trace(workdir, monkeypatch, standard_workload, segment_bytes_max=300)
    events = run.sim.events
    created = {e.name for e in events if isinstance(e, simdisk.Create)}
    assert sum(name.endswith(".jsonl") for name in created) >= 4, "rotation exercised"
    assert any(name.endswith(".snap") or ".snap" in name for name in created), "snapshots"
    assert any(isinstance(e, simdisk.Unlink) for e in events), "compaction exercised"
    assert sum(isinstance(e, simdisk.Truncate) for e in events) >= 2, "both tails were cut"
    assert sum(".broken" in name for name in created) >= 2, "evidence kept"
    assert_no_loss(run, states_dir)


def test_no_committed_record_is_lost_with_two_handles(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trace(workdir, monkeypatch, two_handles_workload, segment_bytes_max=250, handles=2)
    assert any(isinstance(e, simdisk.Unlink) for e in run.sim.events), "compaction exercised"
    assert_no_loss(run, states_dir)


def test_no_committed_record_is_lost_when_a_process_dies_mid_append(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trace(workdir, monkeypatch, process_deaths_workload, segment_bytes_max=1, handles=2)
    assert_no_loss(run, states_dir)


def test_no_committed_record_is_lost_when_a_sector_inside_a_write_is_lost(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trace(workdir, monkeypatch, sectors_workload, segment_bytes_max=1 << 16)
    holed = 0
    for cut in simdisk.power_cuts(run.sim):
        for state in cut.states:
            for name, content in state.items():
                records = (content or b"").rstrip(b"\0")
                if name.endswith(".jsonl") and b"\0" in records[: records.rfind(b"\n")]:
                    holed += 1  # a whole line holding NULs: the states this is about
    assert holed, "a sector lost inside a write, with its later sectors landed"
    assert_no_loss(run, states_dir)


def made_by_its_caller(sim: simdisk.SimDisk, root: Path, patch: pytest.MonkeyPatch) -> Path:
    """The journal's directory made before Journal.open, by a caller that did not fsync
    its parent (as ferry's ensure_home did): Journal.open finds it there."""
    sim.mkdir(root / "journal", 0o700)
    return root / "journal"


def short_workload(d: Driver) -> None:
    d.append(0)
    d.batch([1, 2])
    d.append(3)


def test_a_journal_directory_made_by_its_caller_is_durable_before_a_commit(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first segment of a journal makes the journal directory's own entry durable
    (its parent fsynced): whoever made the directory may not have."""
    run = trace(workdir, monkeypatch, short_workload, 1 << 16, make_directory=made_by_its_caller)
    assert_no_loss_of_the_directory(run, states_dir)


def fresh_ferry_home(
    sim: simdisk.SimDisk, root: Path, patch: pytest.MonkeyPatch, home: Path
) -> Path:
    """A ferry home made by ensure_home, traced (its os calls through the simulated
    disk too): its directories, and those it made on the way to it."""
    from ferry.storage.local import statedir

    patch.setattr(statedir, "os", sim)
    return Path(statedir.ensure_home(home, mountinfo="")) / "journal"


@pytest.mark.parametrize("where", ["home", "home/in/new/parents"])
def test_a_fresh_ferry_home_is_durable_before_its_first_record_is_committed(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """ensure_home made the home, its parents and journal/ without fsyncing their
    parents, and the journal found journal/ there: records were reported committed
    while a power cut could still drop journal/'s entry in the home (or the home's in
    its parent), and with it everything below."""

    def make(sim: simdisk.SimDisk, root: Path, patch: pytest.MonkeyPatch) -> Path:
        return fresh_ferry_home(sim, root, patch, root / where)

    run = trace(workdir, monkeypatch, short_workload, 1 << 16, make_directory=make)
    made = {e.child for e in run.sim.events if isinstance(e, simdisk.Mkdir)}
    assert str(run.directory) in made and str(Path(run.sim.root, where)) in made
    assert_no_loss_of_the_directory(run, states_dir)


def assert_no_loss_of_the_directory(run: Run, states_dir: Path) -> None:
    """No committed record lost, and the model did drop the journal directory's entry
    at some cut (it must, before that entry's parent is fsynced)."""
    verdict = check_power_cuts(run, states_dir)
    assert verdict.violations == [], "\n".join(verdict.violations[:20])
    rel = str(run.directory.relative_to(run.sim.root))
    (made,) = [
        k
        for k, e in enumerate(run.sim.events, start=1)
        if isinstance(e, simdisk.Mkdir) and e.child == str(run.directory)
    ]
    dropped = any(
        rel not in state
        for cut in simdisk.power_cuts(run.sim)
        if cut.k >= made
        for state in cut.states
    )
    assert dropped, "a state without the journal directory, after it was made"


@pytest.mark.crash
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", range(20))
def test_no_committed_record_is_lost_long_random_workloads(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The exhaustive tier: long seeded workloads, many more states per cut."""
    workload = random_workload(seed, steps=150)
    run = trace(workdir, monkeypatch, workload, segment_bytes_max=400, handles=1 + seed % 2)
    assert_no_loss(run, states_dir, max_states_per_cut=400)


def called_from(site: str, package: str = "journal") -> bool:
    """True if a function named `site` in `package` is on the call stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == site and frame.f_globals.get("__name__", "").startswith(package):
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


def test_harness_catches_a_removed_fsync_for_a_dead_creators_segment(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Meta-test, as above: a segment whose creator died before its directory fsync is
    made durable by the next writer into it (``make_durable``, skipped when the segment
    holds a record: its writer did it then). Without that fsync, a loss is reported."""

    def skip(target: int | str) -> bool:
        return isinstance(target, str) and called_from("make_durable")

    run = trace(workdir, monkeypatch, process_deaths_workload, segment_bytes_max=1, handles=2,
                skip_sync=skip)  # fmt: skip
    verdict = check_power_cuts(run, states_dir, stop_at_first=True)
    lost = [v for v in verdict.violations if "lost committed records" in v or "refused" in v]
    assert lost, "removing make_durable's directory fsyncs went unnoticed"


# (setup, call site, its package): fsyncs that make a new directory's entry durable.
DIRECTORY_FSYNC_SITES = [
    ("by its caller", "new_segment", "journal"),  # the journal directory's, at its first
    ("ferry home", "_fsync_parent", "ferry"),  # ensure_home's, for the home and its parents
]


@pytest.mark.parametrize(("setup", "site", "package"), DIRECTORY_FSYNC_SITES)
def test_harness_catches_a_removed_fsync_of_a_new_directorys_parent(
    workdir: Path,
    states_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    setup: str,
    site: str,
    package: str,
) -> None:
    """Meta-test, as above: without the parent's fsync the new directory's entry (and
    with it every record below it) is lost at some power cut, and the harness says so."""
    root = os.path.realpath(workdir / "disk")

    def skip(target: int | str) -> bool:
        # (new_segment also fsyncs the journal directory itself: that one stays.)
        parent = isinstance(target, str) and (setup != "by its caller" or target == root)
        return parent and called_from(site, package)

    def make(sim: simdisk.SimDisk, disk: Path, patch: pytest.MonkeyPatch) -> Path:
        if setup == "by its caller":
            return made_by_its_caller(sim, disk, patch)
        return fresh_ferry_home(sim, disk, patch, disk / "a" / "home")

    run = trace(workdir, monkeypatch, short_workload, 1 << 16, skip_sync=skip, make_directory=make)
    verdict = check_power_cuts(run, states_dir, stop_at_first=True)
    lost = [v for v in verdict.violations if "lost committed records" in v]
    assert lost, f"removing the parent fsyncs in {site} went unnoticed: the model is too kind"


# --- a journal directory swapped in by a salvage that died before its parent's fsync ---
# (found by a review of 032cb2a: both tests failed with its make_durable)


class _AliasDisk(simdisk.SimDisk):
    """A SimDisk that follows a directory renamed within its parent: the model keys a
    directory by the path it was made at, so paths under its new name are translated
    back to that key (``aliases``: new real path -> model key)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.aliases: dict[str, str] = {}
        super().__init__(*args, **kwargs)

    def _canon(self, path: str) -> str:
        return self.aliases.get(path, path)

    def _split(self, path: Any) -> tuple[str, str] | None:
        full = os.path.abspath(os.fspath(path))
        parent, name = os.path.split(full)
        parent = self._canon(os.path.realpath(parent))
        if parent != self.root and not parent.startswith(self.root + os.sep):
            return None
        if parent not in self._dirs:
            raise NotImplementedError(f"simdisk: parent directory {parent} not tracked")
        return parent, name

    def _dir_path(self, path: Any) -> str | None:
        full = self._canon(os.path.realpath(os.fspath(path)))
        return full if full in self._dirs else None

    def check_in_step(self) -> list[str]:
        back = {key: real for real, key in self.aliases.items()}
        saved = self._dirs
        self._dirs = {back.get(d, d): e for d, e in saved.items()}
        try:
            return super().check_in_step()
        finally:
            self._dirs = saved


def test_records_after_a_salvage_swap_whose_parent_fsync_never_ran(
    workdir: Path, states_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """journal.salvage: exchange(journal, build), then fsync_dir(parent). A salvage killed
    (or failing with EIO) between the two leaves the new journal in place with its
    entry not durable. Its segment holds records (the salvage copied them), so the next
    writer must not skip the parent's fsync because of them (its records would be
    reported committed while a power cut still brings the old directory back): the
    build's marker, still there, says so."""
    root = workdir / "disk"
    root.mkdir()
    sim = _AliasDisk(root, content_irrelevant=frozenset({".lock"}))
    build = root / ".journal.salvage-x"
    run = Run(sim, root / "journal")
    with monkeypatch.context() as patch:
        patch.setattr(_fsutil, "os", sim)
        # The build: its marker, then a complete journal holding 3 records, durable
        # (as _build makes it).
        sim.mkdir(build, 0o700)
        fd = sim.open(build / SALVAGE_MARKER, os.O_CREAT | os.O_WRONLY, 0o600)
        sim.write(fd, b'{"stamp": "x"}')
        sim.fsync(fd)
        sim.close(fd)
        j = journal.Journal.open(build)
        for i in range(3):
            record = ("rec", {"i": i, "pad": "p" * (i % 7) * 5})
            j.append(*record)
            run.history.append(record)
        j.close()
        sim.fsync(fd := sim.open(root, os.O_RDONLY | os.O_DIRECTORY))
        sim.close(fd)
        # The swap (a rename here: the old journal plays no part), then the salvage dies.
        sim.rename(build, root / "journal")
        sim.aliases[os.path.realpath(root / "journal")] = os.path.realpath(build)
        run.started.append((0, len(run.history)))  # (there; not committed by a writer)
        driver = Driver(run, segment_bytes_max=1 << 16, handles=1)
        for i in range(3, 6):
            driver.append(i)
        driver.close()
    assert sim.check_in_step() == [], "the trace does not match the real files"
    verdict = check_power_cuts(run, states_dir)
    assert verdict.violations == [], "\n".join(verdict.violations[:5])


def test_a_real_salvage_killed_after_its_swap_is_made_durable_by_the_next_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with the real journal.salvage, killed right after its exchange (before
    the parent's fsync): the next writer's first commit must make the swap durable
    (fsync the parent) before its write."""
    directory = tmp_path / "home" / "journal"
    j = journal.Journal.open(directory, segment_bytes_max=200)
    for i in range(6):
        j.append("rec", {"i": i})
    j.close()
    second = sorted(directory.glob("*.jsonl"))[1]  # seqs 3 and 4: damage seq 3
    body = bytearray(second.read_bytes())
    body[body.index(b'"i":2') + 4] = ord("7")
    second.write_bytes(bytes(body))

    swapped = False
    real_exchange, real_fsync_dir = _fsutil.exchange, _fsutil.fsync_dir

    def exchange(a: Any, b: Any) -> None:
        nonlocal swapped
        real_exchange(a, b)
        swapped = True

    def fsync_dir(path: Any) -> None:
        if swapped and Path(path) == directory.parent:
            raise ProcessDied("killed between the exchange and the parent's fsync")
        real_fsync_dir(path)

    monkeypatch.setattr(_fsutil, "exchange", exchange)
    monkeypatch.setattr(_fsutil, "fsync_dir", fsync_dir)
    with pytest.raises(ProcessDied):
        journal.salvage(directory)
    monkeypatch.undo()

    calls: list[str] = []
    real_pwrite = _fsutil.pwrite_durably

    def traced_fsync_dir(path: Any) -> None:
        calls.append(f"fsync {path}")
        real_fsync_dir(path)

    def traced_pwrite(*args: Any) -> None:
        calls.append("write")
        real_pwrite(*args)

    monkeypatch.setattr(_fsutil, "fsync_dir", traced_fsync_dir)
    monkeypatch.setattr(_fsutil, "pwrite_durably", traced_pwrite)
    j = journal.Journal.open(directory)
    assert j.last_seq == 2, "the salvaged journal (seqs 1, 2) is in place"
    j.append("rec", {"i": 99})
    j.close()
    assert f"fsync {directory.parent}" in calls[: calls.index("write")], calls
