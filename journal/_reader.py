"""Read segments as streams of records, with bounded memory, and classify damage.

Memory is bounded by one read chunk plus the longest line (lines longer than
LINE_BYTES_MAX_READ are damage by definition and skipped without being held).

Classification of the first bad line at byte ``offset`` of a segment:

* a line whose checksum matches but is not the record expected there (wrong seq, bad
  fields): corruption, always;
* bytes that do not check (incomplete last line, NUL bytes, garbage, bad checksum):
  a *torn tail* if the segment is the last one and no checksummed line follows them
  up to its end; otherwise corruption.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import getitem
from pathlib import Path
from typing import NamedTuple, cast

import orjson

from journal import _fsutil
from journal._codec import LineProblem, Record, decode_line, line_checks
from journal._errors import CorruptionError, FormatVersionError

CHUNK_BYTES = 256 << 10
LINE_BYTES_MAX_READ = 64 << 20  # any line longer is damage (memory bound when reading)
_BODY = slice(None, -18)  # a line (without newline) before ',"crc":"'
# The whole fixed tail ',"crc":"xxxxxxxx"}' is compared, not just the digits: a damaged
# byte in the key or the closing brace (which the crc does not cover) must not pass.
_TAIL = slice(-18, None)
_TAIL_TEMPLATE = b',"crc":"%08x"}'
_crc32: Callable[[bytes], int] = zlib.crc32
_slice = cast(Callable[[bytes, slice], bytes], getitem)
_new_record = tuple.__new__


def _checksums_match(lines: list[bytes]) -> bool:
    """True if every line's checksum matches (C-level loops, no bytecode per line: the
    crc is the costliest check, so it is the one done in bulk)."""
    count = len(lines)
    crcs = tuple(map(_crc32, map(_slice, lines, repeat(_BODY, count))))
    # One formatting of all the expected tails against all the actual ones: both are
    # 18 bytes per line exactly when every line matches (a shorter line cannot align).
    expected: bytes = (_TAIL_TEMPLATE * count) % crcs
    return expected == b"".join(map(_slice, lines, repeat(_TAIL, count)))


def _holds_valid_line(line: bytes) -> bool:
    """Does ``line`` check, or end with a record that checks?  (A hole of NUL bytes or
    garbage without a newline glues itself to the record after it.)"""
    if line_checks(line):
        return True
    start = line.rfind(b'{"v":')
    return start > 0 and line_checks(line[start:])


class Damage(NamedTuple):
    offset: int  # first byte of the first bad line
    seq: int  # the seq expected there
    reason: str
    corrupt: bool  # True: can never be a torn tail (a checksummed line is involved)
    tail_bytes: int = 0  # bytes from offset to the end of the segment as scanned


class SegmentScan:
    """Scan one open segment from byte ``start`` where ``next_seq`` is expected.

    Iterate ``records()``; as it goes, ``end_offset`` (just after the last valid record)
    and ``next_seq`` follow; at the end ``damage`` tells what stopped it (None: clean)
    and ``size`` how many bytes were seen.
    """

    def __init__(self, fd: int, path: Path, start: int, next_seq: int) -> None:
        self.fd = fd
        self.path = path
        self.end_offset = start
        self.next_seq = next_seq
        self.max_epoch = 0
        self.damage: Damage | None = None
        self.size = start

    def records(self) -> Iterator[Record]:
        fd = self.fd
        pos = line_start = self.end_offset
        pending = b""
        skipping = False  # inside an over-long line already counted as damage
        damage: Damage | None = None
        loads, new, record_cls = orjson.loads, _new_record, Record
        while True:
            chunk = _fsutil.pread(fd, CHUNK_BYTES, pos)
            if not chunk:
                break
            pos += len(chunk)
            lines = (pending + chunk if pending else chunk).split(b"\n")
            pending = lines.pop()
            if skipping and lines:  # the rest of an over-long line
                skipping = False
                line_start += len(lines[0]) + 1
                del lines[0]
            if damage is None and lines and _checksums_match(lines):
                # The fast path: every checksum matched; parse and check the rest line
                # by line, dropping to the slow path at the first line that fails.
                start = expected = self.next_seq
                top = self.max_epoch
                for line in lines:
                    try:
                        obj = loads(line)
                        epoch, ts, rtype, data = obj["epoch"], obj["ts"], obj["type"], obj["data"]
                        if (
                            obj["seq"] != expected
                            or obj["v"] != 1
                            or type(epoch) is not int
                            or type(ts) is not float
                            or type(rtype) is not str
                            or type(data) is not dict
                            or epoch < 0
                        ):
                            break
                    except (ValueError, KeyError, TypeError):  # JSONDecodeError: ValueError
                        break
                    if epoch > top:
                        top = epoch
                    yield new(record_cls, (expected, epoch, ts, rtype, data))
                    expected += 1
                done = expected - start
                if done:
                    # Positions are brought up to date per run of lines, not per record:
                    # exact whenever the scan stops on its own.
                    line_start += sum(map(len, lines[:done])) + done
                    self.end_offset, self.next_seq, self.max_epoch = line_start, expected, top
                    del lines[:done]
            for line in lines:  # the slow path: find and explain the first bad line
                if damage is None:
                    record, damage = self._explain(line, line_start, self.next_seq)
                    if record is not None:
                        line_start += len(line) + 1
                        self.end_offset = line_start
                        self.next_seq += 1
                        self.max_epoch = max(self.max_epoch, record.epoch)
                        yield record
                        continue
                    assert damage is not None
                    if damage.corrupt:
                        self.damage = damage
                        return
                elif _holds_valid_line(line):
                    # A checksummed line after the damage: the damage is not a torn tail
                    # but a hole in the middle (never skipped, never cut).
                    self.damage = damage._replace(
                        corrupt=True,
                        reason=f"{damage.reason}; a valid line follows at byte {line_start}",
                    )
                    return
                line_start += len(line) + 1
            if skipping and pending:
                line_start += len(pending)
                pending = b""
            elif len(pending) > LINE_BYTES_MAX_READ:
                if damage is None:
                    damage = Damage(line_start, self.next_seq, "line too long", False)
                line_start += len(pending)
                pending = b""
                skipping = True
        if pending and damage is None:
            damage = Damage(line_start, self.next_seq, "incomplete last line", False)
        self.size = pos
        if damage is not None:
            self.damage = damage._replace(tail_bytes=pos - damage.offset)

    def _explain(
        self, line: bytes, offset: int, expected: int
    ) -> tuple[Record | None, Damage | None]:
        """The slow path for a line the fast path refused: a valid record after all (an
        int ts, say), a damaged line, a corrupt one, or a newer format (raised)."""
        try:
            return decode_line(line, expected), None
        except LineProblem as problem:
            reason, corrupt = problem.reason, problem.checks
            if not corrupt and _holds_valid_line(line):
                reason, corrupt = f"{reason}; a valid record follows inside the same line", True
            return None, Damage(offset, expected, reason, corrupt)
        except FormatVersionError as exc:
            raise FormatVersionError(
                exc.message, segment=self.path, offset=offset, seq=expected
            ) from None


def scan_all(scan: SegmentScan) -> None:
    """Run a scan to its end, discarding the records."""
    for _ in scan.records():
        pass


def damage_error(damage: Damage, path: Path, *, last: bool) -> CorruptionError:
    where = "" if last else " in a sealed segment"
    return CorruptionError(
        f"bad record{where}: {damage.reason}", segment=path, offset=damage.offset, seq=damage.seq
    )


class TornTail(NamedTuple):
    segment: Path
    offset: int  # where the valid records end and the tail begins
    seq: int  # the seq a record there would have
    tail_bytes: int
    reason: str
