"""JSON for the journal (and for ferry, which may import this leaf from any layer): the
standard library's codec by default, orjson once a process asks for it (``bulk``).

Why two: importing orjson costs about 15 ms here (it imports dataclasses, inspect,
uuid, platform and datetime to know their types): more than all the JSON a ``ferry
run`` or ``ferry submit`` handles, and a fifth of their start-up. The standard
library's codec is its C module ``_json``, used directly: the ``json`` package around
it compiles regular expressions at import and so imports ``re``, which nothing else on
the start-up path of ``run`` needs (the two cost about 2 ms of each command). orjson
parses and encodes 3 to 10 times faster, which matters for what is large or long: a
replay of thousands of records, a snapshot of megabytes, ``work``'s stream of commits.
A process switches once it has counted 2,000 records or lines (:func:`expect`, which the
codec, the reader and the archives call), parses a document of 512 KiB, or calls
:func:`bulk` (``work`` does, at once); from then on it uses orjson for everything.

Both ways give the same results for what ferry writes and reads, and refuse the same
things (what the journal promises, ``docs/journal-format.md``):

* encoding: compact (``,`` and ``:``, no spaces), UTF-8, keys in the given order
  (``dumps_sorted``: sorted). Refused, with TypeError: a key that is not exactly a str,
  an integer outside [-2**63, 2**64), more than 254 levels of nesting (a cycle too), a
  value JSON cannot hold (bytes, a set, an object, a dataclass, a datetime, a subclass
  of float or tuple: a named tuple); with TypeError or ValueError: a str that is not
  valid Unicode (a lone surrogate); with ValueError, or written as null by orjson (the
  journal's codec refuses it itself): NaN and the infinities. Written as orjson writes
  them: an Enum member as its value, a UUID as its text. Floats may be spelled
  differently (``1e+16`` and ``1e16``): the same number. What this module wrote, both
  read back equal.
* decoding: bytes or str; invalid JSON, ``NaN``/``Infinity``, a number beyond the
  floats (``1e400``), bytes that are not UTF-8, an escaped lone surrogate
  (``"\\ud800"``) and nesting deeper than the interpreter's recursion allows raise
  ValueError; an integer outside [-2**63, 2**64) reads as a float.
"""

from __future__ import annotations

import math

try:  # (CPython's; the json package's own is used where it cannot be: _package_codec)
    from _json import encode_basestring, make_encoder, make_scanner
except ImportError:
    encode_basestring = make_encoder = make_scanner = None  # type: ignore[assignment,misc]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_INT_MIN, _INT_END = -(2**63), 2**64
_DEPTH_MAX = 254  # orjson's: containers within containers


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _int(text: str) -> int | float:
    value = int(text)
    if _INT_MIN <= value < _INT_END:
        return value
    return _float(text)  # (as orjson reads it: a float, refused beyond the floats)


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number out of range: {text[:30]}")
    return value


def _default(obj: Any) -> Any:
    """What orjson writes of an Enum member and a UUID (the standard library refuses
    them); anything else: refused."""
    import enum

    if isinstance(obj, enum.Enum):
        _refuse_non_json(obj.value, 0)  # (orjson refuses what it would refuse anyway)
        return obj.value
    if type(obj).__module__ == "uuid" and type(obj).__name__ == "UUID":
        return str(obj)
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def _encoder(sort_keys: bool) -> Callable[[Any], str]:
    """What ``json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False,
    separators=(",", ":"), sort_keys=..., default=_default).encode`` returns: the same C
    encoder, made as that class makes it (no markers: no check of cycles, as
    ``check_circular=False``; the depth limit stops one)."""
    chunks = make_encoder(None, _default, encode_basestring, None, ":", ",", sort_keys,
                          False, False)  # fmt: skip

    def encode(obj: Any) -> str:
        return encode_basestring(obj) if isinstance(obj, str) else "".join(chunks(obj, 0))

    return encode


class _DecoderSettings:
    """What the C scanner reads of a ``json.JSONDecoder`` when it is made."""

    def __init__(self) -> None:
        self.strict = True
        self.object_hook = self.object_pairs_hook = None
        self.parse_float, self.parse_int, self.parse_constant = _float, _int, _refuse_constant


_BLANK = " \t\n\r"  # JSON's whitespace, allowed around the document


def _c_decode(text: str) -> Any:
    """``json.JSONDecoder(...).decode(text)`` as it does it: the document begins after
    blanks and only blanks follow it (errors: json.JSONDecodeError, a ValueError)."""
    start = len(text) - len(text.lstrip(_BLANK))
    try:
        obj, end = _scan(text, start)
    except StopIteration as err:
        raise _decode_error("Expecting value", text, err.value) from None
    except SystemError:
        # The C scanner raises its JSONDecodeError only if ``json.decoder`` is loaded
        # (Python 3.11 looks for it in sys.modules and, not finding it, returns no
        # result and no exception): loaded now, the same text fails as json says.
        import json.decoder  # noqa: F401

        obj, end = _scan(text, start)
    after = len(text) - len(text[end:].lstrip(_BLANK))
    if after != len(text):
        raise _decode_error("Extra data", text, after)
    return obj


def _decode_error(message: str, text: str, position: int) -> ValueError:
    from json import JSONDecodeError

    return JSONDecodeError(message, text, position)


def _package_codec() -> tuple[Callable[[Any], str], Callable[[Any], str], Callable[[str], Any]]:
    """The same codec from the json package (which imports re): for an interpreter
    without CPython's ``_json``, or whose C functions take other arguments."""
    import json

    def encoder(sort_keys: bool) -> Callable[[Any], str]:
        return json.JSONEncoder(
            ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":"),
            sort_keys=sort_keys, default=_default,
        ).encode  # fmt: skip

    decoder = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_int, parse_float=_float)
    return encoder(False), encoder(True), decoder.decode


_decode: Callable[[str], Any]
try:
    _scan = make_scanner(_DecoderSettings())  # type: ignore[arg-type]  # (typeshed: any object)
    _encode, _encode_sorted, _decode = _encoder(False), _encoder(True), _c_decode
except TypeError:  # (None, or other arguments)
    _encode, _encode_sorted, _decode = _package_codec()


# (A pair is fine; one alone is not.)
_SURROGATE_ESCAPE = r"\\u[dD][89a-fA-F]"


def _has_surrogate_escape(text: str) -> bool:
    import re  # (only a document with an escape gets here: re is not on run's path)

    return re.search(_SURROGATE_ESCAPE, text) is not None


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


def in_bulk() -> bool:
    """Whether this process uses orjson now (:func:`bulk`)."""
    return _orjson is not None


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
    _refuse_non_json(obj, 0)
    return _encode(obj).encode()


def dumps_sorted(obj: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(obj, option=_options | _orjson.OPT_SORT_KEYS)  # type: ignore[no-any-return]
    _refuse_non_json(obj, 0)
    return _encode_sorted(obj).encode()


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    if _orjson is None and len(data) >= BULK_BYTES:
        bulk()
    if _orjson is not None:
        return _orjson.loads(data)
    if not isinstance(data, str):
        data = bytes(data).decode()  # (UnicodeDecodeError: a ValueError)
    try:
        obj = _decode(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if "\\u" in data and _has_surrogate_escape(data):
        _encode(obj).encode()  # a lone surrogate: UnicodeEncodeError (as orjson refuses it)
    return obj


def loads_each(documents: list[bytes]) -> list[Any]:
    """``[loads(d) for d in documents]``, counted (``expect``) and in bulk."""
    expect(len(documents))
    return list(map(loads if _orjson is None else _orjson.loads, documents))


_PLAIN = frozenset({str, float, bool, type(None)})


def _refuse_non_json(obj: Any, depth: int) -> None:
    """orjson's TypeError for what the standard library would write but orjson refuses
    (a non-str key as a str, any integer, any depth, a float or tuple subclass). A walk
    of ``obj``: about as long as encoding it, and much shorter than importing orjson."""
    kind = type(obj)
    if kind in _PLAIN:
        return
    if kind is dict or kind is list or kind is tuple or isinstance(obj, dict | list):
        if depth >= _DEPTH_MAX:
            raise TypeError("Recursion limit reached")
        if isinstance(obj, dict):
            for key, value in obj.items():
                if type(key) is not str:
                    raise TypeError(f"Dict key must be str: {key!r}")
                if type(value) not in _PLAIN:
                    _refuse_non_json(value, depth + 1)
        else:
            for value in obj:
                if type(value) not in _PLAIN:
                    _refuse_non_json(value, depth + 1)
    elif isinstance(obj, int):
        if not _INT_MIN <= obj < _INT_END:
            raise TypeError("Integer exceeds 64-bit range")
    elif isinstance(obj, float | tuple):
        raise TypeError(f"Type is not JSON serializable: {kind.__name__}")
