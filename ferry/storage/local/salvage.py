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
* the settled-task archives the new journal no longer names (``_left_out``: the kept
  snapshot's damaged or missing ones, and every one newer than the last record kept),
  each under a second name before the swap (``archive/damaged-*``, ``archive/kept-*``:
  compaction prunes only ``settled-*`` and ``index-*``);
* what was lost, as the user sees it: the records after the damage (how many, and how
  many of them could still be read); each task whose state is now older (its state
  before and after) or that is gone, by the newest that says it of the readable lost
  records and the archives left out; each archive left out (whole, damaged or
  missing, its tasks, where it is kept); and what cannot be known (``_unknown``),
  rather than a count that is too low.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    accept = _acceptor(home, lenient=False)
    try:
        probe = journal.readable(directory, accept)
    except journal.JournalError as error:
        raise journal_error(error) from error
    if probe.base is None and probe.first_seq > 1:
        # No older state is left: keep what decodes, without its damaged archives.
        accept = _acceptor(home, lenient=True)
    left_out: list[LeftOut] = []

    def keep(plan: journal.SalvageReport) -> None:
        # Under the locks, before the new journal is written (so before the swap):
        # once it is in use, compactions prune every archive it does not name.
        left_out[:] = _left_out(home, plan)
        _keep(home, left_out, make=True)

    with _compaction_held(home, dry_run, on_lock_wait):
        report = _salvage(directory, accept, dry_run, on_lock_wait, keep)
        if dry_run:
            left_out[:] = _left_out(home, report)
            _keep(home, left_out, make=False)
    return _describe(home, report, accept, dry_run, left_out)


def _salvage(
    directory: Path,
    accept: journal.Accept,
    dry_run: bool,
    on_lock_wait: Callable[[], None] | None,
    keep: Callable[[journal.SalvageReport], None],
) -> journal.SalvageReport:
    import time

    for attempt in range(IN_USE_TRIES):
        try:
            return journal.salvage(directory, accept=accept, dry_run=dry_run, hook=failpoint,
                                   on_lock_wait=on_lock_wait, keep=keep)  # fmt: skip
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


def _acceptor(home: Path, *, lenient: bool) -> journal.Accept:
    """A snapshot is usable if it is a task table this ferry reads and every archive it
    names is there and matches. ``lenient``: an archive that is missing or damaged is
    left out of the snapshot's data instead (``_left_out`` then finds it: it is kept
    aside, if it is there, and its tasks are named)."""

    def accept(snapshot: journal.Snapshot) -> bytes:
        refs = snapshot_refs(snapshot)
        bad: list[str] = []
        for name, sha256 in refs:
            try:
                for _ in _read_archive(str(home / "archive" / name), sha256):
                    pass
            except JournalIntegrityError as error:
                if not lenient:
                    raise journal.SnapshotRejected(error.message) from error
                bad.append(name)
        if not bad:
            return snapshot.data
        raw = _json.loads(snapshot.data)
        raw["settled_archives"] = [a for a in raw["settled_archives"] if a["name"] not in bad]
        # Its counts take in the tasks of the archives left out: not to be trusted now
        # (a table without them counts by loading its history; a compaction, once).
        raw.pop("settled_counts", None)
        return _json.dumps(raw)

    return accept


Said = tuple[str | None, int | None, str | None]  # a task's state, attempt and reason

# The second names of what the new journal no longer names (compaction prunes only
# ``settled-*`` and ``index-*``): ``damaged-`` for an archive that is damaged or lost
# (its index, when the archive is gone), ``kept-`` for one that is whole, or that
# nothing can check.
DAMAGED_PREFIX = "damaged-"
KEPT_PREFIX = "kept-"
_ARCHIVE = ("settled-", ".jsonl")
_INDEX = ("index-", ".idx")


@dataclasses.dataclass
class LeftOut:
    """A settled-task archive the damaged journal names, or may name, and the new one
    does not: what it holds, as far as can be known."""

    name: str
    seq: int  # of the compaction that wrote it (its name says): its tasks as of then
    dropped: bool  # the kept snapshot named it (it is damaged or missing)
    status: str  # whole, damaged, missing, or unverified (nothing to check it by)
    checked_by: str | None  # "sha256" (a readable snapshot's entry), "index", or None
    tasks: Sequence[Mapping[str, Any]]  # what it says of each task (its line, or its index)
    complete: bool  # ``tasks`` is every task it held
    count: int | None  # how many it held, if known
    kept_as: str | None = None  # its second name ("archive/..."), once made
    index_kept_as: str | None = None

    def to_json(self, lost: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "checked_by": self.checked_by,
            "tasks": self.count,
            "lost": lost,
            "kept_as": self.kept_as,
            "index_kept_as": self.index_kept_as,
        }


def _left_out(home: Path, plan: journal.SalvageReport) -> list[LeftOut]:
    """The archives the damaged journal names, or may name, that the new journal (the
    view) does not: the kept snapshot's own that it leaves out (damaged or missing),
    and every archive newer than the view's last record, named by a readable snapshot
    or found in ``archive/`` (an unreadable snapshot may name any of them). An archive
    not named by the new journal that is not newer holds nothing it lacks: the new
    journal holds every record up to the archive's compaction (or its base's
    archives, which took it in). Nor is one newer than the damaged journal's last
    record: an older journal's, which an earlier salvage kept aside (and said so: its
    journal started again at seq 1)."""
    view, end = plan.view, plan.view.last_seq + plan.lost_seqs  # (the damaged one's last)
    directory = home / "archive"
    kept = set(_archive_entries(view.base.data)) if view.base is not None else set()
    refs: dict[str, Mapping[str, Any]] = {}
    candidates: set[str] = set()
    dropped: set[str] = set()
    for snapshot in journal.read_snapshots(home / "journal"):  # (oldest first)
        entries = _archive_entries(snapshot.data)
        refs.update(entries)
        if view.base is not None and snapshot.seq == view.base.seq:
            dropped = set(entries) - kept
    candidates |= dropped
    candidates.update(name for name in refs if _seq_of(name) > view.last_seq)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(directory):
            name = _archive_of(entry)
            if name is not None and view.last_seq < _seq_of(name) <= end:
                candidates.add(name)
    return [
        _look_at(directory, name, refs.get(name), name in dropped)
        for name in sorted(candidates - kept)
    ]


def _archive_entries(data: bytes) -> dict[str, Mapping[str, Any]]:
    """name -> entry, of each archive a snapshot's data names ({} if it does not decode)."""
    try:
        raw = _json.loads(data)
        entries = raw.get("settled_archives") or []
        return {e["name"]: e for e in entries if _archive_of(e["name"]) == e["name"]}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def _archive_of(entry: object) -> str | None:
    """The archive a file of ``archive/`` belongs to (an archive's name, or its index's)."""
    if not isinstance(entry, str):
        return None
    for prefix, suffix in (_ARCHIVE, _INDEX):
        if entry.startswith(prefix) and entry.endswith(suffix):
            stem = entry[len(prefix) : -len(suffix)]
            if _seq_of(_ARCHIVE[0] + stem + _ARCHIVE[1]) >= 0:
                return _ARCHIVE[0] + stem + _ARCHIVE[1]
    return None


def _seq_of(name: str) -> int:
    """``settled-<seq:020d>-<hex>.jsonl`` -> seq (-1: not such a name)."""
    digits = name[len(_ARCHIVE[0]) : len(_ARCHIVE[0]) + 20]
    return int(digits) if len(digits) == 20 and digits.isdigit() else -1


def _look_at(directory: Path, name: str, entry: Mapping[str, Any] | None, dropped: bool) -> LeftOut:
    from ferry.storage.local.archive_index import index_made_of, index_tasks

    try:
        body: bytes | None = (directory / name).read_bytes()
    except OSError:
        body = None
    sha256 = entry.get("sha256") if entry is not None else None
    count = entry.get("count") if entry is not None else None
    count = count if isinstance(count, int) else None
    checked_by: str | None = None
    if body is None:
        status = "missing"
    elif isinstance(sha256, str):
        whole = hashlib.sha256(body).hexdigest() == sha256
        status, checked_by = ("whole" if whole else "damaged"), "sha256"
    elif index_made_of(str(directory), name, body):
        status, checked_by = "whole", "index"
    else:
        status = "unverified"
    lines = list(_readable_lines(body or b""))
    if status == "whole":
        return LeftOut(name, _seq_of(name), dropped, status, checked_by, lines, True, len(lines))
    # Its index, if whole, names every task it held (a line that no longer reads is
    # named by its entry, with the state it says; a line damaged in its id names no
    # task); else what either still says.
    indexed, complete = index_tasks(str(directory), name)
    said = {str(task["id"]): task for task in lines}
    if complete:
        tasks = [said.get(str(task["id"]), task) for task in indexed]
        count = len(indexed) if count is None else count
    else:
        by_id: dict[str, Mapping[str, Any]] = {str(task["id"]): task for task in indexed}
        tasks = list({**by_id, **said}.values())
    return LeftOut(name, _seq_of(name), dropped, status, checked_by, tasks, complete, count)


def _readable_lines(body: bytes) -> Iterator[Mapping[str, Any]]:
    """What still parses of an archive's lines (a damaged one's too: not checked)."""
    for line in body.splitlines():
        with contextlib.suppress(ValueError):
            record = _json.loads(line)
            if isinstance(record, dict) and isinstance(record.get("id"), str):
                yield record


def _keep(home: Path, left_out: list[LeftOut], *, make: bool) -> None:
    """A second name for each archive left out, and its index (``make``: else only
    the names it would get): the next compactions prune every ``settled-*`` and
    ``index-*`` file the newest two snapshots do not name, and these are history (or
    the evidence of its loss). Durable before the salvage writes anything."""
    from ferry.storage.local.archive_index import index_name
    from ferry.storage.local.statedir import fsync_dir

    directory = home / "archive"
    for item in left_out:
        prefix = DAMAGED_PREFIX if item.status in ("damaged", "missing") else KEPT_PREFIX
        item.kept_as = _second_name(directory, item.name, prefix, make)
        item.index_kept_as = _second_name(directory, index_name(item.name), prefix, make)
    if make and left_out:
        fsync_dir(directory)


def _second_name(directory: Path, name: str, prefix: str, make: bool) -> str | None:
    """``archive/<prefix><name>``, a hard link to ``name`` (one a salvage killed before
    it made already is that one); None if there is no such file to keep."""
    source = directory / name
    for n in range(100):
        target = prefix + name + (f".{n}" if n else "")
        try:
            if make:
                os.link(source, directory / target)
            elif not source.exists():
                return None
            elif (directory / target).exists():
                raise FileExistsError(target)
            return f"{directory.name}/{target}"
        except FileNotFoundError:
            return None
        except FileExistsError:
            with contextlib.suppress(OSError):
                if os.path.samefile(source, directory / target):
                    return f"{directory.name}/{target}"
    raise FerryError(f"cannot find a free second name for {source}", code="salvage.kept_name")


def _describe(
    home: Path,
    report: journal.SalvageReport,
    accept: journal.Accept,
    dry_run: bool,
    left_out: list[LeftOut],
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
        "dropped_with_the_damage": _of_its_batch(report),
        "dropped_archives": sorted(item.name for item in left_out if item.dropped),
        "archives": [],
        "tasks": [],
        "tasks_unknown": [],
        "kept_aside": _kept_aside(home),
    }
    if not report.finished or report.aside is not None or dry_run:
        rows, lost = _tasks_changed(home, report, accept, dry_run, left_out)
        out["tasks"] = rows
        out["archives"] = [item.to_json(lost.get(item.name, 0)) for item in left_out]
        out["tasks_unknown"] = _unknown(report, left_out)
    return out


def _kept_aside(home: Path) -> list[str]:
    """What salvages kept aside in ``archive/`` (this one's and earlier ones'): said
    by a salvage that finishes one killed before it could say it."""
    try:
        names = os.listdir(home / "archive")
    except FileNotFoundError:
        return []
    return sorted(f"archive/{n}" for n in names if n.startswith((DAMAGED_PREFIX, KEPT_PREFIX)))


def _tasks_changed(
    home: Path,
    report: journal.SalvageReport,
    accept: journal.Accept,
    dry_run: bool,
    left_out: list[LeftOut],
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Each task whose state in the new journal is older than the damaged journal
    said, or that it lacks: as the lost records (those still readable) say it, or an
    archive left out, whichever is newer. A task the lost records name but whose
    submission is lost too is gone in a state not known. Also: how many of them each
    archive names."""
    store = (
        Store.open_view(home, accept)
        if dry_run
        else Store.open(home, read_only=True, tolerate_damage=True)
    )
    last_seq = report.view.last_seq
    try:
        table = store.table
        named: dict[str, journal.Record] = {}  # the last lost record naming each task
        for record in report.lost_records:
            if isinstance(record.data.get("task"), str):
                named[record.data["task"]] = record
        archived: dict[str, tuple[LeftOut, Mapping[str, Any]]] = {}
        for item in sorted(left_out, key=lambda item: item.seq):  # (a later one is newer)
            for task in item.tasks:
                archived[str(task["id"])] = (item, task)
        now = {task_id: table.get(task_id) for task_id in dict.fromkeys([*named, *archived])}
        for record in report.lost_records:
            table.apply_record(record)
        rows: list[dict[str, Any]] = []
        lost: dict[str, int] = {}
        for task_id, current in now.items():
            last = named.get(task_id)
            said = table.get(task_id) if last is not None else None
            found = archived.get(task_id)
            if found is not None and found[0].seq <= last_seq and current is not None:
                found = None  # (the new journal read every record up to it: as new)
            source: LeftOut | None = None
            before: Said
            newer = last is not None and (found is None or last.seq > found[0].seq)
            if said is not None and newer:
                before = (said.state.value, said.attempt, _reason(said))
            elif found is not None and not newer:
                source, task = found
                attempt, reason = task.get("attempt"), task.get("reason")
                before = (str(task.get("state")), attempt if isinstance(attempt, int) else None,
                          reason if isinstance(reason, str) else None)  # fmt: skip
            elif last is not None and current is None and last.type != "FORGOTTEN":
                # Its submission is lost: the records cannot be folded, and an archive
                # that holds it is older than they are. Its state is not known.
                before, source = (None, None, None), None if found is None else found[0]
            else:
                continue
            if _moved(before, current):
                rows.append(_row(task_id, before, current))
                if source is not None:
                    lost[source.name] = lost.get(source.name, 0) + 1
        return rows, lost
    finally:
        store.close()


def _moved(before: Said, now: Task | None) -> bool:
    """Is the task's state in the new journal (``now``) older than ``before``?"""
    if now is None:
        return True
    if before[1] is None:  # (an index entry: it says the state alone)
        return before[0] != now.state.value
    return before != (now.state.value, now.attempt, _reason(now))


def _reason(task: Task) -> str | None:
    return None if task.reason is None else task.reason.value


def _of_its_batch(report: journal.SalvageReport) -> list[int] | None:
    """[first, last]: the seqs before the damage that are not kept with it, though they
    read well: the records of the batch the damage is in (a batch is kept whole or not
    at all: the view ends where the batch begins). None: there are none (those before
    the first segment left were compacted: gone, not dropped)."""
    damaged = 0 if report.damage is None else report.damage.seq or 0
    first = max(report.view.last_seq + 1, report.view.first_seq)
    return [first, damaged - 1] if damaged > first else None


def _unknown(report: journal.SalvageReport, left_out: list[LeftOut]) -> list[str]:
    """Why the tasks named may not be every task lost (nothing: they are)."""
    view = report.view
    said: list[str] = []
    compacted = max(0, view.first_seq - 1 - view.last_seq)  # (gone before the damage)
    unreadable = report.lost_seqs - len(report.lost_records) - compacted
    if unreadable > 0:
        said.append(
            f"{unreadable} lost record(s) cannot be read: a task that only they named is not known"
        )
    if view.base is None and view.first_seq > 1:
        what = (
            ", ".join(f"{os.path.basename(path)} ({why})" for path, why in view.skipped)
            or "no snapshot is left"
        )
        said.append(
            f"the state before seq {view.first_seq} is lost with its snapshot: {what};"
            " a task that only it held (one not settled then, that no later record"
            " names) is not known"
        )
    for item in left_out:
        if item.complete:
            continue
        how = {
            "missing": "is missing",
            "damaged": "is damaged",
            "unverified": "cannot be checked (no readable snapshot names it, and its"
            " index does not match it)",
        }[item.status]
        held = "an unknown number of settled tasks" if item.count is None else (
            f"{item.count} settled task(s)")  # fmt: skip
        said.append(
            f"settled-task archive {item.name} {how}: it held {held}, of which"
            f" {len(item.tasks)} can still be named (its index is missing or damaged"
            " too); the others are not known"
        )
    return said


def _row(task_id: str, before: Said, now: Task | None) -> dict[str, Any]:
    return {
        "task": task_id,
        "before": before[0],
        "attempt_before": before[1],
        "after": None if now is None else now.state.value,
        "attempt_after": None if now is None else now.attempt,
    }
