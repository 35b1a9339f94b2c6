"""Pointers and patches on disk: hash at submit, re-hash before dispatch, keep a private
copy of the patch.  The decisions are pure and live in ``ferry.core.patch`` (the gates) and
``ferry.core.pinning`` (the dispatch verdict); this module only reads and writes files.

At submit (``ferry submit`` / ``ferry run``)::

    pointers = resolve_pointers(args, cwd)                 # usage.* errors, exit 2
    stored = prepare_patch(patch_file, pointers, home / "patches")  # patch.* errors
    spec pointers = [p.spec_entry() for p in pointers]; spec patch = (stored.path, .sha256)

Just before dispatch (``run``, ``claim``, ``work``)::

    verdict = check_before_dispatch(pointers_from_spec(spec.pointers, spec.cwd),
                                    idempotent=spec.idempotent, patch=spec.patch)
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ferry.core.errors import UsageError
from ferry.core.patch import PatchInfo, check_gates, normalise_path
from ferry.core.pinning import (
    DispatchVerdict,
    PatchCopy,
    Pointer,
    PointerCheck,
    PointerObservation,
    StoredPatch,
    decide_dispatch,
)
from ferry.core.spec import is_sha256_hex
from ferry.failpoints import failpoint
from ferry.storage.local.statedir import fsync_dir, write_atomic

PATCH_BYTES_MAX = 64 * 1024 * 1024  # a review patch, not a disk image
# A patch copy written or reused within this long is kept, named or not: a submit
# writes (or touches) it before its task, which names it, is written.
PATCH_QUIET_S = 3600.0
_HEX = frozenset("0123456789abcdef")
_READ_CHUNK_BYTES = 1024 * 1024


def resolve_pointer(arg: str, cwd: Path) -> Pointer:
    """Parse ``PATH[=SHA256]`` and hash the file now unless a hash is given.

    A relative PATH is resolved against ``cwd`` (the task's working directory).  The
    hash follows the last ``=``, so a path containing ``=`` needs an explicit hash.
    """
    path_text, sep, declared = arg.rpartition("=")
    if not sep:
        path_text, declared = arg, ""
    elif not _is_sha256(declared.lower()):
        raise UsageError(
            f"--pointer {arg!r}: after '=' comes a SHA-256 (64 hex digits); "
            "a path that contains '=' needs one: PATH=SHA256",
            code="usage.bad_pointer",
            details={"pointer": arg},
        )
    if not path_text or "\0" in path_text:
        raise UsageError(f"--pointer {arg!r}: no path", code="usage.bad_pointer")
    try:
        path_text.encode("utf-8")
    except UnicodeEncodeError:
        # The journal is JSON: a name that is not UTF-8 could not be recorded faithfully.
        raise UsageError(
            f"--pointer {path_text.encode('utf-8', 'surrogateescape')!r}: "
            "ferry can pin only paths that are valid UTF-8",
            code="usage.bad_pointer",
        ) from None
    base = os.path.abspath(cwd)
    abs_path = os.path.normpath(os.path.join(base, path_text))
    pointer_path = normalise_path(os.path.relpath(abs_path, base))
    if declared:
        return Pointer(path=pointer_path, abs_path=abs_path, sha256=declared.lower())
    try:
        sha256 = hash_file(abs_path)
    except FileNotFoundError:
        raise UsageError(
            f"--pointer {path_text!r}: no such file ({abs_path})",
            code="usage.pointer_missing",
            details={"path": pointer_path},
        ) from None
    except OSError as exc:
        raise UsageError(
            f"--pointer {path_text!r}: cannot read {abs_path}: {exc.strerror or exc}",
            code="usage.pointer_unreadable",
            details={"path": pointer_path},
        ) from None
    return Pointer(path=pointer_path, abs_path=abs_path, sha256=sha256)


def resolve_pointers(args: Iterable[str], cwd: str | os.PathLike[str]) -> tuple[Pointer, ...]:
    """Every ``--pointer``, in order; a path given twice must agree on its hash."""
    by_path: dict[str, Pointer] = {}
    for arg in args:
        pointer = resolve_pointer(arg, Path(cwd))
        earlier = by_path.setdefault(pointer.path, pointer)
        if earlier.sha256 != pointer.sha256:
            raise UsageError(
                f"--pointer {pointer.path!r} is given twice with different hashes",
                code="usage.bad_pointer",
                details={"path": pointer.path},
            )
    return tuple(by_path.values())


def pointers_from_spec(entries: Iterable[tuple[str, str]], cwd: str) -> tuple[Pointer, ...]:
    """Rebuild pointers from a TaskSpec's ``(path, sha256)`` pairs (paths relative to
    ``cwd``, which should be absolute)."""
    base = os.path.abspath(cwd)
    return tuple(
        Pointer(path=path, abs_path=os.path.normpath(os.path.join(base, path)), sha256=sha)
        for path, sha in entries
    )


def hash_file(path: str | Path) -> str:
    """SHA-256 of a regular file's bytes.  Raises OSError (IsADirectoryError for a
    directory, OSError for a FIFO or device, which are not pinnable)."""
    # O_NONBLOCK: opening a FIFO must not hang submit; it is refused just below.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise OSError(22, "not a regular file", str(path))
        digest = hashlib.sha256()
        while chunk := os.read(fd, _READ_CHUNK_BYTES):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def recheck(pointers: Sequence[Pointer]) -> PointerCheck:
    """Re-hash every pointer on disk now.  Missing or unreadable counts as stale."""
    observations = []
    for pointer in pointers:
        try:
            observation = PointerObservation(pointer, hash_file(pointer.abs_path))
        except FileNotFoundError:
            observation = PointerObservation(pointer, None, "missing")
        except OSError as exc:
            observation = PointerObservation(pointer, None, f"unreadable: {exc.strerror or exc}")
        observations.append(observation)
    return PointerCheck(tuple(observations))


def read_patch_file(src: Path) -> bytes:
    """The bytes of a ``--patch-file`` (usage errors when it cannot be read)."""
    try:
        with open(src, "rb") as stream:
            data = stream.read(PATCH_BYTES_MAX + 1)
    except FileNotFoundError:
        raise UsageError(
            f"--patch-file {str(src)!r}: no such file", code="usage.patch_missing"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"--patch-file {str(src)!r}: cannot read: {exc.strerror or exc}",
            code="usage.patch_unreadable",
        ) from None
    if len(data) > PATCH_BYTES_MAX:
        raise UsageError(
            f"--patch-file {str(src)!r} is larger than {PATCH_BYTES_MAX} bytes",
            code="usage.patch_too_large",
        )
    return data


def prepare_patch(
    src: str | os.PathLike[str],
    pointers: Sequence[Pointer],
    patches_dir: str | os.PathLike[str],
) -> tuple[StoredPatch, PatchInfo]:
    """Submit time: read the patch once, run the three gates on those bytes (raises
    PatchGateError), then store exactly those bytes as ferry's private copy."""
    data = read_patch_file(Path(src))
    info = check_gates(data, [pointer.path for pointer in pointers])
    return store_patch_bytes(data, Path(patches_dir)), info


def store_patch(src: Path, patches_dir: Path) -> StoredPatch:
    """Copy a patch file into ``patches_dir`` (0600, atomic, named by its SHA-256)."""
    return store_patch_bytes(read_patch_file(src), patches_dir)


def store_patch_bytes(data: bytes, patches_dir: Path) -> StoredPatch:
    """Write ``data`` as ``<sha256>.patch`` in ``patches_dir``: temp file, fsync,
    rename, fsync the directory.  Idempotent: an intact copy is reused, and touched
    (``ferry gc`` takes only a copy no task names and untouched for an hour: a task
    about to be written with it keeps it; one gc is taking meanwhile is written
    afresh)."""
    sha256 = hashlib.sha256(data).hexdigest()
    _make_private_dir(patches_dir)
    final = patches_dir / f"{sha256}.patch"
    try:
        if hash_file(final) == sha256:
            os.utime(final)
            return StoredPatch(path=str(final), sha256=sha256)
    except OSError:
        pass  # absent (the usual case), unreadable, or gone: write it afresh
    # Atomic (temp, fsync, rename, fsync dir). A crash after the rename but before the
    # directory fsync could lose the entry: the task would then fail POINTER_STALE (copy
    # missing) rather than run without it.
    write_atomic(patches_dir, final.name, data)
    return StoredPatch(path=str(final), sha256=sha256)


def read_stored_patch(patch: PatchCopy) -> bytes | None:
    """The bytes of ferry's private copy, or None when it is missing or unreadable."""
    try:
        with open(patch.path, "rb") as stream:
            return stream.read(PATCH_BYTES_MAX + 1)
    except OSError:
        return None


def check_before_dispatch(
    pointers: Sequence[Pointer], *, idempotent: bool, patch: PatchCopy | None
) -> DispatchVerdict:
    """Dispatch time: re-hash the pointers, read the patch copy only if some pointer is
    stale and it could stand in, and decide (``ferry.core.pinning.decide_dispatch``)."""
    check = recheck(pointers)
    patch_bytes = None
    if check.stale and idempotent and patch is not None:
        patch_bytes = read_stored_patch(patch)
    return decide_dispatch(check, idempotent=idempotent, patch=patch, patch_bytes=patch_bytes)


def _make_private_dir(directory: Path) -> None:
    if directory.is_dir():
        return
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The new directory's entry lives in its parent: make it durable before files go in.
    fsync_dir(directory.parent)


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and set(text) <= _HEX


def free_patch_copies(
    directory: Path, named: Callable[[], set[str]], *, dry_run: bool = False
) -> dict[str, int]:
    """``ferry gc``: remove the private copies of ``--patch-file``s in ``directory``
    (``<sha256>.patch``, one per distinct patch, shared by the tasks that name it)
    that no task names any more (``named``: the sha256s the tasks name, read once the
    copies are listed) and that were not written or reused for ``PATCH_QUIET_S``;
    sha256 -> bytes freed (``dry_run``: that would be).

    A submit writes or touches its copy before its task is written: one untouched that
    long and named by no task is no submit's. Each goes aside first (a rename) and is
    looked at again there: touched meanwhile (a submit reused it between the two
    looks), it comes back; a submit that reuses it once it is aside finds it gone and
    writes it afresh. A gc killed with one aside leaves it to the next, which puts it
    back if a task names it again."""
    quiet_before = time.time() - PATCH_QUIET_S
    candidates: dict[str, list[Path]] = {}
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    for entry in entries:
        sha256 = _copy_sha256(entry.name)
        if sha256 is None or not entry.is_file(follow_symlinks=False):
            continue
        if entry.name.startswith(".") or entry.stat().st_mtime < quiet_before:
            candidates.setdefault(sha256, []).append(Path(entry.path))
    if not candidates:
        return {}
    in_use = named()
    freed: dict[str, int] = {}
    for sha256, paths in sorted(candidates.items()):
        final = directory / f"{sha256}.patch"
        for path in paths:
            aside = path if path.name.startswith(".") else directory / f".{path.name}.gc"
            if sha256 in in_use:
                if path == aside and not dry_run:  # (left aside by a gc killed there)
                    _put_back(aside, final)
                continue
            size = os.lstat(path).st_blocks * 512
            if not dry_run and not _taken(path, aside, final, quiet_before):
                continue
            freed[sha256] = freed.get(sha256, 0) + size
    if freed and not dry_run:
        fsync_dir(directory)
    return freed


def _taken(path: Path, aside: Path, final: Path, quiet_before: float) -> bool:
    """Set ``path`` aside, look at it again, and remove it if still untouched (True);
    else it goes back (False)."""
    if path != aside:
        failpoint("before:gc_patch")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        failpoint("after:gc_patch")
    if os.lstat(aside).st_mtime >= quiet_before:  # (reused since it was listed)
        _put_back(aside, final)
        return False
    aside.unlink()
    return True


def _put_back(aside: Path, final: Path) -> None:
    """A copy set aside goes back (one written afresh meanwhile holds the same bytes)."""
    if final.exists():
        aside.unlink()
    else:
        os.rename(aside, final)


def _copy_sha256(name: str) -> str | None:
    """The sha256 a patch copy's file name carries (``<sha256>.patch``, or ``.<it>.gc``
    set aside by a gc); None for another file."""
    if name.startswith(".") and name.endswith(".gc"):
        name = name[1:-3]
    stem, dot, suffix = name.partition(".")
    return stem if dot and suffix == "patch" and is_sha256_hex(stem) else None
