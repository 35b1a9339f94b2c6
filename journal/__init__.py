"""journal: a small, crash-safe write-ahead log (JSON Lines segments).

On-disk format, version 1 (full text: docs/journal-format.md)
-------------------------------------------------------------

A journal is a directory::

    00000000000000000001.jsonl       segments, named by the seq of their first record
    00000000000000004127.jsonl       (20 digits: names sort in seq order); the last is active
    snapshot-00000000000000004000.snap   snapshots (header line + caller's bytes)
    .lock                            the cross-process append lock (flock); its size counts
                                     segment creations (a hint for other handles, not data)
    <segment>.broken[.N]             bytes cut from a torn tail by repair (kept as evidence)

Only names of exactly these shapes matter; anything else (``.broken`` copies, temp
files ``.*.tmp``) is ignored by readers.

Record line: one compact JSON object (``journal._json``), keys in this order, then ``\\n``::

    {"v":1,"seq":7,"epoch":2,"ts":1700000000.25,"type":"SUBMITTED","data":{...},"crc":"0a1b2c3d"}

``v`` format version; ``seq`` gap-free from 1 across segments; ``epoch`` int >= 0 (0 =
an unfenced writer); ``ts`` float unix seconds; ``type`` str; ``data`` a JSON object;
``crc`` = ``zlib.crc32`` of the line's bytes before ``,"crc":"``, 8 lowercase hex
digits.  A line is valid only if it ends in ``\\n``, its checksum matches, it parses,
has ``v`` 1 and the expected seq.  Batches: every record of a batch of several records
but its last carries ``"more":K`` right after ``seq`` (K records of its batch follow
it); the last one, and a single record, carry no such key.  Files are read in binary
and split on ``b"\\n"`` only.  NUL bytes from the end of a segment's last record to
the end of the file are its *zero tail*: space the writer preallocated, not records and
not damage.
NaN/Infinity, non-JSON values and lines longer than ``record_bytes_max`` are refused
before anything is written; ``record_bytes_max`` is at most 64 MiB, the longest line
readers take (a longer one is damage).  A record or snapshot with a newer ``v`` raises
FormatVersionError.

Snapshot file ``snapshot-{seq:020d}.snap``: a header line
``{"v":1,"seq":S,"epoch_max":E,"length":L,"data_crc":"..","crc":".."}\\n`` (crc as for
records) followed by the L bytes of data.  Damaged snapshots are skipped (fall back to an
older one or a full replay); a valid one beyond the journal's end is corruption.

Guarantees
----------

* A batch is all or none on disk too: readers yield its records only once its last
  record was read (their end moves past whole batches only).  A batch left incomplete
  at the end of the last segment (a crash in its write, or a write still being copied
  in) is a torn tail from its first record, cut whole before the next append; a valid
  record its batch's marks did not announce is corruption.
* ``append``/``append_batch`` return only after the lines were written with one
  ``os.pwrite`` at the end of the records (over the zero tail, which a write that
  reaches past it extends in the same write) and fdatasync returned: then they survive
  a crash or power cut of this machine *if the disk honours flushes*.  A failed write or
  fsync makes the handle unusable (WriterFailedError; never retried).
* Appenders (threads and processes) serialise on ``flock(.lock)``; threads of one handle
  share one write and one fsync (group commit).  Under the lock an appender first
  catches up on what others appended (feeding subscribers) and cuts a torn tail.
  Subscribers see this handle's records once durable; those subscribed with
  ``before_durable=True`` see each batch as soon as it is accepted, so that later
  checks in the same group see it (its outcome is unknown if the write then fails).
* ``Journal.open`` checks every record from the latest snapshot's seq on (the line of a
  seq is found by bisection, ``_seek``) and changes nothing; ``verify`` checks
  everything; ``repair`` cuts only a torn tail.  ``Journal.open(read_only=True)``
  creates nothing and takes no lock (a file system mounted read-only) but for its
  ``sync`` (a moment, to read no append in progress); its writes raise ReadOnlyError.
* A damaged journal: ``readable`` / ``Journal.open_view`` say what is still readable
  (the newest usable snapshot, then every record to the first damage); ``salvage``
  moves the damaged journal aside whole (``<dir>.damaged-<stamp>``, never deleted) and
  swaps in a new one written from that view, in one ``renameat2(RENAME_EXCHANGE)``.
* Creating, renaming and removing segments and snapshots fsync the directory.  The
  journal's first segment also fsyncs the directory's parent (whoever made the
  directory may not have: a power cut would drop it, records and all); a directory
  ``open`` creates has each new one's parent fsynced.
* Each handle pins its active segment (a shared ``flock``); compaction removes no
  pinned segment nor any after it, so a handle that fell behind finds every record.
* Damage: bytes after the last valid record of the last segment that a torn write can
  leave (no valid line in them; no whole line, but one whose NULs are sectors that
  never landed) and that are not all NUL are a *torn tail*: cut before the next append
  (a ``.broken`` copy is kept).
  Anything else (a whole line that does not check, e.g. a committed last record with
  a flipped bit; a bad record followed by valid ones, a bad record in a sealed segment,
  a gap, a missing segment) is *corruption*: CorruptionError with segment, byte offset
  and seq; never skipped, never repaired, never reset to empty.
* Not protected: disks or controllers that lie about flushes (volatile write caches),
  network filesystems (flock and fsync semantics vary), an fsync error that the kernel
  reported to another process first, a full disk (the append fails; the handle is
  unusable), bugs that write valid-looking lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from types import TracebackType

from journal import _fsutil, _reader
from journal._codec import FORMAT_VERSION, Record, prepare, prepare_batch
from journal._errors import (
    CompactedError,
    CorruptionError,
    FencedError,
    FormatVersionError,
    InvalidRecordError,
    JournalClosedError,
    JournalError,
    ReadOnlyError,
    RecordTooLargeError,
    SalvageRefusedError,
    TakenBackError,
    TornTailError,
    WriterFailedError,
)
from journal._fsutil import NO_LOCK_ERRNOS
from journal._reader import TornTail
from journal._segment import LOCK_NAME, list_segments
from journal._snapshot import (
    Snapshot,
    compact,
    headers_epoch_max,
    latest_snapshot,
    read_latest_snapshot,
    read_snapshots,
    snapshots_in,
    write_snapshot,
)
from journal._survey import Survey, iter_records, survey
from journal._writer import Fence, Hook, Subscriber, Writer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from journal._repair import RepairReport, repair
    from journal._salvage import SalvageReport, salvage
    from journal._verify import VerifyReport, verify
    from journal._view import Accept, Piece, SnapshotRejected, View, readable

__all__ = [
    "FORMAT_VERSION",
    "NO_LOCK_ERRNOS",
    "Accept",
    "CompactedError",
    "CorruptionError",
    "Fence",
    "FencedError",
    "FormatVersionError",
    "Hook",
    "InvalidRecordError",
    "Journal",
    "JournalClosedError",
    "JournalError",
    "Piece",
    "ReadOnlyError",
    "Record",
    "RecordTooLargeError",
    "RepairReport",
    "SalvageRefusedError",
    "SalvageReport",
    "Snapshot",
    "SnapshotRejected",
    "Subscriber",
    "TakenBackError",
    "TornTail",
    "TornTailError",
    "VerifyReport",
    "View",
    "WriterFailedError",
    "read_latest_snapshot",
    "read_records",
    "read_snapshots",
    "readable",
    "repair",
    "salvage",
    "verify",
]

# What only a damaged journal or a maintenance command needs is imported when first
# used (PEP 562 ``__getattr__``): these modules are not on the start-up path of a
# program that opens a healthy journal and appends to it.
_LAZY = {
    "RepairReport": "_repair", "repair": "_repair",
    "SalvageReport": "_salvage", "salvage": "_salvage",
    "VerifyReport": "_verify", "verify": "_verify",
    "Accept": "_view", "Piece": "_view", "SnapshotRejected": "_view", "View": "_view",
    "readable": "_view",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'journal' has no attribute {name!r}")
    value = getattr(__import__(f"journal.{module}", fromlist=[name]), name)
    globals()[name] = value
    return value


MiB = 1 << 20
_OPEN_TRIES = 3  # surveys at open that a concurrent compaction may spoil, in a row
_EMPTY = Survey([], 1, 0, 0, 0, None, None)


def _is_dir(directory: str) -> bool:
    try:
        _fsutil.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _open_writer(
    directory: str,
    lock_fd: int,
    segment_bytes_max: int,
    fence: Fence | None,
    *,
    entry_durable: bool,
    read_only: bool = False,
) -> Writer:
    """Survey the journal (lock-free) and stand at its end.  FileNotFoundError: a
    compaction removed a segment the survey listed, or a salvage swapped the directory
    (the caller looks again)."""
    snapshot_epoch, snapshot_seq = headers_epoch_max(directory, _fsutil.listdir(directory))
    # What a snapshot covers is not read: start-up cost follows the records after the
    # latest snapshot, not the whole history.
    found = survey(directory, covered_through=snapshot_seq, keep=True)
    if found.last_seq < snapshot_seq:  # lost records? look at everything
        found = survey(directory)
    if found.corruption is not None:
        raise found.corruption
    if found.first_seq > 1 and snapshot_seq < found.first_seq - 1:
        if headers_epoch_max(directory, _fsutil.listdir(directory))[1] >= found.first_seq - 1:
            # A snapshot and a compaction came after we read the snapshots: not a hole.
            raise FileNotFoundError(f"the journal at {directory} was compacted meanwhile")
        raise CorruptionError(
            f"records before seq {found.first_seq} are missing and no snapshot covers them",
            segment=found.segments[0].path,
            offset=0,
            seq=found.first_seq - 1,
        )
    return Writer(
        directory,
        lock_fd,
        found,
        max_epoch=max(found.max_epoch, snapshot_epoch),
        segment_bytes_max=segment_bytes_max,
        fence=fence,
        entry_durable=entry_durable,
        read_only=read_only,
    )


class Journal:
    """A handle on a journal directory.  Thread-safe; one per process is typical, but
    several handles (in one or many processes) may append to the same directory."""

    def __init__(
        self,
        writer: Writer,
        record_bytes_max: int,
        *,
        read_only: bool = False,
        view: View | None = None,
    ) -> None:
        self._writer = writer
        self._record_bytes_max = record_bytes_max
        self._read_only = read_only or view is not None
        self._view = view

    @classmethod
    def open(
        cls,
        directory: _fsutil.StrPath,
        *,
        segment_bytes_max: int = 64 * MiB,
        record_bytes_max: int = 1 * MiB,
        fence: Fence | None = None,
        on_lock_wait: Callable[[], None] | None = None,
        read_only: bool = False,
    ) -> Journal:
        """Open (creating if needed) the journal at ``directory``.

        ``read_only``: for a reader; nothing is created or written, no lock is taken
        but by ``sync`` (the directory may be on a file system mounted read-only, or not
        ours to write).  A missing directory reads as an empty journal.  Every write
        through the handle raises ReadOnlyError; ``refresh`` still catches up on
        appends.

        ``on_lock_wait`` is called (from a timer thread) when an append has waited for
        the cross-process append lock for 5 s: another process holds it, perhaps one
        that was stopped (it keeps the lock until it is continued or killed).

        Reads and checks every record from the latest snapshot's seq on (all of them
        when there is none; ``verify`` reads everything).  Lock-free, and nothing is
        modified: a torn tail is cut only before the next append.  Raises
        CorruptionError or FormatVersionError; ValueError for a ``record_bytes_max``
        above the longest line readers take (64 MiB: a longer one is damage)."""
        if segment_bytes_max < 1 or record_bytes_max < 64:
            raise ValueError("segment_bytes_max must be >= 1 and record_bytes_max >= 64")
        if record_bytes_max > _reader.LINE_BYTES_MAX_READ:
            # A longer line is damage to every reader: the next handle's append would
            # cut a record this one committed (a torn tail), or refuse it (corruption).
            raise ValueError(
                f"record_bytes_max={record_bytes_max} is more than readers take in one"
                f" line ({_reader.LINE_BYTES_MAX_READ} bytes, newline included)"
            )
        directory = _fsutil.fspath(directory)
        made = False
        if not read_only:
            try:
                made = _fsutil.makedirs(directory)
            except OSError as exc:
                raise JournalError(f"cannot open the journal at {directory}: {exc}") from exc
        for attempt in range(_OPEN_TRIES):
            # Opened at each try: a salvage may have swapped the directory meanwhile,
            # and appenders must all lock the new journal's lock file.
            try:
                if read_only:
                    lock_fd = _fsutil.open_lockfile_read(_fsutil.join(directory, LOCK_NAME))
                else:
                    # Its name need not survive a crash (it is recreated): no dir fsync.
                    lock_fd = _fsutil.open_lockfile(_fsutil.join(directory, LOCK_NAME))
            except OSError as exc:
                raise JournalError(f"cannot open the journal at {directory}: {exc}") from exc
            try:
                if read_only and lock_fd < 0 and not _is_dir(directory):
                    writer = Writer(directory, -1, _EMPTY, max_epoch=0, fence=None,
                                    segment_bytes_max=segment_bytes_max, read_only=True)  # fmt: skip
                else:
                    writer = _open_writer(directory, lock_fd, segment_bytes_max, fence,
                                          entry_durable=made, read_only=read_only)  # fmt: skip
                writer.on_lock_wait = on_lock_wait
                return cls(writer, record_bytes_max, read_only=read_only)
            except FileNotFoundError as exc:
                # A compaction removed a segment between the listing and its reading:
                # look again (it keeps the last segment, and each try sees a newer one).
                if lock_fd >= 0:
                    _fsutil.close(lock_fd)
                if attempt + 1 == _OPEN_TRIES:
                    raise JournalError(f"cannot open the journal at {directory}: {exc}") from exc
            except BaseException:
                if lock_fd >= 0:
                    _fsutil.close(lock_fd)
                raise
        raise AssertionError("unreachable")

    @classmethod
    def open_view(cls, directory: _fsutil.StrPath, *, accept: Accept | None = None) -> Journal:
        """A read-only handle on what is readable of a damaged journal (``_view``): the
        newest usable snapshot (``latest_snapshot``; ``accept`` may refuse one, or
        rewrite its data), then every record after it up to the first damage.  It
        stays there: ``refresh`` reads nothing more, ``subscribe`` replays the view.
        ``view`` says what was found (the damage, where, what was skipped)."""
        from journal._view import readable

        directory = _fsutil.fspath(directory)
        view = readable(directory, accept)
        found = _EMPTY._replace(first_seq=view.first_seq, last_seq=view.last_seq)
        writer = Writer(directory, -1, found, max_epoch=view.max_epoch, fence=None,
                        segment_bytes_max=1, read_only=True)  # fmt: skip
        return cls(writer, 64, read_only=True, view=view)

    @property
    def view(self) -> View | None:
        """What ``open_view`` found (None for a handle from ``open``)."""
        return self._view

    @property
    def read_only(self) -> bool:
        return self._read_only

    def _refuse_write(self) -> None:
        if self._read_only:
            raise ReadOnlyError(f"the journal at {self.directory} was opened read-only")

    # -- properties ---------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._writer.directory

    @property
    def last_seq(self) -> int:
        """The last record this handle has seen (its own appends and caught-up ones)."""
        return self._writer.pos.last_seq

    @property
    def first_seq(self) -> int:
        """The first record still on disk (1 unless compacted, by any handle: a listing
        of the directory now; a view's, where it was found)."""
        segments = []
        if self._view is None:
            with suppress(FileNotFoundError):  # (read-only, before the journal is made)
                segments = list_segments(self._writer.directory)
        return segments[0].first_seq if segments else self._writer.pos.first_seq

    @property
    def max_epoch(self) -> int:
        """The highest epoch in the journal as far as this handle has seen."""
        return self._writer.pos.max_epoch

    @property
    def commits(self) -> int:
        """Commits this handle made (one write and one fdatasync each) since it opened."""
        return self._writer.commits

    @property
    def committed_records(self) -> int:
        """Records those commits carried: ``committed_records / commits`` is the mean
        number of records per fsync (group commit: appends from several threads share
        one)."""
        return self._writer.committed_records

    # -- appending ----------------------------------------------------------------------

    def append(
        self, type: str, data: dict[str, Any], *, epoch: int = 0, check: Hook | None = None
    ) -> Record:
        """Append one record; durable on return.  See ``append_batch``."""
        self._refuse_write()
        return self._writer.append_one(
            prepare(type, data, epoch, self._record_bytes_max), epoch, check
        )

    def append_batch(
        self,
        items: Iterable[tuple[str, dict[str, Any]]],
        *,
        epoch: int = 0,
        check: Hook | None = None,
    ) -> list[Record]:
        """Append records together: one write and one fsync, all or none (they share
        one ``ts``).

        Under the cross-process lock: catch up (feeding subscribers), cut a torn tail,
        refuse ``0 < epoch <`` the journal's highest epoch (FencedError), call
        ``fence(epoch)`` then ``check()`` (either may raise: nothing is written and the
        exception reaches this caller only).  Returns the records, committed.
        InvalidRecordError / RecordTooLargeError are raised before anything else."""
        self._refuse_write()
        prepared = prepare_batch(items, epoch, self._record_bytes_max)
        if not prepared:
            self._writer.ensure_usable()
            return []
        return self._writer.append_batch(prepared, epoch, check)

    def refresh(self) -> None:
        """Catch up on records other processes appended (feeds the subscribers).  Without
        the lock: a record another process has written but not yet synced may be seen
        (and lost to a power cut if that process dies first); see ``sync``.  A view
        (``open_view``) stays where it is: past its damage nothing is read."""
        if self._view is None:
            self._writer.refresh()

    def sync(self, within_s: float | None = None) -> bool:
        """Catch up under the append lock, then fdatasync the active segment: once this
        returns True, every record this handle has seen is durable.  (Appenders sync
        before they release the lock, but one that died between its write and its sync
        leaves records readable that no disk holds yet.)  For a decision taken from what
        was read that writes nothing ("already done"), so that it cannot rest on a
        record a power cut then takes back.  ``within_s``: only if the handle (another
        thread's commit may have it) and the lock are free within that time; False if
        they were not (nothing done).  A read-only handle takes the lock too, for that
        moment (it writes nothing): no append is then in progress, and a record whose
        writer took it back is gone; one without a lock file (no journal yet: it looks
        again each time) catches up as ``refresh`` does, and a view (``open_view``)
        stays where it is."""
        if self._view is not None:  # (it stays where it is, as for refresh)
            return True
        writer = self._writer
        deadline = None if within_s is None else time.monotonic() + within_s
        with writer.owned(deadline) as owned:
            if not owned:  # (another thread's commit has the handle, and waits)
                return False
            if not writer.can_lock():  # (read-only, and no journal yet)
                writer.catch_up_feeding()
                return True
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            with writer.locked(left) as locked:
                if not locked:
                    return False
                writer.catch_up_feeding(locked=True)
                writer.sync_read()
        return True

    def subscribe(
        self, on_record: Subscriber, after_seq: int = 0, *, before_durable: bool = False
    ) -> None:
        """Call ``on_record`` for every record with seq > ``after_seq``: those already in
        the journal now (read from disk), then each record this handle later sees, exactly
        once, in seq order.  CompactedError if ``after_seq + 1`` was compacted away.  A
        subscriber that raises later breaks the handle (WriterFailedError).

        A record this handle appends reaches ``on_record`` once it is durable; with
        ``before_durable=True``, as soon as its batch is accepted (fence and check
        passed), before the write and fsync of its group commit.  Then the ``check``
        hooks of later batches in the same group see its effects, and the whole group
        shares one write and one fsync (without such a subscriber, a batch with a check
        waits for the batches before it to be written and synced).  The price: if that
        write or fsync fails (WriterFailedError: the handle is unusable) or the process
        dies before writing, ``on_record`` has seen records that may never be on disk.
        Use it for the state that checks validate against; throw that state away with a
        failed handle; take no side effect from a record before its own append returned."""
        writer = self._writer
        with writer.owned():
            # The records the survey at open read and checked: for this subscriber if
            # they still reach the end, not read and parsed a second time; then let go.
            kept, writer.surveyed = writer.surveyed, ()
            if self._view is not None:
                from journal._view import view_records

                for record in view_records(self._view, after_seq):
                    on_record(record)
            elif after_seq < writer.pos.last_seq:
                last = writer.pos.last_seq
                if kept and kept[0].seq <= after_seq + 1 and kept[-1].seq == last:
                    records: Iterable[Record] = kept[after_seq + 1 - kept[0].seq :]
                else:
                    records = iter_records(writer.directory, after_seq + 1)
                for record in records:
                    if record.seq > last:
                        break
                    on_record(record)
                    if record.seq == last:
                        break  # (read no further: a reader may find an append in progress)
            elif after_seq > writer.pos.last_seq:
                # Ahead of what this handle has seen (a snapshot written elsewhere, say):
                # records up to after_seq will still come by; they are not wanted.
                wanted = on_record

                def on_record(record: Record) -> None:
                    if record.seq > after_seq:
                        wanted(record)

            if before_durable:
                writer.early_subscribers.append(on_record)
            else:
                writer.subscribers.append(on_record)

    # -- reading ------------------------------------------------------------------------

    def read(self, from_seq: int = 1) -> Iterator[Record]:
        """Stream records with seq >= ``from_seq`` from disk (bounded memory), up to the
        last complete record on disk (which may be past ``last_seq``).  Raises
        CompactedError if ``from_seq < first_seq`` and CorruptionError at corruption."""
        if self._read_only and not _is_dir(self._writer.directory):
            return iter(())  # (a read-only handle on a journal not made yet)
        return iter_records(self._writer.directory, from_seq)

    # -- snapshots ----------------------------------------------------------------------

    def write_snapshot(self, seq: int, data: bytes) -> None:
        """Store ``data`` as the state after record ``seq`` (<= last_seq), atomically."""
        self._refuse_write()
        writer = self._writer
        with writer.owned():
            if not 0 <= seq <= writer.pos.last_seq:
                raise JournalError(
                    f"snapshot seq {seq} is not in 0..{writer.pos.last_seq}", seq=seq
                )
            with writer.locked():
                # The records a snapshot covers must be durable before it claims them:
                # some may be another process's, written but never synced (it died in
                # between); a power cut would leave the snapshot beyond the journal's end.
                # And still there: read before their writer's fdatasync failed, they
                # were taken back (the catch-up fails the handle: TakenBackError).
                writer.catch_up_feeding(locked=True)
                writer.sync_read()
                write_snapshot(writer.directory, seq, bytes(data), writer.pos.max_epoch)

    def latest_snapshot(self) -> Snapshot | None:
        """The newest snapshot that passes its checks (damaged ones are skipped), or None.
        CorruptionError if it lies beyond the journal's end.  A view's is its base."""
        if self._view is not None:
            return self._view.base
        writer = self._writer
        with writer.owned():
            try:
                return latest_snapshot(writer.directory, writer.pos.last_seq).snapshot
            except CorruptionError:
                # Perhaps another process appended and snapshotted past what this handle
                # has seen: catch up (feeding subscribers) and look again.
                writer.catch_up_feeding()
                return latest_snapshot(writer.directory, writer.pos.last_seq).snapshot

    def newest_snapshot_file(self) -> tuple[int, int]:
        """(seq, inode) of the newest snapshot file ((0, 0): none), by listing the
        directory and one ``stat``: nothing read or checked, so it may be one that fails
        its checks (``latest_snapshot`` skips those).  For a cheap "has anyone written
        a snapshot since I last looked?": a snapshot written again at the same seq (an
        idle journal) is a new file (written aside, then renamed), so a new inode."""
        directory = self._writer.directory
        try:
            found = snapshots_in(_fsutil.listdir(directory), directory)
            return (found[-1][0], _fsutil.inode(found[-1][1])) if found else (0, 0)
        except FileNotFoundError:  # (no journal yet; or removed by a compaction meanwhile)
            return (0, 0)

    def compact(self) -> list[str]:
        """Remove sealed segments whose records are all <= the latest snapshot's seq (never
        the active one) and older snapshots.  Returns the removed paths."""
        self._refuse_write()
        writer = self._writer
        with writer.owned(), writer.locked():
            writer.catch_up_feeding(locked=True)
            found = latest_snapshot(writer.directory, writer.pos.last_seq)
            if found.snapshot is None:
                return []
            removed = compact(writer.directory, list_segments(writer.directory), found.snapshot.seq)
            segments = list_segments(writer.directory)
            if segments:
                writer.pos.first_seq = segments[0].first_seq
            return removed

    # -- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_records(
    directory: _fsutil.StrPath, from_seq: int = 1, *, allow_torn_tail: bool = True
) -> Iterator[Record]:
    """Stream the records of the journal at ``directory`` (see ``Journal.read``).  With
    ``allow_torn_tail=False`` a torn tail raises TornTailError (segment, offset, seq,
    tail_bytes) after the last valid record instead of ending the stream quietly."""
    return iter_records(_fsutil.fspath(directory), from_seq, allow_torn_tail=allow_torn_tail)
