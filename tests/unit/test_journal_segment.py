"""Segment names, listing, ordering, gap checks and .broken names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal import CorruptionError
from journal._segment import (
    Segment,
    broken_copy_path,
    check_next,
    list_segments,
    parse_segment_name,
    segment_name,
    segments_in,
)
from journal._snapshot import snapshots_in


def test_name_is_twenty_digits_of_the_first_seq() -> None:
    assert segment_name(1) == "00000000000000000001.jsonl"
    assert segment_name(12345) == "00000000000000012345.jsonl"
    assert segment_name(10**19) == "10000000000000000000.jsonl"


def test_names_sort_in_seq_order() -> None:
    seqs = [1, 9, 10, 99, 100, 123456789]
    assert sorted(segment_name(s) for s in seqs) == [segment_name(s) for s in seqs]


@pytest.mark.parametrize("seq", [1, 2, 10**6, 10**19])
def test_parse_round_trips(seq: int) -> None:
    assert parse_segment_name(segment_name(seq)) == seq


@pytest.mark.parametrize(
    "name",
    [
        "00000000000000000001.jsonl.broken",
        "00000000000000000001.jsonl.broken.2",
        "0000000000000000001.jsonl",  # 19 digits
        "000000000000000000001.jsonl",  # 21 digits
        "00000000000000000000.jsonl",  # seq 0 does not exist
        "00000000000000000001.json",
        ".00000000000000000001.jsonl.tmp",
        "snapshot-00000000000000000001.snap",
        ".lock",
        "x0000000000000000001.jsonl",
        "00000000000000000001.jsonl\n",  # (a regular expression's "$" let this one in)
        "0000000000000000000\u0661.jsonl",  # a digit, but not an ASCII one
        "+0000000000000000001.jsonl",
    ],
)
def test_other_names_are_not_segments(name: str) -> None:
    assert parse_segment_name(name) is None


def test_zero_or_negative_first_seq_is_refused() -> None:
    with pytest.raises(ValueError):
        segment_name(0)


def test_listing_orders_and_ignores_other_files(tmp_path: Path) -> None:
    for name in [segment_name(30), segment_name(1), segment_name(12), ".lock", "notes.txt"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / (segment_name(12) + ".broken")).write_bytes(b"junk")
    (tmp_path / "snapshot-00000000000000000011.snap").write_bytes(b"")
    assert list_segments(tmp_path) == [
        Segment(1, str(tmp_path / segment_name(1))),
        Segment(12, str(tmp_path / segment_name(12))),
        Segment(30, str(tmp_path / segment_name(30))),
    ]


def test_segments_in_works_on_names() -> None:
    names = [segment_name(5), "x", segment_name(2)]
    assert [s.first_seq for s in segments_in(names, Path("/j"))] == [2, 5]


def test_check_next_accepts_the_exact_successor() -> None:
    check_next(Segment(1, Path("/j/a")), 11, Segment(11, Path("/j/b")))


@pytest.mark.parametrize(("following", "kind"), [(12, "gap"), (10, "overlap")])
def test_check_next_refuses_gaps_and_overlaps(following: int, kind: str) -> None:
    with pytest.raises(CorruptionError, match=kind) as caught:
        check_next(Segment(1, "/j/a"), 11, Segment(following, "/j/b"))
    assert caught.value.seq == 11
    assert caught.value.segment == "/j/b"
    assert caught.value.offset == 0


def test_broken_copy_names_are_numbered_when_taken() -> None:
    seg = "/j/" + segment_name(7)
    assert broken_copy_path(seg, []) == "/j/00000000000000000007.jsonl.broken"
    taken = [segment_name(7) + ".broken", segment_name(7) + ".broken.1"]
    assert broken_copy_path(seg, taken) == "/j/00000000000000000007.jsonl.broken.2"


_NAMED = st.builds(
    lambda prefix, seq, suffix: f"{prefix}{seq:020d}{suffix}",
    st.sampled_from(["", "snapshot-", "x", "snapshot"]),
    st.integers(0, 10**20 - 1),
    st.sampled_from([".jsonl", ".snap", ".jsonl\n", ".snap\n", "", ".jsonl.broken"]),
)


@given(st.one_of(_NAMED, st.text(alphabet="0123456789snapshot-.jsonl\n\u0661x", max_size=40)))
def test_names_read_as_the_pattern_says(name: str) -> None:
    """Segment and snapshot names are read without regular expressions: the same
    answers as the patterns they replaced, made exact (ASCII digits, no final newline)."""
    segment = re.fullmatch(r"([0-9]{20})\.jsonl", name)
    want = int(segment[1]) if segment and int(segment[1]) >= 1 else None
    assert parse_segment_name(name) == want
    snapshot = re.fullmatch(r"snapshot-([0-9]{20})\.snap", name)
    found = snapshots_in([name], "/j")
    assert found == ([(int(snapshot[1]), "/j/" + name)] if snapshot else [])
