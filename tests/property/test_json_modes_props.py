"""journal._json's two modes (the standard library's json until a process has much to
handle, then orjson) write text that both read back equal, and refuse the same values."""

from __future__ import annotations

import enum
import json
import math
import uuid
import zlib
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonmodes import using

from journal import _json
from journal._codec import LineProblem, decode_line, prepare
from journal._errors import InvalidRecordError

INT_MIN, INT_END = -(2**63), 2**64
scalars = (
    st.none() | st.booleans() | st.integers(INT_MIN, INT_END - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)  # fmt: skip
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
# What neither mode may write: each must be refused, with the same exception class.
refused = st.sampled_from(
    [{1: "int key"}, {"a": {True: 1}}, {"x": INT_END}, {"x": [INT_MIN - 1]}, {"x": b"b"},
     {"x": {1, 2}}, {"x": float("nan")}, {"x": [math.inf]}, {"x": "\ud800"}, object()]
)  # fmt: skip


@pytest.fixture
def stdlib() -> Iterator[None]:
    with using("stdlib"):
        yield


def _in_orjson_mode(fn: Any, *args: Any) -> Any:
    with using("orjson"):
        return fn(*args)


# (The fixture sets the mode once for all examples: nothing in a test changes it.)
FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@FIXTURE_OK
@given(doc=documents)
def test_what_one_mode_writes_the_other_reads_back_equal(stdlib: None, doc: Any) -> None:
    ours = _json.dumps(doc)
    theirs = _in_orjson_mode(_json.dumps, doc)
    assert _json.loads(theirs) == doc == _in_orjson_mode(_json.loads, ours)
    assert _json.loads(ours) == orjson.loads(theirs)
    if not any(isinstance(x, float) for x in _leaves(doc)):  # (1e+16 or 1e16)
        assert ours == theirs
        assert _json.dumps_sorted(doc) == _in_orjson_mode(_json.dumps_sorted, doc)


@FIXTURE_OK
@given(value=refused)
def test_both_modes_refuse_the_same_values(stdlib: None, value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        _json.dumps(value)
    if any(isinstance(x, float) and not math.isfinite(x) for x in _leaves(value)):
        return  # (orjson writes null: the journal's codec checks for NaN itself)
    with pytest.raises((TypeError, ValueError)):
        _in_orjson_mode(_json.dumps, value)


@pytest.mark.parametrize(
    "text", [b'{"a":NaN}', b'{"a":Infinity}', b'{"a":"\\ud800"}', b"\xff", b'{"a":', b"[1,]"]
)
def test_both_modes_refuse_the_same_text(stdlib: None, text: bytes) -> None:
    with pytest.raises(ValueError):
        _json.loads(text)
    with pytest.raises(ValueError):
        _in_orjson_mode(_json.loads, text)


def test_a_process_switches_to_orjson_after_much_work(stdlib: None) -> None:
    _json._items_left = _json.BULK_AFTER_ITEMS
    _json.expect(_json.BULK_AFTER_ITEMS - 1)
    assert _json._orjson is None
    _json.expect(1)
    assert _json._orjson is orjson
    _json._orjson, _json._items_left = None, 2**62
    _json.loads(b'"' + b"x" * _json.BULK_BYTES + b'"')  # (a large document: at once)
    assert _json._orjson is orjson


def _leaves(doc: Any) -> Iterator[Any]:
    if isinstance(doc, dict):
        for value in doc.values():
            yield from _leaves(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _leaves(value)
    else:
        yield doc


# ---- cases found by an adversarial review: where the modes used to differ ----------


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(*args))
    except Exception as error:
        return ("raises", type(error).__name__)


def _both(fn: Any, *args: Any) -> tuple[Any, Any]:
    return _outcome(fn, *args), _in_orjson_mode(_outcome, fn, *args)


def _nest(depth: int) -> Any:
    doc: Any = {}
    for _ in range(depth):
        doc = {"a": doc}
    return doc


class _Plain(enum.Enum):
    A = "a"


class _Named(enum.StrEnum):
    QUEUED = "QUEUED"


class _Huge(enum.Enum):
    BIG = 2**70
    KEYED = {1: "a"}  # noqa: RUF012


class _Float(float):
    pass


_Pair = namedtuple("_Pair", "x y")


@pytest.mark.parametrize(
    "value",
    [_nest(253), _nest(254), _nest(300), {_Named.QUEUED: 1}, {"x": _Plain.A},
     {"x": uuid.UUID(int=1)}, {"x": _Float(1.5)}, {"x": _Pair(1, 2)}, {"x": _Named.QUEUED},
     {"x": _Huge.BIG}, {"x": _Huge.KEYED}],
    ids=["depth253", "depth254", "depth300", "strenum-key", "plain-enum", "uuid",
         "float-subclass", "named-tuple", "strenum-value", "enum-of-huge-int",
         "enum-of-int-keys"],
)  # fmt: skip
def test_both_modes_accept_or_refuse_alike(stdlib: None, value: Any) -> None:
    ours, theirs = _both(_json.dumps, value)
    assert ours == theirs or (ours[0] == theirs[0] == "ok"), (ours, theirs)
    if ours[0] == "ok":
        assert _json.loads(ours[1]) == _json.loads(theirs[1])


def test_the_codec_refuses_deep_data_in_both_modes(stdlib: None) -> None:
    for depth in (300, 1200):
        with pytest.raises(InvalidRecordError):
            prepare("T", _nest(depth), 1, 2**30, 1.0)
        with pytest.raises(InvalidRecordError):
            _in_orjson_mode(prepare, "T", _nest(depth), 1, 2**30, 1.0)


def _checksummed(body: bytes) -> bytes:
    return body + b',"crc":"%08x"}' % zlib.crc32(body)


@pytest.mark.parametrize("field", [b'"ts":1e400', b'"ts":1.0,"x":' + b"[" * 1100 + b"]" * 1100])
def test_a_checksummed_line_that_is_not_a_record_is_a_line_problem_in_both_modes(
    stdlib: None, field: bytes
) -> None:
    line = _checksummed(b'{"v":1,"seq":1,"epoch":0,' + field + b',"type":"T","data":{}')
    with pytest.raises(LineProblem):
        decode_line(line, 1)
    with pytest.raises(LineProblem):
        _in_orjson_mode(decode_line, line, 1)


@pytest.mark.parametrize("text", [b"99999999999999999999999999", b"-9223372036854775809"])
def test_integers_beyond_64_bits_read_as_floats_in_both_modes(stdlib: None, text: bytes) -> None:
    ours, theirs = _both(_json.loads, text)
    assert ours == theirs and type(ours[1]) is float, (ours, theirs)


@pytest.mark.parametrize("text", [b"1" + b"0" * 400, b"-1" + b"0" * 400])
def test_an_integer_beyond_the_floats_is_refused_in_both_modes(stdlib: None, text: bytes) -> None:
    with pytest.raises(ValueError):
        _json.loads(text)
    with pytest.raises(ValueError):
        _in_orjson_mode(_json.loads, text)


# ---- the standard library's mode: the json package's C codec, without the package ----
# (journal._json makes the C encoder and scanner itself, so that run's start-up imports
# neither json nor re: test_import_budget.py keeps them off.)

_PACKAGE_ENCODERS = {
    sort_keys: json.JSONEncoder(
        ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":"),
        sort_keys=sort_keys, default=_json._default,
    ).encode
    for sort_keys in (False, True)
}  # fmt: skip
_PACKAGE_DECODE = json.JSONDecoder(
    parse_constant=_json._refuse_constant, parse_int=_json._int, parse_float=_json._float
).decode
blanks = st.text(" \t\n\r", max_size=3)


def _verdict(fn: Any, *args: Any) -> tuple[str, Any]:
    """The value, or the exception's class and message (a position in it)."""
    try:
        return ("ok", fn(*args))
    except Exception as error:
        return (type(error).__name__, str(error))


@FIXTURE_OK
@given(doc=documents | refused)
def test_the_stdlib_mode_writes_what_the_json_package_writes(stdlib: None, doc: Any) -> None:
    for sort_keys, dumps in ((False, _json.dumps), (True, _json.dumps_sorted)):
        theirs = _verdict(_PACKAGE_ENCODERS[sort_keys], doc)
        ours = _verdict(dumps, doc)
        if ours[0] == "ok":
            assert ours == ("ok", theirs[1].encode())
        else:  # (refused: where the package writes it, orjson would refuse it)
            assert ours[0] in ("TypeError", "ValueError", "UnicodeEncodeError")


@FIXTURE_OK
@given(before=blanks, doc=documents, after=blanks,
       tail=st.sampled_from(["", "x", "]", " 1", "{", ","]))  # fmt: skip
def test_the_stdlib_mode_reads_what_the_json_package_reads(
    stdlib: None, before: str, doc: Any, after: str, tail: str
) -> None:
    text = before + json.dumps(doc, ensure_ascii=False) + after + tail
    assert _verdict(_json.loads, text) == _verdict(_PACKAGE_DECODE, text)


@FIXTURE_OK
@given(text=st.text(alphabet=' \t\n\r{}[]":,.-+eE0123456789abcdfnlrstu\\', max_size=30))
def test_the_stdlib_mode_reads_any_text_as_the_json_package_does(stdlib: None, text: str) -> None:
    theirs = _verdict(_PACKAGE_DECODE, text)
    if theirs[0] == "ok" and "\\u" in text:
        return  # (a lone surrogate escape: refused by the journal's codec alone)
    assert _verdict(_json.loads, text) == theirs
