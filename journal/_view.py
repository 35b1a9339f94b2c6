"""What is readable of a damaged journal: a base, then every record after it up to the
first damage.  For readers that must show what they can (``Journal.open_view``) and
for ``salvage``, which writes a new journal from it.  Reads only; takes no lock.

The base is the newest snapshot that passes its checks (and the caller's ``accept``,
which may also rewrite its data), whose records after it are on disk and which is not
beyond the journal's records; else seq 0 (an empty state) when the journal still
starts at seq 1.  From the base on, records are read as ever (every line checked, the
seqs gap-free across segments) up to the first damage.  Damage *before* the base (in
records the snapshot covers) limits nothing: the line of the base's next seq is found
past it (by bisection, else line by line, taking only a line that checks and holds
that seq), and the damage is reported as ``covered``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from journal import _fsutil
from journal._codec import LineProblem, Record, decode_line, line_checks
from journal._errors import CorruptionError, FormatVersionError, JournalError
from journal._reader import CHUNK_BYTES, SegmentScan, TornTail, damage_error, scan_all
from journal._seek import find_line
from journal._segment import Segment, check_next, list_segments
from journal._snapshot import Snapshot, SnapshotDamaged, load_snapshot, snapshots_in
from journal._survey import survey


class SnapshotRejected(JournalError):
    """Raised by an ``accept`` hook: the caller cannot use this snapshot (why)."""

    code = "journal.snapshot_rejected"


# accept(snapshot) -> the data to use for it (its own, or rewritten); SnapshotRejected
# if the caller cannot use it.
Accept = Callable[[Snapshot], bytes]


class Piece(NamedTuple):
    """A run of the view's records in one segment: bytes ``start..end`` of ``segment``
    hold exactly the records ``first_seq..last_seq``."""

    segment: str
    first_seq: int
    last_seq: int
    start: int
    end: int


class View(NamedTuple):
    base: Snapshot | None  # with the data ``accept`` returned; None: from seq 1
    base_path: str | None
    base_epoch_max: int
    first_seq: int  # first seq on disk
    last_seq: int  # the view's last record (the base's seq when none follows it)
    max_epoch: int  # over the base and the view's records
    pieces: tuple[Piece, ...]  # where the records after the base are, in order
    damage: CorruptionError | None  # what ends the view (the first damage after the base)
    covered: CorruptionError | None  # damage in records the base covers
    torn: TornTail | None  # a torn tail ends it (not damage: an append in progress)
    skipped: tuple[tuple[str, str], ...]  # damaged snapshots passed over, and why
    # Sound ones passed over (damage): (path, why, "beyond" the records or "rejected"
    # by ``accept``).
    unusable: tuple[tuple[str, str, str], ...]
    highest_seq: int  # the highest seq of any record line that checks, past damage too
    rewritten: bool = False  # ``accept`` changed the base's data (left damage out)

    @property
    def base_seq(self) -> int:
        return 0 if self.base is None else self.base.seq

    @property
    def damaged(self) -> bool:
        """Is anything of the journal damaged (a salvage would change something)?"""
        found = self.damage is not None or self.covered is not None
        return found or bool(self.unusable) or self.rewritten


def lenient_records(directory: str) -> Iterator[Record]:
    """Every line of every segment that checks and decodes as a record, whatever its
    seq and whatever lies around it (damage is stepped over, never explained): what a
    damaged journal still says past its damage, for a report of what salvage drops."""
    for segment in list_segments(directory):
        try:
            fd = _fsutil.open_read(segment.path)
        except (FileNotFoundError, IsADirectoryError):
            continue
        try:
            yield from _lenient_lines(fd)
        finally:
            _fsutil.close(fd)


def _lenient_lines(fd: int) -> Iterator[Record]:
    pos, pending = 0, b""
    while chunk := _fsutil.pread(fd, CHUNK_BYTES, pos):
        pos += len(chunk)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        if len(pending) > (64 << 20):
            pending = b""  # no record is that long (see _reader.LINE_BYTES_MAX_READ)
        for line in lines:
            if line_checks(line):
                try:
                    yield decode_line(line)
                except (LineProblem, FormatVersionError):
                    continue


def _line_of(fd: int, first_seq: int, target: int) -> int | None:
    """The offset of the line holding ``target`` in a segment that starts at
    ``first_seq``: by bisection, else line by line, stepping over lines that do not
    check (covered damage).  None if no line that checks holds it."""
    if target == first_seq:
        return 0
    found = find_line(fd, first_seq, target)
    if found is not None:
        return found
    pos, offset, pending = 0, 0, b""
    while chunk := _fsutil.pread(fd, CHUNK_BYTES, pos):
        pos += len(chunk)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line_checks(line):
                try:
                    seq = decode_line(line).seq
                except (LineProblem, FormatVersionError):
                    seq = 0
                if seq == target:
                    return offset
                if seq > target:
                    return None
            offset += len(line) + 1
    return None


Skips = list[tuple[str, str]]
Refusals = list[tuple[str, str, str]]


def _pick_base(
    directory: str, first_on_disk: int, highest: int, accept: Accept | None
) -> tuple[Snapshot | None, str | None, int, Skips, Refusals]:
    """The newest usable snapshot; the damaged ones skipped (a failed checksum: the
    journal has always fallen back past those), and the sound ones refused (beyond
    the records, or by ``accept``: damage)."""
    skipped: Skips = []
    unusable: Refusals = []
    for seq, path in reversed(snapshots_in(_fsutil.listdir(directory), directory)):
        try:
            snapshot, epoch_max = load_snapshot(path, seq)
        except SnapshotDamaged as exc:
            skipped.append((path, str(exc)))
            continue
        except FileNotFoundError:
            continue  # removed by a concurrent compaction: a newer one superseded it
        if seq < first_on_disk - 1:
            skipped.append((path, f"the records after it (from seq {seq + 1}) are gone"))
            continue
        if seq > highest:
            unusable.append((path, f"beyond the journal's last record, {highest}", "beyond"))
            continue
        if accept is not None:
            try:
                snapshot = Snapshot(seq, accept(snapshot))
            except SnapshotRejected as exc:
                unusable.append((path, exc.message, "rejected"))
                continue
        return snapshot, path, epoch_max, skipped, unusable
    return None, None, 0, skipped, unusable


def _stored_data(path: str, seq: int) -> bytes | None:
    try:
        return load_snapshot(path, seq)[0].data
    except (SnapshotDamaged, FileNotFoundError):
        return None


def readable(directory: _fsutil.StrPath, accept: Accept | None = None) -> View:
    """The view of the journal at ``directory`` (see the module docstring)."""
    directory = _fsutil.fspath(directory)
    try:
        segments = list_segments(directory)
    except FileNotFoundError:
        return View(None, None, 0, 1, 0, 0, (), None, None, None, (), (), 0)
    first_on_disk = segments[0].first_seq if segments else 1
    full = survey(directory)
    highest = max(full.last_seq, max((r.seq for r in lenient_records(directory)), default=0))
    picked = _pick_base(directory, first_on_disk, highest, accept)
    base, base_path, epoch_max, skipped, unusable = picked
    # (``accept`` left something out of the base, a damaged archive say: damage too)
    rewritten = False
    if base is not None and base_path is not None and accept is not None:
        rewritten = _stored_data(base_path, base.seq) != base.data
    base_seq = 0 if base is None else base.seq
    covered = full.corruption
    if covered is not None and (covered.seq or 0) > base_seq:
        covered = None  # (it is the view's own damage: found again below)

    def view(
        last: int,
        top: int,
        pieces: list[Piece],
        damage: CorruptionError | None,
        torn: TornTail | None = None,
    ) -> View:
        known = full.corruption
        if damage is not None and damage.offset is None and known and known.seq == damage.seq:
            damage = known  # (the same damage, said with its offset)
        return View(base, base_path, epoch_max, first_on_disk, last, max(epoch_max, top),
                    tuple(pieces), damage, covered, torn, tuple(skipped), tuple(unusable),
                    highest, rewritten)  # fmt: skip

    if base is None and first_on_disk > 1:
        lost = CorruptionError(
            f"records before seq {first_on_disk} are gone and no usable snapshot covers them",
            segment=segments[0].path,
            offset=0,
            seq=first_on_disk - 1,
        )
        return view(0, 0, [], lost)
    start = base_seq + 1
    index = max((i for i, s in enumerate(segments) if s.first_seq <= start), default=-1)
    if index < 0:
        return view(base_seq, 0, [], None)  # no segment holds anything after the base
    return _read_on(segments, index, start, base_seq, highest, view)


ViewMaker = Callable[..., View]


def _read_on(
    segments: list[Segment], index: int, start: int, base_seq: int, highest: int, view: ViewMaker
) -> View:
    """Every record from ``start`` (in ``segments[index]``) on, up to the first damage."""
    pieces: list[Piece] = []
    next_seq, top = start, 0
    for i in range(index, len(segments)):
        segment, last = segments[i], i == len(segments) - 1
        if i > index:
            try:
                check_next(segments[i - 1], next_seq, segment)
            except CorruptionError as exc:
                return view(next_seq - 1, top, pieces, exc)
        try:
            fd = _fsutil.open_read(segment.path)
        except (FileNotFoundError, IsADirectoryError) as exc:
            odd = CorruptionError(f"segment unreadable: {exc}", segment=segment.path, seq=next_seq)
            return view(next_seq - 1, top, pieces, odd)
        try:
            offset = 0 if i > index else _line_of(fd, segment.first_seq, start)
            if offset is None:
                follows = i + 1 < len(segments) and segments[i + 1].first_seq == start
                if follows or highest < start:
                    continue  # it starts the next segment; or nothing follows the base
                missing = CorruptionError(
                    f"the record after the snapshot at seq {base_seq} is damaged or missing",
                    segment=segment.path,
                    seq=start,
                )
                return view(base_seq, top, pieces, missing)
            scan = SegmentScan(fd, segment.path, offset, next_seq)
            scan_all(scan)
        finally:
            _fsutil.close(fd)
        if scan.next_seq > next_seq:
            pieces.append(Piece(segment.path, next_seq, scan.next_seq - 1, offset, scan.end_offset))
        next_seq, top = scan.next_seq, max(top, scan.max_epoch)
        if scan.damage is not None:
            if last and not scan.damage.corrupt:
                torn = TornTail(segment.path, scan.damage.offset, scan.damage.seq,
                                scan.damage.tail_bytes, scan.damage.reason)  # fmt: skip
                return view(next_seq - 1, top, pieces, None, torn)
            return view(next_seq - 1, top, pieces, damage_error(scan.damage, segment.path,
                                                                 last=last))  # fmt: skip
    return view(next_seq - 1, top, pieces, None)


def view_records(view: View, after_seq: int = 0) -> Iterator[Record]:
    """The records of ``view`` with seq > ``after_seq``, read again from its pieces."""
    for piece in view.pieces:
        if piece.last_seq <= after_seq:
            continue
        fd = _fsutil.open_read(piece.segment)
        try:
            scan = SegmentScan(fd, piece.segment, piece.start, piece.first_seq)
            for record in scan.records():
                if record.seq > piece.last_seq:
                    break
                if record.seq > after_seq:
                    yield record
        finally:
            _fsutil.close(fd)
