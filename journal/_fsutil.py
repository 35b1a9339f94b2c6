"""Every file-system call the journal makes goes through this module.

No other module of the package touches the disk.  This module calls the OS only as
``os.<name>`` on its module-level ``os`` (and ``fcntl.flock`` on its module-level
``fcntl``), so a test can replace ``journal._fsutil.os`` with a simulated disk that
models what a power cut keeps.  The complete set of names used (the surface such a
simulation must provide):

    os.open(path, flags, mode)   flags are built from the real os.O_* constants at import
    os.close(fd)
    os.write(fd, data) -> int    may write less than asked: callers loop (write_all)
    os.pwrite(fd, data, offset) -> int    segments (no O_APPEND): callers loop too
    os.pread(fd, n, offset) -> bytes
    os.lseek(fd, 0, SEEK_END) -> the file's size    (no fd is read at its offset)
    os.fstatvfs(fd)              free space, before preallocating (``free_bytes``)
    os.fsync(fd)                 files (when fdatasync is absent) and directories
    os.fdatasync(fd)             optional: used for appended data when present
    os.ftruncate(fd, length)
    os.replace(src, dst)
    os.unlink(path)
    os.mkdir(path, mode)
    os.listdir(path) -> list[str]
    os.fstat(fd)                 is a pinned segment still linked? (``unlinked``)
    os.stat(path)                is it still the file a handle opened? (``moved``)
    os.lstat(path)               is a name there? (``exists``: a salvage's marker)
    os.rename(src, dst)          salvage: the damaged journal's copy, to its final name
    os.rmdir(path)               salvage: a build it never used
    os.register_at_fork(after_in_child=f)   handles inherited across fork() fail
    fcntl.flock(fd, op)          the cross-process append lock (LOCK_EX / LOCK_UN), and
                                 segment pins (LOCK_SH; compaction: LOCK_EX | LOCK_NB)

Errors are the usual OSError subclasses (FileNotFoundError, FileExistsError, ...).
One call does not go through ``os``: ``exchange`` (``renameat2(RENAME_EXCHANGE)``,
which salvage uses to swap two journal directories in one step; Python has no
wrapper for it).

fsync choice: appended data is made durable with ``fdatasync`` where the platform has
it.  On Linux, fdatasync also flushes the metadata needed to read the data back, which
includes a new file size, so it is enough for a log that grows.  It is cheapest when
nothing but data changed: records written over zeros the segment already holds (its
preallocated tail, see ``_writer``) cost a data flush and no file-system journal commit.
New files and renames are made durable by fsync of the *directory* (``fsync_dir``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable
from os import PathLike
from os import fspath as fspath
from os import path as _path

# Flags (and SEEK_END) are read once from the real os module: a simulated disk sees the
# same values.
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Reads do not follow a symlink either: the journal never makes one, and a segment or a
# snapshot planted as one must not be read as the journal's (ELOOP).
READ_FLAGS = os.O_RDONLY | _CLOEXEC | _NOFOLLOW
RDWR_FLAGS = os.O_RDWR | _CLOEXEC | _NOFOLLOW
CREATE_RDWR_FLAGS = RDWR_FLAGS | os.O_CREAT | os.O_EXCL
CREATE_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC | _NOFOLLOW
LOCKFILE_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | _CLOEXEC | _NOFOLLOW
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
FILE_MODE = 0o600
DIR_MODE = 0o700
SEEK_END = os.SEEK_END
LOCK_EX = fcntl.LOCK_EX
LOCK_SH = fcntl.LOCK_SH
LOCK_NB = fcntl.LOCK_NB
LOCK_UN = fcntl.LOCK_UN
# flock errors that mean "locks do not work on this file system" (not "held"); public as
# journal.NO_LOCK_ERRNOS, for callers that tell that failure apart.
NO_LOCK_ERRNOS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})

# A path a public function takes: made a ``str`` once (``fspath``) where it comes in. The
# journal keeps and returns its paths as ``str``, built with ``os.path`` (no pathlib on
# the start-up path of ferry's commands: docs/architecture.md, "Start-up").
StrPath = str | PathLike[str]
join = _path.join
split = _path.split


def open_segment(path: str, *, create: bool = False, read_only: bool = False) -> int:
    """A read-write descriptor on a segment (records go in with ``pwrite_durably`` at
    the end of the last record, not with O_APPEND: the segment may hold a preallocated
    tail of zeros).  With ``create`` the file must not exist yet (O_EXCL).  A
    ``read_only`` handle's segments are opened for reading only: it works where
    nothing may be written (a file system mounted read-only)."""
    if read_only:
        return os.open(path, READ_FLAGS)
    return os.open(path, CREATE_RDWR_FLAGS if create else RDWR_FLAGS, FILE_MODE)


def open_read(path: str) -> int:
    """A read-only descriptor on a regular file: a directory in a segment's or a
    snapshot's place fails here, naming it (its reads would fail naming nothing)."""
    fd = os.open(path, READ_FLAGS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "not a regular file", str(path))
    return fd


def open_rdwr(path: str) -> int:
    return os.open(path, RDWR_FLAGS)


def open_new(path: str) -> int:
    """Create a file that must not exist yet, write-only."""
    return os.open(path, CREATE_NEW_FLAGS, FILE_MODE)


def open_lockfile(path: str) -> int:
    return os.open(path, LOCKFILE_FLAGS, FILE_MODE)


def open_lockfile_read(path: str) -> int:
    """The lock file for reading only (a read-only handle: its size is the rotation
    counter; ``Journal.sync`` locks it for a moment), or -1 when there is none."""
    try:
        return os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return -1


def at_fork_in_child(callback: Callable[[], None]) -> None:
    """Call ``callback`` in the child of every ``os.fork()`` of this process."""
    os.register_at_fork(after_in_child=callback)


def close(fd: int) -> None:
    os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte, looping on short writes (a signal or a full disk can cut one)."""
    written = os.write(fd, data)
    if written == len(data):
        return
    view = memoryview(data)
    while written < len(data):
        n = os.write(fd, view[written:])
        if n <= 0:
            raise OSError(f"write returned {n}")
        written += n


def pread(fd: int, size: int, offset: int) -> bytes:
    return os.pread(fd, size, offset)


def size(fd: int) -> int:
    """The file's size.  lseek to the end costs a quarter of an fstat (no stat_result to
    build), and moves nothing that matters: reads and segment writes give their offset
    (pread, pwrite), and the lock file is O_APPEND."""
    return os.lseek(fd, 0, SEEK_END)


def free_bytes(fd: int) -> int:
    """Bytes an unprivileged writer may still add to the file system of ``fd``."""
    st = os.fstatvfs(fd)
    return st.f_bavail * st.f_frsize


def sync_data(fd: int) -> None:
    """Make appended bytes durable (fdatasync where available, else fsync)."""
    fdatasync = getattr(os, "fdatasync", None)
    if fdatasync is not None:
        fdatasync(fd)
    else:
        os.fsync(fd)


def pwrite_durably(fd: int, data: bytes, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` (looping on short writes), then
    ``sync_data``: durable on return."""
    written = os.pwrite(fd, data, offset)
    if written != len(data):
        view = memoryview(data)
        while written < len(data):
            n = os.pwrite(fd, view[written:], offset + written)
            if n <= 0:
                raise OSError(f"pwrite returned {n}")
            written += n
    sync_data(fd)


def sync_file(fd: int) -> None:
    os.fsync(fd)


def truncate(fd: int, length: int) -> None:
    os.ftruncate(fd, length)


def listdir(path: str) -> list[str]:
    return os.listdir(path)


def exists(path: str) -> bool:
    """A name is there (a symlink too, whatever it points at)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def inode(path: str) -> int:
    """The file's inode number (FileNotFoundError if it is gone)."""
    return os.stat(path).st_ino


def unlink(path: str) -> None:
    os.unlink(path)


def fsync_dir(path: str) -> None:
    """fsync a directory so that entries created, renamed or removed in it survive a
    power cut (a new file's data can be durable while its name is not)."""
    fd = os.open(path, DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs(path: str) -> bool:
    """Create ``path`` and missing parents (mode 0700), fsyncing each parent whose entry
    we added, so that the directory itself survives a power cut.  True if ``path`` was
    missing (its entry is now durable); False if it was there (made by someone who may
    not have fsynced its parent)."""
    missing: list[str] = []
    probe = path
    while True:
        try:
            fd = os.open(probe, DIR_FLAGS)
        except FileNotFoundError:
            missing.append(probe)
            if parent(probe) == probe:
                raise
            probe = parent(probe)
            continue
        os.close(fd)
        break
    for directory in reversed(missing):
        # FileExistsError: created concurrently by another process, which is fine.
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, DIR_MODE)
        # The new entry lives in the parent: without this a crash can lose the directory.
        fsync_dir(parent(directory))
    return bool(missing)


def atomic_replace(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably: temp file, write, fsync,
    rename over ``path``, fsync the directory.

    A crash at any point leaves either the old file or the complete new one, never a
    mix; the temp file (``.<name>.tmp``) may be left behind by a crash and is ignored by
    readers. A write that fails (the disk full) removes it: it would hold the space.
    """
    directory, name = _path.split(path)
    tmp = _path.join(directory, f".{name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # leftover of an earlier crash
    fd = open_new(tmp)
    try:
        try:
            write_all(fd, data)
            # Data durable before the rename: else a crash after the rename could leave
            # the new name pointing at an empty or partial file.
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename is only durable once the directory is: else a crash can bring back the
    # old file (or nothing) after we reported success.
    fsync_dir(parent(path))


LOCK_WAIT_NOTICE_S = 5.0  # how long a writer waits for the append lock before it says so


def lock(fd: int, on_wait: Callable[[], None] | None = None) -> None:
    """Take the cross-process append lock (blocks).  flock locks belong to the open file
    description: released on unlock, on close and when the process dies.  A holder
    that was stopped (SIGSTOP) keeps it until it is continued or killed: ``on_wait``
    is called (from a timer thread) once the wait has lasted LOCK_WAIT_NOTICE_S."""
    if on_wait is None:
        fcntl.flock(fd, LOCK_EX)
        return
    try:
        fcntl.flock(fd, LOCK_EX | LOCK_NB)
        return
    except BlockingIOError:
        pass
    timer = threading.Timer(LOCK_WAIT_NOTICE_S, on_wait)
    timer.daemon = True
    timer.start()
    try:
        fcntl.flock(fd, LOCK_EX)
    finally:
        timer.cancel()


def lock_within(fd: int, seconds: float) -> bool:
    """Take the append lock if it is free within ``seconds`` (False: it was not: held by
    another process all along, a stopped one perhaps). Polled, as flock has no timeout."""
    deadline = time.monotonic() + seconds
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, LOCK_EX | LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)


def unlock(fd: int) -> None:
    fcntl.flock(fd, LOCK_UN)


def pin(fd: int) -> None:
    """Say that a handle still reads the segment ``fd`` is open on: a shared lock, held
    until the descriptor is closed (or the process dies).  Compaction removes no pinned
    segment, nor any after it (``removable``).  Blocks only while a compaction holds
    the segment to remove it: check ``unlinked`` afterwards.

    On a file system whose locks do not work the pin is skipped: reading still works
    there, and nobody can compact (that takes the append lock, which fails too)."""
    try:
        fcntl.flock(fd, LOCK_SH)
    except OSError as exc:
        if exc.errno not in NO_LOCK_ERRNOS:
            raise


def parent(path: str) -> str:
    """The directory that holds ``path``, as ``pathlib.PurePath(path).parent`` names it
    ("." for a name alone, "/" for the root's children and the root itself)."""
    head = path.rstrip("/")
    if not head:
        return path or "."
    return _path.dirname(head).rstrip("/") or ("/" if head.startswith("/") else ".")


def name(path: str) -> str:
    """The last component of ``path``, as ``pathlib.PurePath(path).name`` names it."""
    return _path.basename(path.rstrip("/"))


def unlinked(fd: int) -> bool:
    """Has the file ``fd`` is open on been removed from its directory?"""
    return os.fstat(fd).st_nlink == 0


def moved(fd: int, path: str) -> bool:
    """Is ``path`` no longer the file ``fd`` is open on (removed, or another file in its
    place: a journal directory swapped by a salvage)?"""
    st = os.fstat(fd)
    if st.st_nlink == 0:
        return True
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return (there.st_dev, there.st_ino) != (st.st_dev, st.st_ino)


def removable(path: str) -> int | None:
    """A descriptor on the segment ``path``, locked exclusively, or None when some
    handle pins it (never waits).  The caller unlinks the segment, then closes the
    descriptor: a handle pinning it meanwhile then finds it ``unlinked``."""
    fd = open_read(path)
    try:
        fcntl.flock(fd, LOCK_EX | LOCK_NB)
    except BlockingIOError:
        close(fd)
        return None
    except BaseException:
        close(fd)
        raise
    return fd


def rename(src: str, dst: str) -> None:
    os.rename(src, dst)


def mkdir(path: str) -> None:
    os.mkdir(path, DIR_MODE)


def rmdir(path: str) -> None:
    os.rmdir(path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(first: str, second: str) -> None:
    """Swap two existing paths (two directories) atomically: whatever a crash keeps,
    each name names one of the two, never neither (``renameat2`` with
    RENAME_EXCHANGE; Linux 3.15+, and a file system that supports it: ext4, xfs,
    btrfs, tmpfs do).  OSError(EINVAL or ENOSYS) where it is not supported."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(first))
    encoded = [str(p).encode("utf-8", "surrogateescape") for p in (first, second)]
    result = renameat2(_AT_FDCWD, encoded[0], _AT_FDCWD, encoded[1], _RENAME_EXCHANGE)
    if result != 0:
        err = ctypes.get_errno()
        reason = f"renameat2(RENAME_EXCHANGE) failed: {errno.errorcode.get(err, err)}"
        raise OSError(err, reason, str(first), None, str(second))


def copy_range(src: int, start: int, end: int, dst: int) -> None:
    """Append the bytes ``start..end`` of ``src`` to ``dst`` (a new file's descriptor)."""
    pos = start
    while pos < end:
        chunk = os.pread(src, min(1 << 20, end - pos), pos)
        if not chunk:
            raise OSError(errno.EIO, f"file ended at byte {pos}, before {end}")
        write_all(dst, chunk)
        pos += len(chunk)
