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
from collections.abc import Iterable, Sequence
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
from ferry.storage.local.statedir import fsync_dir, write_atomic

PATCH_BYTES_MAX = 64 * 1024 * 1024  # a review patch, not a disk image
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
    rename, fsync the directory.  Idempotent: an intact copy is reused."""
    sha256 = hashlib.sha256(data).hexdigest()
    _make_private_dir(patches_dir)
    final = patches_dir / f"{sha256}.patch"
    try:
        if hash_file(final) == sha256:
            return StoredPatch(path=str(final), sha256=sha256)
    except OSError:
        pass  # absent (the usual case) or unreadable: write it afresh
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
