"""A simulated disk: what survives a power cut, over a real sequence of file operations.

`kill -9` tests cannot find a missing fsync: the page cache survives the process. This
module models what the *disk* keeps, so a test can ask "if the power had gone out right
here, which bytes and which directory entries would still be there?".

How it works (trace, then simulate):

* `SimDisk(root)` stands in for the `os` module inside `journal._fsutil`. Every call goes
  to the real `os` (so locks, reads and the library's own view of its files are real),
  and every call that changes a file or a directory under `root` is also recorded, as a
  model-level event, in `SimDisk.events`:
    - `Create(dir, name, ino)`, `Rename(dir, src, dst)`, `Unlink(dir, name)`,
      `Mkdir(dir, name, child)`: directory entries, volatile until that directory is fsynced;
    - `Write(ino, offset, data)`, `Truncate(ino, length)`: file content, volatile until
      that file is fsynced;
    - `FsyncFile(ino)` (fsync or fdatasync of a file), `FsyncDir(dir)` (fsync of a
      directory descriptor): make the file's content, or the directory's entries, durable.
* `power_cuts(sim)` replays the events in a model that keeps, per file, the durable
  content and the writes not yet synced, and per directory the durable entries and the
  entry operations not yet synced. At every event boundary (the power goes out after
  event k completed) it yields the states a disk may come back with:
    - unsynced directory operations: lost, or kept as an in-order prefix (a journalling
      file system commits metadata in order);
    - unsynced writes of each file: dropped, kept as an in-order prefix, the next write
      torn at a few byte offsets, or NUL-filled (the size reached the disk, the data did
      not), or torn and then NUL-filled, or landed from a 512-byte sector boundary on
      while the sectors before it did not, or landed but for one sector inside it (a
      disk may write them in any order).
  Choices are combined across files and directories (deterministically sampled when
  there are too many) and deduplicated.
* `materialise(state, path)` writes one surviving state into a real directory, so the
  real library (with the real `os`) can open, repair and read it.

Modelling choices (conservative on purpose): fsync of a file does not make its directory
entry durable (POSIX does not promise it; design rule 5 says fsync the directory); a
rename or unlink is lost unless the directory is fsynced afterwards. Renames across
directories are not modelled (the journal never does them) and raise.

Calls the model does not know raise `NotImplementedError` when called (and are listed in
`SimDisk.unmodelled`), so a library change that starts using a new `os` call makes the
power-cut tests fail loudly instead of silently tracing nothing.
"""

from __future__ import annotations

import hashlib
import os as real_os
import random
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Create:
    dir: str
    name: str
    ino: int


@dataclass(frozen=True)
class Mkdir:
    dir: str
    name: str
    child: str  # the new directory's absolute path


@dataclass(frozen=True)
class Rename:
    dir: str
    src: str
    dst: str


@dataclass(frozen=True)
class Unlink:
    dir: str
    name: str


@dataclass(frozen=True)
class Write:
    ino: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class Truncate:
    ino: int
    length: int


@dataclass(frozen=True)
class FsyncFile:
    ino: int


@dataclass(frozen=True)
class FsyncDir:
    dir: str


Event = Create | Mkdir | Rename | Unlink | Write | Truncate | FsyncFile | FsyncDir
DirOp = Create | Mkdir | Rename | Unlink
FileOp = Write | Truncate

# An entry is a file (its inode number) or a sub-directory (its absolute path).
Entry = int | str

# Calls that neither change files nor directories: passed through untouched.
_READ_ONLY = frozenset(
    {
        "read",
        "pread",
        "readv",
        "lseek",
        "fstat",
        "fstatvfs",
        "stat",
        "lstat",
        "listdir",
        "scandir",
        "walk",
        "access",
        "fspath",
        "fsencode",
        "fsdecode",
        "getpid",
        "getppid",
        "strerror",
        "get_inheritable",
        "set_inheritable",
        "get_blocking",
        "set_blocking",
        "urandom",
        "getcwd",
        "cpu_count",
        "isatty",
        "kill",
        "getenv",
        "geteuid",
        "getuid",
    }
)


# --------------------------------------------------------------------------- tracing


class SimDisk:
    """Stands in for `os` in journal._fsutil: real calls, plus a trace of what they did."""

    def __init__(
        self, root: Path | str, *, content_irrelevant: frozenset[str] = frozenset()
    ) -> None:
        self.root = real_os.path.realpath(root)
        # Names of files whose content no reader depends on (a lock file): their unsynced
        # writes are not enumerated, so the state budget goes to the files that matter.
        self.content_irrelevant = content_irrelevant
        self.events: list[Event] = []
        self.unmodelled: list[str] = []
        self.initial_dirs: dict[str, dict[str, Entry]] = {}
        self.initial_files: dict[int, bytes] = {}
        self._next_ino = 1
        # Volatile view of the tree as the running program sees it (kept in step with
        # the real directory): dir path -> name -> entry.
        self._dirs: dict[str, dict[str, Entry]] = {}
        self._fds: dict[int, int | str] = {}  # fd -> inode, or dir path for a dir fd
        # For meta-tests only: a predicate that turns chosen fsyncs into no-ops (neither
        # done nor traced), as if that line had been deleted from the library.
        self.skip_sync: Callable[[int | str], bool] | None = None
        # Called before every call that changes something, with the call's name and its
        # target (inode, directory path, or path): a test raises from it to make the
        # program die right there, as a process killed mid-operation would.
        self.before: Callable[[str, Any], None] | None = None
        self._scan(self.root)
        self.initial_dirs = {d: dict(e) for d, e in self._dirs.items()}

    # -- bookkeeping

    def _scan(self, directory: str) -> None:
        entries: dict[str, Entry] = {}
        self._dirs[directory] = entries
        for name in sorted(real_os.listdir(directory)):
            full = real_os.path.join(directory, name)
            if real_os.path.isdir(full):
                entries[name] = full
                self._scan(full)
            else:
                ino = self._new_ino()
                entries[name] = ino
                self.initial_files[ino] = Path(full).read_bytes()

    def _new_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def _split(self, path: Any) -> tuple[str, str] | None:
        """(parent dir, name) for a path under root, or None for a path outside it."""
        full = real_os.path.abspath(real_os.fspath(path))
        parent, name = real_os.path.split(full)
        parent = real_os.path.realpath(parent)
        if parent != self.root and not parent.startswith(self.root + real_os.sep):
            return None
        if parent not in self._dirs:
            raise NotImplementedError(f"simdisk: parent directory {parent} not tracked")
        return parent, name

    def _dir_path(self, path: Any) -> str | None:
        full = real_os.path.realpath(real_os.fspath(path))
        return full if full in self._dirs else None

    # -- the os interface

    def __getattr__(self, name: str) -> Any:
        value = getattr(real_os, name)
        if not callable(value) or name in _READ_ONLY or isinstance(value, type):
            return value
        if name == "path":
            return value
        self.unmodelled.append(name)

        def unmodelled(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"simdisk: os.{name} is not modelled")

        return unmodelled

    def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if dir_fd is not None:
            raise NotImplementedError("simdisk: dir_fd is not modelled")
        if flags & (real_os.O_CREAT | real_os.O_TRUNC):
            self._before("open", path)
        existed = real_os.path.lexists(path)
        fd = real_os.open(path, flags, mode)
        if stat.S_ISDIR(real_os.fstat(fd).st_mode):
            directory = self._dir_path(path)
            if directory is not None:
                self._fds[fd] = directory
            return fd
        where = self._split(path)
        if where is None:
            return fd
        parent, name = where
        entries = self._dirs[parent]
        if name not in entries:
            if existed:
                raise NotImplementedError(f"simdisk: {path} exists but was never traced")
            ino = self._new_ino()
            entries[name] = ino
            self.events.append(Create(parent, name, ino))
        entry = entries[name]
        assert isinstance(entry, int)
        if flags & real_os.O_TRUNC and flags & (real_os.O_WRONLY | real_os.O_RDWR):
            self.events.append(Truncate(entry, 0))
        self._fds[fd] = entry
        return fd

    def close(self, fd: int) -> None:
        real_os.close(fd)
        self._fds.pop(fd, None)

    def write(self, fd: int, data: Any) -> int:
        self._before("write", self._fds.get(fd))
        written = real_os.write(fd, data)
        ino = self._fds.get(fd)
        if isinstance(ino, int) and written > 0:
            end = real_os.lseek(fd, 0, real_os.SEEK_CUR)
            self.events.append(Write(ino, end - written, bytes(data)[:written]))
        return written

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._before("pwrite", self._fds.get(fd))
        written = real_os.pwrite(fd, data, offset)
        ino = self._fds.get(fd)
        if isinstance(ino, int) and written > 0:
            if _is_append(fd):
                raise NotImplementedError("simdisk: pwrite on an O_APPEND fd")
            self.events.append(Write(ino, offset, bytes(data)[:written]))
        return written

    def fsync(self, fd: int) -> None:
        self._before("fsync", self._fds.get(fd))
        if self._skipped(fd):
            return
        real_os.fsync(fd)
        self._record_sync(fd)

    def fdatasync(self, fd: int) -> None:
        self._before("fdatasync", self._fds.get(fd))
        if self._skipped(fd):
            return
        real_os.fdatasync(fd)
        self._record_sync(fd)

    def _skipped(self, fd: int) -> bool:
        target = self._fds.get(fd)
        return target is not None and self.skip_sync is not None and self.skip_sync(target)

    def _before(self, name: str, target: Any) -> None:
        if self.before is not None:
            self.before(name, target)

    def _record_sync(self, fd: int) -> None:
        target = self._fds.get(fd)
        if isinstance(target, int):
            self.events.append(FsyncFile(target))
        elif isinstance(target, str):
            self.events.append(FsyncDir(target))

    def ftruncate(self, fd: int, length: int) -> None:
        self._before("ftruncate", self._fds.get(fd))
        real_os.ftruncate(fd, length)
        ino = self._fds.get(fd)
        if isinstance(ino, int):
            self.events.append(Truncate(ino, length))

    def truncate(self, path: Any, length: int) -> None:
        if isinstance(path, int):
            self.ftruncate(path, length)
            return
        real_os.truncate(path, length)
        where = self._split(path)
        if where is not None:
            entry = self._dirs[where[0]][where[1]]
            assert isinstance(entry, int)
            self.events.append(Truncate(entry, length))

    def replace(self, src: Any, dst: Any) -> None:
        self._before("replace", src)
        real_os.replace(src, dst)
        self._record_rename(src, dst)

    def rename(self, src: Any, dst: Any) -> None:
        self._before("rename", src)
        real_os.rename(src, dst)
        self._record_rename(src, dst)

    def _record_rename(self, src: Any, dst: Any) -> None:
        a, b = self._split(src), self._split(dst)
        if a is None and b is None:
            return
        if a is None or b is None or a[0] != b[0]:
            raise NotImplementedError("simdisk: rename across directories")
        entries = self._dirs[a[0]]
        entries[b[1]] = entries.pop(a[1])
        self.events.append(Rename(a[0], a[1], b[1]))

    def unlink(self, path: Any, *, dir_fd: Any = None) -> None:
        self._before("unlink", path)
        if dir_fd is not None:
            raise NotImplementedError("simdisk: dir_fd is not modelled")
        real_os.unlink(path)
        where = self._split(path)
        if where is not None:
            del self._dirs[where[0]][where[1]]
            self.events.append(Unlink(*where))

    remove = unlink

    def mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: Any = None) -> None:
        self._before("mkdir", path)
        if dir_fd is not None:
            # Relative to a directory descriptor: traced when that directory is.
            real_os.mkdir(path, mode, dir_fd=dir_fd)
            base = self._fds.get(dir_fd)
            if not isinstance(base, str):
                return
            path = real_os.path.join(base, real_os.fspath(path))
        else:
            real_os.mkdir(path, mode)
        where = self._split(path)
        if where is not None:
            child = real_os.path.realpath(real_os.fspath(path))
            self._dirs[where[0]][where[1]] = child
            self._dirs[child] = {}
            self.events.append(Mkdir(where[0], where[1], child))

    def chmod(
        self, path: Any, mode: int, *, dir_fd: Any = None, follow_symlinks: bool = True
    ) -> None:
        # Permission bits are not modelled (what survives is entries and bytes).
        real_os.chmod(path, mode, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    def makedirs(self, path: Any, mode: int = 0o777, exist_ok: bool = False) -> None:
        # os.makedirs calls the real os.mkdir internally; walk it here so every
        # directory it creates is traced.
        full = real_os.path.abspath(real_os.fspath(path))
        if real_os.path.isdir(full):
            if not exist_ok:
                raise FileExistsError(full)
            return
        parent = real_os.path.dirname(full)
        if parent != full and not real_os.path.isdir(parent):
            self.makedirs(parent, mode, exist_ok=True)
        self.mkdir(full, mode)

    # -- checks

    def check_in_step(self) -> list[str]:
        """Differences between the traced volatile view and the real tree (should be none)."""
        problems: list[str] = []
        contents = volatile_contents(self)
        for directory, entries in self._dirs.items():
            real_names = set(real_os.listdir(directory))
            if real_names != set(entries):
                problems.append(
                    f"{directory}: real {sorted(real_names)} != traced {sorted(entries)}"
                )
            for name, entry in entries.items():
                if isinstance(entry, int) and name in real_names:
                    actual = Path(directory, name).read_bytes()
                    if actual != contents[entry]:
                        problems.append(f"{directory}/{name}: content differs from the trace")
        return problems + [f"unmodelled os.{name}" for name in self.unmodelled]


def _is_append(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & real_os.O_APPEND)


def volatile_contents(sim: SimDisk) -> dict[int, bytes]:
    """Every inode's content as the running program sees it (all events applied)."""
    contents = {ino: bytearray(data) for ino, data in sim.initial_files.items()}
    for event in sim.events:
        if isinstance(event, Create):
            contents[event.ino] = bytearray()
        elif isinstance(event, Write | Truncate):
            _apply(contents[event.ino], event)
    return {ino: bytes(data) for ino, data in contents.items()}


def _apply(content: bytearray, op: FileOp) -> None:
    if isinstance(op, Write):
        end = op.offset + len(op.data)
        if len(content) < op.offset:
            content.extend(b"\0" * (op.offset - len(content)))
        content[op.offset : end] = op.data
    else:
        del content[op.length :]
        if len(content) < op.length:
            content.extend(b"\0" * (op.length - len(content)))


# --------------------------------------------------------------------------- power cuts

# One surviving state: relative path -> file bytes; directories as relative path -> None.
State = dict[str, bytes | None]


@dataclass
class _FileModel:
    durable: bytes
    pending: list[FileOp] = field(default_factory=list)


@dataclass
class _DirModel:
    durable: dict[str, Entry]
    pending: list[DirOp] = field(default_factory=list)


SECTOR_BYTES = 512


def file_outcomes(durable: bytes, pending: list[FileOp]) -> list[bytes]:
    """What a file may hold after a power cut, given its durable bytes and unsynced ops."""
    outcomes: list[bytes] = []
    content = bytearray(durable)
    outcomes.append(bytes(content))
    for op in pending:
        if isinstance(op, Write) and len(op.data) > 1:
            n = len(op.data)
            for cut in sorted({1, n // 2, n - 1}):
                torn = bytearray(content)
                _apply(torn, Write(op.ino, op.offset, op.data[:cut]))
                outcomes.append(bytes(torn))
                mixed = bytearray(content)
                _apply(mixed, Write(op.ino, op.offset, op.data[:cut] + b"\0" * (n - cut)))
                outcomes.append(bytes(mixed))
            zeros = bytearray(content)
            _apply(zeros, Write(op.ino, op.offset, b"\0" * n))
            outcomes.append(bytes(zeros))
            # Its sectors landing out of order: from an aligned sector on, the write
            # reached the disk; before it, the old bytes stayed (zeros beyond the end).
            # Only boundaries inside its non-NUL bytes: a suffix of NULs written over
            # NULs changes nothing.
            landed_end = op.offset + len(op.data.rstrip(b"\0"))
            first = (op.offset // SECTOR_BYTES + 1) * SECTOR_BYTES
            for boundary in range(first, landed_end, SECTOR_BYTES):
                suffix = bytearray(content)
                _apply(suffix, Write(op.ino, boundary, op.data[boundary - op.offset :]))
                outcomes.append(bytes(suffix))
            # Or one sector inside it lost, every other one landed (the smallest case of
            # any subset landing: NULs inside a whole line, records of the write after
            # them).
            for boundary in range(first, landed_end, SECTOR_BYTES):
                holed = bytearray(content)
                _apply(holed, op)
                lost_end = min(boundary + SECTOR_BYTES, op.offset + n)
                old = bytes(content[boundary:lost_end]).ljust(lost_end - boundary, b"\0")
                holed[boundary:lost_end] = old
                outcomes.append(bytes(holed))
        _apply(content, op)
        outcomes.append(bytes(content))
    return list(dict.fromkeys(outcomes))


def _dir_outcomes(model: _DirModel) -> list[dict[str, Entry]]:
    outcomes = [dict(model.durable)]
    entries = dict(model.durable)
    for op in model.pending:
        if isinstance(op, Create):
            entries[op.name] = op.ino
        elif isinstance(op, Mkdir):
            entries[op.name] = op.child
        elif isinstance(op, Rename):
            entries[op.dst] = entries.pop(op.src)
        else:
            entries.pop(op.name, None)
        outcomes.append(dict(entries))
    return outcomes


@dataclass
class PowerCut:
    """The states the disk may come back with if the power went out after `events[:k]`."""

    k: int
    states: list[State]


def power_cuts(sim: SimDisk, *, max_states_per_cut: int = 48, seed: int = 0) -> Iterator[PowerCut]:
    """For k = 0..len(events): the surviving states after events[:k]."""
    rng = random.Random(seed)
    files = {ino: _FileModel(data) for ino, data in sim.initial_files.items()}
    dirs = {d: _DirModel(dict(entries)) for d, entries in sim.initial_dirs.items()}
    irrelevant: set[int] = set()
    yield PowerCut(0, _states(sim.root, files, dirs, irrelevant, max_states_per_cut, rng))
    for k, event in enumerate(sim.events, start=1):
        if isinstance(event, Create):
            files[event.ino] = _FileModel(b"")
            if event.name in sim.content_irrelevant:
                irrelevant.add(event.ino)
            dirs[event.dir].pending.append(event)
        elif isinstance(event, Mkdir):
            dirs[event.child] = _DirModel({})
            dirs[event.dir].pending.append(event)
        elif isinstance(event, Rename | Unlink):
            dirs[event.dir].pending.append(event)
        elif isinstance(event, Write | Truncate):
            files[event.ino].pending.append(event)
        elif isinstance(event, FsyncFile):
            model = files[event.ino]
            content = bytearray(model.durable)
            for op in model.pending:
                _apply(content, op)
            files[event.ino] = _FileModel(bytes(content))
        else:
            dirs[event.dir] = _DirModel(_dir_outcomes(dirs[event.dir])[-1])
        yield PowerCut(k, _states(sim.root, files, dirs, irrelevant, max_states_per_cut, rng))


def _states(
    root: str,
    files: dict[int, _FileModel],
    dirs: dict[str, _DirModel],
    irrelevant: set[int],
    cap: int,
    rng: random.Random,
) -> list[State]:
    file_choices = {
        ino: file_outcomes(m.durable, m.pending)
        if m.pending and ino not in irrelevant
        else [m.durable]
        for ino, m in files.items()
    }
    dir_choices = {d: _dir_outcomes(m) for d, m in dirs.items()}
    axes: list[tuple[str, Any, int]] = [
        ("f", ino, len(c)) for ino, c in file_choices.items() if len(c) > 1
    ] + [("d", d, len(c)) for d, c in dir_choices.items() if len(c) > 1]

    def build(pick: dict[tuple[str, Any], int]) -> State:
        state: State = {}

        def walk(directory: str, rel: str) -> None:
            entries = dir_choices[directory][pick.get(("d", directory), 0)]
            for name, entry in entries.items():
                path = f"{rel}{name}"
                if isinstance(entry, str):
                    state[path] = None
                    walk(entry, path + "/")
                else:
                    state[path] = file_choices[entry][pick.get(("f", entry), 0)]

        walk(root, "")
        return state

    total = 1
    for _, _, n in axes:
        total *= n
    picks: list[dict[tuple[str, Any], int]] = []
    if total <= cap:
        combos: list[dict[tuple[str, Any], int]] = [{}]
        for kind, key, n in axes:
            combos = [c | {(kind, key): i} for c in combos for i in range(n)]
        picks = combos
    else:
        # Always the extremes (everything lost / everything kept), then a sample.
        picks.append({(kind, key): 0 for kind, key, _ in axes})
        picks.append({(kind, key): n - 1 for kind, key, n in axes})
        for _ in range(cap - 2):
            picks.append({(kind, key): rng.randrange(n) for kind, key, n in axes})
    unique: dict[str, State] = {}
    for pick in picks:
        state = build(pick)
        unique.setdefault(state_digest(state), state)
    return list(unique.values())


def state_digest(state: State) -> str:
    h = hashlib.sha256()
    for path in sorted(state):
        data = state[path]
        h.update(path.encode() + (b"/" if data is None else b"=" + hashlib.sha256(data).digest()))
    return h.hexdigest()


def materialise(state: State, target: Path) -> None:
    """Write one surviving state into the (empty or absent) directory `target`."""
    target.mkdir(parents=True, exist_ok=True)
    for rel in sorted(state):
        data = state[rel]
        if data is None:
            (target / rel).mkdir(exist_ok=True)
        else:
            (target / rel).write_bytes(data)


def install(monkeypatch: Any, module: Any, sim: SimDisk) -> None:
    """Make `module.os` (journal._fsutil's) the simulated disk for the rest of a test."""
    monkeypatch.setattr(module, "os", sim)
