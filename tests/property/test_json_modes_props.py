"""journal._json's two modes (the standard library's json until a process has much to
handle, then orjson) write text that both read back equal, and refuse the same values."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import _json

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
    saved = (_json._orjson, _json._options, _json._items_left)
    _json._orjson, _json._options, _json._items_left = None, 0, 2**62
    yield
    _json._orjson, _json._options, _json._items_left = saved


def _in_orjson_mode(fn: Any, *args: Any) -> Any:
    saved = (_json._orjson, _json._options, _json._items_left)
    _json.bulk()
    try:
        return fn(*args)
    finally:
        _json._orjson, _json._options, _json._items_left = saved


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
