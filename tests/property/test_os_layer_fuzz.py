"""Any bytes given to the lease reader, the /proc stat parser or the heartbeat's beat
record parser yield a value or a coded error (the record: a beat or None): never a
crash of another kind, never a hang."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.proc.alivelock import BEAT_BYTES, Beat, beat_record, parse_beat
from ferry.proc.process import parse_stat
from ferry.storage.local.lease import Lease, LeaseUnreadableError, parse_lease

GOOD: dict[str, Any] = {
    "v": 1,
    "epoch": 3,
    "holder": {"pid": 10, "start_time": 5, "boot_id": "b", "host": "h"},
    "acquired_at": 1.0,
    "renewed_at": 2.0,
    "expires_at": 3.0,
    "expires_boot_s": 4.0,
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


def read_or_coded_error(raw: bytes) -> Lease | None:
    try:
        return parse_lease(raw)
    except LeaseUnreadableError as e:
        assert e.code in ("lease.unreadable", "lease.version")
        assert e.exit_code == 125
        return None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes(raw: bytes) -> None:
    read_or_coded_error(raw)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(GOOD)), json_values)
def test_one_field_replaced_by_anything(key: str, value: object) -> None:
    data = {**GOOD, key: value}
    try:
        raw = json.dumps(data, allow_nan=True).encode()
    except (TypeError, ValueError):
        return
    lease = read_or_coded_error(raw)
    if lease is not None:
        assert Lease.from_json(lease.to_json()) == lease


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(json.dumps(GOOD))))
def test_every_truncation(cut: int) -> None:
    raw = json.dumps(GOOD).encode()
    lease = read_or_coded_error(raw[:cut])
    assert (lease is not None) == (cut == len(raw))


def test_the_good_file_round_trips() -> None:
    lease = parse_lease(json.dumps(GOOD).encode())
    assert lease.to_json() == GOOD


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_stat_parser_any_bytes(raw: bytes) -> None:
    with contextlib.suppress(ValueError):
        parse_stat(raw)


@pytest.mark.parametrize("nan", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_times_are_unreadable(nan: str) -> None:
    raw = json.dumps(GOOD).replace('"expires_boot_s": 4.0', f'"expires_boot_s": {nan}').encode()
    assert read_or_coded_error(raw) is None


BEAT = Beat("3f1665a7-b332-4ff0-b2fc-a5e6c3e2ae56", 4026531834, 123_456_789_012)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2 * BEAT_BYTES))
def test_beat_parser_any_bytes(raw: bytes) -> None:
    beat = parse_beat(raw)
    assert beat is None or beat_record(beat) == raw[:BEAT_BYTES]


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.characters(codec="ascii"), max_size=60),
    st.integers(min_value=0, max_value=2**64),
    st.integers(min_value=0, max_value=2**63),
)
def test_beat_records_round_trip_or_are_not_written(boot: str, ns: int, clock: int) -> None:
    record = beat_record(Beat(boot, ns, clock))
    if record is not None:
        assert len(record) == BEAT_BYTES and parse_beat(record) == Beat(boot, ns, clock)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=BEAT_BYTES - 1), st.integers(1, 255))
def test_every_one_byte_change_of_a_beat_record_is_refused(at: int, flip: int) -> None:
    """CRC-32 catches every error burst up to 32 bits: a torn or damaged record is never
    read as a beat (recovery falls back to the file's mtime)."""
    raw = bytearray(beat_record(BEAT) or b"")
    raw[at] ^= flip
    assert parse_beat(bytes(raw)) is None
