"""Snapshots (atomic, checksummed, damage falls back) and compaction; replay from a
snapshot plus the tail."""

from __future__ import annotations

import zlib
from pathlib import Path

import orjson
import pytest

import journal._fsutil as fsutil
from journal import (
    CompactedError,
    CorruptionError,
    FormatVersionError,
    Journal,
    Snapshot,
    read_records,
    verify,
)
from journal._segment import list_segments
from journal._snapshot import encode_snapshot, snapshot_name

# What JSON the journal writes and reads: in both modes of journal._json.
pytestmark = pytest.mark.usefixtures("json_mode")


def fill(j: Journal, count: int, epoch: int = 0) -> None:
    for i in range(count):
        j.append("T", {"i": i}, epoch=epoch)


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "journal"


def test_snapshot_file_layout(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        fill(j, 3, epoch=2)
        j.write_snapshot(2, b"state\x00bytes")
    raw = (jdir / snapshot_name(2)).read_bytes()
    body = b'{"v":1,"seq":2,"epoch_max":2,"length":11,"data_crc":"%08x"' % zlib.crc32(
        b"state\x00bytes"
    )
    assert raw == body + b',"crc":"%08x"}\n' % zlib.crc32(body) + b"state\x00bytes"
    assert raw == encode_snapshot(2, b"state\x00bytes", 2)
    assert snapshot_name(2) == "snapshot-00000000000000000002.snap"
    assert not [p for p in jdir.iterdir() if p.name.endswith(".tmp")]


def test_latest_snapshot_round_trip(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        assert j.latest_snapshot() is None
        fill(j, 5)
        j.write_snapshot(3, b"three")
        j.write_snapshot(5, b"five")
        assert j.latest_snapshot() == Snapshot(5, b"five")
        j.write_snapshot(5, b"five again")  # same seq: replaced atomically
        assert j.latest_snapshot() == Snapshot(5, b"five again")
        j.write_snapshot(0, b"empty state")  # seq 0 = before any record: allowed
    with Journal.open(jdir) as j:
        assert j.latest_snapshot() == Snapshot(5, b"five again")


def _damage_data(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))


def _damage_header(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0x01
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-2])


def _extend(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"x")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _wrong_name(path: Path) -> None:
    # A valid snapshot for seq 3 stored under the name of seq 5.
    path.write_bytes(encode_snapshot(3, b"three", 0))


def test_the_newest_snapshot_file_is_listed_without_reading(jdir: Path) -> None:
    with Journal.open(jdir) as j, Journal.open(jdir) as other:
        assert j.newest_snapshot_file() == (0, 0)
        fill(j, 5)
        j.write_snapshot(3, b"three")
        other.refresh()
        other.write_snapshot(5, b"five")  # (by another handle: nothing this one saw)
        seq, first = j.newest_snapshot_file()
        assert seq == 5
        other.write_snapshot(5, b"five again")  # (an idle journal: the same seq, a new file)
        assert j.newest_snapshot_file()[0] == 5 and j.newest_snapshot_file()[1] != first
        (jdir / snapshot_name(5)).write_bytes(b"damaged")
        assert j.newest_snapshot_file()[0] == 5  # (names only: latest_snapshot skips it)
        assert j.latest_snapshot() == Snapshot(3, b"three")


@pytest.mark.parametrize(
    "damage", [_damage_data, _damage_header, _truncate, _extend, _empty, _wrong_name]
)
def test_a_damaged_snapshot_falls_back_to_an_older_one(jdir: Path, damage: object) -> None:
    with Journal.open(jdir) as j:
        fill(j, 5)
        j.write_snapshot(3, b"three")
        j.write_snapshot(5, b"five")
    assert callable(damage)
    damage(jdir / snapshot_name(5))
    with Journal.open(jdir) as j:
        assert j.latest_snapshot() == Snapshot(3, b"three")
    report = verify(jdir)
    assert report.status == "clean" and report.snapshot_seq == 3
    assert [Path(p).name for p, _why in report.damaged_snapshots] == [snapshot_name(5)]


def test_all_snapshots_damaged_means_full_replay(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        fill(j, 2)
        j.write_snapshot(2, b"two")
    _damage_data(jdir / snapshot_name(2))
    with Journal.open(jdir) as j:
        assert j.latest_snapshot() is None
        assert [r.seq for r in j.read()] == [1, 2]


def test_a_snapshot_beyond_the_end_is_corruption(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        fill(j, 2)
    (jdir / snapshot_name(9)).write_bytes(encode_snapshot(9, b"future", 0))
    with Journal.open(jdir) as j, pytest.raises(CorruptionError) as caught:
        j.latest_snapshot()
    assert caught.value.seq == 9
    assert verify(jdir).status == "corrupt"


def test_a_snapshot_from_a_newer_format_is_a_coded_error(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        fill(j, 2)
    body = b'{"v":2,"seq":1,"epoch_max":0,"length":0,"data_crc":"00000000"'
    (jdir / snapshot_name(1)).write_bytes(body + b',"crc":"%08x"}\n' % zlib.crc32(body))
    for attempt in (lambda: Journal.open(jdir), lambda: verify(jdir)):
        with pytest.raises(FormatVersionError):
            attempt()


def test_leftover_temp_file_is_ignored(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        fill(j, 2)
        (jdir / f".{snapshot_name(2)}.tmp").write_bytes(b"half written")
        assert j.latest_snapshot() is None
        j.write_snapshot(2, b"two")  # replaces the stale temp file
        assert j.latest_snapshot() == Snapshot(2, b"two")


def test_compact_removes_sealed_segments_covered_and_older_snapshots(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=300) as j:
        fill(j, 20)
        segments = list_segments(jdir)
        assert len(segments) >= 4
        j.write_snapshot(5, b"five")
        snap_seq = segments[2].first_seq + 1  # inside the third segment
        j.write_snapshot(snap_seq, b"later")
        removed = j.compact()
        kept = list_segments(jdir)
        assert removed == [segments[0].path, segments[1].path, str(jdir / snapshot_name(5))]
        assert kept == segments[2:]
        assert j.first_seq == segments[2].first_seq
        assert j.latest_snapshot() == Snapshot(snap_seq, b"later")
        assert j.compact() == []  # idempotent


def test_first_seq_follows_a_compaction_by_another_handle(jdir: Path) -> None:
    """``first_seq`` (the first record still on disk) stayed where another handle's
    compaction had left it behind: ``read(first_seq)`` then raised CompactedError."""
    with Journal.open(jdir, segment_bytes_max=300) as j, Journal.open(jdir) as other:
        reader = Journal.open(jdir, read_only=True)
        fill(j, 20)
        other.refresh()
        reader.refresh()
        j.write_snapshot(j.last_seq, b"all")
        j.compact()
        first = list_segments(jdir)[0].first_seq
        assert first > 1
        for handle in (j, other, reader):
            assert handle.first_seq == first
            assert next(iter(handle.read(handle.first_seq))).seq == first
        reader.close()


def test_compact_never_removes_the_active_segment(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=300) as j:
        fill(j, 10)
        j.write_snapshot(10, b"all")
        j.compact()
        segments = list_segments(jdir)
        assert len(segments) == 1 and segments[0].first_seq <= 10
        assert j.append("T", {}).seq == 11
    assert verify(jdir).status == "clean"


def test_compact_without_snapshot_removes_nothing(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=200) as j:
        fill(j, 10)
        before = list_segments(jdir)
        assert j.compact() == []
        assert list_segments(jdir) == before


def test_compact_fsyncs_the_directory_per_removal(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_fsync_dir, real_unlink = fsutil.fsync_dir, fsutil.unlink

    def fsync_dir(path: Path | str) -> None:
        calls.append(str(path))
        real_fsync_dir(path)

    def unlink(path: Path | str) -> None:
        calls.append("unlink")
        real_unlink(path)

    monkeypatch.setattr(fsutil, "fsync_dir", fsync_dir)
    monkeypatch.setattr(fsutil, "unlink", unlink)
    with Journal.open(jdir, segment_bytes_max=200) as j:
        fill(j, 10)
        j.write_snapshot(9, b"x")
        calls.clear()
        removed = j.compact()
    segment_removals = [p for p in removed if p.endswith(".jsonl")]
    assert segment_removals
    # unlink, fsync_dir, unlink, fsync_dir, ...: every removal durable before the next.
    assert calls[: 2 * len(segment_removals)] == ["unlink", str(jdir)] * len(segment_removals)


def test_after_compaction_reads_say_what_was_compacted(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=200) as j:
        fill(j, 12)
        j.write_snapshot(8, b"eight")
        j.compact()
        first = j.first_seq
        assert first > 1
        with pytest.raises(CompactedError) as caught:
            list(j.read())
        assert caught.value.first_seq == first and caught.value.code == "journal.compacted"
        assert [r.seq for r in j.read(first)] == list(range(first, 13))
        with pytest.raises(CompactedError):
            j.subscribe(lambda r: None, after_seq=0)
        seen: list[int] = []
        j.subscribe(lambda r: seen.append(r.seq), after_seq=8)
        assert seen == [9, 10, 11, 12]
    with Journal.open(jdir) as j:
        assert j.first_seq == first and j.last_seq == 12
        assert [r.seq for r in read_records(jdir, first)] == list(range(first, 13))
    report = verify(jdir)
    assert report.status == "clean" and report.first_seq == first and report.snapshot_seq == 8


def test_losing_the_only_snapshot_after_compaction_is_corruption(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=200) as j:
        fill(j, 12)
        j.write_snapshot(8, b"eight")
        j.compact()
    (jdir / snapshot_name(8)).unlink()
    with pytest.raises(CorruptionError, match="no snapshot covers"):
        Journal.open(jdir)
    assert verify(jdir).status == "corrupt"


def test_fencing_survives_compaction(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=200) as j:
        fill(j, 5, epoch=7)
        fill(j, 10, epoch=0)
        j.write_snapshot(j.last_seq, b"state")
        j.compact()
    with Journal.open(jdir) as j:
        assert all(r.epoch == 0 for r in j.read(j.first_seq))  # epoch 7 records are gone
        assert j.max_epoch == 7


def test_replay_from_snapshot_plus_tail_equals_full_replay(jdir: Path) -> None:
    def fold(state: dict[str, int], seq_data: tuple[int, dict[str, int]]) -> dict[str, int]:
        _seq, data = seq_data
        return {**state, f"k{data['i'] % 4}": data["i"]}

    with Journal.open(jdir, segment_bytes_max=250) as j:
        fill(j, 30)
        full: dict[str, int] = {}
        for r in j.read():
            full = fold(full, (r.seq, r.data))
        at: dict[str, int] = {}
        for r in j.read():
            if r.seq > 17:
                break
            at = fold(at, (r.seq, r.data))
        j.write_snapshot(17, orjson.dumps(at))
        j.compact()
    with Journal.open(jdir) as j:
        snap = j.latest_snapshot()
        assert snap is not None and snap.seq == 17
        state = orjson.loads(snap.data)
        for r in j.read(snap.seq + 1):
            state = fold(state, (r.seq, r.data))
    assert state == full


def test_open_reads_only_what_the_latest_snapshot_does_not_cover(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=200) as j:
        fill(j, 4, epoch=3)
        fill(j, 16)
        segments = list_segments(jdir)
        j.write_snapshot(segments[2].first_seq, b"state")
    # Bit rot in a covered segment: open does not read it (verify does) ...
    covered = Path(segments[0].path)
    raw = bytearray(covered.read_bytes())
    raw[15] ^= 0x01
    covered.write_bytes(bytes(raw))
    with Journal.open(jdir) as j:
        assert j.last_seq == 20 and j.max_epoch == 3  # the epoch comes from the snapshot
        seen: list[int] = []
        j.subscribe(lambda r: seen.append(r.seq), after_seq=segments[2].first_seq)
        assert seen == list(range(segments[2].first_seq + 1, 21))
        assert j.append("T", {}).seq == 21
    assert verify(jdir).status == "corrupt"
    # ... but damage after the snapshot is still refused at open.
    last = Path(list_segments(jdir)[-2].path)
    raw = bytearray(last.read_bytes())
    raw[15] ^= 0x01
    last.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError):
        Journal.open(jdir)


def test_compact_removes_temp_files_of_crashed_snapshot_writes(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=200) as j:
        fill(j, 5)
        stale = jdir / f".{snapshot_name(3)}.tmp"
        stale.write_bytes(b"half")
        j.write_snapshot(5, b"five")
        assert str(stale) in j.compact()
        assert not stale.exists()


def test_compact_keeps_the_segments_a_handle_behind_has_not_read(jdir: Path) -> None:
    """A handle that fell behind (a runner between two heartbeats) must still find every
    record after its own: compaction by another handle stops at the segment that handle
    still reads.  (It removed them: the late handle's next append went into its own
    removed segment, was reported committed, and was lost.)"""
    with Journal.open(jdir, segment_bytes_max=300) as late:
        late.append("T", {"who": "late"})
        with Journal.open(jdir, segment_bytes_max=300) as busy:
            fill(busy, 20)  # several rotations past the late handle's segment
            busy.write_snapshot(busy.last_seq, b"all")
            assert busy.compact() == []  # all sealed segments from the late one's on
        assert late.append("T", {"who": "late again"}).seq == 22
    assert [r.data for r in read_records(jdir, from_seq=22)] == [{"who": "late again"}]
    assert verify(jdir).status == "clean"
    sealed = [segment.path for segment in list_segments(jdir)[:-1]]
    with Journal.open(jdir, segment_bytes_max=300) as j:  # nobody behind: they go now
        assert j.compact() == sealed


def test_open_looks_again_when_a_compaction_removes_what_it_surveyed(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open is lock-free: between its survey and its standing at the end, another
    process may rotate, snapshot and compact the segments it listed.  It looks again
    (it would have raised FileNotFoundError, or stood in a removed segment)."""
    import journal as journal_pkg

    with Journal.open(jdir, segment_bytes_max=300) as j:
        fill(j, 5)
    real_survey = journal_pkg.survey
    interfered: list[bool] = []

    def survey_then_compact(*args: object, **kwargs: object) -> object:
        found = real_survey(*args, **kwargs)  # type: ignore[arg-type]
        if not interfered:
            interfered.append(True)
            with Journal.open(jdir, segment_bytes_max=300) as other:
                fill(other, 20)
                other.write_snapshot(other.last_seq, b"s")
                assert other.compact()
        return found

    monkeypatch.setattr(journal_pkg, "survey", survey_then_compact)
    with Journal.open(jdir, segment_bytes_max=300) as j:
        assert j.last_seq == 25
        assert j.append("T", {}).seq == 26
    assert verify(jdir).status == "clean"
