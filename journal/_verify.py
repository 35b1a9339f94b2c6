"""verify(directory): check every record and snapshot; never modifies anything."""

from __future__ import annotations

from dataclasses import dataclass, field

from journal import _fsutil
from journal._errors import CorruptionError
from journal._reader import TornTail
from journal._segment import no_journal
from journal._snapshot import latest_snapshot
from journal._survey import survey

CLEAN = "clean"
TORN_TAIL = "torn_tail"
CORRUPT = "corrupt"


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found.  ``status`` is ``"clean"``, ``"torn_tail"`` (``torn_tail``
    says where and how many bytes; ``repair`` cuts it) or ``"corrupt"`` (``corruption``
    is the error, with segment, offset and seq)."""

    status: str
    first_seq: int  # first record on disk (> 1 after compaction)
    last_seq: int  # last valid record (before any damage)
    segments: tuple[str, ...]
    torn_tail: TornTail | None = None
    corruption: CorruptionError | None = None
    snapshot_seq: int | None = None  # newest valid snapshot
    damaged_snapshots: tuple[tuple[str, str], ...] = field(default=())

    @property
    def clean(self) -> bool:
        return self.status == CLEAN


def verify(directory: _fsutil.StrPath) -> VerifyReport:
    """Read every segment and snapshot of the journal at ``directory``.

    Lock-free and read-only: an append in progress in another process shows as a torn
    tail.  Raises JournalError if ``directory`` does not exist and FormatVersionError
    for records written by a newer format."""
    directory = _fsutil.fspath(directory)
    try:
        _fsutil.listdir(directory)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise no_journal(directory, exc) from None
    found = survey(directory)
    paths = tuple(segment.path for segment in found.segments)
    corruption = found.corruption
    snapshot_seq: int | None = None
    damaged: tuple[tuple[str, str], ...] = ()
    try:
        latest = latest_snapshot(directory, found.last_seq)
        damaged = tuple(latest.damaged)
        snapshot_seq = latest.snapshot.seq if latest.snapshot is not None else None
    except CorruptionError as exc:
        corruption = corruption or exc
    if corruption is None and found.first_seq > 1 and (snapshot_seq or 0) < found.first_seq - 1:
        corruption = CorruptionError(
            f"records before seq {found.first_seq} are missing and no valid snapshot covers them",
            segment=found.segments[0].path,
            offset=0,
            seq=found.first_seq - 1,
        )
    if corruption is not None:
        status = CORRUPT
    elif found.torn is not None:
        status = TORN_TAIL
    else:
        status = CLEAN
    return VerifyReport(
        status,
        found.first_seq,
        found.last_seq,
        paths,
        found.torn if status == TORN_TAIL else None,
        corruption,
        snapshot_seq,
        damaged,
    )
