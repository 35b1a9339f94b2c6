"""The state directory: where it is, creating it private, refusing an unsafe one.

``resolve_home`` follows the contract: ``--home``, else ``$FERRY_HOME``, else
``$XDG_STATE_HOME/ferry``, else ``~/.local/state/ferry``. ``ensure_home`` creates it (mode
0700, and the subdirectories ferry uses, 0700) and refuses, with a coded
:class:`~ferry.core.errors.StateDirError`:

* ``state_dir.symlink``: the home, or a directory ferry creates inside it, is a symlink
  (never followed: a planted link must not redirect ferry's writes);
* ``state_dir.not_a_directory``: it exists and is something else;
* ``state_dir.not_owned``: owned by another user;
* ``state_dir.permissions``: writable by group or others (anyone could plant files);
* ``state_dir.not_writable``: we cannot write there (permissions, read-only mount);
* ``state_dir.network_fs``: it lives on NFS, CIFS/SMB, sshfs and the like, where
  ``flock`` and ``fsync`` do not give the guarantees the journal and the lease need.

A command that only reads calls ``open_home_for_reading`` instead: the same checks of
what is there, nothing created, and a directory it may not write (a disk remounted
read-only) is no refusal: the reader is told so and shows it as it is.

``ferry run`` calls ``ensure_home`` on every start, so it is a handful of system calls
and one read of ``/proc/self/mountinfo``. Each directory it creates is made durable
(its parent fsynced after it: a power cut would drop a directory whose entry never
reached the disk, with everything in it); a home that exists pays no fsync.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping

from ferry.core.errors import StateDirError, UsageError

__all__ = [
    "NETWORK_FS_TYPES",
    "SUBDIRS",
    "absolute",
    "ensure_home",
    "filesystem_type",
    "fsync_dir",
    "is_network_fs",
    "make_dir_durable",
    "open_home_for_reading",
    "private_open",
    "resolve_home",
]

SUBDIRS: tuple[str, ...] = ("journal", "logs", "patches", "heartbeats", "archive")
DIR_MODE = 0o700
FILE_MODE = 0o600

# Filesystem types (as /proc/self/mountinfo spells them) that are not local disks.
NETWORK_FS_TYPES: frozenset[str] = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb",
        "smb2",
        "smb3",
        "smbfs",
        "ncpfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "ocfs2",
        "gfs2",
        "beegfs",
        "orangefs",
        "pvfs2",
        "coda",
        "davfs",
    }
)
# FUSE filesystems that reach over a network (local ones such as fuse-overlayfs are fine).
_NETWORK_FUSE_SUBTYPES: frozenset[str] = frozenset(
    {
        "sshfs",
        "s3fs",
        "gcsfuse",
        "rclone",
        "davfs2",
        "glusterfs",
        "cephfs",
        "ceph-fuse",
        "goofys",
        "juicefs",
        "blobfuse",
        "blobfuse2",
        "smbnetfs",
        "curlftpfs",
    }
)


def resolve_home(cli_home: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> str:
    """The state directory the contract names, as an absolute path (symlinks not resolved).
    An empty ``--home`` (``--home "$UNSET"``) names none: refused, never read as "not
    given" (the fallbacks may be another queue's home). An empty ``FERRY_HOME`` or
    ``XDG_STATE_HOME`` is unset, as the XDG spec has it.

    The path is spelled as ``str(Path(x).expanduser().absolute())`` spelled it (no
    ``.`` components, no repeated or trailing slashes, ``..`` kept), without pathlib:
    it is on the start-up path of every command (docs/architecture.md, start-up)."""
    if cli_home is not None:
        if os.fspath(cli_home) == "":
            raise UsageError(
                "--home is empty: name a directory, or leave --home out for $FERRY_HOME or"
                " the default", code="usage.bad_home",
            )  # fmt: skip
        return _expanded(cli_home, "--home")
    if environ.get("FERRY_HOME"):
        return _expanded(environ["FERRY_HOME"], "FERRY_HOME")
    xdg = environ.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return absolute(os.path.join(xdg, "ferry"))
    home = environ.get("HOME") or os.path.expanduser("~")
    return absolute(os.path.join(home, ".local", "state", "ferry"))


def _parts(path: str) -> tuple[str, list[str]]:
    """``path``'s root and its parts as pathlib parses them on POSIX: a root of exactly
    two slashes is kept (POSIX leaves its meaning to the system), more are one; empty
    and ``.`` parts are dropped, ``..`` kept."""
    rel = path.lstrip("/")
    slashes = len(path) - len(rel)
    root = "//" if slashes == 2 else "/" if slashes else ""
    return root, [part for part in rel.split("/") if part and part != "."]


def _expanded(path: str | os.PathLike[str], named: str) -> str:
    try:
        return absolute(path, expand_user=True)
    except RuntimeError:  # ~nosuchuser
        raise UsageError(
            f"{named} {os.fspath(path)!r}: no such user's home directory", code="usage.bad_home"
        ) from None


def absolute(path: str | os.PathLike[str], *, expand_user: bool = False) -> str:
    """``str(Path(path).absolute())`` (``expand_user``: of ``Path(path).expanduser()``),
    exactly: relative to the working directory, symlinks and ``..`` not resolved.
    A ``~user`` that cannot be expanded raises RuntimeError, as pathlib does."""
    root, parts = _parts(os.fspath(path))
    if expand_user and not root and parts and parts[0][:1] == "~":
        home = os.path.expanduser(parts[0])
        if home[:1] == "~":
            raise RuntimeError("Could not determine home directory.")
        root, home_parts = _parts(home)
        parts = home_parts + parts[1:]
    if not root:
        root, cwd_parts = _parts(os.getcwd())
        parts = cwd_parts + parts
    return root + "/".join(parts)


def ensure_home(path: str | os.PathLike[str], *, mountinfo: str | None = None) -> str:
    """Create ``path`` and its subdirectories private (0700), or refuse it. Returns ``path``.

    ``mountinfo`` is the text of /proc/self/mountinfo (read when None; tests pass a sample).
    """
    path = absolute(path)
    parent = os.path.dirname(path)
    if not os.path.exists(parent):
        # Parents (~/.local/state, say) are created private too; they are not checked.
        _make_parents(parent)
    if _mkdir_private(path, None):
        _fsync_parent(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise _refusal(path, e) from e
    try:
        _check_dir(path, os.fstat(fd))
        made = False
        for name in SUBDIRS:
            made = _mkdir_private(name, fd) or made
            _check_dir(os.path.join(path, name), os.stat(name, dir_fd=fd, follow_symlinks=False))
        if made:
            # Their entries live in the home: durable before anything goes in them (a
            # journal record reported committed in journal/, say).
            try:
                os.fsync(fd)
            except OSError as e:
                raise _refusal(path, e) from e
        # os.access reports a read-only mount (EROFS) as not writable, also for root.
        if not os.access(path, os.W_OK | os.X_OK):
            raise StateDirError(
                f"state directory {path} is not writable",
                code="state_dir.not_writable",
                details={"path": str(path)},
            )
    finally:
        os.close(fd)
    _refuse_network_fs(path, mountinfo)
    return path


def open_home_for_reading(
    path: str | os.PathLike[str], *, mountinfo: str | None = None
) -> tuple[str, bool]:
    """The state directory for a command that only reads: ``(path, writable)``.

    Refuses what ``ensure_home`` refuses of what is there (a symlink, not a directory,
    another owner, writable by others, a network file system), but creates nothing (a
    missing home or subdirectory reads as empty) and accepts a directory it may not
    write: ``writable`` says which (False: a read-only mount, or no write permission)."""
    path = absolute(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return path, True  # nothing to show; nothing made
    except OSError as e:
        raise _refusal(path, e) from e
    try:
        _check_dir(path, os.fstat(fd))
        for name in SUBDIRS:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            _check_dir(os.path.join(path, name), st)
        writable = os.access(path, os.W_OK | os.X_OK)
    finally:
        os.close(fd)
    _refuse_network_fs(path, mountinfo)
    return path, writable


def _refuse_network_fs(path: str, mountinfo: str | None) -> None:
    fstype = filesystem_type(path, _read_mountinfo() if mountinfo is None else mountinfo)
    if fstype is not None and is_network_fs(fstype):
        raise StateDirError(
            f"state directory {path} is on a network filesystem ({fstype}); "
            "ferry needs a local disk for its locks and fsync",
            code="state_dir.network_fs",
            details={"path": str(path), "fstype": fstype},
        )


def private_open(path: str | os.PathLike[str], flags: int, *, dir_fd: int | None = None) -> int:
    """``os.open`` that never follows a symlink in the last component and creates 0600 files.

    A planted symlink (ELOOP) becomes ``state_dir.symlink``; other errors pass through.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateDirError(
                f"refusing to follow a symlink at {os.fspath(path)}",
                code="state_dir.symlink",
                details={"path": os.fspath(path)},
            ) from e
        raise


def _mkdir_private(path: str, dir_fd: int | None) -> bool:
    """Create the directory 0700; False if it was there already.  The caller makes a
    new one's entry durable (fsyncs its parent)."""
    try:
        os.mkdir(path, DIR_MODE, dir_fd=dir_fd)
    except FileExistsError:
        return False
    except OSError as e:
        raise _refusal(path, e) from e
    # mkdir's mode passed through the umask; make it exactly 0700 (only what we created).
    os.chmod(path, DIR_MODE, dir_fd=dir_fd, follow_symlinks=False)
    return True


def _fsync_parent(path: str) -> None:
    """Make the entry of ``path``, a directory just created, durable: a directory
    survives a power cut only once its parent was fsynced after its creation (else the
    cut drops it, and everything written below it, fsynced or not)."""
    parent = os.path.dirname(path)
    try:
        fsync_dir(parent)
    except OSError as e:
        raise _refusal(parent, e) from e


def _make_parents(directory: str) -> None:
    """Create ``directory`` and its missing parents (mode 0700), each new one's parent
    fsynced after it, up to the first that existed."""
    missing: list[str] = []
    probe = directory
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        missing.append(probe)
        probe = os.path.dirname(probe)
    for new in reversed(missing):
        try:
            os.mkdir(new, DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile (its maker may not have fsynced yet: we do)
        except OSError as e:
            raise _refusal(new, e) from e
        _fsync_parent(new)


def make_dir_durable(directory: str | os.PathLike[str]) -> None:
    """Create ``directory`` (0700) if it is missing, fsyncing its parent when it does
    (see ``_fsync_parent``): for a subdirectory of the home made after ``ensure_home``."""
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        return
    fsync_dir(os.path.dirname(os.fspath(directory)))


def _check_dir(path: str, st: os.stat_result) -> None:
    details = {"path": str(path)}
    if stat.S_ISLNK(st.st_mode):
        raise StateDirError(
            f"{path} is a symlink; ferry never follows one in its state directory",
            code="state_dir.symlink",
            details=details,
        )
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(
            f"{path} is not a directory", code="state_dir.not_a_directory", details=details
        )
    if st.st_uid != os.geteuid():
        raise StateDirError(
            f"{path} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})",
            code="state_dir.not_owned",
            details={**details, "owner_uid": st.st_uid},
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            "make it 0700",
            code="state_dir.permissions",
            details={**details, "mode": f"{stat.S_IMODE(st.st_mode):04o}"},
        )


def _refusal(path: str, e: OSError) -> StateDirError:
    details = {"path": str(path), "errno": e.errno}
    # open(O_DIRECTORY | O_NOFOLLOW) on a symlink says ENOTDIR, not ELOOP: look.
    if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and os.path.islink(path)):
        return StateDirError(
            f"{path} is a symlink; ferry never follows one in its state directory",
            code="state_dir.symlink",
            details=details,
        )
    if e.errno == errno.ENOTDIR:
        return StateDirError(
            f"{path} is not a directory", code="state_dir.not_a_directory", details=details
        )
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StateDirError(
            f"cannot create or open state directory {path}: {e.strerror}",
            code="state_dir.not_writable",
            details=details,
        )
    return StateDirError(
        f"state directory {path} is unusable: {e.strerror}",
        code="state_dir.unusable",
        details=details,
    )


def _read_mountinfo() -> str:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""  # no /proc (not Linux): the check is skipped; documented in docs/leases.md


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        octal = field[i + 1 : i + 4]
        if field[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_type(path: str | os.PathLike[str], mountinfo: str) -> str | None:
    """The fstype of the mount holding ``path`` (longest mount-point prefix), or None."""
    target = os.path.realpath(path)
    best_len = -1
    best: str | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-")
            mount_point = _unescape(fields[4])
            fstype = fields[sep + 1]
        except (ValueError, IndexError):
            continue
        if _is_under(target, mount_point) and len(mount_point) >= best_len:
            # '>=': a later mount on the same point hides the earlier one.
            best_len = len(mount_point)
            best = fstype
    return best


def _is_under(target: str, mount_point: str) -> bool:
    if mount_point == "/":
        return True
    return target == mount_point or target.startswith(mount_point.rstrip("/") + "/")


def is_network_fs(fstype: str) -> bool:
    """True for filesystems ferry refuses (see :data:`NETWORK_FS_TYPES`)."""
    if fstype in NETWORK_FS_TYPES:
        return True
    main, _, sub = fstype.partition(".")
    return main in ("fuse", "fuseblk") and sub in _NETWORK_FUSE_SUBTYPES


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, making a create/rename/unlink inside it durable.

    Without it a power loss (not a process crash: the page cache survives those) can
    undo a rename that already returned.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    directory: str | os.PathLike[str], name: str, data: bytes, *, temp_name: str | None = None
) -> str:
    """Write ``data`` as ``directory/name`` (0600) atomically: a private temp file,
    fsync, rename, fsync the directory. A crash at any point leaves either no file of
    that name or the whole of it, never a torn one; a failure (a full disk) removes the
    temp file so it does not hold the space. A symlink planted at the temp name is never
    followed (``state_dir.symlink``).

    ``temp_name``: a fixed temp name, for a caller that holds a lock over ``name`` (one
    writer at a time); a crash's stale temp file is then reused. Without it the temp
    name is unique per call."""
    directory = os.fspath(directory)
    final = os.path.join(directory, name)
    if temp_name is None:
        temp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        fd = private_open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    else:
        temp = os.path.join(directory, temp_name)
        fd = private_open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            # Before the rename: the name must never point at bytes the disk may not keep.
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_dir(directory)  # the rename itself survives a power cut
    return final
