"""JSON for the journal (and for ferry, which may import this leaf from any layer): the
standard library's codec by default, orjson once a process asks for it (``bulk``).

Why two: importing orjson costs about 15 ms here (it imports dataclasses, inspect,
uuid, platform and datetime to know their types): more than all the JSON a ``ferry
run`` or ``ferry submit`` handles, and a fifth of their start-up. The standard
library's json costs about 1 ms (``re``, which it needs, is loaded by then). orjson
parses and encodes 3 to 10 times faster, which matters for what is large or long: a
replay of thousands of records, a snapshot of megabytes, ``work``'s stream of commits.
Those call :func:`bulk` first; from then on the process uses orjson for everything.

Both ways give the same results for what ferry writes and reads, and refuse the same
things (what the journal promises, ``docs/journal-format.md``):

* encoding: compact (``,`` and ``:``, no spaces), UTF-8, keys in the given order
  (``dumps_sorted``: sorted). Refused, with TypeError: a key that is not a str, an
  integer outside [-2**63, 2**64), a value JSON cannot hold (bytes, a set, an object,
  a dataclass, a datetime); with ValueError: NaN and the infinities, a str that is not
  valid Unicode (a lone surrogate). Floats may be spelled differently (``1e+16`` and
  ``1e16``): the same number. What this module wrote, both read back equal.
* decoding: bytes or str; invalid JSON, ``NaN``/``Infinity``, bytes that are not
  UTF-8, and an escaped lone surrogate (``"\\ud800"``) raise ValueError.
"""

from __future__ import annotations

import json
import re
from typing import Any

_INT_MIN, _INT_END = -(2**63), 2**64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_encode = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":")
).encode
_encode_sorted = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":"),
    sort_keys=True,
).encode  # fmt: skip
_decode = json.JSONDecoder(parse_constant=_refuse_constant).decode
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # (a pair is fine; one alone is not)

_orjson: Any = None  # the module, once ``bulk`` was called
_options = 0  # orjson's: refuse dataclasses and datetimes, as the standard library does
# Items (records, lines) this process may handle with the standard library before it
# switches: orjson's import costs about what 1,000 records encoded or 4,000 lines parsed
# with the standard library cost more than with orjson.
BULK_AFTER_ITEMS = 2000
BULK_BYTES = 512 << 10  # a document this large is parsed with orjson at once
_items_left = BULK_AFTER_ITEMS


def bulk() -> None:
    """This process has much to encode or decode: use orjson from now on (imported now,
    once)."""
    global _orjson, _options
    if _orjson is None:
        import orjson

        _options = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
        _orjson = orjson


def expect(items: int) -> None:
    """``items`` records or lines are about to be encoded or parsed: after
    ``BULK_AFTER_ITEMS`` of them in this process, :func:`bulk`."""
    global _items_left
    _items_left -= items
    if _items_left <= 0 and _orjson is None:
        bulk()


def dumps(obj: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(obj, option=_options)  # type: ignore[no-any-return]
    return _checked(obj, _encode(obj).encode())


def dumps_sorted(obj: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(obj, option=_options | _orjson.OPT_SORT_KEYS)  # type: ignore[no-any-return]
    return _checked(obj, _encode_sorted(obj).encode())


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    if _orjson is None and len(data) >= BULK_BYTES:
        bulk()
    if _orjson is not None:
        return _orjson.loads(data)
    if not isinstance(data, str):
        data = bytes(data).decode()  # (UnicodeDecodeError: a ValueError)
    obj = _decode(data)
    if "\\u" in data and _SURROGATE_ESCAPE.search(data):
        _encode(obj).encode()  # a lone surrogate: UnicodeEncodeError (as orjson refuses it)
    return obj


def loads_each(documents: list[bytes]) -> list[Any]:
    """``[loads(d) for d in documents]``, counted (``expect``) and in bulk."""
    expect(len(documents))
    return list(map(loads if _orjson is None else _orjson.loads, documents))


def _checked(obj: Any, encoded: bytes) -> bytes:
    """``encoded``, if orjson would have encoded ``obj`` too; else orjson's TypeError.
    (The standard library writes a non-str key as a str, ``1`` as ``"1"``, and any
    integer.) A walk of ``obj``: about as long as encoding it, and much shorter than
    importing orjson."""
    _refuse_non_json(obj, "")
    return encoded


_PLAIN = frozenset({str, float, bool, type(None)})


def _refuse_non_json(obj: Any, path: str) -> None:
    kind = type(obj)
    if kind in _PLAIN:
        return
    if kind is dict or isinstance(obj, dict):
        for key, value in obj.items():
            if type(key) is not str and not isinstance(key, str):
                raise TypeError(f"Dict key must be str at {path or 'the top'}: {key!r}")
            if type(value) not in _PLAIN:
                _refuse_non_json(value, f"{path}.{key}")
    elif kind is list or kind is tuple or isinstance(obj, list | tuple):
        for index, value in enumerate(obj):
            if type(value) not in _PLAIN:
                _refuse_non_json(value, f"{path}[{index}]")
    elif isinstance(obj, int) and not _INT_MIN <= obj < _INT_END:
        raise TypeError(f"Integer exceeds 64-bit range at {path or 'the top'}")
