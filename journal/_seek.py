"""Find the line of a given seq in a segment without reading the lines before it.

A record's line never holds a raw newline (orjson escapes it) nor a NUL byte, and a line
whose checksum matches is a record the writer wrote, where it wrote it.  So a probe at
any byte offset finds the next line boundary, and the record that starts there tells
its seq.  Bisecting on probes finds the line of a seq in about log2(segment / PROBE)
reads: a start-up that a snapshot covers up to seq S, or a read from seq S, then scans
from S's line instead of from the segment's first byte (8 MiB segments hold tens of
thousands of records).

The lines skipped are not checked, as the sealed segments a snapshot covers are not
(``verify`` reads everything).  Anything unexpected (a probe finding a line that does
not check, a line longer than a probe, seqs that do not follow) gives up, and the
caller reads the segment from its start, where the reader meets and explains it.
"""

from __future__ import annotations

from journal import _fsutil
from journal._codec import LINE_HEAD, line_checks

PROBE_BYTES = 8 << 10


def _seq_of(line: bytes) -> int | None:
    """The seq of a checked v1 line (None: another format; the reader will say so)."""
    if not line.startswith(LINE_HEAD):
        return None
    digits = line[len(LINE_HEAD) : line.find(b",", len(LINE_HEAD))]
    return int(digits) if digits.isdigit() and len(digits) <= 20 else None


def _line_from(fd: int, offset: int) -> tuple[int, int] | None:
    """(start, seq) of the first record line starting at or after ``offset`` (> 0);
    (-1, 0) if NUL bytes come first (the zero tail, or damage: either way no record
    starts there); None if the probe cannot tell (a line longer than a probe, bytes
    that do not check)."""
    data = _fsutil.pread(fd, PROBE_BYTES, offset - 1)
    newline = data.find(b"\n")
    nul = data.find(b"\0")
    if not data or (nul >= 0 and (newline < 0 or nul <= newline + 1)):
        return (-1, 0)
    end = data.find(b"\n", newline + 1)
    if newline < 0 or end < 0:
        return None
    line = data[newline + 1 : end]
    seq = _seq_of(line) if line_checks(line) else None
    return None if seq is None else (offset + newline, seq)


def find_line(fd: int, first_seq: int, target: int) -> int | None:
    """The byte offset of the line holding seq ``target`` in the segment open at ``fd``
    (its first record is ``first_seq``), or None if it could not be found for sure."""
    if target < first_seq:
        return None
    lo, lo_seq = 0, first_seq  # a line start holding a seq <= target
    hi = _fsutil.size(fd)  # no record line at or after hi holds a seq <= target
    while hi - lo > PROBE_BYTES:
        mid = (lo + hi) // 2
        found = _line_from(fd, mid)
        if found is None:
            return None
        start, seq = found
        if start >= 0 and seq <= target:
            lo, lo_seq = start, seq
        else:
            hi = mid
    return _walk(fd, lo, lo_seq, target)


def _walk(fd: int, offset: int, seq: int, target: int) -> int | None:
    """From the line at ``offset`` holding ``seq``, line by line to ``target``'s."""
    while True:
        data = _fsutil.pread(fd, PROBE_BYTES, offset)
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            line = data[start:end]
            if not line_checks(line) or _seq_of(line) != seq:
                return None
            if seq == target:
                return offset + start
            seq += 1
            start = end + 1
        if start == 0:  # no whole line in a probe: too long, or the end
            return None
        offset += start
