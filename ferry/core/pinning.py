"""Input pinning: the dispatch decision for pointers and the self-contained patch (pure).

Just before a task is dispatched its pointers are re-hashed (``ferry.app.pointers.recheck``,
the I/O); :func:`decide_dispatch` turns what was seen into a :class:`DispatchVerdict`:

=====================================================  ==================================
what the re-hash saw                                   verdict
=====================================================  ==================================
every pointer fresh (or none declared)                 run, ``patch_mode: NONE``
some stale, task not ``--idempotent``                  fail ``POINTER_STALE``
some stale, idempotent, no ``--patch-file``            fail ``POINTER_STALE``
some stale, idempotent, ferry's patch copy gone or     fail ``POINTER_STALE`` (the patch
changed (its SHA-256 differs from the recorded one)    is a pinned input too)
some stale, idempotent, patch fails a gate             fail with that gate's reason
some stale, idempotent, patch passes the three gates   run, ``patch_mode: SELF_CONTAINED``
=====================================================  ==================================

Honest evidence: ``verified_sha256`` is built only from hashes computed on disk during
this check (``PointerObservation.actual_sha256`` of a fresh pointer); a hash the user
declared, or one taken at submit, is never copied into it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ferry.core.errors import EX_FERRY_FAILED, FerryError, PatchGateError
from ferry.core.patch import check_gates, json_safe

POINTER_STALE = "POINTER_STALE"
PATCH_MODE_NONE = "NONE"
PATCH_MODE_SELF_CONTAINED = "SELF_CONTAINED"
ENV_PATCH_FILE = "FERRY_PATCH_FILE"
ENV_PATCH_MODE = "FERRY_PATCH_MODE"
POINTER_STALE_CODE = "pointer.stale"
_HASH_SHOWN_CHARS = 12


@dataclass(frozen=True)
class Pointer:
    """A pinned input file."""

    path: str  # normalised, relative to the task's cwd: what gate 2 compares
    abs_path: str  # where it is re-hashed
    sha256: str  # expected: taken at submit, or declared by the user

    def spec_entry(self) -> tuple[str, str]:
        """The ``(path, sha256)`` pair a TaskSpec stores."""
        return (self.path, self.sha256)


@dataclass(frozen=True)
class PointerObservation:
    """One pointer and the hash its file has now (None, with ``problem``, if it
    could not be read)."""

    pointer: Pointer
    actual_sha256: str | None  # None: missing or unreadable (then ``problem`` says why)
    problem: str | None = None

    @property
    def fresh(self) -> bool:
        return self.actual_sha256 is not None and self.actual_sha256 == self.pointer.sha256


@dataclass(frozen=True)
class PointerCheck:
    """What re-hashing every pointer of a task saw, in declaration order."""

    observations: tuple[PointerObservation, ...]

    @property
    def fresh(self) -> tuple[PointerObservation, ...]:
        return tuple(o for o in self.observations if o.fresh)

    @property
    def stale(self) -> tuple[PointerObservation, ...]:
        return tuple(o for o in self.observations if not o.fresh)


class PatchCopy(Protocol):
    """ferry's private copy of a patch: ``StoredPatch`` or the spec's ``PatchRef``."""

    @property
    def path(self) -> str: ...

    @property
    def sha256(self) -> str: ...


@dataclass(frozen=True)
class StoredPatch:
    """A patch copied into the state directory, and its hash."""

    path: str  # absolute path of the private copy in the state directory
    sha256: str


@dataclass(frozen=True)
class DispatchVerdict:
    """Whether a task with pointers may run, in which patch mode, and what to add to
    its environment and evidence (or why it may not run)."""

    run: bool
    patch_mode: str  # PATCH_MODE_NONE or PATCH_MODE_SELF_CONTAINED
    reason: str | None = None  # contract reason when ``run`` is false
    message: str = ""  # one line; why it fails (empty when it runs)
    env: Mapping[str, str] = field(default_factory=dict)  # add to the child's environment
    warning: str | None = None  # "warning: ...": print as "ferry: <warning>" to stderr
    evidence: Mapping[str, Any] = field(default_factory=dict)  # merge into task evidence
    error_code: str | None = None  # ``pointer.stale`` or ``patch.<REASON>`` when failing

    def error(self) -> FerryError | None:
        """The error ``ferry run`` reports (exit 125) when the task may not run."""
        if self.run:
            return None
        details = {"reason": self.reason, "evidence": dict(self.evidence)}
        if self.error_code is not None and self.error_code.startswith("patch."):
            return PatchGateError(
                self.message, code=self.error_code, details=details, exit_code=EX_FERRY_FAILED
            )
        return FerryError(self.message, code=POINTER_STALE_CODE, details=details)


def decide_dispatch(
    check: PointerCheck,
    *,
    idempotent: bool,
    patch: PatchCopy | None,
    patch_bytes: bytes | None,
) -> DispatchVerdict:
    """Decide whether a task may run, and how (see the module's table).

    ``check`` covers every pointer the task declares.  ``patch_bytes`` is what was read
    from ``patch.path`` just now (None: not read, missing or unreadable); it is only
    needed when some pointer is stale.
    """
    verified = {json_safe(o.pointer.path): o.actual_sha256 for o in check.fresh if o.actual_sha256}
    stale = check.stale
    if not stale:
        if not check.observations and patch is None:
            return DispatchVerdict(run=True, patch_mode=PATCH_MODE_NONE)
        evidence = {
            "patch_mode": PATCH_MODE_NONE,
            "verified_on_disk": True,
            "verified_sha256": verified,
        }
        return DispatchVerdict(run=True, patch_mode=PATCH_MODE_NONE, evidence=evidence)

    stale_evidence = {json_safe(o.pointer.path): _stale_entry(o) for o in stale}
    base: dict[str, Any] = {
        "patch_mode": PATCH_MODE_NONE,
        "verified_on_disk": False,
        "stale_pointers": stale_evidence,
        "verified_sha256": verified,
    }
    what = _describe_stale(stale)
    if not idempotent:
        return _fail_stale(f"{what}; the task is not --idempotent, so no patch may stand in", base)
    if patch is None:
        return _fail_stale(f"{what}; the task carries no --patch-file to stand in", base)
    base["patch_sha256"] = patch.sha256
    actual_patch_sha = None if patch_bytes is None else hashlib.sha256(patch_bytes).hexdigest()
    if actual_patch_sha != patch.sha256:
        base["patch_copy"] = {"expected": patch.sha256, "actual": actual_patch_sha}
        found = "is missing" if patch_bytes is None else "changed"
        return _fail_stale(f"{what}; ferry's copy of the patch {found} ({patch.path})", base)
    assert patch_bytes is not None  # the hash of no bytes is None, never patch.sha256
    try:
        check_gates(patch_bytes, [o.pointer.path for o in check.observations])
    except PatchGateError as gate:
        base["patch_gate"] = gate.details
        reason = str(gate.details.get("reason", ""))
        return DispatchVerdict(
            run=False,
            patch_mode=PATCH_MODE_NONE,
            reason=reason,
            message=f"{what}; the patch fails a gate: {gate.message}",
            evidence=base,
            error_code=gate.code,
        )
    unverified = [json_safe(o.pointer.path) for o in stale]
    evidence = {
        "patch_mode": PATCH_MODE_SELF_CONTAINED,
        "patch_sha256": patch.sha256,
        "verified_on_disk": False,
        "unverified_pointers": unverified,
        "verified_sha256": verified,
        "stale_pointers": stale_evidence,
    }
    warning = (
        f"warning: SELF_CONTAINED mode: {what}; the files on disk are NOT the reviewed version; "
        f"the task gets the patch in ${ENV_PATCH_FILE} ({patch.path}, "
        f"sha256 {patch.sha256[:_HASH_SHOWN_CHARS]})"
    )
    env = {ENV_PATCH_FILE: patch.path, ENV_PATCH_MODE: PATCH_MODE_SELF_CONTAINED}
    return DispatchVerdict(
        run=True,
        patch_mode=PATCH_MODE_SELF_CONTAINED,
        env=env,
        warning=warning,
        evidence=evidence,
    )


def _fail_stale(message: str, evidence: dict[str, Any]) -> DispatchVerdict:
    return DispatchVerdict(
        run=False,
        patch_mode=PATCH_MODE_NONE,
        reason=POINTER_STALE,
        message=message,
        evidence=evidence,
        error_code=POINTER_STALE_CODE,
    )


def _stale_entry(observation: PointerObservation) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "expected": observation.pointer.sha256,
        "actual": observation.actual_sha256,
    }
    if observation.problem is not None:
        entry["problem"] = json_safe(observation.problem)
    return entry


def _describe_stale(stale: tuple[PointerObservation, ...]) -> str:
    first = stale[0]
    if first.actual_sha256 is None:
        found = first.problem or "unreadable"
    else:
        found = f"found {first.actual_sha256[:_HASH_SHOWN_CHARS]}"
    more = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
    return (
        f"pointer {json_safe(first.pointer.path)!r} changed since submit (expected "
        f"{first.pointer.sha256[:_HASH_SHOWN_CHARS]}, {found}){more}"
    )
