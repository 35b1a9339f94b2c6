"""The index beside a settled-task archive: what lets ``ls`` and ``show`` read a few of
its lines instead of all of it (docs/journal-format.md, "Settled-task archives").

An archive (``settled-<seq>-<random>.jsonl``) is JSON Lines, one task record a line,
sorted by (``submit_seq``, id): the order ``ls`` lists. Its index
(``index-<seq>-<random>.idx``, the same ``<seq>-<random>``) is written and fsynced
after it and before the snapshot that names both; it is ASCII, fixed-width after its
header line:

    {"v":1,"archive":NAME,"bytes":B,"count":N,"id_width":W,"states":[...],"crc":"xxxxxxxx"}
    N position entries, the archive's order: one per line of the archive
        submit_seq (16 hex) number (16 hex) state (2 hex: its place in "states")
        offset (12 hex) length (8 hex) line_crc (8 hex) id (W, space-padded) crc (8 hex) \\n
    N id entries, sorted by id
        id (W, space-padded) position (8 hex) crc (8 hex) \\n

Every checksum is CRC-32 started from the CRC-32 of the archive's name
(``zlib.crc32(data, seed)``): ``line_crc`` of the archive's line (its newline included),
each entry's ``crc`` of the entry before it, the header's of its bytes before
``,"crc":"``. So what a reader reads is checked, and an index or archive that is
another archive's (renamed, restored from elsewhere) does not check. The archive's
SHA-256 stays in the snapshot: a full load checks the whole file by it, as before.

What a partial read checks: the header (and that it names this archive, its size and
count as the snapshot does), the sizes of both files, each entry it reads, each line
it reads (and that the line is the task the entry names). What it cannot: damage in
lines it does not read, which ``journal verify`` (every line, by SHA-256, and every
index against its archive) and any full load find. Anything that does not check raises
``HistoryMissed``: the table then loads its history whole, which decides what is damage.
"""

from __future__ import annotations

import bisect
import itertools
import os
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence

from ferry.core.history import HistoryMissed
from journal import _json

TYPE_CHECKING = False  # (no typing at run time: docs/architecture.md, "Start-up cost")
if TYPE_CHECKING:
    from typing import Any

INDEX_PREFIX = "index-"
INDEX_SUFFIX = ".idx"
INDEX_FORMAT = 1
_HEADER_BYTES_MAX = 64 << 10  # (a header names the states: a few dozen bytes each)
_CRC_KEY = b',"crc":"'
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
# A position entry without its id: submit_seq, number, state, offset, length, line_crc.
_POSITION_FIXED = 16 + 16 + 2 + 12 + 8 + 8
_CHUNK_ENTRIES = 64  # position entries read at once, newest first


def index_name(archive_name: str) -> str:
    """``settled-<seq>-<random>.jsonl`` -> ``index-<seq>-<random>.idx``."""
    stem = archive_name.removesuffix(".jsonl").partition("-")[2]
    return f"{INDEX_PREFIX}{stem}{INDEX_SUFFIX}"


def _seed(archive_name: str) -> int:
    return zlib.crc32(archive_name.encode())


def _crc(data: bytes, seed: int) -> bytes:
    return b"%08x" % zlib.crc32(data, seed)


def order_key(record: Mapping[str, Any]) -> tuple[int, str]:
    """An archive's order, and ``ls``'s: submission, then id."""
    return int(record.get("submit_seq") or 0), str(record["id"])


def build_index(
    archive_name: str, records: Sequence[Mapping[str, Any]], lines: Sequence[bytes]
) -> tuple[bytes, dict[str, Any]]:
    """The index of an archive whose ``lines`` (each ending in a newline) are
    ``records``, in ``order_key`` order; and what the snapshot's entry for the archive
    says of it (the bytes, the ranges of ids, submissions and numbers it holds)."""
    seed = _seed(archive_name)
    width = max((len(str(r["id"])) for r in records), default=1)
    states = sorted({str(r["state"]) for r in records})
    state_at = {state: i for i, state in enumerate(states)}
    positions, offset = [], 0
    for record, line in zip(records, lines, strict=True):
        entry = b"%016x%016x%02x%012x%08x%s%s" % (
            int(record.get("submit_seq") or 0), int(record.get("number") or 0),
            state_at[str(record["state"])], offset, len(line), _crc(line, seed),
            str(record["id"]).ljust(width).encode(),
        )  # fmt: skip
        positions.append(entry + _crc(entry, seed) + b"\n")
        offset += len(line)
    by_id = sorted(range(len(records)), key=lambda k: str(records[k]["id"]))
    ids = []
    for k in by_id:
        entry = str(records[k]["id"]).ljust(width).encode() + b"%08x" % k
        ids.append(entry + _crc(entry, seed) + b"\n")
    about_index = {"v": INDEX_FORMAT, "archive": archive_name, "bytes": offset,
                   "count": len(records), "id_width": width, "states": states}  # fmt: skip
    head = _json.dumps(about_index)[:-1]
    header = head + _CRC_KEY + _crc(head, seed) + b'"}\n'
    numbers = [int(r.get("number") or 0) for r in records]
    about: dict[str, Any] = {
        "index": index_name(archive_name),
        "bytes": offset,
        "submit_max": max((order_key(r)[0] for r in records), default=0),
        "id_min": min((str(r["id"]) for r in records), default=""),
        "id_max": max((str(r["id"]) for r in records), default=""),
    }
    if numbers and numbers[0] > 0 and all(a < b for a, b in itertools.pairwise(numbers)):
        about["numbers"] = [numbers[0], numbers[-1]]  # (they rise: bisectable)
    return header + b"".join(positions) + b"".join(ids), about


def check_index(directory: str, ref: Mapping[str, Any], body: bytes) -> str | None:
    """What is wrong with the index of the archive ``ref`` names, whose bytes (checked
    by SHA-256) are ``body``: None if it is the index ferry writes for them, byte for
    byte, and the snapshot says of it what it holds (``journal verify``)."""
    lines = body.splitlines(keepends=True)
    try:
        records = _json.loads_each(lines)
        index, about = build_index(str(ref["name"]), records, lines)
    except (ValueError, KeyError, TypeError) as error:
        return f"its records cannot be indexed ({error})"
    if [order_key(r) for r in records] != sorted(order_key(r) for r in records):
        return "its records are not in order"
    try:
        with open(os.path.join(directory, str(ref["index"])), "rb") as file:
            found = file.read()
    except OSError as error:
        return f"its index {ref['index']} is missing or unreadable: {error.strerror}"
    if found != index:
        return f"its index {ref['index']} does not match it"
    if any(ref.get(key) != value for key, value in about.items()):
        return "the snapshot does not say what it holds"
    return None


def index_made_of(directory: str, archive_name: str, body: bytes) -> bool:
    """Is the index beside ``archive_name`` the one its bytes ``body`` make, byte for
    byte? (Salvage's check of an archive no readable snapshot names: every line's CRC
    and the size and count are in it, all chained from the archive's name.)"""
    lines = body.splitlines(keepends=True)
    try:
        records = _json.loads_each(lines)
        index, _ = build_index(archive_name, records, lines)
        with open(os.path.join(directory, index_name(archive_name)), "rb") as file:
            return file.read() == index
    except (OSError, ValueError, KeyError, TypeError):
        return False


def index_tasks(directory: str, archive_name: str) -> tuple[list[dict[str, Any]], bool]:
    """The tasks the index of ``archive_name`` names (``id``, ``state``, ``number``,
    ``submit_seq``), from its entries that check; and whether that is every task of
    the archive (the header checks, the file is whole, every entry checks). For a
    salvage that lost the archive itself: its index is the last list of its tasks."""
    try:
        with open(os.path.join(directory, index_name(archive_name)), "rb") as file:
            data = file.read()
    except OSError:
        return [], False
    seed = _seed(archive_name)
    line, newline, rest = data.partition(b"\n")
    body, _, tail = line.rpartition(_CRC_KEY)
    if not newline or tail != _crc(body, seed) + b'"}':
        return [], False
    try:
        header = _json.loads(line)
        count, width = int(header["count"]), int(header["id_width"])
        states = [str(state) for state in header["states"]]
        if header["archive"] != archive_name:
            return [], False
    except (ValueError, KeyError, TypeError):
        return [], False
    size = _POSITION_FIXED + width + 9
    tasks: list[dict[str, Any]] = []
    for k in range(count):
        raw = rest[k * size : (k + 1) * size]
        entry = raw[: size - 9]
        if len(raw) != size or raw[size - 9 :] != _crc(entry, seed) + b"\n":
            continue
        try:
            tasks.append({
                "id": entry[62 : 62 + width].decode("ascii").rstrip(" "),
                "state": states[int(entry[32:34], 16)],
                "number": int(entry[16:32], 16),
                "submit_seq": int(entry[0:16], 16),
            })  # fmt: skip
        except (ValueError, IndexError):
            continue
    whole = len(tasks) == count and len(rest) == count * (size + width + 17)
    return tasks, whole


class Position:
    """One position entry: an archived task as the index has it (``ArchivedTask``)."""

    __slots__ = ("archive", "length", "line_crc", "number", "offset", "state", "submit_seq",
                 "task_id")  # fmt: skip

    def __init__(self, archive: IndexedArchive, raw: bytes) -> None:
        self.archive = archive
        self.submit_seq = int(raw[0:16], 16)
        self.number = int(raw[16:32], 16)
        self.state = archive.states[int(raw[32:34], 16)]
        self.offset = int(raw[34:46], 16)
        self.length = int(raw[46:54], 16)
        self.line_crc = raw[54:62]
        self.task_id = raw[62 : 62 + archive.width].decode("ascii").rstrip(" ")

    @property
    def key(self) -> tuple[int, str]:
        return self.submit_seq, self.task_id

    def record(self) -> Mapping[str, Any]:
        return self.archive.record(self)


class IndexedArchive:
    """An archive and its index, open for a few reads (use as a context manager). Every
    failure to read or check is ``HistoryMissed``."""

    def __init__(self, directory: str, ref: Mapping[str, Any]) -> None:
        self.name = str(ref["name"])
        self.seed = _seed(self.name)
        self.index_fd = self.archive_fd = -1
        try:
            self.index_fd = os.open(os.path.join(directory, str(ref["index"])), _OPEN_FLAGS)
            self.archive_fd = os.open(os.path.join(directory, self.name), _OPEN_FLAGS)
            self._read_header(ref)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
            self.close()
            raise HistoryMissed(f"archive {self.name}: {error}") from error
        except BaseException:
            self.close()
            raise

    def _read_header(self, ref: Mapping[str, Any]) -> None:
        head = os.pread(self.index_fd, _HEADER_BYTES_MAX, 0)
        line = head[: head.index(b"\n") + 1]
        body, _, tail = line.rpartition(_CRC_KEY)
        if tail != _crc(body, self.seed) + b'"}\n':
            raise ValueError("its index's header does not check")
        header = _json.loads(line)
        self.count, self.width = int(header["count"]), int(header["id_width"])
        self.states = [str(state) for state in header["states"]]
        said = (header["v"], header["archive"], header["bytes"], self.count)
        if said != (INDEX_FORMAT, self.name, ref["bytes"], ref["count"]):
            raise ValueError("its index is not the one the snapshot names")
        self.position_width = _POSITION_FIXED + self.width + 9
        self.id_width = self.width + 17
        self.positions_at = len(line)
        self.ids_at = self.positions_at + self.count * self.position_width
        if os.fstat(self.index_fd).st_size != self.ids_at + self.count * self.id_width:
            raise ValueError("its index is not whole")
        if os.fstat(self.archive_fd).st_size != header["bytes"]:
            raise ValueError("it is not the size the snapshot says")

    def close(self) -> None:
        for fd in (self.index_fd, self.archive_fd):
            if fd >= 0:
                os.close(fd)
        self.index_fd = self.archive_fd = -1

    def __enter__(self) -> IndexedArchive:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- entries -------------------------------------------------------------------

    def _entries(self, at: int, width: int, first: int, count: int) -> list[bytes]:
        """``count`` entries of ``width`` bytes from number ``first``, each checked,
        without its checksum and newline."""
        try:
            raw = os.pread(self.index_fd, width * count, at + first * width)
        except OSError as error:
            raise HistoryMissed(f"archive {self.name}: {error}") from error
        if len(raw) != width * count:
            raise HistoryMissed(f"archive {self.name}: its index ends early")
        entries = []
        for start in range(0, len(raw), width):
            entry = raw[start : start + width - 9]
            if raw[start + width - 9 : start + width] != _crc(entry, self.seed) + b"\n":
                raise HistoryMissed(f"archive {self.name}: an index entry does not check")
            entries.append(entry)
        return entries

    def positions(self, first: int, count: int) -> list[Position]:
        entries = self._entries(self.positions_at, self.position_width, first, count)
        try:
            return [Position(self, entry) for entry in entries]
        except (ValueError, IndexError) as error:  # (checked: written so by a bug)
            raise HistoryMissed(f"archive {self.name}: {error}") from error

    def position(self, k: int) -> Position:
        return self.positions(k, 1)[0]

    def _id_entry(self, j: int) -> tuple[str, int]:
        (entry,) = self._entries(self.ids_at, self.id_width, j, 1)
        return entry[: self.width].decode("ascii").rstrip(" "), int(entry[self.width :], 16)

    def newest_first(self) -> Iterator[Position]:
        """Every position entry, the last first (a chunk at a time)."""
        end = self.count
        while end > 0:
            first = max(0, end - _CHUNK_ENTRIES)
            yield from reversed(self.positions(first, end - first))
            end = first

    # ---- look-ups (bisection: a few entries read) ------------------------------------

    def _first_id_at_least(self, task_id: str) -> int:
        return bisect.bisect_left(_Lazy(self.count, lambda j: self._id_entry(j)[0]), task_id)

    def find_id(self, task_id: str) -> Position | None:
        j = self._first_id_at_least(task_id)
        if j == self.count:
            return None
        found, k = self._id_entry(j)
        return self.position(k) if found == task_id else None

    def with_prefix(self, prefix: str, limit: int) -> tuple[list[str], bool]:
        found: list[str] = []
        j = self._first_id_at_least(prefix)
        while j < self.count:
            task_id, _ = self._id_entry(j)
            if not task_id.startswith(prefix):
                return found, False
            if len(found) == limit:
                return found, True
            found.append(task_id)
            j += 1
        return found, False

    def find_number(self, number: int) -> Position | None:
        """(Numbers rise with the archive's order when every entry has one.)"""
        k = bisect.bisect_left(_Lazy(self.count, lambda k: self.position(k).number), number)
        if k == self.count:
            return None
        position = self.position(k)
        return position if position.number == number else None

    def record(self, position: Position) -> Mapping[str, Any]:
        """The line ``position`` names, checked, as a record of that task."""
        try:
            line = os.pread(self.archive_fd, position.length, position.offset)
        except OSError as error:
            raise HistoryMissed(f"archive {self.name}: {error}") from error
        if len(line) != position.length or _crc(line, self.seed) != position.line_crc:
            raise HistoryMissed(f"archive {self.name}: a line does not check")
        try:
            record = _json.loads(line)
        except ValueError as error:
            raise HistoryMissed(f"archive {self.name}: {error}") from error
        if not isinstance(record, dict) or record.get("id") != position.task_id:
            raise HistoryMissed(f"archive {self.name}: a line is not the task its index says")
        return record


class _Lazy:
    """A sequence whose items are read when ``bisect`` asks for them."""

    def __init__(self, length: int, item: Callable[[int], Any]) -> None:
        self._length, self._item = length, item

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        return self._item(index)
