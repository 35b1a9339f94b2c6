"""Reading a whole journal directory: the survey (every segment, chain of seqs, damage
classification) and streaming records from any seq.  Per-segment scanning and the
damage rules live in ``_reader``."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator

from journal import _fsutil
from journal._codec import Record
from journal._errors import CompactedError, CorruptionError, TornTailError
from journal._reader import SegmentScan, TornTail, damage_error
from journal._seek import find_line
from journal._segment import Segment, check_next, list_segments, no_journal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple


if TYPE_CHECKING:

    class Survey(NamedTuple):
        """What a whole journal directory holds, read without changing anything."""

        segments: list[Segment]
        first_seq: int  # first seq on disk (1 when nothing was compacted)
        last_seq: int  # last valid record (first_seq - 1 if there is none)
        max_epoch: int
        end_offset: int  # end of the last valid record in the last segment
        torn: TornTail | None
        corruption: CorruptionError | None
        # With ``keep``: the records read, in seq order up to last_seq (from
        # covered_through + 1 or before), or () if there were more than KEEP_RECORDS_MAX.
        records: list[Record] | tuple[()] = ()
        # The last bytes before end_offset, as read (b"": no record was read there).
        tail: bytes = b""

else:
    Survey = namedtuple(
        "Survey",
        ("segments", "first_seq", "last_seq", "max_epoch", "end_offset", "torn", "corruption",
         "records", "tail"),
        defaults=((), b""),
    )  # fmt: skip

# A survey asked to keep its records drops them past this many (a journal no snapshot
# has covered for long): its reader then reads them again, as it would without them.
KEEP_RECORDS_MAX = 20_000


def survey(directory: str, *, covered_through: int = 0, keep: bool = False) -> Survey:
    """Scan the segments: chain of seqs, every record, damage classification.

    Records before ``covered_through`` (a snapshot covers them) are skipped: not read,
    not checked (``max_epoch`` then covers only what was read).  Whole segments are
    skipped by name, and in the first one read the scan starts at the line of
    ``covered_through`` when ``_seek`` finds it.  Lock-free: an append in progress in
    another process looks like a torn tail.  A segment removed by a concurrent
    compaction makes it start over (a few times).  ``keep``: the records read are
    kept in ``records`` (opening a journal hands them to its first subscriber, which
    would otherwise read and parse them again)."""
    for _attempt in range(5):
        try:
            return _survey_once(directory, covered_through, keep)
        except FileNotFoundError:
            continue
    return _survey_once(directory, covered_through, keep)


def _survey_once(directory: str, covered_through: int, keep: bool) -> Survey:
    segments = list_segments(directory)
    if not segments:
        return Survey([], 1, 0, 0, 0, None, None)
    kept: list[Record] | None = [] if keep else None
    first_seq = segments[0].first_seq
    start = 0
    while start + 1 < len(segments) and segments[start + 1].first_seq - 1 <= covered_through:
        start += 1
    next_seq, max_epoch, end_offset, tail = segments[start].first_seq, 0, 0, b""
    for index, segment in enumerate(segments):
        if index < start:
            continue
        last = index == len(segments) - 1
        if index > start:
            try:
                check_next(segments[index - 1], next_seq, segment)
            except CorruptionError as exc:
                return Survey(segments, first_seq, next_seq - 1, max_epoch, end_offset, None, exc)
        try:
            fd = _fsutil.open_read(segment.path)
        except IsADirectoryError:
            odd = CorruptionError(
                "a segment that is not a regular file",
                segment=segment.path,
                offset=0,
                seq=next_seq,
            )
            return Survey(segments, first_seq, next_seq - 1, max_epoch, end_offset, None, odd)
        try:
            scan = _scan_from(fd, segment, next_seq, covered_through if index == start else 0)
            for run in scan.runs():
                if kept is not None:
                    kept += run
                    if len(kept) > KEEP_RECORDS_MAX:
                        kept = None
        finally:
            _fsutil.close(fd)
        next_seq, end_offset, tail = scan.next_seq, scan.end_offset, scan.tail
        max_epoch = max(max_epoch, scan.max_epoch)
        damage = scan.damage
        if damage is not None:
            if last and not damage.corrupt:
                torn = TornTail(
                    segment.path, damage.offset, damage.seq, damage.tail_bytes, damage.reason
                )
                return Survey(
                    segments, first_seq, next_seq - 1, max_epoch, end_offset, torn, None,
                    kept or (), tail,
                )  # fmt: skip
            error = damage_error(damage, segment.path, last=last)
            return Survey(segments, first_seq, next_seq - 1, max_epoch, end_offset, None, error)
    return Survey(
        segments, first_seq, next_seq - 1, max_epoch, end_offset, None, None, kept or (), tail
    )


def _scan_from(fd: int, segment: Segment, next_seq: int, skip_to: int) -> SegmentScan:
    """A scan of ``segment`` from its start (where ``next_seq`` is expected), or from the
    line of seq ``skip_to`` when that is found (``_seek``): the lines before it are
    covered by a snapshot, or not asked for."""
    if skip_to > next_seq and (offset := find_line(fd, segment.first_seq, skip_to)) is not None:
        return SegmentScan(fd, segment.path, offset, skip_to)
    return SegmentScan(fd, segment.path, 0, next_seq)


def iter_records(
    directory: str, from_seq: int = 1, *, allow_torn_tail: bool = True
) -> Iterator[Record]:
    """Stream the records with seq >= ``from_seq``, checking what it reads (from the
    line of ``from_seq`` when ``_seek`` finds it, else from its segment's start).

    Stops quietly at a torn tail of the last segment (lock-free readers see an append
    in progress that way), or raises TornTailError there if not ``allow_torn_tail``;
    raises CorruptionError at corruption after yielding every valid record before it,
    and CompactedError if ``from_seq`` was compacted away."""
    from_seq = max(from_seq, 1)
    try:
        segments = list_segments(directory)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise no_journal(directory, exc) from None
    if not segments:
        return
    first_seq = segments[0].first_seq
    if from_seq < first_seq:
        raise CompactedError(
            f"records before seq {first_seq} were compacted; read from a snapshot",
            first_seq=first_seq,
            seq=from_seq,
        )
    start = 0
    for index, segment in enumerate(segments):
        if segment.first_seq <= from_seq:
            start = index
    next_seq = segments[start].first_seq
    for index in range(start, len(segments)):
        segment = segments[index]
        last = index == len(segments) - 1
        if index > start:
            check_next(segments[index - 1], next_seq, segment)
        try:
            fd = _fsutil.open_read(segment.path)
        except FileNotFoundError:
            raise CompactedError(
                f"segment {_fsutil.name(segment.path)} was compacted while being read",
                first_seq=segment.first_seq + 1,
                seq=next_seq,
            ) from None
        try:
            scan = _scan_from(fd, segment, next_seq, from_seq if index == start else 0)
            for run in scan.runs():
                if run[0].seq < from_seq:  # (only in the segment where from_seq is)
                    run = run[from_seq - run[0].seq :]
                yield from run
        finally:
            _fsutil.close(fd)
        next_seq = scan.next_seq
        if scan.damage is not None:
            damage = scan.damage
            if last and not damage.corrupt:
                if allow_torn_tail:
                    return
                raise TornTailError(
                    f"torn tail: {damage.reason}",
                    segment=segment.path,
                    offset=damage.offset,
                    seq=damage.seq,
                    tail_bytes=damage.tail_bytes,
                )
            raise damage_error(scan.damage, segment.path, last=last)
