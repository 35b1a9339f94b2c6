"""Finding a seq's line without reading the lines before it (journal._seek), and the
reads that use it: Journal.open after a snapshot, and reading from a seq (unit tier:
real files; bytes read are counted by wrapping ``journal._fsutil.pread``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import journal._fsutil as fsutil
from journal import Journal, read_records, verify
from journal._codec import encode_record, line_checks
from journal._seek import PROBE_BYTES, find_line
from journal._segment import list_segments


def make_journal(directory: Path, sizes: list[int]) -> Path:
    """One segment whose records have notes of the given sizes; returns the segment."""
    with Journal.open(directory) as j:
        j.append_batch([("T", {"i": i, "note": "x" * size}) for i, size in enumerate(sizes)])
    (segment,) = list_segments(directory)
    return Path(segment.path)


def line_starts(segment: Path) -> list[int]:
    """The byte offset of every record line (seq 1 first)."""
    data = segment.read_bytes().rstrip(b"\0")
    starts, offset = [], 0
    for line in data.splitlines(keepends=True):
        starts.append(offset)
        offset += len(line)
    return starts


def find(segment: Path, target: int) -> int | None:
    fd = os.open(segment, os.O_RDONLY)
    try:
        return find_line(fd, 1, target)
    finally:
        os.close(fd)


def test_every_seq_is_found_at_its_line(tmp_path: Path) -> None:
    segment = make_journal(tmp_path / "j", [150] * 600)  # ~20 probes' worth, a zero tail
    assert segment.stat().st_size > 20 * PROBE_BYTES
    starts = line_starts(segment)
    for seq in [1, 2, 3, 77, 299, 300, 301, 598, 599, 600]:
        assert find(segment, seq) == starts[seq - 1], seq


def test_a_seq_not_in_the_segment_is_not_found(tmp_path: Path) -> None:
    segment = make_journal(tmp_path / "j", [150] * 600)
    assert find(segment, 601) is None
    fd = os.open(segment, os.O_RDONLY)
    try:
        assert find_line(fd, 5, 3) is None  # before the segment's first record
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.sampled_from([0, 10, 200, 3000, PROBE_BYTES + 100]), min_size=1, max_size=90),
    pick=st.floats(0, 1),
    flip=st.none() | st.floats(0, 1),
)
def test_found_is_always_the_right_line_and_not_found_is_the_only_other_answer(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], pick: float, flip: float | None
) -> None:
    """Long lines (past a probe) and damage anywhere make it give up, never mislead."""
    segment = make_journal(tmp_path_factory.mktemp("j"), sizes)
    starts = line_starts(segment)
    if flip is not None:  # one flipped bit somewhere in the records
        data = bytearray(segment.read_bytes())
        at = int(flip * (starts[-1] + 10))
        data[at] ^= 0x20
        segment.write_bytes(bytes(data))
    target = 1 + int(pick * (len(sizes) - 1))
    found = find(segment, target)
    assert found is None or found == starts[target - 1]
    if flip is None and max(sizes) < PROBE_BYTES // 2:
        assert found == starts[target - 1]  # (nothing in the way: found)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pieces=st.lists(
        st.sampled_from(["line", "long", "nul", "newline"]) | st.binary(max_size=300),
        max_size=40,
    ),
    target=st.integers(1, 45),
)
def test_any_bytes_give_the_right_line_or_none(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[str | bytes], target: int
) -> None:
    """Valid lines (seqs in order), long ones, NULs, stray newlines and random bytes,
    in any mix: never an error, never a line that is not the target's."""
    seq, data = 1, b""
    for piece in pieces:
        if piece in ("line", "long"):
            note = "x" * (PROBE_BYTES if piece == "long" else 100)
            data += encode_record(seq, 0, 1.5, "T", {"note": note})
            seq += 1
        else:
            data += (
                piece if isinstance(piece, bytes) else {"nul": b"\0" * 600, "newline": b"\n"}[piece]
            )
    path = tmp_path_factory.mktemp("j") / "segment"
    path.write_bytes(data)
    found = find(path, target)
    if found is not None:
        line = data[found : data.index(b"\n", found)]
        assert line_checks(line) and orjson.loads(line)["seq"] == target


class CountingPread:
    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, fd: int, size: int, offset: int) -> bytes:
        data = os.pread(fd, size, offset)
        self.bytes += len(data)
        return data


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingPread]:
    counter = CountingPread()
    monkeypatch.setattr(fsutil, "pread", counter)
    yield counter


RECORDS, SNAPSHOT_SEQ = 4000, 3990


def big_journal_with_a_late_snapshot(directory: Path) -> tuple[Path, int]:
    """4,000 records in one segment and a snapshot at seq 3,990; returns the segment
    and how many bytes a read from the snapshot's line may take: the lines from there
    on, the zero tail (checked at open), and a bisection's probes."""
    with Journal.open(directory) as j:
        for start in range(0, RECORDS - 1, 500):
            stop = min(start + 500, RECORDS - 1)
            j.append_batch([("T", {"i": i, "note": "x" * 150}) for i in range(start, stop)])
        # The last record alone: a test tears it (the batch it was in would be cut whole,
        # and the snapshot covers part of that batch: corruption, not a tear).
        j.append("T", {"i": RECORDS - 1, "note": "x" * 150})
        j.write_snapshot(SNAPSHOT_SEQ, b"state")
    (segment,) = list_segments(directory)
    path = Path(segment.path)
    from_snapshot = path.stat().st_size - line_starts(path)[SNAPSHOT_SEQ - 1]
    return path, from_snapshot + 16 * PROBE_BYTES


def test_open_after_a_snapshot_reads_from_the_snapshot_seq(
    tmp_path: Path, counted: CountingPread
) -> None:
    directory = tmp_path / "j"
    segment, budget = big_journal_with_a_late_snapshot(directory)
    assert budget < segment.stat().st_size * 3 // 4  # (a read from the start takes it all)
    counted.bytes = 0
    with Journal.open(directory) as j:
        assert j.last_seq == RECORDS
        assert counted.bytes <= budget  # not the records before the snapshot's
        assert j.append("after", {}).seq == RECORDS + 1


def test_reading_from_a_seq_reads_from_its_line(tmp_path: Path, counted: CountingPread) -> None:
    directory = tmp_path / "j"
    _, budget = big_journal_with_a_late_snapshot(directory)
    counted.bytes = 0
    got = [r.seq for r in read_records(directory, SNAPSHOT_SEQ)]
    assert got == list(range(SNAPSHOT_SEQ, RECORDS + 1))
    assert counted.bytes <= budget


def test_damage_before_the_snapshot_seq_is_left_to_verify(tmp_path: Path) -> None:
    """The lines a snapshot covers are not checked at open (as sealed segments it covers
    are not); verify still finds the damage, and what follows reads the same."""
    directory = tmp_path / "j"
    segment, _ = big_journal_with_a_late_snapshot(directory)
    data = bytearray(segment.read_bytes())
    at = line_starts(segment)[100] + 40  # inside record 101, long before the snapshot
    data[at] ^= 0x01
    segment.write_bytes(bytes(data))
    with Journal.open(directory) as j:
        assert [r.seq for r in j.read(RECORDS - 5)] == list(range(RECORDS - 5, RECORDS + 1))
    assert verify(directory).status == "corrupt"


def test_a_torn_tail_after_the_snapshot_seq_is_still_found(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    segment, _ = big_journal_with_a_late_snapshot(directory)
    end = line_starts(segment)[-1]
    records_end = len(segment.read_bytes().rstrip(b"\0"))
    with open(segment, "r+b") as f:
        # The last record torn: its first 30 bytes landed, then garbage, NULs after it
        # (its newline among them: a tear leaves no whole line that does not check).
        f.seek(end + 30)
        f.write(b"garbage" + b"\0" * (records_end - end - 37))
    with Journal.open(directory) as j:
        assert j.last_seq == RECORDS - 1
        assert j.append("after", {}).seq == RECORDS  # the torn record was cut first
    got = [r.seq for r in read_records(directory, SNAPSHOT_SEQ)]
    assert got == list(range(SNAPSHOT_SEQ, RECORDS + 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.sampled_from([0, 50, 400, 3000]), min_size=1, max_size=120),
    segment_bytes=st.sampled_from([20_000, 60_000, 1 << 20]),
    pick=st.floats(0, 1),
)
def test_reading_from_any_seq_gives_what_a_full_read_gives_from_there(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], segment_bytes: int, pick: float
) -> None:
    directory = tmp_path_factory.mktemp("j") / "journal"
    with Journal.open(directory, segment_bytes_max=segment_bytes) as j:
        for i, size in enumerate(sizes):
            j.append("T", {"i": i, "note": "x" * size})
        snapshot_seq = 1 + int(pick * (len(sizes) - 1))
        j.write_snapshot(snapshot_seq, b"state")
    everything = list(read_records(directory))
    assert [r.seq for r in everything] == list(range(1, len(sizes) + 1))
    for from_seq in {1, snapshot_seq, max(1, snapshot_seq - 1), len(sizes)}:
        assert list(read_records(directory, from_seq)) == everything[from_seq - 1 :]
    with Journal.open(directory, segment_bytes_max=segment_bytes) as j:  # from the snapshot
        assert j.last_seq == len(sizes)
        assert j.append("after", {}).seq == len(sizes) + 1
    assert verify(directory).status == "clean"
