"""The journal library's read-only handles, its view of a damaged journal, and salvage
(real files in a temporary directory; the ferry-level behaviour is in
tests/integration/test_journal_salvage.py and test_readonly_state.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import journal
import journal._codec
import journal._fsutil
import journal._salvage

RECORDS = 40
SNAPSHOT_AT = 20


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record stamped with one time: a line's length, and so where the segments
    of ``make`` rotate, must not depend on how many digits the clock's float prints
    (it did: about 1 run in 10 saw segments 1, 16, 31)."""
    monkeypatch.setattr(journal._codec, "_now", lambda: 1_800_000_000.123456)


class Crash(Exception):
    """Raised by a hook: the salvage stops there, leaving what a kill would."""


def make(directory: Path) -> Path:
    """40 records in three segments (1..16, 17..31, 32..40), a snapshot at 20."""
    with journal.Journal.open(directory, segment_bytes_max=1500) as wal:
        for i in range(RECORDS):
            wal.append("T", {"i": i})
        wal.write_snapshot(SNAPSHOT_AT, b"state at 20")
    assert [int(p.name[:20]) for p in segments(directory)] == [1, 17, 32]
    return directory


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def flip(directory: Path, seq: int) -> Path:
    for segment in segments(directory):
        data = bytearray(segment.read_bytes())
        at = data.find(b'{"v":1,"seq":%d,' % seq)
        if at >= 0:
            data[data.index(b'"ts":', at) + 6] ^= 0x01
            segment.write_bytes(bytes(data))
            return segment
    raise AssertionError(seq)


def contents(directory: Path | str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(directory).iterdir() if p.is_file()}


# ---- read-only handles ----------------------------------------------------------------


def test_a_read_only_handle_creates_nothing_and_writes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with journal.Journal.open(missing, read_only=True) as wal:
        assert (wal.last_seq, list(wal.read())) == (0, [])
        assert wal.latest_snapshot() is None
    assert not missing.exists()
    directory = make(tmp_path / "j")
    (directory / ".lock").unlink()
    before = contents(directory)
    with journal.Journal.open(directory, read_only=True) as wal:
        assert wal.read_only and wal.last_seq == RECORDS
        with pytest.raises(journal.ReadOnlyError):
            wal.append("T", {})
        for write in (wal.compact, lambda: wal.write_snapshot(1, b"")):
            with pytest.raises(journal.ReadOnlyError):
                write()
        wal.sync()  # (writes nothing: a catch-up, under the lock when there is one)
    assert contents(directory) == before


def test_a_read_only_handle_follows_a_writer(tmp_path: Path) -> None:
    directory = make(tmp_path / "j")
    seen: list[int] = []
    with journal.Journal.open(directory, read_only=True) as reader:
        reader.subscribe(lambda r: seen.append(r.seq), after_seq=RECORDS)
        with journal.Journal.open(directory, segment_bytes_max=1500) as writer:
            for i in range(30):  # (past a rotation)
                writer.append("T", {"more": i})
        reader.refresh()
    assert seen == list(range(RECORDS + 1, RECORDS + 31))


# ---- the view of a damaged journal ------------------------------------------------------


@pytest.mark.parametrize(
    ("damaged", "last", "pieces"),
    [
        (30, 29, [(21, 29)]),  # a sealed segment, after the snapshot
        (35, 34, [(21, 31), (32, 34)]),  # the middle of the last segment
        (21, 20, []),  # the record right after the snapshot
    ],
)
def test_the_view_ends_at_the_first_damage_after_its_snapshot(
    tmp_path: Path, damaged: int, last: int, pieces: list[tuple[int, int]]
) -> None:
    directory = make(tmp_path / "j")
    segment = flip(directory, damaged)
    with pytest.raises(journal.CorruptionError):
        journal.Journal.open(directory, read_only=True)
    wal = journal.Journal.open_view(directory)
    view = wal.view
    assert view is not None and view.damaged
    assert (view.base_seq, view.last_seq, view.highest_seq) == (SNAPSHOT_AT, last, RECORDS)
    assert [(p.first_seq, p.last_seq) for p in view.pieces] == pieces
    assert view.damage is not None and view.damage.seq == damaged
    assert view.damage.segment == str(segment) and view.damage.offset is not None
    fed: list[int] = []
    wal.subscribe(lambda r: fed.append(r.seq), after_seq=SNAPSHOT_AT)
    wal.refresh()  # (a view reads nothing more)
    assert fed == list(range(SNAPSHOT_AT + 1, last + 1))
    assert wal.latest_snapshot() == journal.Snapshot(SNAPSHOT_AT, b"state at 20")


def test_damage_the_snapshot_covers_limits_nothing(tmp_path: Path) -> None:
    directory = make(tmp_path / "j")
    flip(directory, 10)
    view = journal.readable(directory)
    assert (view.last_seq, view.damage) == (RECORDS, None)
    assert view.covered is not None and view.covered.seq == 10 and view.damaged


def test_a_snapshot_the_caller_rejects_falls_back_to_seq_1(tmp_path: Path) -> None:
    directory = make(tmp_path / "j")

    def reject(snapshot: journal.Snapshot) -> bytes:
        raise journal.SnapshotRejected("not a table")

    view = journal.readable(directory, reject)
    assert (view.base, view.last_seq, view.damage) == (None, RECORDS, None)
    assert [why for _, why, _ in view.unusable] == ["not a table"] and view.damaged


def test_a_torn_tail_ends_the_view_and_is_no_damage(tmp_path: Path) -> None:
    directory = make(tmp_path / "j")
    with segments(directory)[-1].open("ab") as f:
        f.write(b'{"v":1,"seq":41,"ep')
    view = journal.readable(directory)
    assert (view.last_seq, view.damage, view.damaged) == (RECORDS, None, False)
    assert view.torn is not None and view.torn.seq == RECORDS + 1


# ---- salvage ------------------------------------------------------------------------------


def test_salvage_moves_the_damaged_journal_aside_and_keeps_what_was_before(
    tmp_path: Path,
) -> None:
    directory = make(tmp_path / "j")
    flip(directory, 30)
    original = contents(directory)
    planned = journal.salvage(directory, dry_run=True)
    assert contents(directory) == original and planned.aside is None
    report = journal.salvage(directory, stamp="T1")
    assert report.aside == str(tmp_path / "j.damaged-T1")
    assert contents(report.aside) == original, "moved whole, unchanged"
    assert (report.lost_seqs, [r.seq for r in report.lost_records]) == (11, list(range(30, 41)))
    assert report.guessed == (30,), "the damaged line still parses: read as it probably was"
    assert (planned.lost_seqs, planned.lost_records) == (report.lost_seqs, report.lost_records)
    assert planned.view.pieces == report.view.pieces
    checked = journal.verify(directory)
    assert (checked.status, checked.last_seq, checked.snapshot_seq) == ("clean", 29, 20)
    assert sorted(os.listdir(tmp_path)) == ["j", "j.damaged-T1"]
    with journal.Journal.open(directory) as wal:
        assert [r.seq for r in wal.read(21)] == list(range(21, 30))
        assert wal.append("T", {"after": True}).seq == 30  # the seq of the lost record


@pytest.mark.parametrize("snapshot", ["none", "damaged"])
def test_fencing_survives_a_salvage_that_keeps_no_snapshot(tmp_path: Path, snapshot: str) -> None:
    """The records a salvage drops carry the journal's highest epoch: without a base
    snapshot to carry it (none was written; the only one is damaged), the new journal's
    was its kept records' and a writer fenced out before the salvage was let in again
    (found by a review). A snapshot at seq 0 with no data carries it now: never a base,
    counted by ``Journal.open``, replaced by the next snapshot."""
    directory = tmp_path / "j"
    with journal.Journal.open(directory) as wal:
        for epoch in (5, 5, 5, 9, 9):
            wal.append("T", {"epoch": epoch}, epoch=epoch)
        if snapshot == "damaged":
            wal.write_snapshot(5, b"state at 5")
            wal.compact()
    if snapshot == "damaged":
        (path,) = directory.glob("snapshot-*")
        data = bytearray(path.read_bytes())
        data[-2] ^= 0x01  # (its data: its header, epoch 9, still checks)
        path.write_bytes(bytes(data))
    flip(directory, 3)
    report = journal.salvage(directory, stamp="T1")
    assert (report.view.last_seq, report.view.base) == (2, None)
    with journal.Journal.open(directory) as wal:
        assert wal.max_epoch == 9 and wal.latest_snapshot() is None
        with pytest.raises(journal.FencedError):
            wal.append("T", {"late": True}, epoch=5)
        assert wal.append("T", {"new": True}, epoch=9).seq == 3
        wal.write_snapshot(3, b"state at 3")
        wal.compact()
    assert [p.name for p in directory.glob("snapshot-*")] == ["snapshot-00000000000000000003.snap"]
    with journal.Journal.open(directory) as wal:
        assert wal.max_epoch == 9
    assert journal.verify(directory).status == "clean"


def test_two_salvages_within_one_second_get_two_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged journal salvaged, damaged again and salvaged within the same second
    (its default stamp): the second copy gets the next free name, ``-2`` (was: "exists
    already: try again", exit 4, for an operator who had done nothing wrong)."""
    import time

    second = time.gmtime(1_800_000_000)
    monkeypatch.setattr(time, "gmtime", lambda *_: second)
    directory = make(tmp_path / "j")
    flip(directory, 30)
    first = journal.salvage(directory)
    with journal.Journal.open(directory) as wal:
        for i in range(10):
            wal.append("T", {"again": i})
    flip(directory, 35)
    again = journal.salvage(directory)
    assert first.aside == str(tmp_path / "j.damaged-20270115T080000Z")
    assert again.aside == str(tmp_path / "j.damaged-20270115T080000Z-2")
    assert sorted(os.listdir(tmp_path)) == [
        "j",
        *(Path(a).name for a in (first.aside, again.aside)),
    ]
    assert journal.verify(directory).last_seq == 34
    flip(directory, 25)
    with pytest.raises(journal.JournalError, match="exists already"):  # (a stamp given: kept)
        journal.salvage(directory, stamp="20270115T080000Z")


def test_salvage_refuses_a_healthy_journal_a_torn_tail_and_an_open_handle(
    tmp_path: Path,
) -> None:
    directory = make(tmp_path / "j")
    with pytest.raises(journal.SalvageRefusedError) as refused:
        journal.salvage(directory)
    assert refused.value.code == "journal.salvage_clean"
    flip(directory, 35)
    before = contents(directory)
    pinned = os.open(segments(directory)[0], os.O_RDONLY)
    try:
        import fcntl

        fcntl.flock(pinned, fcntl.LOCK_SH)  # as a handle's pin on its segment
        with pytest.raises(journal.SalvageRefusedError) as refused:
            journal.salvage(directory)
        assert refused.value.code == "journal.salvage_in_use"
    finally:
        os.close(pinned)
    assert contents(directory) == before
    other = make(tmp_path / "torn")
    with segments(other)[-1].open("ab") as f:
        f.write(b'{"v":1,"seq":41,"ep')
    with pytest.raises(journal.SalvageRefusedError) as refused:
        journal.salvage(other)
    assert refused.value.code == "journal.salvage_torn"


def test_keep_sees_the_plan_before_anything_is_written_and_can_stop_the_salvage(
    tmp_path: Path,
) -> None:
    """``keep(plan)``: the caller's step (ferry keeps aside the archives the new journal
    no longer names), under the locks, before the build; an error there changes
    nothing. A dry run takes no step."""
    directory = make(tmp_path / "j")
    flip(directory, 30)
    original = contents(directory)
    seen: list[tuple[int, list[str]]] = []

    def keep(plan: journal.SalvageReport) -> None:
        seen.append((plan.view.last_seq, sorted(os.listdir(tmp_path))))
        raise Crash("keep")

    journal.salvage(directory, dry_run=True, keep=keep)
    assert seen == []
    with pytest.raises(Crash):
        journal.salvage(directory, keep=keep, stamp="T1")
    assert seen == [(29, ["j"])], "the plan, and nothing built yet"
    assert contents(directory) == original and sorted(os.listdir(tmp_path)) == ["j"]
    report = journal.salvage(directory, keep=lambda plan: seen.append((0, [])), stamp="T2")
    assert report.aside is not None and len(seen) == 2


def test_read_snapshots_gives_every_sound_snapshot_oldest_first(tmp_path: Path) -> None:
    directory = make(tmp_path / "j")
    with journal.Journal.open(directory) as wal:
        wal.write_snapshot(30, b"state at 30")
    assert journal.read_snapshots(directory) == [
        journal.Snapshot(20, b"state at 20"), journal.Snapshot(30, b"state at 30")]  # fmt: skip
    newest = directory / "snapshot-00000000000000000030.snap"
    newest.write_bytes(newest.read_bytes()[:-3])
    assert journal.read_snapshots(directory) == [journal.Snapshot(20, b"state at 20")]
    assert journal.read_snapshots(tmp_path / "missing") == []


@pytest.mark.parametrize(
    "point",
    ["before:salvage_segment", "after:salvage_segment", "before:salvage_swap",
     "after:salvage_swap"],
)  # fmt: skip
def test_a_salvage_stopped_at_each_step_is_finished_by_the_next(tmp_path: Path, point: str) -> None:
    directory = make(tmp_path / "j")
    flip(directory, 30)
    original = contents(directory)
    steps: list[str] = []

    def hook(name: str) -> None:
        steps.append(name)
        if name == point:
            raise Crash(name)

    with pytest.raises(Crash):
        journal.salvage(directory, hook=hook, stamp="T1")
    build = tmp_path / ".j.salvage-T1"
    assert build.is_dir()
    swapped = point == "after:salvage_swap"
    if swapped:
        assert contents(build) == original and journal.verify(directory).clean
        report = journal.salvage(directory, stamp="T2")  # healthy now: it finishes
        assert report.aside is None and "renamed" in report.finished[0]
    else:
        assert contents(directory) == original
        report = journal.salvage(directory, stamp="T2")
        assert "removed" in report.finished[0] and report.aside == str(tmp_path / "j.damaged-T2")
    (copy,) = tmp_path.glob("j.damaged-*")
    assert contents(copy) == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j", copy.name]
    assert journal.verify(directory).last_seq == 29
    assert ".salvage-build" not in os.listdir(directory)


def test_a_build_killed_right_after_its_mkdir_is_removed_not_taken_for_the_damaged_copy(
    tmp_path: Path,
) -> None:
    directory = make(tmp_path / "j")
    flip(directory, 30)
    (tmp_path / ".j.salvage-T0").mkdir()  # (what a kill before the marker leaves)
    report = journal.salvage(directory, stamp="T1")
    assert "removed .j.salvage-T0" in report.finished[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j", "j.damaged-T1"]


def test_a_build_removal_killed_halfway_still_reads_as_a_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leftover build's marker goes last: a removal stopped after its first unlink
    leaves the marker, so the next salvage removes the rest again instead of renaming
    a half-deleted build as the damaged journal (the marker first, as listdir may give
    it, did that)."""
    directory = make(tmp_path / "j")
    flip(directory, 30)
    build = tmp_path / ".j.salvage-T0"
    build.mkdir()
    for name in (journal._segment.SALVAGE_MARKER, "00000000000000000001.jsonl", ".lock"):
        (build / name).write_bytes(b'{"stamp": "T0"}' if name.startswith(".salvage") else b"x")
    real_unlink, real_listdir = journal._fsutil.unlink, journal._fsutil.listdir

    def marker_first(path: Any) -> list[str]:
        names = real_listdir(path)
        return sorted(names, key=lambda n: n != journal._segment.SALVAGE_MARKER)

    def unlink_once(path: Any) -> None:
        real_unlink(path)
        raise Crash(path)

    monkeypatch.setattr(journal._fsutil, "listdir", marker_first)
    monkeypatch.setattr(journal._fsutil, "unlink", unlink_once)
    with pytest.raises(Crash):
        journal.salvage(directory, stamp="T1")
    monkeypatch.undo()
    assert (build / journal._segment.SALVAGE_MARKER).exists()
    report = journal.salvage(directory, stamp="T1")
    assert "removed .j.salvage-T0" in report.finished[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j", "j.damaged-T1"]
