"""``ferry gc``: forget settled tasks older than a cut-off, and free what they held on
this host (logs, heartbeat files) and in the history (archives, journal segments).

The order of the side effects is the write-ahead rule's, for each batch of tasks:

1. decide what may go (settled, ended before the cut-off, in the states asked for; not
   a quarantined task whose orphan may live: probed here, since only this host's
   probes can prove an orphan dead; not the latest task of a key that ended unsafe);
2. journal it: FORGOTTEN per task, in one commit per batch, validated under the
   journal's lock against the caught-up table (``ferry.core.fold``): a task retried,
   forgotten or otherwise moved since step 1 is refused, and the batch is decided
   again without it;
3. only then remove the tasks' files (``logs/<id>/``, ``heartbeats/<id>.*``);
4. remove the files of the tasks forgotten earlier that are still on this host (a gc
   killed between 2 and 3; on a shared database, a task this host ran that another
   host's gc forgot): the store lists them (``forgotten_here``: the ids its table
   remembers, or the database's notes), never a guess from the files themselves (a
   state directory shared by two backends, a journal salvaged: a log directory the
   store does not know is not proof that its task was forgotten);
5. compact: the archives are rewritten without the forgotten tasks, and the journal's
   segments that the new snapshot covers go (``ferry.storage.local.store``; that
   compaction removes the files of the forgotten tasks it stops naming, too).

A crash anywhere leaves a journal that verifies and a table that tells the truth (a
task is either there, with its logs, or forgotten); what a crash left undone, the next
``gc`` does (steps 4 and 5), or the next compaction. ``dry_run``: step 1, and what
step 4 would remove, told; nothing journaled, nothing removed.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.app.recoverer import task_liveness
from ferry.core import events as ev
from ferry.core.errors import FerryError, InternalError, from_os_error
from ferry.core.fold import MAY_RUN_ON, MOVED_CODES, task_key_outcome
from ferry.core.model import Liveness, Reason, State, Task, rfc3339
from ferry.failpoints import failpoint
from ferry.proc import alivelock

if TYPE_CHECKING:
    from ferry.app.session import Session
    from ferry.storage import TaskStore

SETTLED_STATES = (State.SUCCEEDED.value, State.FAILED.value, State.CANCELLED.value)
DEFAULT_OLDER_THAN_S = 7 * 86400.0
# FORGOTTEN records per commit: a crash costs at most one batch's files (left for the
# next gc), and a shared database locks this many rows at once, at most.
BATCH_TASKS = 1000
# Refusals that mean "this task is no longer as gc read it": decided again without it.
_RETRYABLE = (State.FAILED.value, State.CANCELLED.value)
_KEPT_CODES = {"task.key_unsafe", "task.has_dependants"}  # (the refused task is kept)
_GONE_CODES = MOVED_CODES | _KEPT_CODES | {"task.not_found"}
_TRIES_PER_BATCH = 16


class Kept:
    """A task gc could have forgotten by its age and state, and left: why."""

    __slots__ = ("task", "why")

    def __init__(self, task: Task, why: str) -> None:
        self.task, self.why = task, why


class GcReport:
    """What ``gc`` did (or, ``dry_run``, would do)."""

    def __init__(
        self, *, dry_run: bool, cutoff_s: float, states: Sequence[str], compacts: bool = True
    ) -> None:
        self.dry_run = dry_run
        self.compacts = compacts  # its history goes at a compaction (a shared database: at once)
        self.cutoff_s = cutoff_s
        self.states = list(states)
        self.forgotten: list[Task] = []
        self.log_bytes: dict[str, int] = {}  # task id -> bytes of its files freed
        self.kept: list[Kept] = []
        self.earlier: dict[str, int] = {}  # files of tasks forgotten before, removed now
        self.history_bytes = 0  # archives and journal segments freed by the compaction
        self.compacted: bool | None = None  # None: a dry run
        self.compaction_error: str | None = None  # why the compaction failed (disk full)

    @property
    def freed_bytes(self) -> int:
        return sum(self.log_bytes.values()) + sum(self.earlier.values())


def gc(
    session: Session,
    *,
    older_than_s: float = DEFAULT_OLDER_THAN_S,
    states: Iterable[str] = SETTLED_STATES,
    dry_run: bool = False,
    now_s: float | None = None,
) -> GcReport:
    store, home = session.store, Path(session.home)
    # (The store's clock: a shared database's own, as it stamped the ends: a host's
    # clock, and the end times it wrote, may be days off.)
    cutoff_s = (store.now() if now_s is None else now_s) - older_than_s
    wanted = [state for state in SETTLED_STATES if state in set(states)]
    report = GcReport(
        dry_run=dry_run, cutoff_s=cutoff_s, states=wanted, compacts=session.database is None
    )
    store.refresh()
    while True:
        chosen, held = _choose(store, home, cutoff_s, wanted, report)
        if dry_run:
            report.forgotten = chosen
            files = _files_of(home, [t.id for t in chosen] + store.forgotten_here())
            report.log_bytes = {t.id: _bytes_of(files.pop(t.id, ())) for t in chosen}
            report.earlier = {i: _bytes_of(paths) for i, paths in files.items()}
            return report
        for start in range(0, len(chosen), BATCH_TASKS):
            done = _forget_batch(store, chosen[start : start + BATCH_TASKS], report)
            files = _files_of(home, [task.id for task in done])
            for task in done:
                failpoint("before:gc_remove")
                report.log_bytes[task.id] = _remove(files.get(task.id, ()))
                failpoint("after:gc_remove")
            store.files_removed([task.id for task in done])
        # A task kept for a dependant forgotten just now may go too: choose again.
        if not held & {task.id for task in report.forgotten}:
            break
    # What an earlier gc forgot and left on this host (killed before it removed the
    # files; on a shared database, another host's gc): listed under the journal's lock
    # (the store's table, caught up) or in the database, never guessed from the files.
    files = _files_of(home, store.forgotten_here())
    for task_id, paths in files.items():
        failpoint("before:gc_remove")
        report.earlier[task_id] = _remove(paths)
        failpoint("after:gc_remove")
    store.files_removed(files)
    # Always: an earlier gc may have been killed before its compaction.
    try:
        report.compacted, report.history_bytes = _compact(store, home)
    except OSError as error:  # (the tasks are forgotten: the next compaction goes on)
        report.compacted, report.compaction_error = False, from_os_error(error).message
    except FerryError as error:
        report.compacted, report.compaction_error = False, error.message
    return report


def _choose(
    store: TaskStore, home: Path, cutoff_s: float, wanted: Sequence[str], report: GcReport
) -> tuple[list[Task], set[str]]:
    """The tasks to forget now, the others reported kept (``report.kept``, replaced);
    and the dependants (not SUCCEEDED) that keep a task: once they are forgotten, it
    may go."""
    chosen: list[Task] = []
    report.kept = []
    dependants: dict[str, str] = {}
    retryable = store.settled_before(math.inf, _RETRYABLE)
    for task in [*store.live(), *retryable]:  # (each may be claimed, now or once retried)
        for dependency in task.spec.after:
            dependants.setdefault(dependency, task.id)
    held: set[str] = set()
    for task in store.settled_before(cutoff_s, wanted):
        why = _why_keep(store, home, task, dependants)
        if why is None:
            chosen.append(task)
            continue
        report.kept.append(Kept(task, why))
        if task.id in dependants:
            held.add(dependants[task.id])
    return chosen, held


def _why_keep(
    store: TaskStore, home: Path, task: Task, dependants: Mapping[str, str]
) -> str | None:
    """Why ``task`` must stay (None: it may go). The store checks the same under its
    lock when gc writes (``Table._check_forget``); this is for the report."""
    if task.id in dependants:
        return _has_dependant(dependants[task.id])
    if task.reason in MAY_RUN_ON:
        lost = "" if task.reason is Reason.QUARANTINED_ORPHAN_ALIVE else " (its host was lost)"
        if store.host_lost(task, float("inf")) is not None:
            owner = None if task.runner is None else task.runner.get("host_id")
            return f"quarantined{lost}: its orphan ran on host {owner}, whose gc decides"
        if task_liveness(task, home) is not Liveness.DEAD:
            return f"quarantined{lost}: its orphan may still be alive ('ferry kill {task.id}')"
    if task.spec.key is not None and task_key_outcome(task) == "unsafe":
        return _key_waits(task.spec.key)
    return None


def _has_dependant(dependant: str) -> str:
    return f"task {dependant} comes after it (--after) and has not succeeded"


def _key_waits(key: str) -> str:
    return f"key {key!r} waits for an operator: 'ferry retry' or 'ferry resolve' it first"


def _forget_batch(store: TaskStore, batch: list[Task], report: GcReport) -> list[Task]:
    """Journal FORGOTTEN for ``batch`` (decided again without each task that moved);
    the tasks forgotten."""
    for _ in range(_TRIES_PER_BATCH):
        if not batch:
            return []
        try:
            store.commit(*(ev.Forgotten(task.id, task.attempt) for task in batch))
        except FerryError as error:
            if error.code not in _GONE_CODES:
                raise
            batch = _still_forgettable(store, batch, error, report)
            continue
        report.forgotten.extend(batch)
        return batch
    raise InternalError("the tasks gc chose kept changing while it forgot them")


def _still_forgettable(
    store: TaskStore, batch: list[Task], error: FerryError, report: GcReport
) -> list[Task]:
    """After a refusal (the commit caught the store up): the tasks of ``batch`` still
    settled at the attempt gc read; the one a key rule keeps is reported kept."""
    store.refresh()
    kept_id = error.details.get("task") if error.code in _KEPT_CODES else None
    still = []
    for task in batch:
        current = store.get(task.id)
        if task.id == kept_id and current is not None:
            dependant = error.details.get("dependant")
            why = _key_waits(str(task.spec.key)) if dependant is None else _has_dependant(dependant)
            report.kept.append(Kept(current, why))
        elif current is not None and current.terminal and current.attempt == task.attempt:
            still.append(current)
    if len(still) == len(batch) and kept_id is None:
        # Nothing changed that we can see, and yet it was refused: do not loop on it.
        raise error
    return still


# ---- the tasks' files on this host -----------------------------------------------------


def _files_of(home: Path, task_ids: Iterable[str]) -> dict[str, list[Path]]:
    """The files of each of ``task_ids`` on this host (its log directory, its heartbeat
    files), for the tasks that have any."""
    wanted = set(task_ids)
    found: dict[str, list[Path]] = {}
    for task_id in sorted(wanted):
        path = home / "logs" / task_id
        if os.path.lexists(path):
            found[task_id] = [path]
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(home / alivelock.DIRECTORY):
            task_id = entry.name.partition(".")[0]
            if task_id in wanted:
                found.setdefault(task_id, []).append(Path(entry.path))
    return found


def _bytes_of(paths: Iterable[Path]) -> int:
    """Disk space the files take (blocks: a log with --log-max is sparse)."""
    total = 0
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not os.path.isdir(path) or os.path.islink(path):
            total += st.st_blocks * 512
            continue
        for root, _dirs, names in os.walk(path):
            for name in names:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _remove(paths: Iterable[Path]) -> int:
    """Remove a task's files (a directory whole; a symlink planted in the state
    directory is removed, never followed); the bytes freed."""
    freed = 0
    for path in paths:
        freed += _bytes_of([path])
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)  # (fd-based on Linux: never follows a symlink inside)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
    return freed


# ---- history -----------------------------------------------------------------------------


def _compact(store: TaskStore, home: Path) -> tuple[bool, int]:
    """Compact twice: the first rewrites the archives without the forgotten tasks and
    drops the journal segments its snapshot covers; the second prunes the archives the
    first had to keep (its previous snapshot's: a reader may have been loading them;
    such a reader falls back to the newest snapshot's). (done, bytes freed). Not done
    when another compaction holds its lock: that one, or the next, finishes the job."""
    before = _bytes_under(home / "archive") + _bytes_under(home / "journal")
    for _ in range(2):
        if store.compact(wait=False) is None:
            return False, 0
    after = _bytes_under(home / "archive") + _bytes_under(home / "journal")
    return True, max(0, before - after)


def _bytes_under(directory: Path) -> int:
    try:
        return sum(
            entry.stat(follow_symlinks=False).st_blocks * 512 for entry in os.scandir(directory)
        )
    except OSError:
        return 0


def describe(report: GcReport) -> dict[str, Any]:
    """The report as plain data (``--json``)."""
    forgotten = [
        {"id": t.id, "number": t.number, "state": t.state.value, "ended_at": rfc3339(t.ended_at),
         "bytes": report.log_bytes.get(t.id, 0)}
        for t in report.forgotten
    ]  # fmt: skip
    kept = [{"id": k.task.id, "state": k.task.state.value, "why": k.why} for k in report.kept]
    earlier = [{"id": task_id, "bytes": size} for task_id, size in sorted(report.earlier.items())]
    return {
        "dry_run": report.dry_run,
        "ended_before": rfc3339(report.cutoff_s),
        "states": report.states,
        "forgotten": forgotten,
        "kept": kept,
        "earlier": earlier,
        "log_bytes": report.freed_bytes,
        "history_bytes": report.history_bytes,
        "compacted": report.compacted,
        "compaction_error": report.compaction_error,
    }
