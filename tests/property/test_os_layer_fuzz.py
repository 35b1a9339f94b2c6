"""Any bytes given to the lease reader or the /proc stat parser yield a value or a
coded error: never a crash of another kind, never a hang."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.lease import Lease, LeaseUnreadableError, parse_lease
from ferry.process import parse_stat

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
