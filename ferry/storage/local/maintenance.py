"""``ferry journal verify|repair|dump|salvage``: thin wrappers over ``journal``.

They work on the directory directly (not through the store), so they still answer when
the journal is too damaged to open; ``verify`` and ``dump`` only read (they work on a
directory ferry may not write), ``salvage`` is in :mod:`ferry.storage.local.salvage`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

import journal
from ferry.core.errors import EX_JOURNAL, FerryError, JournalIntegrityError
from ferry.storage.local.store import Store, check_indexes, check_table, journal_error
from journal import _json


def verify(directory: str | os.PathLike[str]) -> dict[str, Any]:
    directory = Path(directory)
    if not directory.exists():  # (a reader makes nothing: no journal yet is an empty one)
        return {"status": "clean", "records": 0, "first_seq": 1, "last_seq": 0,
                "segments": [], "snapshot_seq": None, "damaged_snapshots": [],
                "exit_code": 0, "anomalies": []}  # fmt: skip
    try:
        report = journal.verify(directory)
    except journal.JournalError as error:
        raise journal_error(error) from error
    records = report.last_seq - report.first_seq + 1
    out: dict[str, Any] = {
        "status": {"clean": "clean", "torn_tail": "torn", "corrupt": "corrupt"}[report.status],
        "records": max(records, 0),
        "first_seq": report.first_seq,
        "last_seq": report.last_seq,
        "segments": [str(p) for p in report.segments],
        "snapshot_seq": report.snapshot_seq,
        "damaged_snapshots": [{"path": str(p), "why": why} for p, why in report.damaged_snapshots],
        "exit_code": 0,
    }
    if report.torn_tail is not None:
        torn = report.torn_tail
        out["torn"] = {
            "segment": str(torn.segment),
            "offset": torn.offset,
            "bytes": torn.tail_bytes,
            "seq": torn.seq,
            "reason": torn.reason,
        }
    if report.corruption is not None:
        out["error"] = journal_error(report.corruption).to_json()
        out["exit_code"] = EX_JOURNAL
        return out
    mismatch, anomalies = _check_with_ferry(directory.parent)
    if mismatch is not None:
        out.update(status="corrupt", error=mismatch.to_json(), exit_code=EX_JOURNAL)
    else:
        out["anomalies"] = anomalies
    return out


def _check_with_ferry(home: Path) -> tuple[FerryError | None, list[dict[str, Any]]]:
    """The journal library found the records intact; can ferry read them: the snapshot,
    the settled-task archives it names, every task (else every command that needs
    history fails)? And which records did the fold skip (a sound line whose event is
    illegal or malformed: every command goes on without them, verify names them)?"""
    try:
        store = Store.open(home, read_only=True)
    except JournalIntegrityError as error:
        return error, []
    try:
        check_table(store.table)
        check_indexes(home, store.wal.latest_snapshot())
        return None, [anomaly.to_json() for anomaly in store.table.anomalies]
    except JournalIntegrityError as error:
        return error, []
    finally:
        store.close()


def repair(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Cut a torn tail; refuse (exit 4) a journal that ``verify`` finds corrupt, whether
    or not the library's repair looked there (a damaged snapshot, a missing first
    segment, a snapshot ferry cannot read): "nothing to repair" must not read as clean."""
    try:
        report = journal.repair(directory)
    except journal.JournalError as error:
        raise journal_error(error) from error
    if not report.repaired:
        checked = verify(directory)
        if checked["exit_code"] == EX_JOURNAL:
            found = checked["error"]
            raise JournalIntegrityError(
                f"nothing repair may cut, and the journal is corrupt: {found['message']}",
                code=found["code"],
                details=found["details"],
            )
    return {
        "repaired": report.repaired,
        "segment": None if report.segment is None else str(report.segment),
        "offset": report.offset,
        "cut_bytes": report.bytes_cut,
        "broken_copy": None if report.broken_copy is None else str(report.broken_copy),
        "last_seq": report.last_seq,
    }


def dump(directory: str | os.PathLike[str], from_seq: int, out: BinaryIO) -> None:
    """Every record with seq >= from_seq as JSON Lines (snapshot-covered records that
    were compacted away are not there: the dump starts at the first one on disk).

    Reads the directory without a lock (an append in progress ends it quietly) and
    writes nothing. A damaged journal is dumped up to its damage; then the damage is
    raised (``journal.corrupt``, exit 4), naming it."""
    directory = Path(directory)
    last = 0
    if not directory.exists():
        return  # (no journal yet: nothing to dump, and nothing made)
    try:
        try:
            for record in journal.read_records(directory, from_seq):
                _dump_line(record, out)
                last = record.seq
        except journal.CompactedError as error:
            if last:
                raise
            for record in journal.read_records(directory, max(from_seq, error.first_seq)):
                _dump_line(record, out)
                last = record.seq
    except journal.JournalError as error:
        out.flush()
        found = journal_error(error)
        if isinstance(found, JournalIntegrityError):
            upto = f"up to seq {last}" if last else "nothing"
            found.message = f"the journal is damaged: {error}; dumped {upto}"
        raise found from error
    out.flush()


def _dump_line(record: journal.Record, out: BinaryIO) -> None:
    line = {
        "seq": record.seq,
        "epoch": record.epoch,
        "ts": record.ts,
        "type": record.type,
        "data": record.data,
    }
    out.write(_json.dumps(line) + b"\n")
