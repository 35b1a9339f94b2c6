"""A pid-free liveness signal: a lock the task's processes inherit.

Before the spawn the runner opens the task's heartbeat file
``heartbeats/<id>.<attempt>`` (the same file it writes its beats into: one file per
attempt, not two; a ``work`` supervisor renames its last task's to it, see
:func:`hold`) and takes an exclusive ``flock`` on it; the descriptor is passed to
the child (not close-on-exec), so the child and every descendant that does not close
it share that one open file, and the lock stays held until the last of them exits (or
closes it). After a runner crash, recovery asks: can I take the lock? If not, some
process of the task still runs, even one that called ``setsid`` and replaced its
environment (where the FERRY_TASK marker scan is blind). Zombies hold no descriptors,
so they do not count: as the contract says.

The same descriptor also leads to the processes: ``ferry.proc.process.scan_processes``
(``holding=``) finds those that hold the file open read-write and inheritable, so that
``ferry kill`` can reach such an orphan (after checking its identity, as always).

It is one more proof of life, never a proof of death: a daemon that closed all its
descriptors is invisible here (the marker and the session scan still look for it).

The beat. Every ``--heartbeat`` seconds the runner writes one fixed-size record at the
start of the file (:func:`beat`; :func:`hold` writes the first)::

    ferry-beat/1 <boot id> <time namespace inode> <CLOCK_BOOTTIME ns> <crc32 hex>

(ASCII, one space between fields, the CRC-32 of what precedes it, in 8 hex digits;
padded with spaces to 127 bytes, then a newline.)

The write also sets the file's mtime, which ``ferry show`` reports as ``heartbeat_at``
and which ferry before this record read as the beat. Recovery measures a beat's age
on CLOCK_BOOTTIME when the record is sound and comes from its own boot and time
namespace: a step of the wall clock (NTP, ``date -s``) moves the mtime's age, not
this one. A record that is missing (a file from an older ferry), torn (a read that
met a write half done, a crash) or from elsewhere gives no age of its own: the mtime
decides, as before (``ferry.proc.liveness.heartbeat_age``). One ``pwrite`` of 128 bytes
in place: no rename, no fsync (a beat is evidence of this boot only; after a crash
the boot id differs anyway).
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
import zlib

from ferry.core._value import Value, init
from ferry.proc.process import boot_id, time_namespace

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
# O_NONBLOCK: a FIFO planted in the file's place must not hang a beat or a read.
_BEAT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_GIVEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
# A record's clock, by its magic: /2 CLOCK_MONOTONIC (which stops while the machine is
# suspended, as the supervisors do), /1 CLOCK_BOOTTIME (written until the seventeenth
# session; still read).
BEAT_MAGICS = {b"ferry-beat/2": "monotonic", b"ferry-beat/1": "boot"}
_MAGIC_OF = {clock: magic for magic, clock in BEAT_MAGICS.items()}
_CLOCK_IDS = {"monotonic": time.CLOCK_MONOTONIC, "boot": time.CLOCK_BOOTTIME}
BEAT_BYTES = 128  # every record has this size: a shorter one would leave a tail behind
_BEAT_READS = 3  # a read that met a beat half written is tried again, this many times


DIRECTORY = "heartbeats"  # in the state directory


def alive_name(task_id: str, attempt: int) -> str:
    """The heartbeat file's name in DIRECTORY."""
    return f"{task_id}.{attempt}"


def alive_path(home: str | os.PathLike[str], task_id: str, attempt: int) -> str:
    """The heartbeat file, which also carries the lock."""
    return os.path.join(home, DIRECTORY, alive_name(task_id, attempt))


class Beat(Value):
    """A sound beat record: written in boot ``boot_id``, in the time namespace
    ``time_namespace`` (0: unknown), at ``clock_ns`` on that boot's ``clock``
    (``"monotonic"``, or ``"boot"`` in an older record)."""

    __slots__ = ("boot_id", "clock", "clock_ns", "time_namespace")
    _FIELDS = ("boot_id", "time_namespace", "clock_ns", "clock")
    boot_id: str
    time_namespace: int
    clock_ns: int
    clock: str

    def __init__(
        self, boot_id: str, time_namespace: int, clock_ns: int, clock: str = "monotonic"
    ) -> None:
        init(self, "boot_id", boot_id)
        init(self, "time_namespace", time_namespace)
        init(self, "clock_ns", clock_ns)
        init(self, "clock", clock)

    def age_s(self) -> float:
        """Seconds since the beat, on its clock (read after the record: never < 0)."""
        return (time.clock_gettime_ns(_CLOCK_IDS[self.clock]) - self.clock_ns) / 1e9


def beat_record(beat: Beat) -> bytes | None:
    """The record's bytes (None: a boot id that does not fit, or is not one word)."""
    try:
        boot = beat.boot_id.encode("ascii")
    except UnicodeEncodeError:
        return None
    if boot.split() != [boot]:  # one word, without whitespace (nor empty)
        return None
    body = b"%s %s %d %d" % (_MAGIC_OF[beat.clock], boot, beat.time_namespace, beat.clock_ns)
    line = b"%s %08x" % (body, zlib.crc32(body))
    return line.ljust(BEAT_BYTES - 1) + b"\n" if len(line) < BEAT_BYTES else None


def parse_beat(raw: bytes) -> Beat | None:
    """The record at the start of ``raw``, or None: none, torn, or not ours (never raises)."""
    if len(raw) < BEAT_BYTES or raw[BEAT_BYTES - 1 : BEAT_BYTES] != b"\n":
        return None
    fields = raw[: BEAT_BYTES - 1].split(b" ")
    while fields and fields[-1] == b"":  # the padding
        fields.pop()
    if len(fields) != 5 or fields[0] not in BEAT_MAGICS:
        return None
    _, boot, namespace, clock, crc = fields
    if not (namespace.isdigit() and clock.isdigit() and boot.isascii() and boot):
        return None
    if crc != b"%08x" % zlib.crc32(b" ".join(fields[:4])):
        return None
    return Beat(boot.decode("ascii"), int(namespace), int(clock), BEAT_MAGICS[fields[0]])


def _now() -> bytes | None:
    clock_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return beat_record(Beat(boot_id(), time_namespace() or 0, clock_ns))


def hold(path: str, given: str | None = None) -> int:
    """Create and lock the file, and write its first beat; the caller passes the fd to
    the child (pass_fds). ``given``: the file of a task this runner ran before, whose
    end is durable: named ``path`` instead of a new file made, if nothing holds it any
    more (:func:`_given_on`)."""
    fd = None if given is None else _given_on(given, path)
    if fd is None:
        fd = os.open(path, _FLAGS, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        _write_beat(fd)
    return fd


def _given_on(old: str, new: str) -> int | None:
    """``old`` locked and renamed ``new`` (a descriptor of it); None when it cannot be:
    a process its task left still holds its lock (it is that task's alive-lock, for
    as long as that process lives), it is gone (a compaction pruned it), ``new``
    exists, or it is not a plain file of one name. Not made durable (no fsync of the
    directory), as no heartbeat file is: it is evidence of this boot only, and the
    rename follows the task's DISPATCHING, durable; after a power cut either name may
    be there, and the new boot finds no process alive either way.

    Why: a file made is an inode allocated, and one pruned an inode freed; on ext4 many
    recent frees make each allocation search past them (``recently_deleted``): a few
    hundred microseconds of every short task of ``work``, before its spawn, and a third
    of ``work``'s time per task here (``tests/integration/test_heartbeat_reuse.py``).
    A rename in one directory costs neither. A rename, not a link and an unlink: the
    descriptor then names the new file in ``/proc/PID/fd`` (where ``ferry kill`` finds
    a task's processes by the file they hold), not a deleted one. Only this runner
    makes ``new`` (a released claim's earlier try may have left it: then it is opened
    as it is, as before); the inode is checked after the rename, in case ``old`` was
    replaced meanwhile.

    The inode moves to the new task, so whoever looks for the old task's processes by
    its file checks that the name still names it: the scan by descriptor
    (``ferry.proc.process.scan_processes``, after its walk: a scan that stat'ed the old
    name just before the rename would otherwise find the new task's processes), and
    :func:`held`.

    Known limit: a process of the old task that unlocked its inherited descriptor
    (``flock(LOCK_UN)``) and kept it open is then holding the new task's file open
    (the scan could count it in for the new task); nothing ferry starts does so, and a
    task's process group is gone before its end is written."""
    try:
        fd = os.open(old, _GIVEN_FLAGS)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (BlockingIOError: still held)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or os.path.lexists(new):
            raise OSError(f"{old} is not to be given on as {new}")
        _write_beat(fd)  # (first: the new name never shows the old task's beat)
        os.rename(old, new)
        if os.stat(new, follow_symlinks=False).st_ino != st.st_ino:
            raise OSError(f"{old} was replaced meanwhile")
    except OSError:
        os.close(fd)
        return None
    return fd


def beat(path: str) -> None:
    """One heartbeat: this moment's record, written in place (re-creating the file if
    it was removed, never through a symlink)."""
    try:
        fd = os.open(path, _BEAT_FLAGS, 0o600)
    except OSError:
        return  # a heartbeat is evidence, not a reason to stop the task
    try:
        _write_beat(fd)
    finally:
        os.close(fd)


def _write_beat(fd: int) -> None:
    record = _now()
    try:
        if record is None:
            os.utime(fd)  # no record to write: the mtime still says when
        else:
            os.pwrite(fd, record, 0)
    except OSError:
        pass  # (a full disk): the mtime, or the last record, remains


def read_beat(path: str) -> tuple[Beat | None, float] | None:
    """The file's beat record (None if it has no sound one) and its mtime; None when
    there is no file. Other OSErrors raise: the caller decides what it cannot see."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    try:
        found = None
        for _ in range(_BEAT_READS):
            raw = os.pread(fd, BEAT_BYTES, 0)
            found = parse_beat(raw)
            if found is not None or not raw:
                break  # a record, or an empty file (older ferry): nothing to retry
        return found, os.fstat(fd).st_mtime
    finally:
        os.close(fd)


def release(fd: int) -> None:
    """The runner is done with the task: drop its hold (the file stays, with the task's
    last beat, until a compaction prunes it once the task settled, or a ``work``
    supervisor gives it to its next task: :func:`hold`)."""
    os.close(fd)


def held(path: str) -> bool | None:
    """True: some process still holds the lock (the task is alive). False: nobody
    does. None: no lock file (a task dispatched before this existed, or settled)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return True  # cannot tell: fail closed (counts as alive)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True if _still_named(fd, path) else None  # (given on to another task)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops our lock, if we took it
    return False


def _still_named(fd: int, path: str) -> bool:
    """``path`` still names the file open on ``fd`` (a ``work`` supervisor may have
    renamed it for its next task since it was opened: :func:`hold`)."""
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
