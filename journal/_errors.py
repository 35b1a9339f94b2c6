"""Errors of the journal: one base, stable dotted codes, each saying where it happened.

The tree::

    JournalError                 journal.error        base; also I/O trouble, misuse
    +-- CorruptionError          journal.corrupt      damage that is not a torn tail
    +-- CompactedError           journal.compacted    records asked for were compacted away
    +-- TornTailError            journal.torn_tail    a torn tail where none is allowed
    +-- FencedError              journal.fenced       epoch older than the journal's highest
    +-- WriterFailedError        journal.writer_failed  a write/fsync failed; handle unusable
    +-- TakenBackError           journal.taken_back   records this handle read are gone
    +-- RecordTooLargeError      journal.record_too_large
    +-- InvalidRecordError       journal.invalid_record  NaN/Infinity, non-JSON types, ...
    +-- FormatVersionError       journal.format_version  written by a newer format
    +-- JournalClosedError       journal.closed       the handle was closed
    +-- ReadOnlyError            journal.read_only    a write through a read-only handle
    +-- SalvageRefusedError      journal.salvage_*    salvage will not run (see _salvage)

Every error carries ``code``, ``message`` and where it happened: ``segment`` (a path or
None), ``offset`` (byte offset in that segment or None) and ``seq`` (the record's seq, or
the seq that was expected there, or None).  ``details`` is a JSON-able dict of all that.
"""

from __future__ import annotations

from journal import _fsutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class JournalError(Exception):
    """Base of every error raised by the journal package."""

    code: str = "journal.error"

    def __init__(
        self,
        message: str,
        *,
        segment: _fsutil.StrPath | None = None,
        offset: int | None = None,
        seq: int | None = None,
    ) -> None:
        self.message = message
        self.segment = _fsutil.fspath(segment) if segment is not None else None
        self.offset = offset
        self.seq = seq
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.segment is not None:
            where.append(f"segment {_fsutil.name(self.segment)}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        return f"{self.message} ({', '.join(where)})" if where else self.message

    @property
    def details(self) -> dict[str, Any]:
        return {
            "segment": str(self.segment) if self.segment is not None else None,
            "offset": self.offset,
            "seq": self.seq,
        }


class CorruptionError(JournalError):
    """Damage that is not a torn tail: a bad record followed by valid ones, a bad record
    in a sealed segment, a gap in seq, a missing segment, a damaged snapshot that is the
    only cover for compacted records.  Never skipped, never repaired automatically."""

    code = "journal.corrupt"


class CompactedError(JournalError):
    """Records below ``first_seq`` were removed by compaction; read from a snapshot."""

    code = "journal.compacted"

    def __init__(self, message: str, *, first_seq: int, seq: int | None = None) -> None:
        self.first_seq = first_seq
        super().__init__(message, seq=seq)

    @property
    def details(self) -> dict[str, Any]:
        return {**super().details, "first_seq": self.first_seq}


class TornTailError(JournalError):
    """A torn tail (incomplete or garbage bytes after the last valid record of the last
    segment) where the caller asked for a clean journal; ``repair`` cuts it."""

    code = "journal.torn_tail"

    def __init__(
        self,
        message: str,
        *,
        segment: _fsutil.StrPath | None = None,
        offset: int | None = None,
        seq: int | None = None,
        tail_bytes: int = 0,
    ) -> None:
        self.tail_bytes = tail_bytes
        super().__init__(message, segment=segment, offset=offset, seq=seq)

    @property
    def details(self) -> dict[str, Any]:
        return {**super().details, "tail_bytes": self.tail_bytes}


class FencedError(JournalError):
    """An append whose epoch is older than the highest epoch already in the journal."""

    code = "journal.fenced"

    def __init__(self, message: str, *, epoch: int, current_epoch: int) -> None:
        self.epoch = epoch
        self.current_epoch = current_epoch
        super().__init__(message)

    @property
    def details(self) -> dict[str, Any]:
        return {**super().details, "epoch": self.epoch, "current_epoch": self.current_epoch}


class WriterFailedError(JournalError):
    """A write or fsync failed (or the handle broke in some other way mid-commit).

    The handle is unusable from then on: every later call raises this.  The outcome of
    the append that failed is unknown (its records may or may not be on disk); reopen
    the journal and read to find out.  A failed fsync is never retried."""

    code = "journal.writer_failed"


class TakenBackError(JournalError):
    """Records this handle read are no longer where it read them: another process wrote
    them, its fdatasync failed, and it cut them off again (or someone cut the segment by
    hand).  The handle's view holds records that were never committed: it fails
    (every later call raises WriterFailedError, with this as its cause); reopen the
    journal to read it as it is."""

    code = "journal.taken_back"


class RecordTooLargeError(JournalError):
    """The encoded record line would exceed ``record_bytes_max``; nothing was written."""

    code = "journal.record_too_large"


class InvalidRecordError(JournalError):
    """The record cannot be encoded faithfully (NaN/Infinity, non-JSON types, non-str
    keys, bad type or epoch); nothing was written."""

    code = "journal.invalid_record"


class FormatVersionError(JournalError):
    """A record or snapshot written by a newer format version than this code reads."""

    code = "journal.format_version"


class JournalClosedError(JournalError):
    """The journal handle was closed."""

    code = "journal.closed"


class ReadOnlyError(JournalError):
    """A write (append, snapshot, compaction, sync) through a read-only handle."""

    code = "journal.read_only"


class SalvageRefusedError(JournalError):
    """``salvage`` will not run: the journal is not damaged (``journal.salvage_clean``),
    only torn at its end (``journal.salvage_torn``: that is ``repair``'s), or another
    handle has it open (``journal.salvage_in_use``).  Nothing was changed."""

    code = "journal.salvage_refused"

    def __init__(self, message: str, *, code: str, **where: Any) -> None:
        self.code = code
        super().__init__(message, **where)
