"""Hypothesis properties of the record codec (journal._codec): round-trips and refusals."""

from __future__ import annotations

import math
import time
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from journal import _codec
from journal._errors import FormatVersionError, InvalidRecordError, RecordTooLargeError

# What JSON the journal writes and reads: in both modes of journal._json.
pytestmark = pytest.mark.usefixtures("json_mode")

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what the codec promises to carry exactly

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(INT_MIN, INT_MAX)
    | st.sampled_from([INT_MIN, INT_MAX, 2**63, 2**53 + 1, -(2**53) - 1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=25,
)
payloads = st.dictionaries(st.text(max_size=12), json_values, max_size=6)
types = st.text(min_size=1, max_size=20)
seqs = st.integers(1, 2**63 - 1)
epochs = st.integers(0, 2**63 - 1)
timestamps = st.floats(allow_nan=False, allow_infinity=False)


def same_json(a: Any, b: Any) -> bool:
    """Equality that tells floats from ints and -0.0 from 0.0 (JSON keeps both apart)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@SETTINGS
@given(seq=seqs, epoch=epochs, ts=timestamps, rtype=types, data=payloads)
def test_encode_then_decode_gives_the_record_back(
    seq: int, epoch: int, ts: float, rtype: str, data: dict[str, Any]
) -> None:
    line = _codec.encode_record(seq, epoch, ts, rtype, data)
    assert line.endswith(b"\n") and line.count(b"\n") == 1, "one record = one line"
    assert _codec.line_checks(line[:-1])
    record = _codec.decode_line(line, expected_seq=seq)
    assert (record.seq, record.epoch, record.type) == (seq, epoch, rtype)
    assert same_json(record.ts, ts)
    assert same_json(record.data, data)
    # Encoding is deterministic: the same record gives the same bytes.
    assert _codec.encode_record(seq, epoch, ts, rtype, data) == line


@SETTINGS
@given(rtype=types, data=payloads)
def test_prepare_returns_the_decoded_copy_readers_will_see(
    rtype: str, data: dict[str, Any]
) -> None:
    prepared = _codec.prepare(rtype, data, 0, 2**40, ts=1.5)
    line = _codec.encode_line(7, prepared)
    assert same_json(_codec.decode_line(line, 7).data, prepared.data)


def _with_nan(bad: float, where: int) -> Any:
    """A value with `bad` somewhere inside it."""
    return {"a": [1, {"b": bad}]} if where == 0 else {"x": bad} if where == 1 else {"l": [bad]}


@SETTINGS
@given(
    data=payloads,
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    where=st.integers(0, 2),
)
def test_nan_and_infinity_are_refused_anywhere(
    data: dict[str, Any], bad: float, where: int
) -> None:
    poisoned = {**data, "poison": _with_nan(bad, where)}
    with pytest.raises(InvalidRecordError):
        _codec.prepare("t", poisoned, 0, 2**40)
    with pytest.raises(InvalidRecordError):
        _codec.prepare("t", {"ok": 1}, 0, 2**40, ts=bad)


@SETTINGS
@given(big=st.integers(INT_MAX + 1, 2**80) | st.integers(-(2**80), INT_MIN - 1))
def test_integers_out_of_range_are_refused(big: int) -> None:
    with pytest.raises(InvalidRecordError):
        _codec.prepare("t", {"n": [big]}, 0, 2**40)


@pytest.mark.parametrize(
    "value", [b"bytes", {1: "int key"}, {1.5}, object(), complex(1, 2), (i for i in [])]
)
def test_values_json_cannot_hold_are_refused(value: Any) -> None:
    with pytest.raises(InvalidRecordError):
        _codec.prepare("t", {"v": value}, 0, 2**40)


@SETTINGS
@given(data=payloads, limit=st.integers(0, 600))
def test_size_limit_is_checked_before_encoding_and_holds_for_any_seq(
    data: dict[str, Any], limit: int
) -> None:
    try:
        prepared = _codec.prepare("t", data, 2**63 - 1, limit, ts=-1.2345678901234567e300)
    except RecordTooLargeError:
        return
    # Whatever seq it gets at commit time, the line fits the limit it passed.
    assert len(_codec.encode_line(2**63 - 1, prepared)) <= limit


@SETTINGS
@given(seq=seqs, data=payloads, position=st.integers(0, 10**6), bit=st.integers(0, 7))
def test_any_single_bit_flip_is_detected(
    seq: int, data: dict[str, Any], position: int, bit: int
) -> None:
    line = _codec.encode_record(seq, 0, 1.0, "t", data)
    at = position % (len(line) - 1)  # the newline itself is the reader's business
    damaged = bytearray(line)
    damaged[at] ^= 1 << bit
    with pytest.raises(_codec.LineProblem) as info:
        _codec.decode_line(bytes(damaged), expected_seq=seq)
    assert not info.value.checks, "a flipped bit is damage, not a well-formed wrong record"


@SETTINGS
@given(seq=seqs, data=payloads, data_cut=st.data())
def test_every_strict_prefix_of_a_line_is_refused(
    seq: int, data: dict[str, Any], data_cut: st.DataObject
) -> None:
    line = _codec.encode_record(seq, 0, 1.0, "t", data)
    # line[:-1] (just the newline missing) checks: the reader insists on the newline.
    cut = data_cut.draw(st.integers(0, len(line) - 2))
    with pytest.raises(_codec.LineProblem):
        _codec.decode_line(line[:cut], expected_seq=seq)


@SETTINGS
@given(seq=st.integers(1, 2**62), other=st.integers(1, 2**62), data=payloads)
def test_an_unexpected_seq_is_a_checked_but_invalid_line(
    seq: int, other: int, data: dict[str, Any]
) -> None:
    assume(seq != other)
    line = _codec.encode_record(seq, 0, 1.0, "t", data)
    with pytest.raises(_codec.LineProblem) as info:
        _codec.decode_line(line, expected_seq=other)
    assert info.value.checks


@pytest.mark.parametrize("version", [2, 99])
def test_a_newer_format_version_is_refused_by_name(version: int) -> None:
    body = b'{"v":%d,"seq":1,"epoch":0,"ts":1.0,"type":"t","data":{}' % version
    line = b'%s,"crc":"%08x"}\n' % (body, zlib.crc32(body))
    with pytest.raises(FormatVersionError):
        _codec.decode_line(line, expected_seq=1)


def test_nul_filled_line_is_damage() -> None:
    with pytest.raises(_codec.LineProblem) as info:
        _codec.decode_line(b"\0" * 80 + b"\n")
    assert not info.value.checks


# -- the batch path: prepare_batch and encode_lines are the per-record path in bulk


# Items as callers pass them, now and then one that prepare refuses (a NaN, a value JSON
# cannot hold, a non-dict, an empty or non-str type) or a str subclass it accepts.
class _Str(str):
    pass


odd_types = st.sampled_from(["", 7, None, _Str("T"), "new-type-\u2713"])
odd_data = st.sampled_from([{"x": float("nan")}, {"x": {1, 2}}, [1], {"t": (1, 2)}, {"n": None}])
known_types = st.sampled_from(["T", "SETTLED"])  # (warmed below: the bulk path's case)
any_data = payloads | odd_data
batch_items = st.lists(st.tuples(known_types, any_data), max_size=8) | st.lists(
    st.tuples(known_types | types | odd_types, any_data), max_size=8
)


def outcome(fn: Any) -> Any:
    """What a call gives: its value, or the type and message of what it raised."""
    try:
        return fn()
    except Exception as exc:
        return (type(exc), str(exc))


@settings(SETTINGS, max_examples=300)
@given(
    items=batch_items,
    epoch=epochs | st.sampled_from([-1, True, 2**63]),
    seq=seqs,
    ts=timestamps | st.sampled_from([float("nan"), 7]),
)
def test_prepare_batch_is_prepare_per_item(
    items: list[tuple[Any, Any]], epoch: Any, seq: int, ts: Any
) -> None:
    limit = 200  # small enough that some records are too large
    for known in ("T", "SETTLED"):
        _codec.prepare(known, {}, 0, limit)  # (their JSON is kept: the bulk path's case)
    got = outcome(lambda: _codec.prepare_batch(iter(items), epoch, limit, ts))
    want = outcome(lambda: [_codec.prepare(t, d, epoch, limit, ts) for t, d in items])
    if isinstance(want, tuple):  # refused: the same error, for the same first bad item
        assert got == want
        return
    assert isinstance(got, list)
    assert [(p.epoch, p.ts, p.type, p.inner) for p in got] == [
        (p.epoch, p.ts, p.type, p.inner) for p in want
    ]
    assert all(same_json(mine.data, theirs.data) for mine, theirs in zip(got, want, strict=True))
    lines = _codec.encode_lines(seq, [p.inner for p in got]) if got else b""
    assert lines == b"".join(_codec.encode_line(seq + i, p) for i, p in enumerate(got))
    decoded = [_codec.decode_line(line) for line in lines.splitlines()]
    assert [r.seq for r in decoded] == list(range(seq, seq + len(got)))


def test_a_batch_shares_one_timestamp_from_the_clock() -> None:
    before = time.time()
    prepared = _codec.prepare_batch([("T", {"i": i}) for i in range(5)], 0, 1 << 20)
    assert len({p.ts for p in prepared}) == 1 and before <= prepared[0].ts <= time.time()
