"""The record line codec: exact bytes, round trips, and every rejection."""

from __future__ import annotations

import dataclasses
import datetime
import zlib
from typing import Any

import orjson
import pytest

from journal import FormatVersionError, InvalidRecordError, Record, RecordTooLargeError
from journal._codec import (
    CRC_SUFFIX_BYTES,
    LineProblem,
    Prepared,
    _pair,
    decode_line,
    decode_marked,
    encode_batch,
    encode_line,
    encode_record,
    line_checks,
    prepare,
    prepare_batch,
)

# What JSON the journal writes and reads: in both modes of journal._json.
pytestmark = pytest.mark.usefixtures("json_mode")

MiB = 1 << 20


def test_line_layout_is_exact() -> None:
    line = encode_record(7, 2, 1700000000.25, "SUBMITTED", {"task": "t1", "n": [1, 2]})
    body = b'{"v":1,"seq":7,"epoch":2,"ts":1700000000.25,"type":"SUBMITTED","data":{"task":"t1","n":[1,2]}'
    assert line == body + b',"crc":"%08x"}\n' % zlib.crc32(body)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line[-CRC_SUFFIX_BYTES:].startswith(b',"crc":"')


def test_line_is_plain_json_with_all_fields() -> None:
    line = encode_record(1, 0, 1.5, "T", {"a": None})
    assert orjson.loads(line) == {
        "v": 1,
        "seq": 1,
        "epoch": 0,
        "ts": 1.5,
        "type": "T",
        "data": {"a": None},
        "crc": f"{zlib.crc32(line[:-CRC_SUFFIX_BYTES]):08x}",
    }


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"s": "plain"},
        {"unicode": "h\u00e9llo \u2713 \U0001f680 \u4e2d\u6587", "nul": "a\x00b", "nl": "a\nb\r\n"},
        {"ints": [0, -1, 2**63 - 1, -(2**63)], "big": 2**64 - 1},
        {"floats": [0.1, -2.5e-300, 1e300, 0.0]},
        {"nested": {"a": {"b": [{"c": [True, False, None]}]}}},
        {"quote": 'he said "hi"\\', "crc": "looks like a crc field", "v": 99},
    ],
    ids=["empty", "str", "unicode", "ints", "floats", "nested", "tricky-keys"],
)
def test_round_trip(data: dict[str, Any]) -> None:
    line = encode_record(42, 3, 1700000001.125, "EVENT", data)
    assert decode_line(line, 42) == Record(42, 3, 1700000001.125, "EVENT", data)
    assert line_checks(line[:-1])


def test_tuples_and_str_subclasses_encode_as_plain_json() -> None:
    prepared = prepare("T", {"argv": ("a", "b")}, 0, MiB, ts=1.0)
    assert prepared.data == {"argv": ["a", "b"]}  # what a reader will see, not the input


def test_prepared_data_is_a_copy() -> None:
    data: dict[str, Any] = {"k": [1]}
    prepared = prepare("T", data, 0, MiB, ts=1.0)
    data["k"].append(2)
    assert prepared.data == {"k": [1]}


@pytest.mark.parametrize(
    "data",
    [
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": [1.0, float("-inf")]},
        {"x": {"y": (float("nan"),)}},
    ],
    ids=["nan", "inf", "-inf-in-list", "nan-in-nested-tuple"],
)
def test_nan_and_infinity_are_refused(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidRecordError, match="NaN/Infinity"):
        prepare("T", data, 0, MiB)


def test_null_in_text_is_not_mistaken_for_nan() -> None:
    assert prepare("T", {"s": "null", "n": None}, 0, MiB).data == {"s": "null", "n": None}


@dataclasses.dataclass
class _Point:
    x: int


@pytest.mark.parametrize(
    "data",
    [
        {1: "non-str key"},
        {"x": 2**64},
        {"x": b"bytes"},
        {"x": {1, 2}},
        {"x": object()},
        {"x": _Point(1)},
        {"x": datetime.datetime(2024, 1, 1)},
    ],
    ids=["int-key", "huge-int", "bytes", "set", "object", "dataclass", "datetime"],
)
def test_non_json_data_is_refused(data: dict[Any, Any]) -> None:
    with pytest.raises(InvalidRecordError):
        prepare("T", data, 0, MiB)


@pytest.mark.parametrize(
    ("rtype", "data", "epoch"),
    [
        ("", {}, 0),
        (None, {}, 0),
        ("T", [], 0),
        ("T", None, 0),
        ("T", {}, -1),
        ("T", {}, True),
        ("T", {}, 1.0),
    ],
    ids=[
        "empty-type",
        "none-type",
        "list-data",
        "none-data",
        "negative-epoch",
        "bool-epoch",
        "float-epoch",
    ],
)
def test_bad_envelope_is_refused(rtype: Any, data: Any, epoch: Any) -> None:
    with pytest.raises(InvalidRecordError):
        prepare(rtype, data, epoch, MiB)


def test_bad_ts_is_refused() -> None:
    with pytest.raises(InvalidRecordError):
        prepare("T", {}, 0, MiB, ts=float("nan"))


def _widest(prepared: Prepared) -> bytes:
    """The line of ``prepared`` at its widest: the widest seq, marked with the widest
    batch mark (the first of a batch of 10**19 records)."""
    line = encode_line(10**19, prepared)
    return line.replace(b',"epoch"', b',"more":%d,"epoch"' % (10**19), 1)


def test_size_limit_counts_the_whole_line_at_the_widest_seq_and_batch_mark() -> None:
    limit = 1000
    overhead = len(_widest(prepare("T", {"p": ""}, 0, 10**9, ts=1.5)))
    fits = {"p": "x" * (limit - overhead)}
    assert len(_widest(prepare("T", fits, 0, limit, ts=1.5))) == limit
    with pytest.raises(RecordTooLargeError):
        prepare("T", {"p": "x" * (limit - overhead + 1)}, 0, limit, ts=1.5)


class _LooksLikeT:
    """Hashes and compares like the str "T" (a cached type), but is no str."""

    def __hash__(self) -> int:
        return hash("T")

    def __eq__(self, other: object) -> bool:
        return other == "T"


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return (type(exc), str(exc))


_FIT = 1000 - len(_widest(prepare("T", {"p": ""}, 0, 10**9, ts=1.5)))


@pytest.mark.parametrize(
    ("items", "epoch", "ts"),
    [
        ([("T", {"p": "x" * _FIT}), ("T", {"p": ""})], 0, 1.5),
        ([("T", {"p": ""}), ("T", {"p": "x" * (_FIT + 1)})], 0, 1.5),
        ([("T", {"p": "x" * (_FIT + 1)}), ("T", {"x": float("nan")})], 0, 1.5),
        ([("T", {"x": float("nan")}), ("T", {"p": "x" * (_FIT + 1)})], 0, 1.5),
        ([("T", {"n": None}), ("T", {"x": [float("inf")]})], 0, 1.5),
        ([("T", {"n": None}), ("T", {"s": "null"})], 0, 1.5),
        ([("T", {}), ("T", {})], True, 1.5),
        ([("T", {}), ("T", {})], -1, 1.5),
        ([("T", {}), ("T", {})], 2**63, 1.5),
        ([("T", {}), (_LooksLikeT(), {})], 0, 1.5),
        ([("T", {}), ("never-seen-before", {})], 0, 1.5),
        ([("T", {}), ("", {})], 0, 1.5),
        ([("T", {}), ("\ud800", {})], 0, 1.5),
        ([("T", {}), ("T", {"t": (1, 2)})], 0, 1.5),
        ([("T", {}), ("T", [1])], 0, 1.5),
        ([("T", {}), ("T", {}, "extra")], 0, 1.5),
        ([("T", {}), ("T", {})], 0, float("nan")),
        ([("T", {}), ("T", {})], 0, 7),
    ],
    ids=[
        "at-the-limit",
        "over-the-limit",
        "too-large-before-nan",
        "nan-before-too-large",
        "infinity",
        "null-is-not-nan",
        "bool-epoch",
        "negative-epoch",
        "epoch-too-big",
        "type-that-only-looks-like-a-str",
        "a-new-type",
        "an-empty-type",
        "a-type-json-cannot-hold",
        "tuple-in-data",
        "data-not-a-dict",
        "not-a-pair",
        "nan-ts",
        "int-ts",
    ],
)
def test_prepare_batch_gives_what_prepare_per_item_gives(
    items: list[Any], epoch: Any, ts: Any
) -> None:
    prepare("T", {}, 0, MiB)  # (the type's JSON is kept: the bulk path's case)
    got = _outcome(lambda: prepare_batch(items, epoch, 1000, ts))
    # (An item that is not a pair: InvalidRecordError, as the item by item path says.)
    want = _outcome(lambda: [prepare(*_pair(item), epoch, 1000, ts) for item in items])
    if isinstance(want, tuple):
        assert got == want
    else:
        assert [tuple(p) for p in got] == [tuple(p) for p in want]


def test_default_limit_refuses_a_record_over_one_mib() -> None:
    with pytest.raises(RecordTooLargeError):
        prepare("T", {"p": "x" * MiB}, 0, MiB)


def test_line_checks_rejects_any_single_byte_change() -> None:
    line = encode_record(5, 1, 2.5, "T", {"k": "value"})[:-1]
    for index in range(len(line)):
        damaged = bytearray(line)
        damaged[index] ^= 0x01
        assert not line_checks(bytes(damaged)), index


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"\x00" * 40, "NUL bytes"),
        (b'{"v":1,"seq":1', "checksum"),
        (b"garbage", "checksum"),
        (b"", "empty line"),
    ],
)
def test_decode_explains_damaged_lines(line: bytes, reason: str) -> None:
    with pytest.raises(LineProblem, match=reason) as caught:
        decode_line(line, 1)
    assert not caught.value.checks


def _checked(body: bytes) -> bytes:
    return body + b',"crc":"%08x"}' % zlib.crc32(body)


def test_decode_refuses_unexpected_seq_as_a_checked_line() -> None:
    with pytest.raises(LineProblem, match="seq 5 where 6") as caught:
        decode_line(encode_record(5, 0, 1.0, "T", {}), 6)
    assert caught.value.checks


@pytest.mark.parametrize(
    "body",
    [
        b'{"v":1,"seq":1,"epoch":-1,"ts":1.0,"type":"T","data":{}',
        b'{"v":1,"seq":1,"epoch":0,"ts":"x","type":"T","data":{}',
        b'{"v":1,"seq":1,"epoch":0,"ts":1.0,"type":3,"data":{}',
        b'{"v":1,"seq":1,"epoch":0,"ts":1.0,"type":"T","data":[]',
        b'{"v":0,"seq":1,"epoch":0,"ts":1.0,"type":"T","data":{}',
        b'{"v":1,"seq":0,"epoch":0,"ts":1.0,"type":"T","data":{}',
    ],
    ids=["neg-epoch", "str-ts", "int-type", "list-data", "v0", "seq0"],
)
def test_decode_refuses_checksummed_lines_with_bad_fields(body: bytes) -> None:
    with pytest.raises(LineProblem) as caught:
        decode_line(_checked(body), 1)
    assert caught.value.checks


def test_decode_accepts_an_integer_ts() -> None:
    line = _checked(b'{"v":1,"seq":1,"epoch":0,"ts":17,"type":"T","data":{}')
    assert decode_line(line, 1) == Record(1, 0, 17.0, "T", {})


def test_newer_version_is_a_coded_error() -> None:
    line = _checked(b'{"v":2,"seq":1,"epoch":0,"ts":1.0,"type":"T","data":{}')
    with pytest.raises(FormatVersionError) as caught:
        decode_line(line, 1)
    assert caught.value.code == "journal.format_version"


def test_a_batch_is_marked_on_every_record_but_its_last() -> None:
    """The bytes of a batch, pinned (docs/journal-format.md, "Batches"): ``"more":K``
    right after ``seq``, inside the checksum; the last line as a single record's."""
    prepared = prepare_batch([("T", {"a": 1}), ("T", {"b": 2}), ("U", {})], 0, MiB, ts=1.5)
    lines = encode_batch(7, [p.inner for p in prepared])
    assert lines.splitlines(keepends=True) == [
        b'{"v":1,"seq":7,"more":2,"epoch":0,"ts":1.5,"type":"T","data":{"a":1},"crc":"875494d9"}\n',
        b'{"v":1,"seq":8,"more":1,"epoch":0,"ts":1.5,"type":"T","data":{"b":2},"crc":"4ee596ce"}\n',
        b'{"v":1,"seq":9,"epoch":0,"ts":1.5,"type":"U","data":{},"crc":"e032cb34"}\n',
    ]
    assert lines.splitlines(keepends=True)[-1] == encode_line(9, prepared[2])
    decoded = [decode_marked(line, 7 + i) for i, line in enumerate(lines.splitlines())]
    assert [more for _record, more in decoded] == [2, 1, 0]
    assert [record for record, _more in decoded] == [
        decode_line(line) for line in lines.splitlines()
    ]
    assert encode_batch(7, [prepared[0].inner]) == encode_line(7, prepared[0])
