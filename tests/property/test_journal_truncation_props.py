"""Every truncation of a real journal is a valid prefix or a repairable torn tail.

A crash can leave the last segment cut at any byte, or (a torn write over its
preallocated zero tail) hold NUL bytes from any byte on. Whatever the cut, the library
must read the records whose whole line precedes it, call the rest a torn tail (never
corruption) unless it is only zeros, and repair must cut exactly that tail, keep it in a
`.broken` copy, and never drop a record whose line was complete.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import journal

# What JSON the journal writes and reads: in both modes of journal._json.
pytestmark = pytest.mark.usefixtures("json_mode")

payloads = st.dictionaries(
    st.text(max_size=6),
    st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=40)
    | st.floats(allow_nan=False, allow_infinity=False),
    max_size=3,
)


def scratch_parent() -> str | None:
    """tmpfs when there is one: these properties are about bytes and classification,
    not durability (the power-cut tests cover fsync), and thousands of fsyncs on a
    shared disk would make the default run slow."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


@contextmanager
def built_journal(records: list[dict[str, Any]], segment_bytes_max: int) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="journal-trunc-", dir=scratch_parent()) as tmp:
        directory = Path(tmp) / "j"
        j = journal.Journal.open(directory, segment_bytes_max=segment_bytes_max)
        try:
            for data in records:
                j.append("t", data)
        finally:
            j.close()
        yield directory


def line_ends(content: bytes) -> list[int]:
    """Byte offsets just after each complete line (0 included: the empty prefix)."""
    ends = [0]
    for index, byte in enumerate(content):
        if byte == 0x0A:
            ends.append(index + 1)
    return ends


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def check_cut(
    directory: Path, last: Path, full: bytes, cut: int, before: int, *, zero_fill: bool = False
) -> None:
    """Cut `last` at `cut` (with `zero_fill`: keep its size, NUL bytes from `cut` on, as a
    torn write over the preallocated zero tail leaves it), then verify, repair, read and
    append; `before` = number of records in the earlier (sealed) segments."""
    # Undo the previous cut's repair and its "after" append (which may have rotated).
    for leftover in directory.glob("*.broken*"):
        leftover.unlink()
    for later in segments(directory):
        if later.name > last.name:
            later.unlink()
    damaged = full[:cut] + (b"\x00" * (len(full) - cut) if zero_fill else b"")
    last.write_bytes(damaged)
    ends = line_ends(full)
    boundary = max(e for e in ends if e <= cut)
    survivors = before + ends.index(boundary)
    # Past the last record there are only zeros (the tail the writer preallocated): a
    # cut there leaves every record and no torn bytes.
    torn = boundary < cut <= len(full.rstrip(b"\x00"))

    report = journal.verify(directory)
    assert report.corruption is None, (cut, report)
    assert report.last_seq == survivors, (cut, report)
    if not torn:
        assert report.clean and report.torn_tail is None, (cut, report)
    else:
        assert report.torn_tail is not None and not report.clean, (cut, report)
        assert (report.torn_tail.offset, report.torn_tail.tail_bytes) == (boundary, cut - boundary)

    repaired = journal.repair(directory)
    assert repaired.last_seq == survivors
    if torn:
        assert repaired.bytes_cut == cut - boundary
        assert repaired.broken_copy is not None
        assert Path(repaired.broken_copy).read_bytes() == full[boundary:cut]
        assert last.read_bytes() == full[:boundary]
    else:
        assert not repaired.repaired and last.read_bytes() == damaged
    assert journal.verify(directory).clean

    j = journal.Journal.open(directory)
    try:
        seqs = [r.seq for r in j.read()]
        assert seqs == list(range(1, survivors + 1)), "a complete line was dropped"
        assert j.append("after", {}).seq == survivors + 1
    finally:
        j.close()


def records_before_last(directory: Path) -> int:
    """Records in the sealed segments: the last segment is named after its first seq."""
    return int(segments(directory)[-1].name.split(".")[0]) - 1


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(payloads, min_size=1, max_size=15),
    segment_bytes_max=st.sampled_from([300, 700, 1 << 20]),
    picks=st.lists(st.floats(0, 1), min_size=1, max_size=8),
)
def test_truncations_near_the_end_are_prefixes_or_torn_tails(
    records: list[dict[str, Any]], segment_bytes_max: int, picks: list[float]
) -> None:
    with built_journal(records, segment_bytes_max) as directory:
        last = segments(directory)[-1]
        full = last.read_bytes()
        before = records_before_last(directory)
        ends = line_ends(full)
        # Cuts inside the last three records, plus their boundaries, plus a few picks,
        # plus the zero tail's first byte, one inside it and its end.
        zone_start = ends[max(0, len(ends) - 4)]
        records_end = len(full.rstrip(b"\x00"))
        cuts = {zone_start, records_end - 1, records_end, records_end + 1, len(full)}
        cuts |= {zone_start + int(p * (records_end - zone_start)) for p in picks}
        for cut in sorted(c for c in cuts if 0 <= c <= len(full)):
            check_cut(directory, last, full, cut, before)
            check_cut(directory, last, full, cut, before, zero_fill=True)


@pytest.mark.soak  # (27 s: every byte offset of every example; tox -e soak)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(payloads, min_size=1, max_size=3))
def test_small_journal_every_byte_offset(records: list[dict[str, Any]]) -> None:
    with built_journal(records, 1 << 20) as directory:
        last = segments(directory)[-1]
        full = last.read_bytes()
        records_end = len(full.rstrip(b"\x00"))
        for cut in range(records_end + 2):
            check_cut(directory, last, full, cut, 0)
            check_cut(directory, last, full, cut, 0, zero_fill=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(payloads, min_size=1, max_size=6),
    at=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
)
def test_one_flipped_bit_in_the_last_record_is_corruption_never_a_torn_tail(
    records: list[dict[str, Any]], at: float, bit: int
) -> None:
    """The converse of the truncations above: a committed last record (zero tail after
    it, as the writer leaves it) with any one bit flipped is no tear; it is reported as
    corruption at its line, and neither repair nor the next append cuts it."""
    with built_journal(records, 1 << 20) as directory:
        last = segments(directory)[-1]
        full = last.read_bytes()
        ends = line_ends(full.rstrip(b"\x00"))
        start = ends[-2]
        offset = start + int(at * (ends[-1] - start))
        damaged = bytearray(full)
        damaged[offset] ^= 1 << bit
        last.write_bytes(bytes(damaged))
        report = journal.verify(directory)
        assert report.status == "corrupt" and report.corruption is not None, (offset, report)
        assert (report.corruption.offset, report.corruption.seq) == (start, len(records))
        try:
            journal.repair(directory)
        except journal.CorruptionError:
            pass
        else:
            raise AssertionError("repair cut a committed record")
        try:
            journal.Journal.open(directory).close()
        except journal.CorruptionError:
            pass
        else:
            raise AssertionError("opened a journal whose last record is corrupt")
        assert last.read_bytes() == bytes(damaged)
        assert not list(directory.glob("*.broken*"))
