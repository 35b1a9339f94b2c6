"""Encode and decode one record line (pure: no I/O).

A v1 line is the compact JSON encoding of the object (keys in this order; made by
:mod:`journal._json`)::

    {"v":1,"seq":<int>,"epoch":<int>,"ts":<float>,"type":<str>,"data":<object>,"crc":"<8 hex>"}

followed by ``\\n``.  ``crc`` is ``zlib.crc32`` of every byte of the line *before*
``,"crc":"``, written as 8 lowercase hex digits; so the last 19 bytes of every line are
``,"crc":"xxxxxxxx"}\\n`` and checking a line needs no parsing.

A batch of several records (``encode_batch``) marks every line but its last with
``"more":K`` right after ``seq`` (K: how many records of the batch follow it), so that
a reader can tell a batch cut short by a crash from a whole one (``_reader``)::

    {"v":1,"seq":7,"more":2,"epoch":..}  {"v":1,"seq":8,"more":1,"epoch":..}  {"v":1,"seq":9,"epoch":..}

The last line of a batch, and a single record, carry no mark: they are the lines of
before marks, byte for byte.
"""

from __future__ import annotations

import math
import time
import zlib
from collections import namedtuple
from collections.abc import Callable, Iterable
from itertools import chain, repeat

from journal import _json
from journal._errors import FormatVersionError, InvalidRecordError, RecordTooLargeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple

FORMAT_VERSION = 1
CRC_SUFFIX_BYTES = 19  # len(b',"crc":"xxxxxxxx"}\n')
_CRC_KEY = b',"crc":"'
# The widest a seq can print (20 digits) so a size check does not depend on the seq.
_SEQ_WIDTH_MAX = 20
LINE_HEAD = b'{"v":1,"seq":'  # how every v1 line starts
# A batch mark at its widest, '"more":K,' (counted for every record, so that whether a
# record fits does not depend on its place in a batch either).
_MARK_BYTES_MAX = len(b'"more":,') + _SEQ_WIDTH_MAX
_OVERHEAD_BYTES = len(LINE_HEAD) + _SEQ_WIDTH_MAX + 1 + _MARK_BYTES_MAX + CRC_SUFFIX_BYTES
# Data must be plain JSON: _json refuses (TypeError) dataclasses, datetimes, non-str keys
# and integers beyond 64 bits; NaN/Infinity (ValueError, or null from orjson: below).


if TYPE_CHECKING:

    class Record(NamedTuple):
        """One committed journal record (immutable)."""

        seq: int
        epoch: int
        ts: float
        type: str
        data: dict[str, Any]

else:
    Record = namedtuple("Record", ("seq", "epoch", "ts", "type", "data"))


if TYPE_CHECKING:

    class Prepared(NamedTuple):
        """A record validated and encoded except for its seq (assigned at commit time)."""

        epoch: int
        ts: float
        type: str
        data: dict[str, Any]  # the decoded copy: what readers will see
        inner: bytes  # b'"epoch":..,"ts":..,"type":..,"data":{..}'

else:
    Prepared = namedtuple("Prepared", ("epoch", "ts", "type", "data", "inner"))


_new_tuple = tuple.__new__
_dumps, _loads, _now, _crc32 = _json.dumps, _json.loads, time.time, zlib.crc32
# The parts of a line around its data, as C-level callables (``prepare_batch``,
# ``encode_lines``): a line is head, inner (before_data, then the data's JSON), tail.
_before_data: Callable[[tuple[Any, ...]], bytes] = b'"epoch":%d,"ts":%s,"type":%s,"data":'.__mod__
_head_of: Callable[[int], bytes] = b'{"v":1,"seq":%d,'.__mod__
_marked_head_of: Callable[[tuple[int, int]], bytes] = b'{"v":1,"seq":%d,"more":%d,'.__mod__
_tail_of: Callable[[int], bytes] = b',"crc":"%08x"}\n'.__mod__
# Record types are few: their JSON is kept (for exact str only).
_type_bytes: dict[str, bytes] = {}
_TYPE_CACHE_MAX = 1024
_STR, _DICT = {str}, {dict}


def _check_finite(value: Any, path: str) -> None:
    """Refuse NaN/Infinity anywhere in ``value`` (orjson would write them as null, the
    standard library refuses them without saying where)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRecordError(f"NaN/Infinity at {path} (JSON cannot hold it)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_finite(item, f"{path}[{index}]")


def prepare(
    type: str,
    data: dict[str, Any],
    epoch: int,
    record_bytes_max: int,
    ts: float | None = None,
) -> Prepared:
    """Validate and encode everything but the seq; raise before anything is written."""
    # (Exact classes are tested first: the common case costs one comparison each.)
    if (type.__class__ is not str and not isinstance(type, str)) or not type:
        raise InvalidRecordError(f"record type must be a non-empty str, got {type!r}")
    if (
        epoch.__class__ is not int and (not isinstance(epoch, int) or isinstance(epoch, bool))
    ) or not 0 <= epoch < 2**63:
        raise InvalidRecordError(f"epoch must be an int >= 0, got {epoch!r}")
    if data.__class__ is not dict and not isinstance(data, dict):
        raise InvalidRecordError(f"record data must be a dict, got {data.__class__.__name__}")
    if ts is None:
        ts = _now()
    elif not isinstance(ts, float) or not math.isfinite(ts):
        raise InvalidRecordError(f"ts must be a finite float, got {ts!r}")
    type_bytes = _type_bytes.get(type) if type.__class__ is str else None
    _json.expect(1)
    try:
        data_bytes = _dumps(data)
        if type_bytes is None:
            type_bytes = _dumps(type)
            if len(_type_bytes) < _TYPE_CACHE_MAX and type.__class__ is str:
                _type_bytes[type] = type_bytes
    except (TypeError, ValueError) as exc:  # (orjson's JSONEncodeError is a TypeError)
        if exc.__class__ is ValueError:  # (the standard library's NaN: say where)
            _check_finite(data, "data")
        raise InvalidRecordError(f"record cannot be encoded: {exc}") from exc
    if b"null" in data_bytes:
        # orjson writes NaN/Infinity as null without a word: only then walk the data
        # (a real None or the text "null" also lands here; the walk tells them apart).
        _check_finite(data, "data")
    inner = _before_data((epoch, _dumps(ts), type_bytes)) + data_bytes
    if len(inner) + _OVERHEAD_BYTES > record_bytes_max:
        raise RecordTooLargeError(
            f"record of type {type!r} needs up to {len(inner) + _OVERHEAD_BYTES} bytes,"
            f" more than record_bytes_max={record_bytes_max}"
        )
    # tuple.__new__ skips the NamedTuple's Python-level __new__ (hot path).
    return _new_tuple(Prepared, (epoch, ts, type, _loads(data_bytes), inner))


def _pair(item: Any) -> tuple[Any, Any]:
    """A batch's item, ``(type, data)``, else InvalidRecordError."""
    if type(item) not in (tuple, list) or len(item) != 2:
        raise InvalidRecordError(f"a batch's item must be a (type, data) pair, got {item!r:.80}")
    return item[0], item[1]


def prepare_batch(
    items: Iterable[tuple[str, dict[str, Any]]],
    epoch: int,
    record_bytes_max: int,
    ts: float | None = None,
) -> list[Prepared]:
    """``[prepare(type, data, epoch, record_bytes_max, ts) for type, data in items]``,
    the common case in bulk: C-level maps over the whole batch instead of a call per
    record.  The records share one timestamp (they commit together): ``ts``, or now.
    Anything unusual (an empty or non-str type, a value orjson refuses, a record too
    large, NaN) goes to ``prepare`` item by item, which raises exactly what it always
    did, for the first bad item."""
    pairs = list(items)
    if ts is None:
        ts = _now()
    try:
        if len(pairs) < 2 or ts.__class__ is not float or not math.isfinite(ts):
            raise ValueError
        types, datas = zip(*pairs, strict=True)
        if (
            {*map(type, types)} != _STR
            or {*map(type, datas)} != _DICT
            or epoch.__class__ is not int
            or not 0 <= epoch < 2**63
        ):
            raise ValueError
        kinds = set(types)
        if not kinds <= _type_bytes.keys():  # a type not seen yet: keep its JSON, as prepare does
            if "" in kinds or len(_type_bytes) + len(kinds) > _TYPE_CACHE_MAX:
                raise ValueError  # (an empty type: prepare refuses it)
            _type_bytes.update((t, _dumps(t)) for t in kinds - _type_bytes.keys())
        _json.expect(len(datas))
        data_bytes = list(map(_dumps, datas))
        # Each line's inner is its type's part before the data, then the data: the parts
        # made once per type in the batch (most batches have one or two).
        ts_bytes = _dumps(ts)
        if len(kinds) == 1:
            inners = list(
                map(_before_data((epoch, ts_bytes, _type_bytes[types[0]])).__add__, data_bytes)
            )
        else:
            before = {t: _before_data((epoch, ts_bytes, _type_bytes[t])) for t in kinds}
            inners = list(map(bytes.__add__, map(before.__getitem__, types), data_bytes))
        if max(map(len, inners)) + _OVERHEAD_BYTES > record_bytes_max:
            raise ValueError
        joined = b",".join(data_bytes)  # (no "null" can straddle a '},{')
        if b"null" in joined:  # (as in prepare: only then walk the data)
            for data, encoded in zip(datas, data_bytes, strict=True):
                if b"null" in encoded:
                    _check_finite(data, "data")
    except (ValueError, TypeError, InvalidRecordError):  # (JSONEncodeError: a TypeError)
        return [prepare(*_pair(item), epoch, record_bytes_max, ts) for item in pairs]
    # The decoded copies, one parse for all: each part is the encoding of a dict.
    copies = _loads(b"[%s]" % joined)
    return list(
        map(_new_tuple, repeat(Prepared), zip(repeat(epoch), repeat(ts), types, copies, inners))
    )


def encode_line(seq: int, prepared: Prepared) -> bytes:
    """The complete line (with its newline) for ``prepared`` at ``seq``."""
    head, inner = _head_of(seq), prepared.inner
    return b"".join((head, inner, _tail_of(_crc32(inner, _crc32(head)))))


def encode_lines(first_seq: int, inners: Iterable[bytes]) -> bytes:
    """The lines of records whose ``Prepared.inner`` are ``inners``, seqs from
    ``first_seq``: the bytes of ``encode_line`` for each, in bulk (the checksum of a
    line's head and inner is that of the head continued over the inner: no copy)."""
    inners = list(inners)
    heads = list(map(_head_of, range(first_seq, first_seq + len(inners))))
    tails = map(_tail_of, map(_crc32, inners, map(_crc32, heads)))
    return b"".join(chain.from_iterable(zip(heads, inners, tails, strict=True)))


def encode_batch(first_seq: int, inners: Iterable[bytes]) -> bytes:
    """The lines of one batch (``encode_lines``), every line but the last marked with
    ``"more":K``, K the number of the batch's records after it (see the module
    docstring).  A batch of one record is its plain line."""
    inners = list(inners)
    count = len(inners)
    if count < 2:
        return encode_lines(first_seq, inners)
    last = first_seq + count - 1
    seqs = range(first_seq, last)
    heads = list(map(_marked_head_of, zip(seqs, range(count - 1, 0, -1), strict=True)))
    heads.append(_head_of(last))
    tails = map(_tail_of, map(_crc32, inners, map(_crc32, heads)))
    return b"".join(chain.from_iterable(zip(heads, inners, tails, strict=True)))


def encode_record(
    seq: int, epoch: int, ts: float, type: str, data: dict[str, Any], record_bytes_max: int = 2**62
) -> bytes:
    """Encode one record line (for tests, tools and the golden generator)."""
    return encode_line(seq, prepare(type, data, epoch, record_bytes_max, ts=ts))


def line_checks(line: bytes) -> bool:
    """True if ``line`` (without its newline) carries a matching checksum."""
    if len(line) < CRC_SUFFIX_BYTES - 1 or line[-18:-10] != _CRC_KEY or line[-2:] != b'"}':
        return False
    return b"%08x" % zlib.crc32(line[:-18]) == line[-10:-2]


class LineProblem(Exception):
    """Why a line is not a valid record (internal; the reader turns it into an error)."""

    def __init__(self, reason: str, *, checks: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.checks = checks  # the checksum matched: not a torn write but a bad writer


def decode_line(line: bytes, expected_seq: int | None = None) -> Record:
    """Decode one line (with or without its trailing newline); the slow, explaining path.

    Raises LineProblem (checks=False: damaged bytes; checks=True: a checksummed line that
    is still not a valid record, e.g. an unexpected seq) or FormatVersionError.
    """
    return decode_marked(line, expected_seq)[0]


def decode_marked(line: bytes, expected_seq: int | None = None) -> tuple[Record, int]:
    """``decode_line``, and the line's batch mark: K of ``"more":K`` (an int >= 1), 0
    for a line without one (a batch's last record, a single record)."""
    if line.endswith(b"\n"):
        line = line[:-1]
    if not line_checks(line):
        if not line:
            raise LineProblem("empty line", checks=False)
        if line.strip(b"\x00") == b"":
            raise LineProblem("NUL bytes", checks=False)
        raise LineProblem("checksum mismatch or malformed line", checks=False)
    try:
        obj = _loads(line)
    except ValueError:
        raise LineProblem("checksum matches but the line does not parse", checks=False) from None
    if not isinstance(obj, dict):
        raise LineProblem("not a JSON object", checks=True)
    version = obj.get("v")
    if type(version) is int and version > FORMAT_VERSION:
        raise FormatVersionError(
            f"record format v{version} is newer than the supported v{FORMAT_VERSION}"
        )
    if version != FORMAT_VERSION or type(version) is not int:
        raise LineProblem(f"bad format version {version!r}", checks=True)
    seq, epoch, ts = obj.get("seq"), obj.get("epoch"), obj.get("ts")
    rtype, data = obj.get("type"), obj.get("data")
    if type(seq) is not int or seq < 1:
        raise LineProblem(f"bad seq {seq!r}", checks=True)
    if type(epoch) is not int or epoch < 0:
        raise LineProblem(f"bad epoch {epoch!r}", checks=True)
    if not isinstance(ts, float | int) or isinstance(ts, bool):
        raise LineProblem(f"bad ts {ts!r}", checks=True)
    if type(rtype) is not str or type(data) is not dict:
        raise LineProblem("bad type or data field", checks=True)
    more = obj.get("more", 0)
    if type(more) is not int or more < 0 or (more == 0 and "more" in obj):
        raise LineProblem(f"bad batch mark {more!r}", checks=True)
    if expected_seq is not None and seq != expected_seq:
        raise LineProblem(f"seq {seq} where {expected_seq} was expected", checks=True)
    return Record(seq, epoch, float(ts), rtype, data), more
