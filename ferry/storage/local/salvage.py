"""``ferry journal salvage``: the operator's way out of a damaged journal.

``journal.salvage`` moves the damaged journal aside whole (``journal.damaged-<UTC
time>/``, never deleted) and writes a new one from every record before the damage (its
newest usable snapshot, then the records after it up to the damage). What ferry adds:

* which snapshot is usable: one that is a task table this ferry reads and whose
  settled-task archives are all there and match their SHA-256. When none is, and the
  records before the journal's first segment are gone (so no older state can be read
  again), the newest that decodes is used without its damaged archives: their settled
  tasks are lost, and reported;
* ``compact.lock``, so that no compaction writes a snapshot or prunes archives while
  the journal is swapped;
* what was lost, as the user sees it: the records after the damage (how many, and how
  many of them could still be read), and each task those readable records moved whose
  state is now older (its state before and after) or that is gone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import journal
from ferry.core.errors import EX_TEMPFAIL, FerryError, JournalIntegrityError, RefusedError
from ferry.core.model import Task
from ferry.failpoints import failpoint
from ferry.storage.local.store import (
    Store,
    _lock_compaction,
    _read_archive,
    journal_error,
    snapshot_refs,
    view_damage,
)
from journal import _json

# Other processes with the journal open make salvage refuse (they could write into
# the damaged copy): a reader holds it a moment, so look again a few times first.
IN_USE_TRIES = 20
IN_USE_PAUSE_S = 0.1


def salvage(
    home: str | os.PathLike[str], *, dry_run: bool, on_lock_wait: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Salvage ``home``'s journal (``dry_run``: say what it would do; change nothing)."""
    home = Path(home)
    directory = home / "journal"
    if not directory.exists():
        raise RefusedError("there is no journal to salvage", code="salvage.not_damaged")
    dropped: dict[str, list[Mapping[str, Any]]] = {}
    accept = _acceptor(home, None)
    try:
        probe = journal.readable(directory, accept)
    except journal.JournalError as error:
        raise journal_error(error) from error
    if probe.base is None and probe.first_seq > 1:
        # No older state is left: keep what decodes (and, before the swap, a second
        # name for each damaged archive it leaves out).
        accept = _acceptor(home, dropped, keep=not dry_run)
    with _compaction_held(home, dry_run, on_lock_wait):
        report = _salvage(directory, accept, dry_run, on_lock_wait)
    return _describe(home, report, accept, dry_run, dropped)


def _salvage(
    directory: Path,
    accept: journal.Accept,
    dry_run: bool,
    on_lock_wait: Callable[[], None] | None,
) -> journal.SalvageReport:
    import time

    for attempt in range(IN_USE_TRIES):
        try:
            return journal.salvage(directory, accept=accept, dry_run=dry_run, hook=failpoint,
                                   on_lock_wait=on_lock_wait)  # fmt: skip
        except journal.SalvageRefusedError as error:
            if error.code == "journal.salvage_in_use" and attempt + 1 < IN_USE_TRIES:
                time.sleep(IN_USE_PAUSE_S)
                continue
            raise _refusal(error) from error
        except journal.JournalError as error:
            raise journal_error(error) from error
    raise AssertionError("unreachable")


def _refusal(error: journal.SalvageRefusedError) -> FerryError:
    details = dict(error.details)
    if error.code == "journal.salvage_torn":
        return RefusedError(
            f"{error.message}; run 'ferry journal repair' (salvage is for damage)",
            code="salvage.torn_tail",
            details=details,
        )
    if error.code == "journal.salvage_in_use":
        return FerryError(str(error), code="salvage.in_use", details=details,
                          exit_code=EX_TEMPFAIL)  # fmt: skip
    return RefusedError(
        f"{error.message}: nothing to salvage ('ferry journal verify' says what it holds)",
        code="salvage.not_damaged",
        details=details,
    )


@contextlib.contextmanager
def _compaction_held(
    home: Path, dry_run: bool, on_wait: Callable[[], None] | None
) -> Iterator[None]:
    """``compact.lock`` for the salvage: no compaction may write a snapshot (into the
    journal being swapped) or prune an archive meanwhile."""
    if dry_run:
        yield
        return
    fd = os.open(home / "compact.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)  # fmt: skip
    try:
        _lock_compaction(fd, True, on_wait)
        yield
    finally:
        os.close(fd)


def _acceptor(
    home: Path, dropped: dict[str, list[Mapping[str, Any]]] | None, *, keep: bool = False
) -> journal.Accept:
    """A snapshot is usable if it is a task table this ferry reads and every archive it
    names is there and matches. With ``dropped``: a damaged archive is left out of the
    snapshot's data instead (what could still be read of it goes into ``dropped``;
    ``keep``: and it gets a second name, ``_keep_archives``: salvage calls this under
    its locks, before the swap)."""

    def accept(snapshot: journal.Snapshot) -> bytes:
        refs = snapshot_refs(snapshot)
        bad: list[str] = []
        for name, sha256 in refs:
            try:
                for _ in _read_archive(str(home / "archive" / name), sha256):
                    pass
            except JournalIntegrityError as error:
                if dropped is None:
                    raise journal.SnapshotRejected(error.message) from error
                bad.append(name)
        if not bad:
            return snapshot.data
        assert dropped is not None
        for name in bad:
            dropped[name] = list(_readable_lines(home / "archive" / name))
        if keep:
            _keep_archives(home, bad)
        raw = _json.loads(snapshot.data)
        raw["settled_archives"] = [a for a in raw["settled_archives"] if a["name"] not in bad]
        # Its counts take in the tasks of the archives left out: not to be trusted now
        # (a table without them counts by loading its history; a compaction, once).
        raw.pop("settled_counts", None)
        return _json.dumps(raw)

    return accept


DAMAGED_PREFIX = "damaged-"


def _keep_archives(home: Path, dropped: list[str]) -> None:
    """A second name for each archive the new snapshot leaves out, before the swap: the
    next compaction prunes the archives no snapshot names (``settled-*``), and the
    damaged one is evidence, never deleted."""
    directory = home / "archive"
    for name in dropped:
        with contextlib.suppress(FileExistsError, FileNotFoundError):
            os.link(directory / name, directory / (DAMAGED_PREFIX + name))
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _readable_lines(path: Path) -> Iterator[Mapping[str, Any]]:
    """What still parses of a damaged archive (not checked: its hash failed)."""
    with contextlib.suppress(OSError):
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                record = _json.loads(line)
                if isinstance(record, dict) and isinstance(record.get("id"), str):
                    yield record


def _describe(
    home: Path,
    report: journal.SalvageReport,
    accept: journal.Accept,
    dry_run: bool,
    dropped: dict[str, list[Mapping[str, Any]]],
) -> dict[str, Any]:
    view = report.view
    out: dict[str, Any] = {
        "salvaged": not dry_run and report.aside is not None,
        "dry_run": dry_run,
        "damaged_copy": None if report.aside is None else str(report.aside),
        "finished": list(report.finished),
        "kept": {
            "snapshot_seq": view.base_seq if view.base is not None else None,
            "last_seq": view.last_seq,
        },
        "damage": [error.to_json() for error in view_damage(view, shown=False)],
        "lost_records": report.lost_seqs,
        "lost_readable": len(report.lost_records) - len(report.guessed),
        "lost_guessed": list(report.guessed),
        "lost_seqs": [view.last_seq + 1, view.last_seq + report.lost_seqs]
        if report.lost_seqs
        else None,
        "dropped_archives": sorted(dropped),
        "tasks": [],
    }
    if not report.finished or report.aside is not None or dry_run:
        out["tasks"] = _tasks_changed(home, report, accept, dry_run, dropped)
    return out


def _tasks_changed(
    home: Path,
    report: journal.SalvageReport,
    accept: journal.Accept,
    dry_run: bool,
    dropped: dict[str, list[Mapping[str, Any]]],
) -> list[dict[str, Any]]:
    """Each task the lost records (those still readable) or a dropped archive speak of,
    whose state in the new journal is older than they say, or that it lacks."""
    store = (
        Store.open_view(home, accept)
        if dry_run
        else Store.open(home, read_only=True, tolerate_damage=True)
    )
    try:
        table = store.table
        ids = [r.data["task"] for r in report.lost_records if isinstance(r.data.get("task"), str)]
        after = {task_id: table.get(task_id) for task_id in dict.fromkeys(ids)}
        for record in report.lost_records:
            table.apply_record(record)
        rows = []
        for task_id, now in after.items():
            said = table.get(task_id)
            if said is not None and (now is None or _moved(said, now)):
                rows.append(_row(task_id, _state(said), now, said.attempt))
        for lines in dropped.values():
            for line in lines:
                task_id = str(line["id"])
                if table.get(task_id) is None:
                    rows.append(_row(task_id, str(line.get("state")), None,
                                     int(line.get("attempt") or 1)))  # fmt: skip
        return rows
    finally:
        store.close()


def _moved(said: Task, now: Task) -> bool:
    return (said.state, said.attempt, said.reason) != (now.state, now.attempt, now.reason)


def _state(task: Task) -> str:
    return task.state.value


def _row(task_id: str, before: str, now: Task | None, attempt: int) -> dict[str, Any]:
    return {
        "task": task_id,
        "before": before,
        "attempt_before": attempt,
        "after": None if now is None else now.state.value,
        "attempt_after": None if now is None else now.attempt,
    }
