"""Errors of ferry: one base, stable dotted codes, one place that maps them to exit codes.

The tree (codes are part of the observable contract; scripts match on them)::

    FerryError                      code             exit (other cmds) exit (run/claim)
    +-- UsageError                  usage.*          2                 2
    +-- NotFoundError               task.not_found   5                 125
    +-- AmbiguousIdError            task.ambiguous   5                 125
    +-- IllegalTransitionError      task.illegal_transition  1         125
    +-- RefusedError                task.refused     1 (or its own)    125
    +-- OperatorNeededError         recovery.*       3                 125
    |   +-- KeyUnsafeError          task.key_unsafe  3                 3
    +-- LeaseHeldError              lease.held       75                75
    +-- KeyInFlightError            task.key_in_flight 75              75
    +-- JournalIntegrityError       journal.*        4                 125
    +-- StateDirError               state_dir.*      125               125
    +-- DatabaseError               db.*             125               125
    |   +-- DatabaseUnavailableError db.unavailable  75                75
    |                               db.queue_busy    75                75
    +-- PatchGateError              patch.*          2                 125
    +-- SpawnError                  spawn.*          125 / 126 / 127   125 / 126 / 127
    +-- ResourceError               io.*             125               125
    +-- Interrupted                 interrupted      128+N             128+N
    +-- InternalError               internal         125               125

Every error carries ``code`` (stable), ``message`` (one line, for humans) and
``details`` (a JSON-able dict, possibly empty).  ``exit_code`` is what a command other
than ``run``/``claim`` exits with; ``run``/``claim`` map every failure before the task
starts to 125 except usage errors (2), the EX_TEMPFAIL cases (75), an unsafe key (3)
and the exec failures 126/127 (see :func:`exit_code_for`).
"""

from __future__ import annotations

import errno

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EX_USAGE = 2
EX_OPERATOR = 3
EX_JOURNAL = 4
EX_NOT_FOUND = 5
EX_TEMPFAIL = 75
# The code of an error that says records a process read were taken back by their writer
# (its fdatasync failed): the local store has read the journal again; look again.
TAKEN_BACK = "journal.taken_back"
EX_TIMEOUT = 124
EX_FERRY_FAILED = 125
EX_NOT_EXECUTABLE = 126
EX_NOT_FOUND_CMD = 127


class FerryError(Exception):
    """Base of every error ferry reports to a user."""

    code: str = "internal"
    exit_code: int = EX_FERRY_FAILED

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if exit_code is not None:
            self.exit_code = exit_code
        self.details: dict[str, Any] = dict(details or {})

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class UsageError(FerryError):
    code = "usage.invalid"
    exit_code = EX_USAGE


class NotFoundError(FerryError):
    code = "task.not_found"
    exit_code = EX_NOT_FOUND


class StateDirMissingError(FerryError):
    """A maintenance command (``journal compact``, ``journal repair``) named a state
    directory that does not exist (a typo in ``--home``, say): not made, nothing done."""

    code = "state_dir.missing"
    exit_code = EX_NOT_FOUND


class AmbiguousIdError(FerryError):
    code = "task.ambiguous"
    exit_code = EX_NOT_FOUND


class RefusedError(FerryError):
    """Refused because of the task's state (exit 1 unless the contract says otherwise)."""

    code = "task.refused"
    exit_code = 1


class IllegalTransitionError(RefusedError):
    code = "task.illegal_transition"


class OperatorNeededError(FerryError):
    code = "recovery.operator_needed"
    exit_code = EX_OPERATOR


class TaskFateUnknown(OperatorNeededError):
    """The task may have started and its end is not known (its supervisor died after
    its plan: the spawn may have happened): recovery decides it.  Exit 3 for ``run``
    and ``claim`` too, never 125 (ferry failed *before* the task could start: a script
    may run it again)."""


class KeyUnsafeError(OperatorNeededError):
    """The key's latest task ended in a way that may have changed things (unsafe,
    quarantined): not run again until an operator retries or resolves that task."""

    code = "task.key_unsafe"


class LeaseHeldError(FerryError):
    code = "lease.held"
    exit_code = EX_TEMPFAIL


class KeyInFlightError(FerryError):
    code = "task.key_in_flight"
    exit_code = EX_TEMPFAIL


class JournalIntegrityError(FerryError):
    code = "journal.corrupt"
    exit_code = EX_JOURNAL


class StateDirError(FerryError):
    code = "state_dir.unusable"
    exit_code = EX_FERRY_FAILED


class DatabaseError(FerryError):
    """The shared database is not fit to use: not initialised (``db.not_initialised``),
    not durable (``db.not_durable``), a schema newer than this ferry (``db.version``)."""

    code = "db.error"
    exit_code = EX_FERRY_FAILED


class DatabaseUnavailableError(DatabaseError):
    """The database cannot be reached now: try again later (exit 75)."""

    code = "db.unavailable"
    exit_code = EX_TEMPFAIL


class PatchGateError(FerryError):
    """A patch failed one of the three gates; ``code`` names the gate (patch.<REASON>)."""

    code = "patch.invalid"
    exit_code = EX_USAGE


class SpawnError(FerryError):
    code = "spawn.failed"
    exit_code = EX_FERRY_FAILED


class ResourceError(FerryError):
    """ferry's own I/O failed (disk full, read-only filesystem, out of descriptors...);
    made from the OSError by :func:`from_os_error`."""

    code = "io.error"
    exit_code = EX_FERRY_FAILED


class Interrupted(FerryError):
    """SIGINT, SIGTERM or SIGHUP before anything was started: ferry stops, 128+N."""

    code = "interrupted"
    exit_code = 130


class InternalError(FerryError):
    code = "internal"
    exit_code = EX_FERRY_FAILED


_OS_ERROR_CODES = {
    errno.ENOSPC: "io.no_space",
    errno.EDQUOT: "io.no_space",
    errno.EROFS: "io.read_only",
    errno.EACCES: "io.permission_denied",
    errno.EPERM: "io.permission_denied",
    errno.EMFILE: "io.too_many_open_files",
    errno.ENFILE: "io.too_many_open_files",
    errno.ENOMEM: "io.no_memory",
    errno.EIO: "io.device_error",
}


def from_os_error(error: OSError) -> FerryError:
    """An OSError that reached the command line, as a coded error with its errno and path.

    A symlink where ferry opens a file without following links (ELOOP) is the state
    directory check's ``state_dir.symlink``."""
    path = error.filename if isinstance(error.filename, str) else None
    details: dict[str, Any] = {"errno": error.errno, "path": path}
    where = f": {path}" if path else ""
    if error.errno == errno.ELOOP:
        return StateDirError(
            f"refusing to follow a symlink{where}", code="state_dir.symlink", details=details
        )
    code = _OS_ERROR_CODES.get(error.errno or 0, "io.error")
    reason = error.strerror or str(error)
    return ResourceError(f"{reason}{where}", code=code, details=details)


# Exit codes that run/claim pass through unchanged for errors before the task starts.
_RUN_PASSTHROUGH = frozenset({EX_USAGE, EX_TEMPFAIL, EX_NOT_EXECUTABLE, EX_NOT_FOUND_CMD})


def exit_code_for(error: FerryError, *, runs_task: bool) -> int:
    """The one place that maps an error to a process exit code.

    ``runs_task`` is true for ``run`` and ``claim``: there every failure before the task
    could start exits 125, except usage errors (2), EX_TEMPFAIL (75) and the exec
    failures 126/127.
    """
    if runs_task and isinstance(error, KeyUnsafeError | TaskFateUnknown):
        return EX_OPERATOR  # the contract: run refuses such a key with exit 3 too
    if isinstance(error, Interrupted):
        return error.exit_code  # 128+N, as a signal that killed it would
    if runs_task and error.exit_code not in _RUN_PASSTHROUGH:
        return EX_FERRY_FAILED
    if runs_task and isinstance(error, PatchGateError):
        # The contract: for run/claim a patch that fails a gate exits 125, not 2.
        return EX_FERRY_FAILED
    return error.exit_code
