"""Byte-level damage to real journal files: what is a torn tail, what is corruption.

Each test damages one copy of a real journal (built once per module) in one small
"corrupt this way" function and asserts how verify, reading and repair classify it:

* cut, NUL-filled or garbage bytes at the end of the last segment, as a torn write
  leaves them (no whole line among them but one whose NULs are a lost sector): a torn
  tail; repair cuts exactly those bytes, keeps them in a `.broken` copy, and every
  record whose line was complete before the damage is still there;
* NUL bytes alone up to the end of a segment: its zero tail (preallocated space), not
  damage: nothing is cut, and appends write over them;
* anything else (a flipped bit anywhere, the last record included; a whole garbage
  line; a bad record followed by valid ones, a truncated sealed segment): corruption, reported with segment, offset and seq;
  reading stops there with CorruptionError, repair refuses, and no file changes.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import journal

RECORDS = 40
SEGMENT_BYTES_MAX = 1200  # about 10 records per segment: several sealed segments
LAST_SEGMENT_RECORDS = 8
TOTAL = RECORDS + RECORDS // 9 + LAST_SEGMENT_RECORDS  # every 9th append is a batch of 2


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pristine") / "j"
    j = journal.Journal.open(directory, segment_bytes_max=SEGMENT_BYTES_MAX)
    try:
        for i in range(RECORDS):
            if i % 9 == 8:
                j.append_batch([("t", {"i": i, "k": 0}), ("t", {"i": i, "k": 1})])
            else:
                j.append("t", {"i": i, "note": "n" * (i % 13) * 3, "u": "ü€𝄞"})
    finally:
        j.close()
    # A long active segment: reopened with a large bound, the last records stay in it.
    with journal.Journal.open(directory, segment_bytes_max=1 << 20) as j:
        for i in range(LAST_SEGMENT_RECORDS):
            j.append("t", {"i": RECORDS + i, "tail": True})
    assert len(segments(directory)) >= 4
    # Without its zero tail (as a journal written before preallocation, or one whose
    # tail was cut, ends): damage appended below lands right after the records.
    last = segments(directory)[-1]
    truncate(last, len(last.read_bytes().rstrip(b"\0")))
    return directory


@pytest.fixture
def work(pristine: Path, tmp_path: Path) -> Iterator[Path]:
    copy = tmp_path / "j"
    shutil.copytree(pristine, copy)
    yield copy


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def total_records(directory: Path) -> int:
    return journal.verify(directory).last_seq


def line_starts(content: bytes) -> list[int]:
    """Offsets at which each line starts, plus the end."""
    starts = [0]
    starts += [i + 1 for i, b in enumerate(content) if b == 0x0A]
    return starts


def fingerprint(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def read_all(directory: Path) -> list[journal.Record]:
    return list(journal.read_records(directory))


# --------------------------------------------------------------------------- damage


def truncate(path: Path, length: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(length)


def append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip_bit(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


# --------------------------------------------------------------------------- checks


def assert_torn_and_repairable(directory: Path, valid_end: int, survivors: int) -> None:
    """The last segment has a torn tail starting at `valid_end`; `survivors` records."""
    last = segments(directory)[-1]
    damaged = last.read_bytes()
    report = journal.verify(directory)
    assert report.status == "torn_tail", report
    assert report.torn_tail is not None
    assert report.torn_tail.segment == str(last)
    assert report.torn_tail.offset == valid_end
    assert report.torn_tail.tail_bytes == len(damaged) - valid_end
    assert report.last_seq == survivors
    # Lock-free readers stop quietly before a torn tail.
    assert [r.seq for r in read_all(directory)] == list(range(1, survivors + 1))

    repaired = journal.repair(directory)
    assert repaired.repaired and repaired.bytes_cut == len(damaged) - valid_end
    assert repaired.broken_copy is not None
    assert Path(repaired.broken_copy).read_bytes() == damaged[valid_end:], (
        ".broken keeps the bytes cut"
    )
    assert last.read_bytes() == damaged[:valid_end]
    assert journal.verify(directory).clean
    with journal.Journal.open(directory) as j:
        assert j.append("after", {}).seq == survivors + 1
    assert journal.verify(directory).clean


def assert_corrupt_and_untouched(directory: Path, segment: Path) -> journal.CorruptionError:
    before = fingerprint(directory)
    report = journal.verify(directory)
    assert report.status == "corrupt", report
    assert report.corruption is not None
    error = report.corruption
    assert error.segment == str(segment) and error.offset is not None and error.seq is not None
    with pytest.raises(journal.CorruptionError):
        read_all(directory)
    with pytest.raises(journal.CorruptionError):
        journal.repair(directory)
    with pytest.raises(journal.CorruptionError):
        journal.Journal.open(directory)
    assert fingerprint(directory) == before, "nothing is cut, copied or rewritten"
    return error


# --------------------------------------------------------------------------- torn tails


def test_truncation_at_every_offset_of_the_last_three_records(work: Path) -> None:
    last = segments(work)[-1]
    full = last.read_bytes()
    starts = line_starts(full)
    first_of_last = int(last.name.split(".")[0])
    assert len(starts) >= 5, "the last segment holds at least 4 records"
    zone = starts[-4]  # start of the third-to-last record
    for cut in range(zone, len(full) + 1):
        # Same directory each time: put the segment back, drop the last cut's evidence.
        for broken in work.glob("*.broken*"):
            broken.unlink()
        last.write_bytes(full[:cut])
        boundary = max(s for s in starts if s <= cut)
        survivors = first_of_last - 1 + starts.index(boundary)
        if cut == boundary:
            report = journal.verify(work)
            assert report.clean and report.last_seq == survivors, (cut, report)
            assert not journal.repair(work).repaired
        else:
            assert_torn_and_repairable(work, boundary, survivors)


def assert_zero_tail(directory: Path, records_end: int, survivors: int) -> None:
    """NULs from `records_end` to the end of the last segment, `survivors` records: a
    clean journal; repair changes nothing; the next append writes over the zeros."""
    last = segments(directory)[-1]
    before = fingerprint(directory)
    report = journal.verify(directory)
    assert report.clean and report.last_seq == survivors, report
    assert [r.seq for r in read_all(directory)] == list(range(1, survivors + 1))
    assert not journal.repair(directory).repaired
    assert fingerprint(directory) == before
    with journal.Journal.open(directory) as j:
        record = j.append("after", {})
    assert record.seq == survivors + 1
    content = last.read_bytes()
    assert content[records_end:].startswith(b'{"v":1,"seq":%d,' % (survivors + 1))
    assert journal.verify(directory).clean


@pytest.mark.parametrize("nuls", [1, 18, 4096])
def test_nul_tail_is_the_zero_tail_not_damage(work: Path, nuls: int) -> None:
    last = segments(work)[-1]
    end = last.stat().st_size
    append_bytes(last, b"\0" * nuls)
    assert_zero_tail(work, end, TOTAL)


def test_last_record_zeroed_in_place_reads_as_zero_tail(work: Path) -> None:
    """What ext4 can leave after a power cut: the size grew, the data never landed (so
    the record was never committed: its fdatasync had not returned)."""
    last = segments(work)[-1]
    starts = line_starts(last.read_bytes())
    overwrite(last, starts[-2], b"\0" * (starts[-1] - starts[-2]))
    assert_zero_tail(work, starts[-2], TOTAL - 1)


@pytest.mark.parametrize("written", [1, 30, -1])
def test_torn_write_over_the_zero_tail_is_torn(work: Path, written: int) -> None:
    """A crash in the middle of a write over the preallocated zeros: part of the line
    landed, zeros follow.  Only the landed bytes are torn (and kept)."""
    last = segments(work)[-1]
    end = last.stat().st_size
    content = last.read_bytes()
    part = content[line_starts(content)[-2] :][:written]
    append_bytes(last, part + b"\0" * 5000)
    report = journal.verify(work)
    assert report.torn_tail is not None and report.last_seq == TOTAL
    assert (report.torn_tail.offset, report.torn_tail.tail_bytes) == (end, len(part))
    repaired = journal.repair(work)
    assert repaired.bytes_cut == len(part) and repaired.broken_copy is not None
    assert Path(repaired.broken_copy).read_bytes() == part
    assert last.stat().st_size == end
    with journal.Journal.open(work) as j:
        assert j.append("after", {}).seq == TOTAL + 1
    assert journal.verify(work).clean


@pytest.mark.parametrize("seed", range(12))
def test_random_garbage_tail_is_torn(work: Path, seed: int) -> None:
    """Garbage with no newline after it (a prefix of a write), or after a whole line
    whose NULs are a sector that never landed: what a torn write can leave."""
    rng = random.Random(seed)
    garbage = rng.randbytes(rng.randint(1, 300)).replace(b"\n", b"n")
    last = segments(work)[-1]
    end = last.stat().st_size
    if seed % 3 == 0:  # a whole "line" too: NULs up to a sector boundary, then bytes
        whole = b"\0" * (-end % 512 or 512) + garbage.replace(b"\0", b"z") + b"\n"
        garbage = whole + garbage
    append_bytes(last, garbage)
    assert_torn_and_repairable(work, end, TOTAL)


@pytest.mark.parametrize("seed", range(6))
def test_a_garbage_tail_with_a_complete_line_is_corruption(work: Path, seed: int) -> None:
    """A complete line (newline-terminated) with no NUL that does not check, after the
    last record: no tear makes that (its bytes all landed, and the writer wrote only
    records), so it is corruption, never cut."""
    rng = random.Random(seed)
    garbage = rng.randbytes(rng.randint(0, 300)).replace(b"\n", b"").replace(b"\0", b"")
    last = segments(work)[-1]
    append_bytes(last, garbage + b"\n" + rng.randbytes(seed * 10))
    error = assert_corrupt_and_untouched(work, last)
    assert error.seq == TOTAL + 1


def test_partial_then_garbage_after_a_crash_and_repeated_repairs(work: Path) -> None:
    """Two crashes in a row, each repaired: two .broken copies, nothing else lost."""
    last = segments(work)[-1]
    end = last.stat().st_size
    append_bytes(last, b'{"v":1,"seq":')
    assert_torn_and_repairable(work, end, TOTAL)
    last = segments(work)[-1]
    end = len(last.read_bytes().rstrip(b"\0"))
    truncate(last, end)  # (the zero tail of the append after the repair)
    append_bytes(last, b"\0\0garbage")
    assert_torn_and_repairable(work, end, TOTAL + 1)
    assert len(list(work.glob("*.broken*"))) == 2


def test_append_cuts_a_torn_tail_first(work: Path) -> None:
    last = segments(work)[-1]
    end = last.stat().st_size
    append_bytes(last, b'{"v":1,"seq":999,"torn')
    with journal.Journal.open(work) as j:
        record = j.append("after", {"x": 1})
    assert record.seq == TOTAL + 1
    assert journal.verify(work).clean
    assert [p.read_bytes() for p in work.glob("*.broken*")] == [b'{"v":1,"seq":999,"torn']
    assert read_all(work)[-1].data == {"x": 1}
    assert last.stat().st_size > end


# --------------------------------------------------------------------------- corruption


@pytest.mark.parametrize(
    ("index", "stride"),
    [
        # Every byte of the first sealed segment: a minute of CPU, so in the explorer
        # suites (tox -e soak); the default run flips every 5th byte of each.
        pytest.param(0, 1, marks=pytest.mark.crash, id="0-every-byte"),
        pytest.param(0, 5, id="0"),
        pytest.param(1, 5, id="1"),
        pytest.param(2, 5, id="2"),
    ],
)
def test_single_bit_flips_in_sealed_segments_are_corruption(
    work: Path, tmp_path: Path, index: int, stride: int
) -> None:
    """A bit flipped at every ``stride``-th byte of a sealed segment (the bit moves with
    the offset: a stride of 5 still flips each of the 8 in turn)."""
    sealed = segments(work)[:-1]
    assert len(sealed) >= 3
    segment = sealed[index]
    content = segment.read_bytes()
    case = tmp_path / "case"
    shutil.copytree(work, case)
    target = case / segment.name
    for offset in range(0, len(content), stride):
        bit = offset % 8
        flip_bit(target, offset, bit)
        error = assert_corrupt_and_untouched(case, target)
        starts = line_starts(content)
        line_start = max(s for s in starts if s <= offset)
        assert error.offset is not None and error.offset <= line_start, (offset, error)
        flip_bit(target, offset, bit)  # undo
    assert target.read_bytes() == content


@pytest.mark.parametrize("which", ["first", "middle", "second_to_last"])
def test_bad_record_followed_by_valid_ones_in_the_last_segment_is_corruption(
    work: Path, tmp_path: Path, which: str
) -> None:
    last = segments(work)[-1]
    content = last.read_bytes()
    starts = line_starts(content)
    lines = len(starts) - 1
    assert lines >= 3
    line = {"first": 0, "middle": lines // 2, "second_to_last": lines - 2}[which]
    first_seq = int(last.name.split(".")[0])
    for offset in range(starts[line], starts[line + 1]):
        flip_bit(last, offset, (offset * 3) % 8)
        error = assert_corrupt_and_untouched(work, last)
        assert error.offset == starts[line] and error.seq == first_seq + line, (offset, error)
        flip_bit(last, offset, (offset * 3) % 8)
    assert last.read_bytes() == content


@pytest.mark.parametrize("zero_tail", [0, 4096], ids=["at-the-end", "before-a-zero-tail"])
def test_a_bit_flip_anywhere_in_the_very_last_record_is_corruption(
    work: Path, zero_tail: int
) -> None:
    """A committed last record with one bit flipped, at every byte of its line (its
    newline too): corruption, never a torn tail cut at the next append (it was: the
    record vanished and its seq was reused).  A tear cannot make such a line: it leaves
    a prefix of the write (no newline at its end) or NULs where sectors did not land."""
    last = segments(work)[-1]
    append_bytes(last, b"\0" * zero_tail)  # (as the writer leaves it: preallocated zeros)
    content = last.read_bytes()
    starts = line_starts(content.rstrip(b"\0"))
    for offset in range(starts[-2], starts[-1]):
        bit = (offset * 5) % 8
        flip_bit(last, offset, bit)
        error = assert_corrupt_and_untouched(work, last)
        assert (error.offset, error.seq) == (starts[-2], TOTAL), (offset, bit, error)
        flip_bit(last, offset, bit)  # undo
    assert last.read_bytes() == content


def test_a_handle_catching_up_refuses_a_flipped_last_record_rather_than_cut_it(
    work: Path,
) -> None:
    """A handle opened before another committed a record finds that record damaged
    when it catches up, before its own append: it refuses (CorruptionError, nothing
    written, nothing cut) and stays usable once the damage is gone."""
    with journal.Journal.open(work) as behind, journal.Journal.open(work) as ahead:
        committed = ahead.append("SETTLED", {"state": "SUCCEEDED"})
        last = segments(work)[-1]
        content = last.read_bytes()
        starts = line_starts(content.rstrip(b"\0"))
        flip_bit(last, starts[-2] + 30, 3)
        before = fingerprint(work)
        with pytest.raises(journal.CorruptionError) as caught:
            behind.append("next", {})
        assert (caught.value.offset, caught.value.seq) == (starts[-2], committed.seq)
        assert fingerprint(work) == before, "nothing cut, nothing written"
        flip_bit(last, starts[-2] + 30, 3)  # undo
        assert behind.append("next", {}).seq == committed.seq + 1
    assert [r.type for r in read_all(work)[-2:]] == ["SETTLED", "next"]


def test_truncated_sealed_segment_is_corruption(work: Path) -> None:
    sealed = segments(work)[1]
    starts = line_starts(sealed.read_bytes())
    truncate(sealed, starts[-2])  # a whole record gone: a seq gap at the next segment
    assert_corrupt_and_untouched(work, segments(work)[2])


def test_sealed_segment_cut_mid_line_is_corruption(work: Path) -> None:
    sealed = segments(work)[1]
    truncate(sealed, sealed.stat().st_size - 7)
    assert_corrupt_and_untouched(work, sealed)


def test_missing_middle_segment_is_corruption(work: Path) -> None:
    middle = segments(work)[1]
    middle.unlink()
    assert_corrupt_and_untouched(work, segments(work)[1])


def test_swapped_lines_are_corruption(work: Path) -> None:
    """Two valid lines in the wrong order: each checks, but the seq is wrong."""
    sealed = segments(work)[0]
    content = sealed.read_bytes()
    starts = line_starts(content)
    first, second = content[starts[0] : starts[1]], content[starts[1] : starts[2]]
    sealed.write_bytes(second + first + content[starts[2] :])
    error = assert_corrupt_and_untouched(work, sealed)
    assert (error.offset, error.seq) == (0, 1)
