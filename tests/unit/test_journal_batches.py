"""A batch is all or none on disk too: every record of a multi-record batch but its last
carries ``"more":K`` (docs/journal-format.md, "Batches"), and readers yield a batch only
once its last record is read.  What a crash in the middle of a batch's write leaves (a
prefix of it, whole lines of it then a cut line, a hole of NUL sectors) is a torn tail
that begins at the batch's first record, cut whole by the next append or ``repair``.

Before the marks, a prefix of whole records of a batch read as committed records: a
``ferry submit --from`` of 40,000 tasks SIGKILLed in its write left 1,420 of them queued
(and run), though the batch was never reported committed."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import journal._reader as reader_module
from journal import (
    CorruptionError,
    Journal,
    Record,
    TornTailError,
    read_records,
    repair,
    verify,
)
from journal._codec import decode_marked, encode_batch, encode_line, prepare, prepare_batch
from journal._segment import segment_name
from journal._survey import survey
from journal._writer import _Batch

# What JSON the journal writes and reads: in both modes of journal._json.
pytestmark = pytest.mark.usefixtures("json_mode")

SECTOR = 512


def batch_lines(first_seq: int, count: int, pad: int = 40) -> bytes:
    """The bytes the writer writes for one batch of ``count`` records from ``first_seq``."""
    items = [("T", {"i": first_seq + i, "pad": "p" * pad}) for i in range(count)]
    prepared = prepare_batch(items, 0, 1 << 20, ts=1.5)
    return encode_batch(first_seq, [p.inner for p in prepared])


class Layout:
    """Batches written one after another into one segment: their bytes and where each
    begins and ends."""

    def __init__(self, sizes: list[int], pad: int = 40) -> None:
        self.data = b""
        self.batches: list[tuple[int, int, int, int]] = []  # (start, end, first_seq, count)
        seq = 1
        for count in sizes:
            lines = batch_lines(seq, count, pad)
            self.batches.append((len(self.data), len(self.data) + len(lines), seq, count))
            self.data += lines
            seq += count

    def expect(self, cut: int) -> tuple[int, tuple[int, int, int] | None]:
        """For the first ``cut`` bytes: the last seq of the whole batches in them, and
        the torn tail (offset, seq, bytes) a reader must report, or None."""
        last = 0
        for start, end, first, count in self.batches:
            if end <= cut:
                last = first + count - 1
            elif start < cut:
                return last, (start, first, cut - start)
            else:
                break
        return last, None


def write_segment(directory: Path, data: bytes, zero_tail: int = 0) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / segment_name(1)
    path.write_bytes(data + bytes(zero_tail))
    return path


def read_seqs(directory: Path, from_seq: int = 1) -> list[int]:
    return [r.seq for r in read_records(directory, from_seq)]


def check_prefix(directory: Path, layout: Layout, cut: int, zero_tail: int) -> None:
    write_segment(directory, layout.data[:cut], zero_tail)
    last, torn = layout.expect(cut)
    found = survey(str(directory))
    assert found.corruption is None, (cut, found.corruption)
    assert found.last_seq == last, cut
    assert read_seqs(directory) == list(range(1, last + 1)), cut
    if torn is None:
        assert found.torn is None, (cut, found.torn)
        assert found.end_offset == cut
    else:
        assert found.torn is not None, cut
        assert (found.torn.offset, found.torn.seq, found.torn.tail_bytes) == torn, cut
        assert found.end_offset == torn[0]


@pytest.fixture(params=["default", "tiny"])
def chunks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The reader's defaults, and tiny reads and runs: lines and batches split across
    read chunks and across the bulk runs of the fast path."""
    if request.param == "tiny":
        monkeypatch.setattr(reader_module, "CHUNK_BYTES", 97)
        monkeypatch.setattr(reader_module, "RUN_LINES", 2)
    return str(request.param)


@pytest.mark.parametrize(
    "sizes",
    [
        [3, 4],  # two consecutive batches
        [1, 3, 1, 2, 1],  # a group commit: batches and single appends, one write
        [2, 1, 1, 5],
    ],
)
@pytest.mark.parametrize("zero_tail", [0, 300])
def test_every_prefix_reads_as_whole_batches_then_a_tail_from_the_first_incomplete_one(
    tmp_path: Path, chunks: str, sizes: list[int], zero_tail: int
) -> None:
    layout = Layout(sizes)
    for cut in range(len(layout.data) + 1):
        check_prefix(tmp_path / "j", layout, cut, zero_tail)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    where=st.floats(0, 1),
    zero_tail=st.sampled_from([0, 1, 4096]),
    pad=st.integers(0, 300),
)
def test_a_prefix_of_any_batches_is_cut_whole_by_the_next_append(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    where: float,
    zero_tail: int,
    pad: int,
) -> None:
    layout = Layout(sizes, pad)
    cut = int(len(layout.data) * where)
    directory = tmp_path_factory.mktemp("j") / "j"
    check_prefix(directory, layout, cut, zero_tail)
    last, torn = layout.expect(cut)
    report = verify(directory)
    assert report.status == ("clean" if torn is None else "torn_tail"), report
    with Journal.open(directory) as j:
        assert j.last_seq == last
        assert j.append("after", {}).seq == last + 1
    assert verify(directory).clean
    assert read_seqs(directory) == list(range(1, last + 2))
    if torn is not None:
        broken = directory / (segment_name(1) + ".broken")
        assert broken.read_bytes() == layout.data[torn[0] : cut]


def test_a_torn_tail_says_how_many_of_the_batch_landed(tmp_path: Path) -> None:
    layout = Layout([2, 5])
    start, end, first, _count = layout.batches[1]
    lines = layout.data[start:end].splitlines(keepends=True)
    # Two whole lines of the batch, then half of the third.
    cut = start + len(lines[0]) + len(lines[1]) + len(lines[2]) // 2
    write_segment(tmp_path / "j", layout.data[:cut], 1000)
    report = verify(tmp_path / "j")
    assert report.status == "torn_tail"
    assert report.torn_tail is not None
    assert (report.torn_tail.offset, report.torn_tail.seq) == (start, first)
    assert "2 of 5 records" in report.torn_tail.reason, report.torn_tail.reason
    # Whole lines only, then nothing: "2 of 5" too.
    cut = start + len(lines[0]) + len(lines[1])
    write_segment(tmp_path / "k", layout.data[:cut])
    report = verify(tmp_path / "k")
    assert report.torn_tail is not None and "2 of 5 records" in report.torn_tail.reason


def test_repair_cuts_the_whole_incomplete_batch_and_keeps_it(tmp_path: Path) -> None:
    layout = Layout([3, 4])
    start, end, first, _count = layout.batches[1]
    cut = end - 10
    directory = tmp_path / "j"
    write_segment(directory, layout.data[:cut], 2000)
    fixed = repair(directory)
    assert fixed.repaired and fixed.offset == start and fixed.last_seq == first - 1
    assert fixed.broken_copy is not None
    assert Path(fixed.broken_copy).read_bytes() == layout.data[start:cut]
    assert verify(directory).clean
    assert read_seqs(directory) == [1, 2, 3]
    assert not repair(directory).repaired  # (idempotent)
    with Journal.open(directory) as j:
        assert j.append_batch([("T", {}), ("T", {})])[0].seq == first


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sector=st.integers(0, 40), count=st.integers(1, 3))
def test_holes_of_nul_sectors_inside_a_batch_are_a_tail_from_its_first_record(
    tmp_path_factory: pytest.TempPathFactory, sector: int, count: int
) -> None:
    """Sectors of the batch's write lost (out of order before a power cut), later ones
    landed: whole records of the batch before and after the hole, none committed."""
    layout = Layout([2, 12], pad=200)
    start, end, first, _ = layout.batches[1]
    sectors = [s for s in range(0, end, SECTOR) if s >= start and s + SECTOR * count <= end]
    hole = sectors[sector % len(sectors)]
    data = bytearray(layout.data)
    data[hole : hole + SECTOR * count] = bytes(SECTOR * count)
    directory = tmp_path_factory.mktemp("j") / "j"
    write_segment(directory, bytes(data), 4096)
    found = survey(str(directory))
    assert found.corruption is None, found.corruption
    assert found.last_seq == first - 1
    assert found.torn is not None and (found.torn.offset, found.torn.seq) == (start, first)
    assert read_seqs(directory) == list(range(1, first))
    with Journal.open(directory) as j:
        assert j.append("after", {}).seq == first
    assert verify(directory).clean


# -- broken marks: corruption -----------------------------------------------------------


def marked(seq: int, mark: bytes | None, pad: str = "") -> bytes:
    """A checksummed line of seq ``seq`` with ``"more":<mark>`` (None: no mark)."""
    line = encode_line(seq, prepare("T", {"i": seq, "pad": pad}, 0, 1 << 20, ts=1.5))
    body = line[: -len(b',"crc":"00000000"}\n')]
    if mark is not None:
        body = body.replace(b',"epoch"', b',"more":' + mark + b',"epoch"', 1)
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body)


# (lines as (seq, mark), the index of the first line that is corruption)
BROKEN = {
    "a mark where the last record was due": ([(1, b"2"), (2, b"1"), (3, b"1"), (4, None)], 2),
    "no mark where one was due": ([(1, b"2"), (2, None), (3, None)], 1),
    "a mark that does not count down": ([(1, b"2"), (2, b"2"), (3, b"1"), (4, None)], 1),
    "a mark that counts down by two": ([(1, b"3"), (2, b"1"), (3, None)], 1),
    "a new batch before the last one ended": ([(1, b"1"), (2, b"1"), (3, None)], 1),
    "more:0": ([(1, None), (2, b"0"), (3, None)], 1),
    "a negative mark": ([(1, None), (2, b"-1"), (3, None)], 1),
    "a string mark": ([(1, None), (2, b'"1"'), (3, None)], 1),
    "a boolean mark": ([(1, None), (2, b"true"), (3, None)], 1),
    "a null mark": ([(1, None), (2, b"null"), (3, None)], 1),
    "a float mark": ([(1, None), (2, b"1.0"), (3, None)], 1),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_mark_is_corruption(tmp_path: Path, chunks: str, case: str) -> None:
    """No writer leaves a valid record that its batch's marks did not announce (nor a
    mark that is not an int >= 1): corruption, never a torn tail, in the last segment
    too, wherever it is (here followed by one more valid record)."""
    shape, bad = BROKEN[case]
    lines = [marked(seq, mark) for seq, mark in shape]
    directory = tmp_path / "j"
    write_segment(directory, b"".join(lines) + marked(len(lines) + 1, None), 100)
    report = verify(directory)
    assert report.status == "corrupt", report
    assert report.corruption is not None
    assert report.corruption.offset == sum(map(len, lines[:bad])), report.corruption
    assert report.corruption.seq == bad + 1
    with pytest.raises(CorruptionError):
        repair(directory)
    with pytest.raises(CorruptionError):
        Journal.open(directory)
    with pytest.raises(CorruptionError):
        read_seqs(directory)


def test_a_whole_batch_with_good_marks_reads_whole(tmp_path: Path, chunks: str) -> None:
    lines = [marked(1, None), marked(2, b"2"), marked(3, b"1"), marked(4, None)]
    write_segment(tmp_path / "j", b"".join(lines))
    assert verify(tmp_path / "j").clean
    assert read_seqs(tmp_path / "j") == [1, 2, 3, 4]


def test_an_incomplete_batch_in_a_sealed_segment_is_corruption(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    directory.mkdir()
    first = batch_lines(1, 3)
    whole_two = b"".join(first.splitlines(keepends=True)[:2])
    (directory / segment_name(1)).write_bytes(whole_two)
    (directory / segment_name(3)).write_bytes(batch_lines(3, 1))
    report = verify(directory)
    assert report.status == "corrupt", report
    assert report.corruption is not None and report.corruption.seq == 1
    assert "sealed" in str(report.corruption)
    with pytest.raises(CorruptionError):
        Journal.open(directory)


# -- reading from a seq -----------------------------------------------------------------


def test_reading_from_a_seq_inside_a_batch(tmp_path: Path, chunks: str) -> None:
    layout = Layout([3, 5, 2, 4])
    directory = tmp_path / "j"
    write_segment(directory, layout.data, 500)
    for from_seq in range(1, 16):
        assert read_seqs(directory, from_seq) == list(range(from_seq, 15)), from_seq
    with Journal.open(directory) as j:
        assert [r.seq for r in j.read(6)] == list(range(6, 15))
    # The last batch cut short: reading from any seq of it (or before) stops before it.
    _start, end, first, _ = layout.batches[-1]
    write_segment(directory, layout.data[: end - 5], 500)
    for from_seq in range(1, 16):
        assert read_seqs(directory, from_seq) == list(range(from_seq, first)), from_seq
    with pytest.raises(TornTailError):
        list(read_records(directory, first + 2, allow_torn_tail=False))


def test_a_snapshot_inside_a_batch_opens_from_there(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    with Journal.open(directory) as j:
        j.append_batch([("T", {"i": i, "pad": "x" * 3000}) for i in range(40)])
        j.write_snapshot(17, b"state")
    with Journal.open(directory) as j:
        assert j.last_seq == 40
        seen: list[int] = []
        j.subscribe(lambda r: seen.append(r.seq), after_seq=17)
        assert seen == list(range(18, 41))
        assert j.append("after", {}).seq == 41


# -- the writer -------------------------------------------------------------------------


def segment_bytes(directory: Path) -> bytes:
    return (directory / segment_name(1)).read_bytes().rstrip(b"\0")


def test_the_writer_marks_every_record_of_a_batch_but_its_last(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    with Journal.open(directory) as j:
        j.append("one", {})
        j.append_batch([("T", {"i": i}) for i in range(3)])
        j.append_batch([("single", {})])
    lines = segment_bytes(directory).splitlines()
    marks = [line[line.index(b'"seq"') : line.index(b'"epoch"')] for line in lines]
    assert marks == [
        b'"seq":1,',
        b'"seq":2,"more":2,',
        b'"seq":3,"more":1,',
        b'"seq":4,',
        b'"seq":5,',
    ]


def test_each_batch_of_a_group_commit_is_marked_on_its_own(tmp_path: Path) -> None:
    directory = tmp_path / "j"
    with Journal.open(directory) as j:
        writer = j._writer
        group = [
            _Batch(prepare_batch([("T", {"i": i}) for i in range(n)], 0, 1 << 20), 0, None)
            for n in (2, 1, 3)
        ]
        writer._lead(group)
        assert j.commits == 1
        assert [[r.seq for r in b.records or []] for b in group] == [[1, 2], [3], [4, 5, 6]]
    expected = b"".join(
        encode_batch(first, [p.inner for p in batch.prepared])
        for first, batch in zip((1, 3, 4), group, strict=True)
    )
    assert segment_bytes(directory) == expected
    assert read_seqs(directory) == [1, 2, 3, 4, 5, 6]


def test_an_old_unmarked_batch_reads_as_before(tmp_path: Path) -> None:
    """Lines written before marks (a batch's records all unmarked) are records each."""
    lines = b"".join(marked(seq, None) for seq in range(1, 6))
    write_segment(tmp_path / "j", lines[:-7])
    assert read_seqs(tmp_path / "j") == [1, 2, 3, 4]
    assert verify(tmp_path / "j").torn_tail.seq == 5  # type: ignore[union-attr]


# -- lock-free readers ------------------------------------------------------------------


def test_a_lock_free_reader_sees_a_batch_being_copied_in_only_whole(tmp_path: Path) -> None:
    """Another process's batch, half copied into the zero tail: a handle's catch-up
    stops before it, and takes it whole once it is all there."""
    directory = tmp_path / "j"
    with Journal.open(directory) as writer:
        writer.append("first", {})
        end = (directory / segment_name(1)).stat().st_size
        records_end = len(segment_bytes(directory))
        with Journal.open(directory, read_only=True) as reader:
            seen: list[Record] = []
            reader.subscribe(seen.append)
            batch = batch_lines(2, 6, pad=500)
            assert records_end + len(batch) < end  # (all of it into the zero tail)
            for copied in (len(batch) // 3, len(batch) - 1):
                with open(directory / segment_name(1), "r+b") as f:
                    f.seek(records_end)
                    f.write(batch[:copied])
                reader.refresh()
                assert [r.seq for r in seen] == [1], copied
                assert reader.last_seq == 1
            with open(directory / segment_name(1), "r+b") as f:
                f.seek(records_end)
                f.write(batch)
            reader.refresh()
            assert [r.seq for r in seen] == list(range(1, 8))


def test_a_whole_batch_is_yielded_run_by_run_not_held_whole(tmp_path: Path) -> None:
    """A batch whose last line is in the file is yielded as its lines are parsed (runs
    of ``RUN_LINES``), across read chunks (the reader reads on to its last line first),
    but for the part of it read with the batch before it (a read chunk at most, held):
    holding the parsed records of a large batch until its last one made a journal of
    batches of 5,000 read a third slower (bench journal-replay). One still open at the
    file's end is never yielded (above)."""
    layout = Layout([5000, 1, 3000])
    path = tmp_path / segment_name(1)
    path.write_bytes(layout.data)
    fd = os.open(path, os.O_RDONLY)
    try:
        scan = reader_module.SegmentScan(fd, str(path), 0, 1)
        runs = list(scan.runs())
    finally:
        os.close(fd)
    assert [r.seq for run in runs for r in run] == list(range(1, 8002))
    shortest = min(len(line) + 1 for line in layout.data.split(b"\n") if line)
    held_at_most = reader_module.CHUNK_BYTES // shortest + reader_module.RUN_LINES
    assert max(map(len, runs)) <= held_at_most < 3000
    assert (scan.next_seq, scan.end_offset, scan.damage) == (8002, len(layout.data), None)


def reference_batch_ends(marks: list[object], left: int) -> tuple[int, int] | None:
    """What ``_batch_ends`` decides in bulk, one record at a time (None: absent)."""
    closed = 0
    for index, mark in enumerate(marks):
        if mark is not None and (type(mark) is not int or mark < 1):
            return None
        more = mark or 0
        if left and more != left - 1:
            return None
        left = more
        if not more:
            closed = index + 1
    return closed, left


MARKS = st.one_of(st.none(), st.integers(-2, 6), st.sampled_from([True, False, 1.0, 2.0, "1", [1]]))


def raw_line(seq: object, mark: object = None, **fields: object) -> bytes:
    """A checksummed line of any fields (its mark, if not None, after its seq; then
    epoch 0, ts 1.5, type "t", data {}, unless ``fields`` says otherwise or more)."""
    obj: dict[str, object] = {"v": 1, "seq": seq}
    if mark is not None:
        obj["more"] = mark
    obj.update({"epoch": 0, "ts": 1.5, "type": "t", "data": {}, **fields})
    body = orjson.dumps(obj)[:-1]
    return body + b',"crc":"%08x"}' % zlib.crc32(body)


@settings(max_examples=3000, deadline=None)
@given(st.lists(MARKS, min_size=1, max_size=12), st.integers(0, 6))
def test_a_run_s_marks_are_decided_in_bulk_as_one_record_at_a_time(
    marks: list[object], left: int
) -> None:
    """The fast path's check of a run's marks (no bytecode per record) against the plain
    loop, on any marks: valid countdowns and every way of breaking one."""
    lines = [raw_line(seq, mark) for seq, mark in enumerate(marks, 1)]
    got = reader_module._parse_run(lines, 1, left)
    assert (None if got is None else tuple(got[2:])) == reference_batch_ends(marks, left)


@st.composite
def countdowns(draw: st.DrawFn) -> list[object]:
    """Marks of a run inside one batch, or ending with it (the reader's one-comparison
    case), perhaps with one mark changed to any other."""
    first, count = draw(st.integers(0, 14)), draw(st.integers(1, 12))
    marks: list[object] = [mark or None for mark in range(first, first - count, -1)]
    if draw(st.booleans()):
        at = draw(st.integers(0, count - 1))
        due = first - at  # (equal, not the same: a float, a bool)
        marks[at] = draw(
            st.sampled_from([float(due), bool(due), due + 1, due - 1, 0, None]) | MARKS
        )
    return marks


@settings(max_examples=3000, deadline=None)
@given(countdowns(), st.integers(0, 16))
def test_a_run_within_one_batch_is_decided_as_one_record_at_a_time(
    marks: list[object], left: int
) -> None:
    """The same, on runs that count down within one batch (or to its end), where one
    comparison decides: valid ones, and each broken by one mark."""
    lines = [raw_line(seq, mark) for seq, mark in enumerate(marks, 1)]
    got = reader_module._parse_run(lines, 1, left)
    assert (None if got is None else tuple(got[2:])) == reference_batch_ends(marks, left)


ODD = st.one_of(
    st.integers(-1, 3), st.booleans(), st.floats(0, 3, allow_nan=False), st.none(),
    st.text(max_size=2), st.just({}), st.just([]),
)  # fmt: skip
FIELD = st.sampled_from(["v", "seq", "epoch", "ts", "type", "data", "more", "x"])


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.dictionaries(FIELD, ODD, max_size=2), min_size=1, max_size=6))
def test_what_the_fast_path_accepts_the_slow_path_reads_the_same(
    changes: list[dict[str, object]],
) -> None:
    """Lines of canonical records with any field replaced or added by a value of any
    type: a run the fast path takes is read the same, record by record and mark by
    mark, by the slow path (which explains what it refuses)."""
    lines = []
    for seq, change in enumerate(changes, 1):
        obj: dict[str, object] = {"seq": seq, "mark": None}
        obj.update({("mark" if key == "more" else key): value for key, value in change.items()})
        lines.append(raw_line(**obj))
    got = reader_module._parse_run(lines, 1, 0)
    if got is None:
        return
    read = [decode_marked(line, seq) for seq, line in enumerate(lines, 1)]
    assert got[0] == [record for record, _ in read]
    assert tuple(got[2:]) == reference_batch_ends([mark or None for _, mark in read], 0)


def test_a_record_that_checks_but_is_no_record_in_a_batch_yields_each_record_once(
    tmp_path: Path,
) -> None:
    """A checksummed line that is not a record (a writer's bug; never a tear) inside a
    large batch: the records read before it are yielded (the batch closes in the lines
    read, so they go out as they are parsed), then corruption is raised; the reader's
    second looks at corruption (a lock-free read racing an append) once yielded them
    again, up to three times, and a subscriber was fed each of them three times."""
    directory = tmp_path / "j"
    with Journal.open(directory) as j:
        j.append("first", {"i": 0})
        j.append_batch([("T", {"i": i}) for i in range(300)])  # seqs 2..301
    path = directory / segment_name(1)
    lines = path.read_bytes().rstrip(b"\0").split(b"\n")[:-1]
    body = lines[199][:-18].replace(b'"type":"T"', b'"type":7')  # seq 200
    lines[199] = body + b',"crc":"%08x"}' % zlib.crc32(body)
    path.write_bytes(b"\n".join(lines) + b"\n")
    seen: list[int] = []
    with pytest.raises(CorruptionError, match="seq 200"):
        seen.extend(r.seq for r in read_records(directory))
    assert seen == list(range(1, len(seen) + 1)) and seen[-1] < 200

    other = tmp_path / "k"
    with Journal.open(other) as j:
        j.append("first", {"i": 0})
    with Journal.open(other, read_only=True) as reader:
        fed: list[int] = []
        reader.subscribe(lambda record: fed.append(record.seq))
        segment = other / segment_name(1)
        with open(segment, "r+b") as f:  # (another writer, with a bug, appends it)
            f.seek(len(segment.read_bytes().rstrip(b"\0")))
            f.write(b"\n".join(lines[1:]) + b"\n")
        with pytest.raises(CorruptionError):
            reader.refresh()
        assert fed == list(range(1, len(fed) + 1)) and fed[-1] < 200


def test_a_mark_of_thousands_of_digits_is_corruption_not_a_crash(
    tmp_path: Path, chunks: str
) -> None:
    """The reader's read-ahead took the mark of the last line read with int(), which
    refuses more than 4,300 digits: a ValueError out of every reader (a review)."""
    directory = tmp_path / "j"
    write_segment(directory, marked(1, None) + marked(2, b"9" * 5000))
    assert verify(directory).status == "corrupt"
    with pytest.raises(CorruptionError):
        read_seqs(directory)
