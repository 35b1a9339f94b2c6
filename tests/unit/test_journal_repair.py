"""repair(): cuts only a torn tail, keeps the exact bytes in a .broken copy, refuses
corruption, is idempotent, and a leftover .broken file is harmless."""

from __future__ import annotations

from pathlib import Path

import pytest

from journal import CorruptionError, Journal, JournalError, Record, read_records, repair, verify
from journal._codec import encode_record
from journal._segment import segment_name


def build(directory: Path, counts: tuple[int, ...] = (3, 4)) -> list[Path]:
    directory.mkdir()
    paths, seq = [], 1
    for count in counts:
        path = directory / segment_name(seq)
        path.write_bytes(
            b"".join(encode_record(seq + i, 0, 1.0, "T", {"i": seq + i}) for i in range(count))
        )
        paths.append(path)
        seq += count
    return paths


def snapshot_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00" * 1000 + b"x",
        b"garbage",
        b'{"v":1,"seq":8,"epoch":0,"ts":1.0,"type":"T","da',
        b"garbage" + b"\x00" * 40 + b"more",
    ],
    ids=["nul-then-garbage", "garbage", "half-record", "garbage-nuls-garbage"],
)
def test_cuts_exactly_the_torn_tail_and_keeps_the_bytes(tmp_path: Path, tail: bytes) -> None:
    paths = build(tmp_path / "j")
    clean = paths[-1].read_bytes()
    paths[-1].write_bytes(clean + tail)
    report = repair(tmp_path / "j")
    assert report.repaired
    assert report.segment == str(paths[-1])
    assert report.offset == len(clean)
    assert report.bytes_cut == len(tail)
    assert report.last_seq == 7
    assert report.broken_copy == str(paths[-1].with_name(paths[-1].name + ".broken"))
    assert Path(report.broken_copy).read_bytes() == tail
    assert paths[-1].read_bytes() == clean
    assert paths[0].read_bytes() == b"".join(
        encode_record(i, 0, 1.0, "T", {"i": i}) for i in (1, 2, 3)
    )
    assert verify(tmp_path / "j").status == "clean"


@pytest.mark.parametrize("zeros", [0, 5000])
def test_the_copy_stops_where_the_zero_tail_begins(tmp_path: Path, zeros: int) -> None:
    paths = build(tmp_path / "j")
    clean = paths[-1].read_bytes()
    paths[-1].write_bytes(clean + b'{"v":1,"seq":8,"ep' + b"\x00" * zeros)
    report = repair(tmp_path / "j")
    assert report.repaired and report.offset == len(clean) and report.bytes_cut == 18
    assert report.broken_copy is not None
    assert Path(report.broken_copy).read_bytes() == b'{"v":1,"seq":8,"ep'
    assert paths[-1].read_bytes() == clean


def test_a_zero_tail_is_not_torn_and_is_left_alone(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    paths[-1].write_bytes(paths[-1].read_bytes() + b"\x00" * 5000)
    before = snapshot_of(tmp_path / "j")
    report = repair(tmp_path / "j")
    assert not report.repaired and report.last_seq == 7
    assert snapshot_of(tmp_path / "j") == before


def test_a_tail_that_is_the_whole_last_segment_leaves_it_empty(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    paths[-1].write_bytes(b"\x00" * 10 + b"x")
    report = repair(tmp_path / "j")
    assert report.repaired and report.offset == 0 and report.last_seq == 3
    assert paths[-1].read_bytes() == b""
    assert [r.seq for r in read_records(tmp_path / "j")] == [1, 2, 3]


def test_clean_journal_is_left_alone(tmp_path: Path) -> None:
    build(tmp_path / "j")
    before = snapshot_of(tmp_path / "j")
    report = repair(tmp_path / "j")
    assert not report.repaired and report.broken_copy is None and report.last_seq == 7
    assert snapshot_of(tmp_path / "j") == before


def test_idempotent(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    paths[-1].write_bytes(paths[-1].read_bytes() + b"torn")
    assert repair(tmp_path / "j").repaired
    after_first = snapshot_of(tmp_path / "j")
    second = repair(tmp_path / "j")
    assert not second.repaired
    assert snapshot_of(tmp_path / "j") == after_first


def test_refuses_corruption_and_touches_nothing(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    data = bytearray(paths[0].read_bytes())
    data[30] ^= 0x10  # a bad record in a sealed segment
    paths[0].write_bytes(bytes(data))
    paths[-1].write_bytes(paths[-1].read_bytes() + b"torn too")
    before = snapshot_of(tmp_path / "j")
    with pytest.raises(CorruptionError) as caught:
        repair(tmp_path / "j")
    assert caught.value.segment == str(paths[0]) and caught.value.seq == 1
    assert snapshot_of(tmp_path / "j") == before


def test_refuses_to_cut_a_last_record_with_a_flipped_bit(tmp_path: Path) -> None:
    """Whole (newline-terminated, no NUL) and not checking: damage after it was
    committed, not a tear.  Cutting it would erase a committed record."""
    paths = build(tmp_path / "j")
    data = bytearray(paths[-1].read_bytes())
    data[-30] ^= 0x02
    paths[-1].write_bytes(bytes(data))
    before = snapshot_of(tmp_path / "j")
    with pytest.raises(CorruptionError) as caught:
        repair(tmp_path / "j")
    assert caught.value.segment == str(paths[-1]) and caught.value.seq == 7
    assert snapshot_of(tmp_path / "j") == before


def test_refuses_a_hole_followed_by_valid_records(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    lines = paths[-1].read_bytes().splitlines(keepends=True)
    paths[-1].write_bytes(lines[0] + b"\x00" * 20 + b"\n" + b"".join(lines[1:]))
    before = snapshot_of(tmp_path / "j")
    with pytest.raises(CorruptionError):
        repair(tmp_path / "j")
    assert snapshot_of(tmp_path / "j") == before


def test_leftover_broken_file_is_harmless_and_gets_a_new_number(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    clean = paths[-1].read_bytes()
    paths[-1].write_bytes(clean + b"first tear")
    first = repair(tmp_path / "j")
    paths[-1].write_bytes(clean + b"second tear")
    assert verify(tmp_path / "j").status == "torn_tail"
    second = repair(tmp_path / "j")
    assert first.broken_copy is not None and second.broken_copy is not None
    assert Path(first.broken_copy).read_bytes() == b"first tear"
    assert Path(second.broken_copy).name == paths[-1].name + ".broken.1"
    assert Path(second.broken_copy).read_bytes() == b"second tear"
    assert verify(tmp_path / "j").status == "clean"
    with Journal.open(tmp_path / "j") as journal:
        assert journal.last_seq == 7
        assert journal.append("NEXT", {}).seq == 8


def test_missing_directory_is_a_journal_error(tmp_path: Path) -> None:
    with pytest.raises(JournalError):
        repair(tmp_path / "nope")
    with pytest.raises(JournalError):
        verify(tmp_path / "nope")


def test_append_cuts_a_torn_tail_first_and_keeps_a_copy(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    clean = paths[-1].read_bytes()
    paths[-1].write_bytes(clean + b"\x00\x00torn")
    with Journal.open(tmp_path / "j") as journal:
        assert paths[-1].read_bytes() == clean + b"\x00\x00torn"  # open changes nothing
        rec = journal.append("AFTER", {"ok": True})
    assert rec.seq == 8
    assert (tmp_path / "j" / (paths[-1].name + ".broken")).read_bytes() == b"\x00\x00torn"
    # (followed by the zero tail the append preallocated)
    records = paths[-1].read_bytes().rstrip(b"\x00")
    assert records == clean + encode_record(8, 0, rec.ts, "AFTER", {"ok": True})
    got = list(read_records(tmp_path / "j"))
    assert got[-1] == Record(8, 0, rec.ts, "AFTER", {"ok": True})
    assert [r.seq for r in got] == list(range(1, 9))


def test_append_refuses_corruption_and_writes_nothing(tmp_path: Path) -> None:
    paths = build(tmp_path / "j")
    with Journal.open(tmp_path / "j") as journal:
        # After open, "another process" leaves garbage followed by a valid record: that
        # is not a torn tail, so the next append must refuse and write nothing.
        with paths[-1].open("ab") as f:
            f.write(b"garbage\n" + encode_record(8, 0, 1.0, "T", {}))
        before = snapshot_of(tmp_path / "j")
        with pytest.raises(CorruptionError) as caught:
            journal.append("NOPE", {})
        assert caught.value.seq == 8 and caught.value.segment == str(paths[-1])
        assert snapshot_of(tmp_path / "j") == before
        with pytest.raises(CorruptionError):  # and keeps refusing; the handle is not broken
            journal.append("NOPE", {})


# ---- damage under a snapshot is not a tear ---------------------------------------------
# (Found by a review: what looks like a torn tail, in records a valid snapshot covers, can
# only be damage (a snapshot is written once its records are durable, and nothing is
# written after a commit that did not return). Cut as a tear, it took records away that
# append had reported committed after it.)


def covered_journal(directory: Path, records: int, snapshot_seq: int) -> Path:
    with Journal.open(directory) as j:
        for i in range(records):
            j.append("T", {"i": i, "pad": "x" * 200})
        j.write_snapshot(snapshot_seq, b"state")
    [segment] = sorted(directory.glob("*.jsonl"))
    return segment


def test_repair_refuses_to_cut_records_a_snapshot_covers(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    segment = covered_journal(directory, 20, 15)
    with segment.open("r+b") as f:  # one sector of covered records reads back as zeros
        f.seek(1024)
        f.write(bytes(512))
    with Journal.open(directory) as j:  # (what the snapshot covers is not read at open)
        committed = j.append("T", {"i": "after"})
    before = segment.read_bytes()
    with pytest.raises(CorruptionError):
        repair(directory)
    assert segment.read_bytes() == before  # the committed record is still there
    assert committed.seq == 21 and verify(directory).status == "corrupt"


def test_an_append_never_cuts_a_record_a_snapshot_covers(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    segment = covered_journal(directory, 10, 10)
    size = len(segment.read_bytes().rstrip(b"\0"))
    with segment.open("r+b") as f:  # the covered last record cut short
        f.truncate(size - 5)
    before = segment.read_bytes()
    with Journal.open(directory) as j, pytest.raises(CorruptionError):
        j.append("T", {"i": "new"})  # (it would have cut seq 10 and written a new seq 10)
    assert segment.read_bytes() == before
    assert verify(directory).status == "corrupt"
