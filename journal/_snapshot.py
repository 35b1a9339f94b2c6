"""Snapshots (atomic, checksummed) and compaction.

A snapshot file ``snapshot-{seq:020d}.snap`` is one header line and then the caller's
bytes::

    {"v":1,"seq":S,"epoch_max":E,"length":L,"data_crc":"xxxxxxxx","crc":"xxxxxxxx"}\\n<L bytes>

``crc`` covers the header bytes before ``,"crc":"`` (as for records); ``data_crc`` is
``zlib.crc32`` of the data; ``epoch_max`` is the highest epoch the journal held when
the snapshot was written, so fencing survives the compaction of the records that
carried it.  A snapshot that fails any check is *damaged*: readers fall back to an older
one (or to a full replay) and never crash on it.
"""

from __future__ import annotations

import itertools
import sys
import zlib
from collections import namedtuple

from journal import _fsutil, _json
from journal._codec import FORMAT_VERSION, line_checks
from journal._errors import CorruptionError, FormatVersionError
from journal._segment import Segment, seq_in_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple

_HEADER_BYTES_MAX = 4096


if TYPE_CHECKING:

    class Snapshot(NamedTuple):
        seq: int
        data: bytes

else:
    Snapshot = namedtuple("Snapshot", ("seq", "data"))


if TYPE_CHECKING:

    class SnapshotHeader(NamedTuple):
        seq: int
        epoch_max: int
        length: int
        data_crc: int
        header_bytes: int

else:
    SnapshotHeader = namedtuple(
        "SnapshotHeader", ("seq", "epoch_max", "length", "data_crc", "header_bytes")
    )


class SnapshotDamaged(Exception):
    """A snapshot file that fails a check (internal: callers fall back)."""


# What a salvage that keeps no snapshot writes, so that fencing survives it: a snapshot
# at seq 0 with no data, whose header carries the highest epoch of the damaged journal
# (_salvage._build). Counted at open (headers_epoch_max), removed by the next compaction.
EPOCH_CARRIER = "snapshot-epoch.snap"


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:020d}.snap"


def snapshots_in(
    names: list[str], directory: str, *, carriers: bool = False
) -> list[tuple[int, str]]:
    """The snapshot files among ``names``, oldest first; with ``carriers``, a salvage's
    ``EPOCH_CARRIER`` first (seq 0, no data: it only carries ``epoch_max``, and is never
    a base)."""
    found = []
    for name in names:
        seq = seq_in_name(name, "snapshot-", ".snap")
        if seq is not None:
            found.append((seq, _fsutil.join(directory, name)))
        elif carriers and name == EPOCH_CARRIER:
            found.append((0, _fsutil.join(directory, name)))
    found.sort()
    return found


def encode_snapshot(seq: int, data: bytes, epoch_max: int) -> bytes:
    body = b'{"v":%d,"seq":%d,"epoch_max":%d,"length":%d,"data_crc":"%08x"' % (
        FORMAT_VERSION,
        seq,
        epoch_max,
        len(data),
        zlib.crc32(data),
    )
    return b'%s,"crc":"%08x"}\n%s' % (body, zlib.crc32(body), data)


def write_snapshot(directory: str, seq: int, data: bytes, epoch_max: int) -> str:
    path = _fsutil.join(directory, snapshot_name(seq))
    # temp + fsync + rename + fsync dir: a crash leaves the old snapshot set or this
    # complete one, never a partial file under a snapshot name.
    _fsutil.atomic_replace(path, encode_snapshot(seq, data, epoch_max))
    return path


def _read_all(fd: int, start: int, length: int) -> bytes:
    parts = []
    pos, end = start, start + length
    while pos < end:
        chunk = _fsutil.pread(fd, min(end - pos, 1 << 20), pos)
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
    return b"".join(parts)


def read_header(fd: int, seq_from_name: int) -> SnapshotHeader:
    head = _fsutil.pread(fd, _HEADER_BYTES_MAX, 0)
    newline = head.find(b"\n")
    if newline < 0 or not line_checks(head[:newline]):
        raise SnapshotDamaged("header incomplete or checksum mismatch")
    try:
        obj = _json.loads(head[:newline])
    except ValueError:
        raise SnapshotDamaged("header does not parse") from None
    if not isinstance(obj, dict):
        raise SnapshotDamaged("header is not a JSON object")
    version = obj.get("v")
    if type(version) is int and version > FORMAT_VERSION:
        raise FormatVersionError(f"snapshot format v{version} is newer than v{FORMAT_VERSION}")
    fields = (obj.get("seq"), obj.get("epoch_max"), obj.get("length"))
    if version != FORMAT_VERSION or any(type(f) is not int for f in fields):
        raise SnapshotDamaged("header fields missing or of the wrong type")
    if obj["seq"] != seq_from_name:
        raise SnapshotDamaged(f"header says seq {obj['seq']}, file name says {seq_from_name}")
    try:
        data_crc = int(obj.get("data_crc", ""), 16)
    except (TypeError, ValueError):
        raise SnapshotDamaged("bad data_crc") from None
    return SnapshotHeader(obj["seq"], obj["epoch_max"], obj["length"], data_crc, newline + 1)


def load_snapshot(path: str, seq_from_name: int) -> tuple[Snapshot, int]:
    """The snapshot and its epoch_max; SnapshotDamaged if any check fails."""
    fd = _fsutil.open_read(path)
    try:
        header = read_header(fd, seq_from_name)
        if _fsutil.size(fd) != header.header_bytes + header.length:
            raise SnapshotDamaged("file length does not match the header")
        data = _read_all(fd, header.header_bytes, header.length)
    finally:
        _fsutil.close(fd)
    if len(data) != header.length or zlib.crc32(data) != header.data_crc:
        raise SnapshotDamaged("data checksum mismatch")
    return Snapshot(header.seq, data), header.epoch_max


if TYPE_CHECKING:

    class LatestSnapshot(NamedTuple):
        snapshot: Snapshot | None
        epoch_max: int
        path: str | None
        damaged: list[tuple[str, str]]

else:
    LatestSnapshot = namedtuple("LatestSnapshot", ("snapshot", "epoch_max", "path", "damaged"))


def latest_snapshot(directory: str, last_seq: int) -> LatestSnapshot:
    """The newest snapshot that passes every check, skipping damaged ones.

    A valid snapshot beyond ``last_seq`` means the journal lost committed records (or
    the snapshot was written for another journal): CorruptionError."""
    damaged: list[tuple[str, str]] = []
    try:
        names = _fsutil.listdir(directory)
    except FileNotFoundError:  # (a read-only handle on a journal not made yet)
        return LatestSnapshot(None, 0, None, damaged)
    for seq, path in reversed(snapshots_in(names, directory)):
        try:
            snapshot, epoch_max = load_snapshot(path, seq)
        except SnapshotDamaged as exc:
            damaged.append((path, str(exc)))
            continue
        except FileNotFoundError:
            continue  # removed by a concurrent compaction: an older one was superseded
        if snapshot.seq > last_seq:
            raise CorruptionError(
                f"snapshot at seq {snapshot.seq} is beyond the journal's last seq {last_seq}",
                segment=path,
                seq=snapshot.seq,
            )
        return LatestSnapshot(snapshot, epoch_max, path, damaged)
    return LatestSnapshot(None, 0, None, damaged)


def read_latest_snapshot(directory: _fsutil.StrPath) -> Snapshot | None:
    """The newest snapshot in the journal at ``directory`` that passes its checks, read
    without a handle (lock-free): for a reader that must not call back into its own
    handle, such as a subscriber that loads history.  Unlike
    ``Journal.latest_snapshot`` it does not compare it with the journal's end."""
    return latest_snapshot(_fsutil.fspath(directory), sys.maxsize).snapshot


def read_snapshots(directory: _fsutil.StrPath) -> list[Snapshot]:
    """Every snapshot in the journal at ``directory`` that passes its checks, oldest
    first (a damaged one is left out), read without a handle: what a salvage looks at
    besides the one it keeps (the archives a newer one names, say)."""
    directory = _fsutil.fspath(directory)
    try:
        names = _fsutil.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for seq, path in snapshots_in(names, directory):
        try:
            found.append(load_snapshot(path, seq)[0])
        except (SnapshotDamaged, FileNotFoundError):
            continue
    return found


def headers_epoch_max(directory: str, names: list[str]) -> tuple[int, int]:
    """(highest epoch_max, highest seq) over the snapshot headers that check (cheap: the
    data is not read).  Used at open so that fencing survives compaction."""
    epoch_max = seq_max = 0
    for seq, path in snapshots_in(names, directory, carriers=True):
        try:
            fd = _fsutil.open_read(path)
        except FileNotFoundError:
            continue
        try:
            header = read_header(fd, seq)
        except SnapshotDamaged:
            continue
        finally:
            _fsutil.close(fd)
        epoch_max = max(epoch_max, header.epoch_max)
        seq_max = max(seq_max, header.seq)
    return epoch_max, seq_max


def compact(directory: str, segments: list[Segment], snapshot_seq: int) -> list[str]:
    """Remove sealed segments whose records are all <= ``snapshot_seq`` (never the last
    one), oldest first, up to the first one a handle still reads (pinned: a handle that
    fell behind must find every record after its own), then snapshots older than it.
    Returns the removed paths."""
    removed: list[str] = []
    for segment, following in itertools.pairwise(segments):
        if following.first_seq - 1 > snapshot_seq:
            break
        fd = _fsutil.removable(segment.path)
        if fd is None:
            break  # pinned: it and the segments after it stay until its reader moves on
        try:
            _fsutil.unlink(segment.path)
            # One directory fsync per removal, oldest first: whatever a crash keeps is
            # still a contiguous run of segments (no hole that would read as a gap).
            _fsutil.fsync_dir(directory)
        finally:
            _fsutil.close(fd)
        removed.append(segment.path)
    names = _fsutil.listdir(directory)
    older = [p for seq, p in snapshots_in(names, directory, carriers=True) if seq < snapshot_seq]
    # Temp files of snapshot writes that crashed (the caller holds the append lock, so
    # no snapshot write is in progress).
    older += [
        _fsutil.join(directory, n)
        for n in names
        if n.startswith(".snapshot-") and n.endswith(".tmp")
    ]
    for path in older:
        _fsutil.unlink(path)
        removed.append(path)
    if older:
        # Losing these removals in a crash is harmless (older snapshots are ignored);
        # the fsync just makes compaction's effect durable when it returns.
        _fsutil.fsync_dir(directory)
    return removed
