"""Read segments as streams of records, with bounded memory, and classify damage.

Memory is bounded by one read chunk plus the longest line (lines longer than
LINE_BYTES_MAX_READ are damage by definition and skipped without being held), plus the
records of an open batch.

Batches (``_codec``): every record of a batch of several records but its last carries
``"more":K``.  A batch's records are yielded only once its last record is read, and
``end_offset``, ``next_seq``, ``tail`` and ``max_epoch`` move past whole batches only.
A batch left incomplete where the scan stops (whole lines of it, then nothing, an
incomplete line, a hole of NUL sectors or the zero tail) is damage that begins at the
batch's first record, with the verdict of what ended it (a torn tail in the last
segment, where a crash in the batch's write or a write still being copied in leaves
it); a valid record that its batch's marks did not announce is corruption
(``_broken_mark``).  The fast path pays one more C-level pass per run of lines without
a mark (``_parse_run``); runs with marks are checked by ``_batch_ends``.

Classification of the first bad line at byte ``offset`` of a segment.  What a torn
write can leave decides it: the writer writes records only (never a NUL byte, never an
empty line), over zeros (its preallocated tail; a file grown by the write reads as
zeros where its data did not land).  A crash mid-write leaves a prefix of the write
(whole records, then part of one with no newline after it), and sectors of it that
never landed read as NULs: whole sectors, so each run of NULs a tear puts in a line
begins where the line does or at a sector boundary, and ends at one (``_torn_shape``).

* a line whose checksum matches but is not the record expected there (wrong seq, bad
  fields): corruption, always;
* a *whole* line (a newline follows it) that does not check and that no tear leaves: no
  NUL in it, or NULs off the sector boundaries; and a record that checks followed by a
  byte other than its newline: corruption, always, in the last segment too.  Every
  byte of it landed as written, so it was damaged after it was written (a committed
  record with a flipped bit: erasing it as a torn tail erased a commit) or written by
  something else;
* other bytes that do not check (an incomplete last line; whole lines whose NULs are
  sectors that never landed): a *torn tail* if the segment is the last one and neither
  a checksummed line nor a whole line that no tear leaves follows them up to its end;
  otherwise corruption;
* one exception, the mark of a write whose sectors reached the disk out of order
  before a power cut (some lost, later ones landed): after a whole line holding such
  NULs, the records that follow have seqs above the one expected, rising.  Those
  records were never committed (a commit's fdatasync returns once every sector is on
  disk, and nothing is written after a commit that did not return), so in the last
  segment this too is a torn tail.

A segment's records end where only NUL bytes follow up to the end of the file: that
*zero tail* is space the writer preallocated (``_writer``), not damage, in any segment.
An incomplete line before it is a torn tail all the same, and the tail's length
(``Damage.tail_bytes``) stops where the zeros begin.
"""

from __future__ import annotations

import sys
import time
import zlib
from array import array
from binascii import hexlify
from collections import namedtuple
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import getitem, itemgetter, sub

from journal import _fsutil, _json
from journal._codec import LINE_HEAD, LineProblem, Record, decode_marked, line_checks
from journal._errors import CorruptionError, FormatVersionError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple

CHUNK_BYTES = 256 << 10
LINE_BYTES_MAX_READ = 64 << 20  # any line longer is damage (memory bound when reading)
# Lines checked and parsed together.  Small enough that a run's objects stay below the
# cyclic GC's first threshold (700 new containers): a larger run makes the collector
# walk them, for nothing (they are acyclic and freed as the consumer drops them).
RUN_LINES = 128
# Corruption is looked at again, after these pauses (at once: the append being copied
# in is done by then; and later, for a writer that lost its CPU mid-copy): real damage
# costs a reader 10 ms more, a race taken for damage a false alarm (exit 4).
RESCAN_DELAYS_S = (0.0, 0.01)
_BODY = slice(None, -18)  # a line (without newline) before ',"crc":"'
# The whole fixed tail ',"crc":"xxxxxxxx"}' is compared, not just the digits: a damaged
# byte in the key or the closing brace (which the crc does not cover) must not pass.
_TAIL = slice(-18, None)
_TAIL_BYTES = 18
_CRC_KEY = b',"crc":"'
_HEX_AT = len(_CRC_KEY)  # where the 8 hex digits start in the tail
_CLOSE = b'"}'
_U32 = "I" if array("I").itemsize == 4 else "L"
_BIG_ENDIAN = sys.byteorder == "big"
_crc32: Callable[[bytes], int] = zlib.crc32
_slice: Callable[[bytes, slice], bytes] = getitem  # type: ignore[assignment]  # (its slice overload)
_new_record = tuple.__new__
# (seq, epoch, ts, type, data): a Record's fields, in its order, from a parsed line.
_FIELDS: Callable[[Any], tuple[Any, ...]] = itemgetter("seq", "epoch", "ts", "type", "data")
_EPOCH: Callable[[Record], int] = itemgetter(1)
_MARK = b'"more":'
_HEAD_BYTES = len(LINE_HEAD)  # b'{"v":1,"seq":'; the seq, then ',' and a mark or "epoch"
_INT, _FLOAT, _STR, _DICT = {int}, {float}, {str}, {dict}


def _checksums_match(lines: list[bytes]) -> bool:
    """True if every line ends in the 18-byte tail ',"crc":"xxxxxxxx"}' holding the
    crc32 of the bytes before it.  Bulk, C-level work only (no bytecode per line): the
    crc is the costliest check, so it is the one done in bulk."""
    count = len(lines)
    crcs = array(_U32, map(_crc32, map(_slice, lines, repeat(_BODY, count))))
    if not _BIG_ENDIAN:
        crcs.byteswap()
    digits = hexlify(crcs)  # 8 lowercase hex digits per line, in line order
    tails = b"".join(map(_slice, lines, repeat(_TAIL, count)))
    if len(tails) != _TAIL_BYTES * count:  # some line is shorter than a tail
        return False
    # Column by column: byte k of every tail, against what it must be.
    for k, byte in enumerate(_CRC_KEY):
        if tails[k::_TAIL_BYTES] != bytes((byte,)) * count:
            return False
    for k in range(8):
        if tails[_HEX_AT + k :: _TAIL_BYTES] != digits[k::8]:
            return False
    return (
        tails[_HEX_AT + 8 :: _TAIL_BYTES] == b'"' * count
        and tails[_HEX_AT + 9 :: _TAIL_BYTES] == b"}" * count
    )


def _parse_run(
    lines: list[bytes], expected: int, left: int
) -> tuple[list[Record], int, int, int] | None:
    """The records of checksummed ``lines`` (seqs from ``expected``; the batch open
    before them has ``left`` records still to come, 0: none is open), their highest
    epoch, and where their batches end: ``closed``, the first ``closed`` records end
    batches, and ``left``, the records still to come of the batch open after them.
    None if any line is not a record in the canonical form the writer makes, or a
    batch mark is broken (the slow path then finds and explains it).  Every field of
    every line is checked, in bulk: parsed as JSON, ``v`` is 1, ``seq`` follows on,
    ``epoch`` an int >= 0, ``ts`` a float, ``type`` a str, ``data`` an object, and
    the marks (``_batch_ends``)."""
    count = len(lines)
    try:
        objs = _json.loads_each(lines)
        fields = list(map(_FIELDS, objs))  # KeyError: a field is missing
        versions = list(map(getitem, objs, repeat("v", count)))  # TypeError: not an object
    except (ValueError, KeyError, TypeError):  # (a JSON decoding error is a ValueError)
        return None
    seqs, epochs, stamps, types, datas = zip(*fields, strict=True)
    if (
        seqs != tuple(range(expected, expected + count))
        or versions.count(1) != count
        or {*map(type, seqs), *map(type, epochs), *map(type, versions)} != _INT
        or {*map(type, stamps)} != _FLOAT
        or {*map(type, types)} != _STR
        or {*map(type, datas)} != _DICT
        or min(epochs) < 0
    ):
        return None
    # (The one pass a run without a mark costs more: every obj is a dict by now.)
    marks = sum(map(dict.__contains__, objs, repeat("more", count)))
    ends = _batch_ends(objs, marks, left)
    if ends is None:
        return None
    records = list(map(_new_record, repeat(Record, count), fields))
    return records, max(epochs), *ends


def _batch_ends(objs: list[dict[str, Any]], marks: int, left: int) -> tuple[int, int] | None:
    """(closed, left) of ``_parse_run`` for a run whose ``objs`` carry ``marks`` batch
    marks, or None if one is broken: not an int >= 1, or not the one the record before
    it announced.  In bulk, with no bytecode per record.  Read a record without a mark
    as marked 0: the marks are right when every mark is an int >= 1, the first record
    goes on with the batch open before the run (``left``), and each record marked K >= 1
    is followed by one marked K - 1.  Those steps down by exactly 1 are counted: a record
    marked 0 never makes one (the next mark is >= 0)."""
    count = len(objs)
    if not marks:  # (an open batch's last record must come first)
        return (count, 0) if left <= 1 else None
    more = list(map(dict.get, objs, repeat("more", count), repeat(0, count)))
    closers = more.count(0)
    if {*map(type, more)} != _INT or min(more) < 0 or closers != count - marks:
        return None  # (closers: a "more":0 there is counted apart, by ``marks``)
    still_open = more[-1]
    steps = list(map(sub, more, more[1:])).count(1)
    if (left and more[0] != left - 1) or steps != count - 1 - closers + (not still_open):
        return None
    closed = count - more[::-1].index(0) if closers else 0
    return closed, still_open


def _more_to_come(line: bytes) -> int:
    """K of the batch mark ``"more":K`` of ``line`` (right after its seq), if it has
    one, of at most 19 digits (``int`` refuses thousands; no batch is that long), and
    checks; else 0 (the parse of the line decides)."""
    at = line.find(b",", _HEAD_BYTES) + 1
    if not line.startswith(_MARK, at):
        return 0
    digits = line[at + len(_MARK) : line.find(b",", at)]
    usable = digits.isdigit() and len(digits) <= 19 and line_checks(line)
    return int(digits) if usable else 0


SECTOR_BYTES = 512  # the smallest unit a disk writes whole (4096-byte sectors align too)


def _held_seq(line: bytes) -> int | None:
    """The seq of the record ``line`` holds (checks whole, or ends with a record that
    checks: a hole of NUL bytes or garbage without a newline glues itself to the record
    after it), 0 if that record has no int seq, None if it holds none."""
    start = 0
    if not line_checks(line):
        start = line.rfind(b'{"v":')
        if start <= 0 or not line_checks(line[start:]):
            return None
    try:
        seq = _json.loads(line[start:]).get("seq")
    except (ValueError, AttributeError):  # (does not parse; not an object)
        return 0
    return seq if type(seq) is int else 0


if TYPE_CHECKING:

    class Damage(NamedTuple):
        offset: int  # first byte of the first bad line
        seq: int  # the seq expected there
        reason: str
        corrupt: bool  # True: can never be a torn tail
        tail_bytes: int = 0  # bytes from offset to the end of the segment as scanned
        hole: bool = False  # a whole line with NULs of sectors that never landed (see above)
        top: int = 0  # with ``hole``: the highest seq of the records after it so far

else:
    Damage = namedtuple(
        "Damage",
        ("offset", "seq", "reason", "corrupt", "tail_bytes", "hole", "top"),
        defaults=(0, False, 0),
    )


class SegmentScan:
    """Scan one open segment from byte ``start`` where ``next_seq`` is expected.

    Iterate ``records()`` (or ``runs()``, lists of consecutive records); as it goes,
    ``end_offset`` (just after the last valid record) and ``next_seq`` follow, brought
    up to date after each run is consumed (exact whenever the scan stops on its own);
    at the end ``damage`` tells what stopped it (None: clean).

    A NUL byte ending a read chunk may begin the zero tail.  The scan then reads ahead to
    the end of the file to be sure every byte left is NUL, unless ``trust_zeros``:
    a handle catching up on appends made since it opened (and checked) the journal
    knows that appends only ever write over zeros, from the end of the records on.
    """

    def __init__(
        self, fd: int, path: str, start: int, next_seq: int, *, trust_zeros: bool = False
    ) -> None:
        self.fd = fd
        self.path = path
        self.end_offset = start
        # The last bytes before ``end_offset`` (its line's ``,"crc":"..."}\n``), once a
        # record was read: what a handle checks is still there (``_position``).
        self.tail = b""
        self.next_seq = next_seq
        self.max_epoch = 0
        self.damage: Damage | None = None
        self.trust_zeros = trust_zeros

    def records(self) -> Iterator[Record]:
        for run in self.runs():
            yield from run

    def runs(self) -> Iterator[list[Record]]:
        fresh = self.next_seq  # the seq of the first record not yielded yet
        for attempt in range(len(RESCAN_DELAYS_S) + 1):
            if attempt:
                # Lock-free readers race appends: a chunk read while an append was
                # being copied in holds zeros where bytes now are, and joined with what
                # was read after it, makes a line no torn write leaves. Damage on disk
                # stays where it is; such a line does not: look again from the end of
                # the whole batches.  (Records of a batch that closes in the lines read
                # went out as they were parsed: a look again yields none twice.)
                self.damage = None
                time.sleep(RESCAN_DELAYS_S[attempt - 1])
            for run in self._scan():
                if run[-1].seq >= fresh:
                    yield run[fresh - run[0].seq :] if run[0].seq < fresh else run
                    fresh = run[-1].seq + 1
            if self.damage is None or not self.damage.corrupt:
                return

    def _scan(self) -> Iterator[list[Record]]:
        fd = self.fd
        pos = line_start = self.end_offset
        expect = self.next_seq  # the seq of the next line (end_offset: of the next batch)
        # The batch open so far (its records are yielded once its last one is read):
        # its records, how many of it are still to come (0: none is open), its first
        # line's offset and seq.
        held: list[Record] = []
        left = batch_start = batch_seq = 0
        pending = b""
        skipping = False  # inside an over-long line already counted as damage
        long_start, long_nul = 0, False  # where that line began; has it held a NUL?
        damage: Damage | None = None
        while True:
            chunk = _fsutil.pread(fd, CHUNK_BYTES, pos)
            if not chunk:
                break
            pos += len(chunk)
            lines = chunk.split(b"\n")
            if pending:  # (joined to the first line only: no copy of the whole chunk)
                lines[0] = pending + lines[0]
            pending = lines.pop()
            if skipping and lines:  # the rest of an over-long line
                skipping = False
                line_start += len(lines[0]) + 1
                if not long_nul and b"\0" not in lines[0]:
                    assert damage is not None
                    self.damage = _whole_bad_line(damage, long_start)
                    return
                del lines[0]
            if damage is None and not skipping and lines:
                # A batch open at the chunk's end: read on to its last line (its lines
                # are then parsed and yielded as they come, not held), unless the
                # records end first (the zero tail, or the end of the file).
                to_come = _more_to_come(lines[-1])
                while to_come > 0 and pending[:1] != b"\0":
                    if not (ahead := _fsutil.pread(fd, CHUNK_BYTES, pos)):
                        break
                    pos += len(ahead)
                    extra = (pending + ahead).split(b"\n")
                    pending = extra.pop()
                    lines += extra
                    to_come -= len(extra)
            if damage is None and lines and _checksums_match(lines):
                # The fast path: every checksum matched; check the rest in runs, and
                # leave the first run that has a bad line (or a broken batch mark) to
                # the slow path.  A run's records are yielded at once if the batch
                # open at its end closes in the lines read; if not, that batch's are
                # held (those of the batches it closes are yielded).
                done = 0
                while done < len(lines):
                    run_lines = lines[done : done + RUN_LINES]
                    parsed = _parse_run(run_lines, expect, left)
                    if parsed is None:
                        break
                    records, top, closed, left = parsed
                    count = len(run_lines)
                    done += count
                    run_end = line_start + sum(map(len, run_lines)) + count
                    if closed == count:  # (where the last batch it closes ends)
                        end = run_end
                    elif closed:
                        end = line_start + sum(map(len, run_lines[:closed])) + closed
                    if done + left <= len(lines):
                        if held:
                            records, held = held + records, []
                        yield records
                    else:
                        if closed:
                            whole = records[:closed]
                            if held:
                                whole, held = held + whole, []
                            yield whole
                            top = max(map(_EPOCH, whole))
                        if not held:
                            batch_start = end if closed else line_start
                            batch_seq = expect + closed
                        held += records[closed:]
                    if closed:
                        self.end_offset, self.next_seq = end, expect + closed
                        self.tail = run_lines[closed - 1][-_TAIL_BYTES:] + b"\n"
                        if top > self.max_epoch:
                            self.max_epoch = top
                    line_start, expect = run_end, expect + count
                del lines[:done]
            for line in lines:  # the slow path: find and explain the first bad line
                if damage is None:
                    record, more, damage = self._explain(line, line_start, expect)
                    if record is not None:
                        if left and more != left - 1:
                            self.damage = _broken_mark(line_start, expect, left, more)
                            return
                        if not held and more:
                            batch_start, batch_seq = line_start, expect
                        line_start += len(line) + 1
                        expect += 1
                        left = more
                        if more:
                            held.append(record)
                            continue
                        if held:
                            held.append(record)
                            whole, held = held, []
                        else:
                            whole = [record]
                        yield whole
                        self.end_offset, self.next_seq = line_start, expect
                        self.tail = line[-_TAIL_BYTES:] + b"\n"
                        self.max_epoch = max(self.max_epoch, *map(_EPOCH, whole))
                        continue
                    assert damage is not None
                    if damage.corrupt:
                        self.damage = damage
                        return
                elif (held_seq := _held_seq(line)) is not None:
                    if damage.hole and held_seq > damage.top:
                        damage = damage._replace(top=held_seq)  # (an unsynced write: above)
                    else:
                        # A checksummed line after the damage: the damage is not a torn
                        # tail but a hole in the middle (never skipped, never cut).
                        self.damage = damage._replace(
                            corrupt=True,
                            reason=f"{damage.reason}; a valid line follows at byte {line_start}",
                        )
                        return
                elif not _torn_shape(line, line_start):
                    # A whole line that does not check, after the damage, and that no
                    # tear leaves (see _torn_shape).
                    self.damage = _whole_bad_line(damage, line_start)
                    return
                line_start += len(line) + 1
            if (
                pending[-1:] == b"\0"
                and not skipping
                and (self.trust_zeros or _zeros_to_end(fd, pos))
            ):
                # The zero tail: the segment's bytes end where the NULs begin.
                data_bytes = len(pending.rstrip(b"\0"))
                if data_bytes and damage is None:
                    damage = _incomplete(line_start, expect, pending[:data_bytes])
                pos, pending = line_start + data_bytes, b""
                break
            if skipping and pending:
                long_nul = long_nul or b"\0" in pending
                line_start += len(pending)
                pending = b""
            elif len(pending) > LINE_BYTES_MAX_READ:
                if damage is None:
                    damage = Damage(line_start, expect, "line too long", False)
                long_start, long_nul = line_start, b"\0" in pending
                line_start += len(pending)
                pending = b""
                skipping = True
        if pending and damage is None:
            damage = _incomplete(line_start, expect, pending)
        if left and (damage is None or not damage.corrupt):
            # A batch that never completed: what a crash in the middle of its write
            # leaves (a prefix of it, a hole), or a write still being copied in.  None
            # of it was committed: the tail begins at its first record.
            reason = f"an incomplete batch: {len(held)} of {len(held) + left} records landed"
            if damage is not None:
                reason = f"{reason}, then {damage.reason}"
            damage = Damage(batch_start, batch_seq, reason, False)
        if damage is not None:
            self.damage = damage._replace(tail_bytes=pos - damage.offset)

    def _explain(
        self, line: bytes, offset: int, expected: int
    ) -> tuple[Record | None, int, Damage | None]:
        """The slow path for a line the fast path refused: a valid record after all (an
        int ts, say; with its batch mark), a damaged line, a corrupt one, or a newer
        format (raised)."""
        try:
            record, more = decode_marked(line, expected)
            return record, more, None
        except LineProblem as problem:
            reason, corrupt = problem.reason, problem.checks
            if not corrupt and not _torn_shape(line, offset):
                reason, corrupt = f"{reason}; {_WHOLE}", True
            # A whole line a tear leaves holds NULs of sectors that never landed.
            hole = not corrupt
            held = None if corrupt else _held_seq(line)
            if held is not None and not (hole and held > expected):
                reason, corrupt = f"{reason}; a valid record follows inside the same line", True
            if hole and not corrupt:
                reason = f"{reason} on sector boundaries (a write that never completed)"
            top = max(held or 0, expected)
            return None, 0, Damage(offset, expected, reason, corrupt, hole=hole, top=top)
        except FormatVersionError as exc:
            raise FormatVersionError(
                exc.message, segment=self.path, offset=offset, seq=expected
            ) from None


def _broken_mark(offset: int, seq: int, left: int, more: int) -> Damage:
    """A valid record that is not the one its batch's mark announced: no writer leaves
    it (a batch is written whole, in one write, its marks counting down to its last
    record), so it is corruption."""
    said = "its last record" if left == 1 else f"a record marked more:{left - 1}"
    got = f"more:{more}" if more else "no mark"
    return Damage(
        offset,
        seq,
        f"a broken batch mark: the record before it announced {said}, this one has {got}",
        True,
    )


_WHOLE = "a whole line that no torn write leaves (see docs/journal-format.md)"
_NUL_RUN = rb"\0+"  # (only a line with a NUL gets here)


def _torn_shape(line: bytes, offset: int) -> bool:
    """Can a torn write leave ``line``, a whole line (a newline follows it) at byte
    ``offset`` that does not check?  Only with NULs in it, in runs that are sectors of
    the write that never landed: each run begins where the line does or at a sector
    boundary, and ends at one (where the next sector, which landed, begins).

    Why: the writer writes records only (no NUL in them), over zeros, and a crash leaves
    a prefix of the write (no newline at its end: never a whole line) or sectors of it
    that never landed (they read as NULs).  A whole line with no NUL landed whole as
    written: if it does not check, it was damaged after it was written (a committed
    record with a flipped bit) or written by something else; one whose NULs do not sit
    on sector boundaries was damaged too (a flipped bit turns a space into a NUL).
    Cutting such a line could erase a committed record: it is corruption."""
    nul = line.find(b"\0")
    if nul < 0:
        return False
    import re  # (not on run's start-up path: journal._json says why)

    for run in re.compile(_NUL_RUN).finditer(line, nul):
        start, end = run.span()
        if (start and (offset + start) % SECTOR_BYTES) or (offset + end) % SECTOR_BYTES:
            return False
    return True


def _whole_bad_line(damage: Damage, offset: int) -> Damage:
    """``damage`` (not corrupt so far) made corruption by the whole line at ``offset``,
    which does not check and which no torn write leaves (``_torn_shape``)."""
    if damage.offset == offset:
        return damage._replace(corrupt=True, reason=f"{damage.reason}; {_WHOLE}")
    return damage._replace(
        corrupt=True,
        reason=f"{damage.reason}; a whole line that does not check follows at byte {offset}",
    )


def _incomplete(offset: int, seq: int, data: bytes) -> Damage:
    """The damage of ``data``, the bytes after the last line (no newline after them,
    no NUL at their end).  A tear leaves a prefix of what was written: never a record
    that checks followed by a byte other than its newline (a flipped newline)."""
    if len(data) > _TAIL_BYTES and line_checks(data[:-1]):
        return Damage(offset, seq, "a record whose newline is damaged", True)
    return Damage(offset, seq, "incomplete last line", False)


def _zeros_to_end(fd: int, pos: int) -> bool:
    """Is every byte of the file from ``pos`` on a NUL?"""
    while chunk := _fsutil.pread(fd, CHUNK_BYTES, pos):
        if chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def scan_all(scan: SegmentScan) -> None:
    """Run a scan to its end, discarding the records."""
    for _ in scan.runs():
        pass


def damage_error(damage: Damage, path: str, *, last: bool) -> CorruptionError:
    where = "" if last else " in a sealed segment"
    return CorruptionError(
        f"bad record{where}: {damage.reason}", segment=path, offset=damage.offset, seq=damage.seq
    )


if TYPE_CHECKING:

    class TornTail(NamedTuple):
        segment: str
        offset: int  # where the valid records end and the tail begins
        seq: int  # the seq a record there would have
        tail_bytes: int
        reason: str

else:
    TornTail = namedtuple("TornTail", ("segment", "offset", "seq", "tail_bytes", "reason"))
