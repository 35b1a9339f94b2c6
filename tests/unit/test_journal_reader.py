"""Reader damage classification, as a table: each case damages a real three-segment
journal one way and states what verify, open and read must say (clean / torn tail /
corruption, with segment, byte offset and seq).  Every case also runs with tiny read
chunks, so that lines split across reads are covered."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import journal._reader as reader_module
from journal import (
    CompactedError,
    CorruptionError,
    FormatVersionError,
    Journal,
    Record,
    TornTailError,
    read_records,
    verify,
)
from journal._codec import LineProblem, decode_line, encode_record
from journal._segment import segment_name

# What JSON the journal writes and reads: in both modes of journal._json.
pytestmark = pytest.mark.usefixtures("json_mode")

COUNTS = (3, 3, 4)  # records per segment: seqs 1-3, 4-6, 7-10
LAST_SEQ = 10


def record(seq: int) -> Record:
    return Record(seq, seq % 3, 1000.0 + seq, "T", {"i": seq, "text": "\u00e9\u2713" * (seq % 4)})


def line(seq: int) -> bytes:
    r = record(seq)
    return encode_record(r.seq, r.epoch, r.ts, r.type, r.data)


class Journal3:
    """A journal of three segments written byte by byte, plus damage helpers."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.lines: list[list[bytes]] = []
        self.paths: list[Path] = []
        seq = 1
        directory.mkdir()
        for count in COUNTS:
            lines = [line(seq + i) for i in range(count)]
            path = directory / segment_name(seq)
            path.write_bytes(b"".join(lines))
            self.lines.append(lines)
            self.paths.append(path)
            seq += count

    def offset(self, segment: int, index: int) -> int:
        return sum(len(x) for x in self.lines[segment][:index])

    def size(self, segment: int) -> int:
        return self.paths[segment].stat().st_size

    def append(self, segment: int, data: bytes) -> None:
        with self.paths[segment].open("ab") as f:
            f.write(data)

    def after_sector_hole(self, segment: int, data: bytes, *, short: int = 0) -> None:
        """NULs from the end of ``segment`` to a sector boundary (``short`` bytes short
        of it), then ``data``: an unsynced write whose first sector never landed."""
        run = -self.size(segment) % 512 or 512
        self.append(segment, b"\x00" * (run - short) + data)

    def sector_lost_inside(self, segment: int, data: bytes, *, shift: int = 0) -> None:
        """Append ``data`` with the 512 bytes from the first sector boundary in it (moved
        by ``shift``) turned into NULs: an unsynced write whose middle sector never
        landed (``shift`` != 0: NULs a lost sector cannot make)."""
        start = (-self.size(segment) % 512) + shift
        assert start + 512 < len(data)
        self.append(segment, data[:start] + b"\x00" * 512 + data[start + 512 :])

    def truncate_end(self, segment: int, n: int) -> None:
        path = self.paths[segment]
        path.write_bytes(path.read_bytes()[:-n])

    def flip(self, segment: int, index: int, at: int = 20) -> None:
        path = self.paths[segment]
        data = bytearray(path.read_bytes())
        data[self.offset(segment, index) + at] ^= 0x04
        path.write_bytes(bytes(data))

    def replace_line(self, segment: int, index: int, new: bytes) -> None:
        lines = list(self.lines[segment])
        lines[index : index + 1] = [new] if new else []
        self.paths[segment].write_bytes(b"".join(lines))


@dataclass(frozen=True)
class Expect:
    status: str  # clean | torn_tail | corrupt
    last_seq: int  # last valid record before the damage
    segment: int | None = None  # index of the damaged segment
    offset: Callable[[Journal3], int] | None = None
    seq: int | None = None  # seq expected at the damage
    tail_bytes: Callable[[Journal3], int] | None = None


def clean(last_seq: int = LAST_SEQ) -> Expect:
    return Expect("clean", last_seq)


def torn(
    last_seq: int, segment: int, offset: Callable[[Journal3], int], tail: Callable[[Journal3], int]
) -> Expect:
    return Expect("torn_tail", last_seq, segment, offset, last_seq + 1, tail)


def corrupt(last_seq: int, segment: int, offset: Callable[[Journal3], int], seq: int) -> Expect:
    return Expect("corrupt", last_seq, segment, offset, seq)


def _checked(body: bytes) -> bytes:
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body)


LAST_LINE = len(line(10))
LONG_LINE = encode_record(11, 0, 1.0, "T", {"pad": "p" * 1500}) + line(12)  # (one write)
CASES: dict[str, tuple[Callable[[Journal3], object], Expect]] = {
    "clean": (lambda j: None, clean()),
    "truncated-1-byte (no newline)": (
        lambda j: j.truncate_end(2, 1),
        torn(9, 2, lambda j: j.offset(2, 3), lambda j: LAST_LINE - 1),
    ),
    "truncated-in-crc": (
        lambda j: j.truncate_end(2, 12),
        torn(9, 2, lambda j: j.offset(2, 3), lambda j: LAST_LINE - 12),
    ),
    "truncated-to-one-byte": (
        lambda j: j.truncate_end(2, LAST_LINE - 1),
        torn(9, 2, lambda j: j.offset(2, 3), lambda j: 1),
    ),
    "truncated-at-record-boundary": (lambda j: j.truncate_end(2, LAST_LINE), clean(9)),
    # NUL bytes up to the end of a segment are its zero tail (preallocated space).
    "zero-tail": (lambda j: j.append(2, b"\x00" * 4096), clean()),
    "last-record-nul-filled (its size reached the disk, its data did not)": (
        lambda j: j.replace_line(2, 3, b"\x00" * LAST_LINE),
        clean(9),
    ),
    "zero-tail-of-a-sealed-segment": (lambda j: j.append(1, b"\x00" * 300), clean()),
    "half-record-then-zero-tail": (
        lambda j: j.append(2, line(11)[:30] + b"\x00" * 4096),
        torn(10, 2, lambda j: j.offset(2, 4), lambda j: 30),
    ),
    # A complete line (it ends in a newline) holding no NUL that does not check: never
    # left by a tear (its bytes all landed, and the writer writes records only).
    "garbage-line-then-zero-tail": (
        lambda j: j.append(2, b"junk\n" + b"\x00" * 300),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "bit-flip-in-the-last-record": (
        lambda j: j.flip(2, 3),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    "bit-flip-in-the-last-record-then-zero-tail": (
        lambda j: (j.flip(2, 3), j.append(2, b"\x00" * 4096)),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    "bit-flip-in-the-crc-of-the-last-record": (
        lambda j: j.flip(2, 3, at=LAST_LINE - 5),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    # The newline itself flipped: the record's bytes check, but a byte that is not a
    # newline follows them (a tear leaves a prefix of the line: never that).
    "flipped-newline-of-the-last-record": (
        lambda j: j.flip(2, 3, at=LAST_LINE - 1),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    "flipped-newline-of-the-last-record-then-zero-tail": (
        lambda j: (j.flip(2, 3, at=LAST_LINE - 1), j.append(2, b"\x00" * 4096)),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    "a-byte-of-the-last-record-flipped-into-a-newline": (
        lambda j: j.replace_line(2, 3, line(10)[:40] + b"\n" + line(10)[41:]),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    "nul-line-then-a-complete-garbage-line": (
        lambda j: j.append(2, b"\x00" * 10 + b"torn\njunk\n"),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "nul-then-garbage-to-the-end": (
        lambda j: j.append(2, b"\x00" * 300 + b"junk"),
        torn(10, 2, lambda j: j.offset(2, 4), lambda j: 304),
    ),
    "nul-then-garbage-then-zero-tail": (
        lambda j: j.append(2, b"\x00" * 300 + b"junk" + b"\x00" * 300),
        torn(10, 2, lambda j: j.offset(2, 4), lambda j: 304),
    ),
    # NULs in a whole line that end off a sector boundary: no lost sector made them.
    "nul-filled-with-newline": (
        lambda j: j.replace_line(2, 3, b"\x00" * (LAST_LINE - 1) + b"\n"),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    "a-byte-of-the-last-record-turned-into-a-nul": (
        lambda j: j.replace_line(2, 3, line(10)[:40] + b"\x00" + line(10)[41:]),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    # A write whose middle sector never landed: the line it cuts through is whole, and
    # its NULs are that sector's.
    "a-lost-sector-inside-a-whole-line": (
        lambda j: j.sector_lost_inside(2, LONG_LINE),
        torn(10, 2, lambda j: j.offset(2, 4), lambda j: len(LONG_LINE)),
    ),
    "nuls-inside-a-whole-line-off-the-sector-boundaries": (
        lambda j: j.sector_lost_inside(2, LONG_LINE, shift=1),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "garbage-tail": (
        lambda j: j.append(2, b"garbage more \xff\xfe garbage"),
        torn(10, 2, lambda j: j.offset(2, 4), lambda j: 23),
    ),
    "garbage-lines-with-nuls-off-the-sector-boundaries": (
        lambda j: j.append(2, b"garbage\x00\nmore\x00 \xff\xfe\n garbage"),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "garbage-tail-with-a-complete-line": (
        lambda j: j.append(2, b"garbage\nmore \xff\xfe garbage"),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "half-record-with-newline": (
        lambda j: j.append(2, line(11)[:30] + b"\n"),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "half-record-then-nuls-and-a-newline": (
        lambda j: j.append(2, line(11)[:30] + b"\x00" * 20 + b"\n"),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "last-segment-only-garbage": (
        lambda j: j.paths[2].write_bytes(b"xx"),
        torn(6, 2, lambda j: 0, lambda j: 2),
    ),
    "empty-last-segment": (
        lambda j: (j.dir / segment_name(11)).write_bytes(b""),
        clean(),
    ),
    "bad-crc-mid-last-segment": (
        lambda j: j.flip(2, 1),
        corrupt(7, 2, lambda j: j.offset(2, 1), 8),
    ),
    "bad-crc-first-record": (
        lambda j: j.flip(0, 0),
        corrupt(0, 0, lambda j: 0, 1),
    ),
    "nul-hole-then-valid-record": (
        lambda j: j.replace_line(2, 2, b"\x00" * 50),
        corrupt(8, 2, lambda j: j.offset(2, 2), 9),
    ),
    "nul-hole-with-newline-then-valid-record": (
        lambda j: j.replace_line(2, 2, b"\x00" * 50 + b"\n"),
        corrupt(8, 2, lambda j: j.offset(2, 2), 9),
    ),
    # A write whose later sectors landed and first did not: NULs up to a sector
    # boundary, then the rest of it (never committed: a torn tail).
    "sector-hole-then-records-of-the-same-write": (
        lambda j: j.after_sector_hole(2, b'a","text":""},"crc":"0"}\n' + line(12) + line(13)),
        torn(10, 2, lambda j: j.offset(2, 4), lambda j: j.size(2) - j.offset(2, 4)),
    ),
    "sector-hole-glued-to-a-record-then-a-zero-tail": (
        lambda j: j.after_sector_hole(2, line(12) + b"\x00" * 700),
        torn(10, 2, lambda j: j.offset(2, 4), lambda j: j.size(2) - 700 - j.offset(2, 4)),
    ),
    "nul-hole-short-of-a-sector-boundary-then-a-record": (
        lambda j: j.after_sector_hole(2, b"\n" + line(12), short=1),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "sector-hole-then-an-older-record": (
        lambda j: j.after_sector_hole(2, line(9)),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "sector-hole-then-records-out-of-order": (
        lambda j: j.after_sector_hole(2, line(13) + line(12)),
        corrupt(10, 2, lambda j: j.offset(2, 4), 11),
    ),
    "sector-hole-in-a-sealed-segment": (
        lambda j: j.after_sector_hole(1, line(8)),
        corrupt(6, 1, lambda j: j.offset(1, 3), 7),
    ),
    "garbage-glued-to-a-valid-last-record": (
        lambda j: j.replace_line(2, 3, b"junk" + line(10)),
        corrupt(9, 2, lambda j: j.offset(2, 3), 10),
    ),
    "bad-record-in-sealed-segment": (
        lambda j: j.flip(1, 1),
        corrupt(4, 1, lambda j: j.offset(1, 1), 5),
    ),
    "bad-last-record-of-sealed-segment": (
        lambda j: j.flip(1, 2),
        corrupt(5, 1, lambda j: j.offset(1, 2), 6),
    ),
    "torn-end-of-sealed-segment": (
        lambda j: j.truncate_end(1, 5),
        corrupt(5, 1, lambda j: j.offset(1, 2), 6),
    ),
    "gap-inside-segment": (
        lambda j: j.replace_line(2, 1, b""),
        corrupt(7, 2, lambda j: j.offset(2, 1), 8),
    ),
    "duplicate-record": (
        lambda j: j.replace_line(2, 1, line(8) + line(8)),
        corrupt(8, 2, lambda j: j.offset(2, 2), 9),
    ),
    "checksummed-record-with-bad-fields": (
        lambda j: j.replace_line(
            2, 1, _checked(b'{"v":1,"seq":8,"epoch":0,"ts":1.0,"type":"T","data":[]')
        ),
        corrupt(7, 2, lambda j: j.offset(2, 1), 8),
    ),
    "missing-middle-segment": (
        lambda j: j.paths[1].unlink(),
        corrupt(3, 2, lambda j: 0, 4),
    ),
    "segment-named-with-a-gap": (
        lambda j: j.paths[2].rename(j.dir / segment_name(8)),
        corrupt(6, 2, lambda j: 0, 7),
    ),
}


@pytest.fixture(params=[None, 7, 100], ids=["chunk-default", "chunk-7", "chunk-100"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param is not None:
        monkeypatch.setattr(reader_module, "CHUNK_BYTES", request.param)


@pytest.fixture(autouse=True)
def _no_rescan_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    # Corruption is looked at again after a pause, for a live writer: none here.
    monkeypatch.setattr(reader_module, "RESCAN_DELAYS_S", (0.0,))


@pytest.fixture
def j3(tmp_path: Path) -> Journal3:
    return Journal3(tmp_path / "j")


@pytest.mark.usefixtures("chunk")
@pytest.mark.parametrize("case", list(CASES))
def test_verify_classifies(case: str, j3: Journal3) -> None:
    damage, expect = CASES[case]
    damage(j3)
    before = {p.name: p.read_bytes() for p in j3.dir.iterdir()}
    report = verify(j3.dir)
    assert {p.name: p.read_bytes() for p in j3.dir.iterdir()} == before, "verify modified files"
    assert report.status == expect.status
    assert report.last_seq == expect.last_seq
    if expect.status == "torn_tail":
        assert report.torn_tail is not None and expect.offset and expect.tail_bytes
        assert report.torn_tail.segment == str(j3.paths[expect.segment or 0])
        assert report.torn_tail.offset == expect.offset(j3)
        assert report.torn_tail.seq == expect.seq
        assert report.torn_tail.tail_bytes == expect.tail_bytes(j3)
    elif expect.status == "corrupt":
        error = report.corruption
        assert error is not None and expect.offset is not None
        assert error.code == "journal.corrupt"
        assert error.segment is not None and Path(error.segment).parent == j3.dir
        assert (
            Path(error.segment).name == j3.paths[expect.segment or 0].name
            or case == "segment-named-with-a-gap"
        )
        assert error.offset == expect.offset(j3)
        assert error.seq == expect.seq
    else:
        assert report.torn_tail is None and report.corruption is None


@pytest.mark.usefixtures("chunk")
@pytest.mark.parametrize("case", list(CASES))
def test_read_yields_the_valid_prefix_then_stops_or_raises(case: str, j3: Journal3) -> None:
    damage, expect = CASES[case]
    damage(j3)
    got: list[Record] = []
    if expect.status == "corrupt":
        with pytest.raises(CorruptionError) as caught:
            got.extend(read_records(j3.dir))
        assert caught.value.seq == expect.seq
    else:
        got.extend(read_records(j3.dir))
    assert got == [record(s) for s in range(1, expect.last_seq + 1)]


@pytest.mark.parametrize("case", list(CASES))
def test_open_refuses_corruption_and_accepts_a_torn_tail(case: str, j3: Journal3) -> None:
    damage, expect = CASES[case]
    damage(j3)
    if expect.status == "corrupt":
        with pytest.raises(CorruptionError) as caught:
            Journal.open(j3.dir)
        assert caught.value.seq == expect.seq
        return
    before = {p.name: p.read_bytes() for p in j3.dir.iterdir() if p.name != ".lock"}
    with Journal.open(j3.dir) as journal:
        assert journal.last_seq == expect.last_seq
        assert journal.max_epoch == max(
            (record(s).epoch for s in range(1, expect.last_seq + 1)), default=0
        )
    after = {p.name: p.read_bytes() for p in j3.dir.iterdir() if p.name != ".lock"}
    assert after == before, "open must not modify anything (a torn tail is cut at the next append)"


def test_read_from_the_middle(j3: Journal3) -> None:
    assert [r.seq for r in read_records(j3.dir, 5)] == list(range(5, 11))
    assert [r.seq for r in read_records(j3.dir, 7)] == list(range(7, 11))
    assert list(read_records(j3.dir, 11)) == []


def test_read_stops_early_without_reading_on(j3: Journal3) -> None:
    j3.flip(2, 3)  # damage after what we read: never reached
    it = read_records(j3.dir)
    assert [next(it).seq for _ in range(3)] == [1, 2, 3]


def test_read_before_first_segment_says_compacted(j3: Journal3) -> None:
    j3.paths[0].unlink()
    with pytest.raises(CompactedError) as caught:
        list(read_records(j3.dir, 1))
    assert caught.value.first_seq == 4
    assert [r.seq for r in read_records(j3.dir, 4)] == list(range(4, 11))


def test_missing_first_segment_without_snapshot_is_corruption(j3: Journal3) -> None:
    j3.paths[0].unlink()
    report = verify(j3.dir)
    assert report.status == "corrupt"
    assert report.corruption is not None and "no valid snapshot" in report.corruption.message
    with pytest.raises(CorruptionError):
        Journal.open(j3.dir)


def test_newer_format_version_raises_a_coded_error(j3: Journal3) -> None:
    j3.replace_line(2, 3, _checked(b'{"v":2,"seq":10,"epoch":0,"ts":1.0,"type":"T","data":{}'))
    for attempt in (
        lambda: verify(j3.dir),
        lambda: list(read_records(j3.dir)),
        lambda: Journal.open(j3.dir),
    ):
        with pytest.raises(FormatVersionError) as caught:
            attempt()
        assert caught.value.seq == 10
        assert caught.value.segment == str(j3.paths[2])
        assert caught.value.offset == j3.offset(2, 3)


def test_an_over_long_garbage_tail_is_torn(j3: Journal3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module, "LINE_BYTES_MAX_READ", 300)
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", 50)
    j3.append(2, b"z" * 1000)
    report = verify(j3.dir)
    assert report.status == "torn_tail" and report.torn_tail is not None
    assert (report.torn_tail.offset, report.torn_tail.tail_bytes) == (j3.size(2) - 1000, 1000)


def test_an_over_long_bad_line_followed_by_a_valid_one_is_corrupt(
    j3: Journal3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "LINE_BYTES_MAX_READ", 300)
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", 50)
    j3.replace_line(2, 3, b"z" * 1000 + b"\n" + line(10))
    report = verify(j3.dir)
    assert report.status == "corrupt" and report.corruption is not None
    assert report.corruption.offset == j3.offset(2, 3)


@pytest.mark.parametrize("nul", [False, True], ids=["no-nul", "a-nul-inside"])
def test_an_over_long_whole_line_is_corrupt_unless_it_holds_a_nul(
    j3: Journal3, monkeypatch: pytest.MonkeyPatch, nul: bool
) -> None:
    """Skipped without being held, an over-long line is still judged whole: with a
    newline at its end and no NUL it is no tear (two records glued by a flipped newline
    look like that), with a NUL in it it may be one."""
    monkeypatch.setattr(reader_module, "LINE_BYTES_MAX_READ", 300)
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", 50)
    j3.append(2, b"z" * 500 + (b"\x00" if nul else b"z") + b"z" * 499 + b"\n")
    report = verify(j3.dir)
    if nul:
        assert report.status == "torn_tail" and report.torn_tail is not None
        assert (report.torn_tail.offset, report.torn_tail.tail_bytes) == (j3.offset(2, 4), 1001)
    else:
        assert report.status == "corrupt" and report.corruption is not None
        assert (report.corruption.offset, report.corruption.seq) == (j3.offset(2, 4), 11)


def test_leftover_broken_and_temp_files_are_ignored(j3: Journal3) -> None:
    (j3.dir / (j3.paths[2].name + ".broken")).write_bytes(b"\x00garbage")
    (j3.dir / ".snapshot-00000000000000000003.snap.tmp").write_bytes(b"partial")
    (j3.dir / "README").write_text("hello")
    assert verify(j3.dir).status == "clean"
    assert [r.seq for r in read_records(j3.dir)] == list(range(1, 11))


def test_error_carries_where_in_message_and_details(j3: Journal3) -> None:
    j3.flip(1, 1)
    error = verify(j3.dir).corruption
    assert error is not None
    assert error.details == {"segment": str(j3.paths[1]), "offset": j3.offset(1, 1), "seq": 5}
    assert j3.paths[1].name in str(error) and "seq 5" in str(error)


@pytest.mark.parametrize("from_end", range(1, 20))
def test_a_flipped_byte_in_the_checksum_tail_is_caught(j3: Journal3, from_end: int) -> None:
    # The crc covers the bytes before ',"crc":"'; its own key, digits, closing brace and
    # newline are checked structurally, on the fast path too.
    path = j3.paths[2]
    data = bytearray(path.read_bytes())
    data[j3.offset(2, 2) - from_end] ^= 0x01  # inside the tail of record 8
    path.write_bytes(bytes(data))
    report = verify(j3.dir)
    assert report.status == "corrupt", report
    assert report.corruption is not None and report.corruption.seq in (8, 9)


def test_strict_read_raises_torn_tail_error_after_the_valid_records(j3: Journal3) -> None:
    j3.append(2, b"\x00\x00torn")
    got: list[int] = []
    with pytest.raises(TornTailError) as caught:
        got.extend(r.seq for r in read_records(j3.dir, allow_torn_tail=False))
    assert got == list(range(1, 11))
    error = caught.value
    assert (error.segment, error.offset, error.seq, error.tail_bytes) == (
        str(j3.paths[2]),
        j3.offset(2, 4),
        11,
        6,
    )
    assert error.code == "journal.torn_tail"
    assert [r.seq for r in read_records(j3.dir)] == list(range(1, 11))  # default: quiet


# -- the bulk fast path checks every field of every line, as the slow path does

RUN_TEST_LINES = 300  # more than one chunk run (reader_module.RUN_LINES), fewer than a chunk


def _checked(body: bytes) -> bytes:
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body)


BODIES = {  # (the line at seq 200, formatted with its seq): every one checksums
    "int-ts": b'{"v":1,"seq":%d,"epoch":0,"ts":17,"type":"T","data":{}',
    "extra-key": b'{"v":1,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{},"x":[1]',
    "v-true": b'{"v":true,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{}',
    "v-float": b'{"v":1.0,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{}',
    "v-str": b'{"v":"1","seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{}',
    "v-missing": b'{"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{}',
    "v2": b'{"v":2,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{}',
    "seq-float": b'{"v":1,"seq":%d.0,"epoch":0,"ts":1.5,"type":"T","data":{}',
    "seq-next": b'{"v":1,"seq":%d1,"epoch":0,"ts":1.5,"type":"T","data":{}',
    "epoch-neg": b'{"v":1,"seq":%d,"epoch":-1,"ts":1.5,"type":"T","data":{}',
    "epoch-float": b'{"v":1,"seq":%d,"epoch":1.0,"ts":1.5,"type":"T","data":{}',
    "epoch-true": b'{"v":1,"seq":%d,"epoch":true,"ts":1.5,"type":"T","data":{}',
    "ts-str": b'{"v":1,"seq":%d,"epoch":0,"ts":"1.5","type":"T","data":{}',
    "ts-null": b'{"v":1,"seq":%d,"epoch":0,"ts":null,"type":"T","data":{}',
    "type-int": b'{"v":1,"seq":%d,"epoch":0,"ts":1.5,"type":3,"data":{}',
    "data-list": b'{"v":1,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":[]',
    "data-null": b'{"v":1,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":null',
    "data-missing": b'{"v":1,"seq":%d,"epoch":0,"ts":1.5,"type":"T"',
    "duplicate-seq": b'{"v":1,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{},"seq":1',
    "not-json": b'{"v":1,"seq":%d,"epoch":0,"ts":1.5,"type":"T","data":{}}}',
}


@pytest.mark.usefixtures("chunk")
@pytest.mark.parametrize("case", list(BODIES))
def test_bulk_and_line_by_line_checks_agree(case: str, tmp_path: Path) -> None:
    """One checksummed line among many valid ones: whatever decode_line (the slow,
    explaining path) says of it alone, reading the segment says too."""
    bad_seq = 200
    odd = _checked(BODIES[case] % bad_seq)
    lines = [line(seq) if seq != bad_seq else odd for seq in range(1, RUN_TEST_LINES + 1)]
    directory = tmp_path / "j"
    directory.mkdir()
    (directory / segment_name(1)).write_bytes(b"".join(lines))
    offset = sum(map(len, lines[: bad_seq - 1]))
    got: list[Record] = []
    try:
        alone: Record | BaseException = decode_line(odd, bad_seq)
    except (LineProblem, FormatVersionError) as exc:
        alone = exc
    if isinstance(alone, Record):
        got.extend(read_records(directory))
        assert got[bad_seq - 1] == alone
        assert [r.seq for r in got] == list(range(1, RUN_TEST_LINES + 1))
        assert got[:3] == [record(1), record(2), record(3)]
        return
    expected = FormatVersionError if isinstance(alone, FormatVersionError) else CorruptionError
    with pytest.raises(expected) as caught:
        got.extend(read_records(directory))
    assert [r.seq for r in got] == list(range(1, bad_seq))
    assert (caught.value.offset, caught.value.seq) == (offset, bad_seq)
    if isinstance(alone, LineProblem):
        assert alone.checks or case == "not-json"


# -- a lock-free reader racing an append -----------------------------------------------


def _racing_first_read(
    monkeypatch: pytest.MonkeyPatch, path: Path, copied_to: int, copied_later: list[int]
) -> None:
    """The scan's first read of ``path`` sees an append copied in only up to byte
    ``copied_to`` (zeros after it: the writer was mid-copy, lock-free readers race it);
    its later reads see the append whole, as the writer finished meanwhile."""
    real = reader_module._fsutil.pread
    target = os.stat(path).st_ino

    def pread(fd: int, size: int, offset: int) -> bytes:
        data = real(fd, size, offset)
        if os.fstat(fd).st_ino == target and not copied_later:
            copied_later.append(offset)
            cut = max(0, copied_to - offset)
            return data[:cut] + bytes(max(0, len(data) - cut))
        return data

    monkeypatch.setattr(reader_module._fsutil, "pread", pread)


@pytest.mark.parametrize("torn", ["mid-line", "line-start"])
def test_an_append_copied_in_during_the_read_is_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: str
) -> None:
    # The reader reads a chunk while an append that runs past the chunk's end is being
    # copied in: the chunk ends in zeros, the bytes after it are already there. Seen
    # as damage (exit 4 from a read-only `journal dump` while `work` ran, once in CI).
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", 4096)
    lines = [line(seq) for seq in range(1, 201)]
    directory = tmp_path / "j"
    directory.mkdir()
    path = directory / segment_name(1)
    path.write_bytes(b"".join(lines) + bytes(8192))  # (the writer's preallocated zeros)
    starts = [sum(map(len, lines[:n])) for n in range(len(lines))]
    line_start = next(s for s in starts if s > 2000)
    copied_to = line_start + (7 if torn == "mid-line" else 0)
    seen: list[int] = []
    _racing_first_read(monkeypatch, path, copied_to, seen)
    got = [r.seq for r in read_records(directory)]
    assert seen == [0]
    if torn == "mid-line":  # (seen as no torn write leaves: looked at again)
        assert got == list(range(1, 201))
    else:  # (a write whose first sectors had not landed: it ends there, or is whole)
        assert got in (list(range(1, 22)), list(range(1, 201)))
    seen.clear()
    assert verify(directory).last_seq == got[-1]


APPEND_BIG = """
import sys, journal
with journal.Journal.open(sys.argv[1], segment_bytes_max=4000) as writer:
    writer.append("T", {"big": "y" * 2000})
"""


def test_a_torn_tail_cut_and_rotated_past_while_a_reader_looks_is_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock-free reader finds a torn tail (a writer killed mid-append) at the end of the
    active segment; before it looks for the next segment, another handle cuts that tail
    and appends a record that does not fit, in a new segment. The reader found the
    next segment behind a torn tail and raised "bad record in a sealed segment" (exit 4
    from a ``ferry ls``) on a clean journal (found by a review). It reads that segment
    again first: the tail is gone, the record follows."""
    import journal._position as position_module

    directory = tmp_path / "j"
    with Journal.open(directory, segment_bytes_max=4000) as first:
        for i in range(5):
            first.append("T", {"i": i, "pad": "x" * 500})
    [segment] = sorted(directory.glob("*.jsonl"))
    data = segment.read_bytes()
    with segment.open("r+b") as f:  # (what kill -9 in the middle of an append leaves)
        f.seek(len(data.rstrip(b"\0")))
        f.write(b'{"v":1,"seq":6,"epoch":0,"ts":1.0,"type":"T","data":{"i":99,"pad":"xx')
    open_segment = position_module._fsutil.open_segment
    next_path = str(directory / segment_name(6))

    def meanwhile(path: str, **options: bool) -> int:
        if path == next_path and not os.path.exists(path):  # (another process)
            subprocess.run(
                [sys.executable, "-c", APPEND_BIG, str(directory)], check=True, timeout=60
            )
        return open_segment(path, **options)

    with Journal.open(directory, read_only=True) as reader:
        assert reader.last_seq == 5
        monkeypatch.setattr(position_module._fsutil, "open_segment", meanwhile)
        reader.refresh()
        monkeypatch.undo()
        assert reader.last_seq == 6
    assert [r.seq for r in read_records(directory)] == [1, 2, 3, 4, 5, 6]
    assert verify(directory).status == "clean"
