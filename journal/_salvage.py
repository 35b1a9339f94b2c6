"""salvage(directory): the operator's way out of a damaged journal.  The damaged
journal is moved aside whole (never deleted, never changed), and a new one is written
from what is readable of it (``_view``): its newest usable snapshot and every record
after it up to the first damage, byte for byte.  What the new journal does not hold
(the records after the damage, readable or not) is reported.  A journal that is not
damaged, or only torn at its end (``repair``'s), is refused: nothing is changed.

Steps, under the append lock, with every segment held exclusively (so no handle has
the journal open: a salvage under a running appender would lose its records):

1. build the new journal in ``.<name>.salvage-<stamp>/`` beside it: a marker file
   ``.salvage-build`` (the stamp), the snapshot, the segments, ``.lock``, each fsynced,
   then the directory and its parent (first, the caller's ``keep(plan)``: what it must
   keep of what the new journal leaves out, made durable before anything is written);
2. **swap** the two directories in one step (``renameat2(RENAME_EXCHANGE)``), fsync
   the parent: whatever a crash keeps, ``<name>`` is the whole damaged journal or the
   whole new one, never neither and never a half-written one;
3. rename the damaged one (now under the build's name) to ``<name>.damaged-<stamp>``,
   fsync the parent; remove the marker from the new journal.

A crash after step 2 leaves the damaged journal under the build's name; one before it,
a build that was never used.  The next ``salvage`` (it runs on a healthy journal too
for this) finishes both: the first is renamed to ``<name>.damaged-<stamp>``, the second
(it holds its own stamp in its marker) removed.

A handle that opened the old journal while the segments were held waits at its pin,
then finds its segment moved and opens the new journal instead (``Journal.open``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import NamedTuple

from journal import _fsutil, _json
from journal._codec import Record
from journal._errors import CorruptionError, JournalError, SalvageRefusedError
from journal._segment import LOCK_NAME, SALVAGE_MARKER, list_segments, no_journal, segment_name
from journal._snapshot import EPOCH_CARRIER, encode_snapshot, headers_epoch_max, snapshot_name
from journal._view import Accept, View, lenient_records, readable

Hook = Callable[[str], None]


class SalvageReport(NamedTuple):
    view: View  # what the new journal holds
    damage: CorruptionError | None  # the damage that ends what was kept (None: none did)
    lost_seqs: int  # records of the damaged journal not kept (readable or not)
    lost_records: tuple[Record, ...]  # those of them still readable, in seq order
    guessed: tuple[int, ...]  # seqs among them read from a damaged line (unchecked)
    aside: str | None  # where the damaged journal is now (None: a dry run)
    finished: tuple[str, ...]  # an interrupted salvage's leftovers, dealt with


def build_name(directory: str, stamp: str) -> str:
    return _fsutil.join(_fsutil.parent(directory), f".{_fsutil.name(directory)}.salvage-{stamp}")


def aside_name(directory: str, stamp: str) -> str:
    return _fsutil.join(_fsutil.parent(directory), f"{_fsutil.name(directory)}.damaged-{stamp}")


def salvage(
    directory: _fsutil.StrPath,
    *,
    accept: Accept | None = None,
    dry_run: bool = False,
    hook: Hook | None = None,
    stamp: str | None = None,
    on_lock_wait: Callable[[], None] | None = None,
    keep: Callable[[SalvageReport], None] | None = None,
) -> SalvageReport:
    """Salvage the damaged journal at ``directory`` (see the module docstring).

    ``accept``: the caller's test of a snapshot (``_view``); ``keep(plan)`` is called
    once the plan is made, under the locks, before anything of the new journal is
    written: the caller makes durable there what it must keep of what the new journal
    leaves out (files of its own that the old journal's snapshots name; an error
    there stops the salvage, nothing of the journal changed); ``hook(name)`` is called
    at each step (``before:salvage_segment``, ``after:salvage_segment``,
    ``before:salvage_swap``, ``after:salvage_swap``: crash tests kill the process
    there); ``stamp`` names the damaged copy (default: the UTC time to the second, with
    ``-2``, ``-3``... after it if a salvage of that second has the name).  ``dry_run``:
    find out, change nothing, take no lock.  Raises SalvageRefusedError (nothing
    changed) and JournalError."""
    directory = _fsutil.fspath(directory)
    given = stamp
    step: Hook = hook or (lambda name: None)
    try:
        _fsutil.listdir(directory)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise no_journal(directory, exc) from None
    if dry_run:
        planned = _plan(directory, accept, ())
        assert planned is not None  # (None only once something was finished)
        return planned
    lock_fd = _fsutil.open_lockfile(_fsutil.join(directory, LOCK_NAME))
    held: list[int] = []
    try:
        _fsutil.lock(lock_fd, on_lock_wait)
        held = _hold_segments(directory)
        finished = finish_interrupted(directory)
        report = _plan(directory, accept, finished)
        if report is None:
            return SalvageReport(readable(directory), None, 0, (), (), None, finished)
        stamp = _free_stamp(directory, given or _now_stamp(), given=given is not None)
        aside, build = aside_name(directory, stamp), build_name(directory, stamp)
        if keep is not None:
            keep(report)
        _build(
            build, stamp, report, step, headers_epoch_max(directory, _fsutil.listdir(directory))[0]
        )
        step("before:salvage_swap")
        _fsutil.exchange(directory, build)
        _fsutil.fsync_dir(_fsutil.parent(directory))
        step("after:salvage_swap")
        _fsutil.rename(build, aside)
        _fsutil.fsync_dir(_fsutil.parent(directory))
        _drop_marker(directory)
        return report._replace(aside=aside)
    finally:
        for fd in held:  # (after the swap: a handle waiting at its pin then sees it moved)
            _fsutil.close(fd)
        _fsutil.close(lock_fd)  # releases the append lock


def _plan(directory: str, accept: Accept | None, finished: tuple[str, ...]) -> SalvageReport | None:
    """What a salvage would keep and lose; refuses (SalvageRefusedError) a journal
    that needs none, unless an interrupted salvage was just finished (None then)."""
    view = readable(directory, accept)
    if not view.damaged:
        if finished:
            return None
        if view.torn is not None:
            torn = view.torn
            raise SalvageRefusedError(
                f"the journal is only torn at its end ({torn.reason}): 'repair' cuts that",
                code="journal.salvage_torn",
                segment=torn.segment,
                offset=torn.offset,
                seq=torn.seq,
            )
        raise SalvageRefusedError("the journal is not damaged", code="journal.salvage_clean")
    lost: dict[int, Record] = {}
    for record in lenient_records(directory):
        if record.seq > view.last_seq:
            lost.setdefault(record.seq, record)
    guess = None if view.damage is None else _guess(view.damage)
    guessed: tuple[int, ...] = ()
    if guess is not None and guess.seq > view.last_seq and guess.seq not in lost:
        lost[guess.seq], guessed = guess, (guess.seq,)
    records = tuple(lost[seq] for seq in sorted(lost))
    # (The damaged line itself held a record, readable or not: it counts.)
    damaged_seq = 0 if view.damage is None else view.damage.seq or 0
    lost_seqs = max(0, max(view.highest_seq, damaged_seq) - view.last_seq)
    return SalvageReport(view, view.damage, lost_seqs, records, guessed, None, finished)


def _guess(damage: CorruptionError) -> Record | None:
    """What the damaged line itself probably said, if it still parses (a flipped bit
    in a value, say): for the report only, never for the new journal."""
    if damage.segment is None or damage.offset is None:
        return None
    try:
        fd = _fsutil.open_read(damage.segment)
    except OSError:
        return None
    try:
        line = _fsutil.pread(fd, 1 << 20, damage.offset).split(b"\n", 1)[0]
    finally:
        _fsutil.close(fd)
    try:
        obj = _json.loads(line)
        seq, epoch, ts = obj["seq"], obj.get("epoch", 0), obj.get("ts", 0.0)
        kind, data = obj["type"], obj["data"]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not (type(seq) is int and type(epoch) is int and isinstance(ts, int | float)):
        return None
    if not (isinstance(kind, str) and isinstance(data, dict)):
        return None
    return Record(seq, epoch, float(ts), kind, data)


def _hold_segments(directory: str) -> list[int]:
    """Every segment locked exclusively: none is pinned by a handle (a running
    appender, a reader), and none can be pinned until they are let go."""
    held: list[int] = []
    try:
        for segment in list_segments(directory):
            fd = _fsutil.removable(segment.path)
            if fd is None:
                raise SalvageRefusedError(
                    "another process has the journal open (a running 'work', 'run' or"
                    " task supervisor, or a reader): stop it, or let it finish, and"
                    " salvage again",
                    code="journal.salvage_in_use",
                    segment=segment.path,
                )
            held.append(fd)
    except BaseException:
        for fd in held:
            _fsutil.close(fd)
        raise
    return held


def _build(build: str, stamp: str, report: SalvageReport, step: Hook, headers_epoch: int) -> None:
    """The new journal, complete and durable, under ``build`` (a new directory).
    ``headers_epoch``: the highest ``epoch_max`` of the damaged journal's snapshot
    headers that check (their data may not)."""
    view = report.view
    _fsutil.mkdir(build)
    _write_new(_fsutil.join(build, SALVAGE_MARKER), _json.dumps({"stamp": stamp}))
    # The highest epoch seen, lost records included, so that fencing survives: in the
    # base snapshot, or with none, in a carrier (seq 0, no data: never a base).
    epoch_max = max([view.max_epoch, headers_epoch, *(r.epoch for r in report.lost_records)])
    if view.base is not None:
        body = encode_snapshot(view.base.seq, view.base.data, epoch_max)
        _write_new(_fsutil.join(build, snapshot_name(view.base.seq)), body)
    elif epoch_max > view.max_epoch:
        _write_new(_fsutil.join(build, EPOCH_CARRIER), encode_snapshot(0, b"", epoch_max))
    step("before:salvage_segment")
    if not view.pieces:
        # A journal always has a segment: an empty one names the next seq.
        _write_new(_fsutil.join(build, segment_name(view.last_seq + 1)), b"")
    for piece in view.pieces:
        src = _fsutil.open_read(piece.segment)
        try:
            dst = _fsutil.open_new(_fsutil.join(build, segment_name(piece.first_seq)))
            try:
                _fsutil.copy_range(src, piece.start, piece.end, dst)
                _fsutil.sync_file(dst)
            finally:
                _fsutil.close(dst)
        finally:
            _fsutil.close(src)
    step("after:salvage_segment")
    _write_new(_fsutil.join(build, LOCK_NAME), b"")
    _fsutil.fsync_dir(build)
    _fsutil.fsync_dir(_fsutil.parent(build))


def _write_new(path: str, data: bytes) -> None:
    fd = _fsutil.open_new(path)
    try:
        _fsutil.write_all(fd, data)
        _fsutil.sync_file(fd)
    finally:
        _fsutil.close(fd)


def _drop_marker(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _fsutil.unlink(_fsutil.join(directory, SALVAGE_MARKER))
        _fsutil.fsync_dir(directory)


def _now_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _free_stamp(directory: str, stamp: str, *, given: bool) -> str:
    """``stamp``, or (not ``given``) the first of ``stamp-2``, ``stamp-3``... that names
    neither a damaged copy nor a build beside ``directory`` (under its lock: no other
    salvage of it runs)."""
    taken = set(_fsutil.listdir(_fsutil.parent(directory)))
    for n in range(1, 1000):
        candidate = stamp if n == 1 else f"{stamp}-{n}"
        names = {
            _fsutil.name(aside_name(directory, candidate)),
            _fsutil.name(build_name(directory, candidate)),
        }
        if not names & taken:
            return candidate
        if given:
            break
    raise JournalError(
        f"{' or '.join(sorted(names))} exists already: move it away, or give another name"
    )


def finish_interrupted(directory: str) -> tuple[str, ...]:
    """Deal with what a salvage killed half-way left beside ``directory`` (the caller
    holds the append lock): a build never swapped in is removed (it was never used);
    the damaged journal swapped out but not yet renamed gets its name.  Says what it
    did, one line each."""
    done: list[str] = []
    prefix = f".{_fsutil.name(directory)}.salvage-"
    for name in sorted(_fsutil.listdir(_fsutil.parent(directory))):
        if not name.startswith(prefix):
            continue
        stamp, leftover = name[len(prefix) :], _fsutil.join(_fsutil.parent(directory), name)
        # A build holds its marker (first thing written; "" if cut short) or nothing
        # at all (killed right after its mkdir); the damaged journal neither.
        if _marker_stamp(leftover) in (stamp, "") or not _fsutil.listdir(leftover):
            _remove_tree(leftover)
            done.append(f"removed {name}, a new journal a salvage built and never used")
        else:
            target = aside_name(directory, stamp)
            _fsutil.rename(leftover, target)
            done.append(
                f"renamed {name} to {_fsutil.name(target)}: the damaged journal it moved aside"
            )
    if done:
        _fsutil.fsync_dir(_fsutil.parent(directory))
    if _marker_stamp(directory) is not None:
        _drop_marker(directory)
    return tuple(done)


def _marker_stamp(directory: str) -> str | None:
    try:
        fd = _fsutil.open_read(_fsutil.join(directory, SALVAGE_MARKER))
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        raw = _fsutil.pread(fd, 4096, 0)
    finally:
        _fsutil.close(fd)
    try:
        stamp = _json.loads(raw).get("stamp")
    except (ValueError, AttributeError):
        return ""  # a marker the crash cut short: a build (only builds have one)
    return stamp if isinstance(stamp, str) else ""


def _remove_tree(directory: str) -> None:
    """A leftover build, removed so that a crash at any point leaves it readable as a
    build: its marker goes last (and only once the other removals are durable), so it
    never looks like the damaged journal, which holds no marker."""
    names = _fsutil.listdir(directory)
    for name in names:
        if name != SALVAGE_MARKER:
            _fsutil.unlink(_fsutil.join(directory, name))
    if SALVAGE_MARKER in names:
        _fsutil.fsync_dir(directory)
        _fsutil.unlink(_fsutil.join(directory, SALVAGE_MARKER))
    _fsutil.rmdir(directory)
