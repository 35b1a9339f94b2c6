"""TaskSpec: what to run and how (pure). Validated once, at submit, with usage.* codes.

The spec is what SUBMITTED journals. It never changes after that: retries reuse it.
Paths are stored as given; resolving them (``cwd``, relative pointers) is the caller's
job, before the spec is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from ferry.core._value import Value, init
from ferry.core.errors import UsageError
from ferry.core.ids import is_task_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_RELEASES_DEFAULT = 3
KILL_GRACE_DEFAULT_S = 10.0
HEARTBEAT_DEFAULT_S = 5.0
HEARTBEAT_MIN_S = 0.01  # below this a runner would spend its time beating
# Ten years: far beyond any sane timeout, far below threading.TIMEOUT_MAX (overflow).
SECONDS_MAX = 10 * 365 * 24 * 3600.0
MAX_RELEASES_MAX = 1_000_000
TEXT_CHARS_MAX = 256  # name and key
# --log-max: at least two file system blocks of head and of tail (the log keeps whole
# blocks: ferry.proc._logcap), at most what a file can hold.
LOG_MAX_BYTES_MIN = 16 << 10
LOG_MAX_BYTES_MAX = 1 << 50
# Queue control (contract.md, "Queue control and housekeeping").
GROUP_DEFAULT = "default"
GROUP_CHARS_MAX = 64
PRIORITY_MAX = 1_000_000_000  # |priority|: a bigint column on PostgreSQL, with room
RETRIES_MAX = 100
RETRY_DELAY_DEFAULT_S = 1.0
AFTER_MAX = 1_000  # dependencies of one task
_SHA256_HEX = frozenset("0123456789abcdef")


# The default of TaskSpec.env: each spec gets a new dict of its own (as a dataclass's
# default_factory=dict); the shared empty mapping itself is never stored.
_NEW_DICT: Mapping[str, str] = MappingProxyType({})


class PatchRef(Value):
    """ferry's private copy of a patch (``path`` in the state directory) and its hash."""

    __slots__ = ("path", "sha256")
    _FIELDS = ("path", "sha256")
    path: str
    sha256: str

    def __init__(self, path: str, sha256: str) -> None:
        init(self, "path", path)
        init(self, "sha256", sha256)


class TaskSpec(Value):
    """What to run and how, as submitted: journaled with the task and never changed.
    (A hand-written frozen value, not a dataclass: see ``ferry.core._value``.)"""

    _FIELDS = (
        "argv",
        "cwd",
        "name",
        "key",
        "env",
        "idempotent",
        "max_releases",
        "timeout_s",
        "kill_grace_s",
        "heartbeat_s",
        "shell",
        "pointers",
        "patch",
        "pty",
        "log_max_bytes",
        "group",
        "priority",
        "after",
        "not_before",
        "retries",
        "retry_delay_s",
    )
    argv: tuple[str, ...]
    cwd: str
    name: str | None
    key: str | None
    env: Mapping[str, str]
    idempotent: bool
    max_releases: int
    timeout_s: float | None
    kill_grace_s: float
    heartbeat_s: float
    shell: bool
    pointers: tuple[tuple[str, str], ...]  # (path, sha256 hex)
    patch: PatchRef | None
    pty: bool  # stdout and stderr one pseudo-terminal (run/submit --pty)
    # Each stream's log keeps its first and last log_max_bytes/2 (None: all of it).
    log_max_bytes: int | None
    # Queue control. (These and the two above are written into a record only when not
    # the default: a task that uses none of them is journaled as before they existed.)
    group: str
    priority: int  # higher first; FIFO within a priority
    after: tuple[str, ...]  # task ids that must SUCCEED before this one is claimed
    not_before: float | None  # Unix seconds: not claimed before then
    retries: int  # automatic new attempts after EXIT_NONZERO or TIMEOUT
    retry_delay_s: float  # before the first; doubled each time

    def __init__(
        self,
        argv: tuple[str, ...],
        cwd: str,
        name: str | None = None,
        key: str | None = None,
        env: Mapping[str, str] = _NEW_DICT,
        idempotent: bool = False,
        max_releases: int = MAX_RELEASES_DEFAULT,
        timeout_s: float | None = None,
        kill_grace_s: float = KILL_GRACE_DEFAULT_S,
        heartbeat_s: float = HEARTBEAT_DEFAULT_S,
        shell: bool = False,
        pointers: tuple[tuple[str, str], ...] = (),
        patch: PatchRef | None = None,
        pty: bool = False,
        log_max_bytes: int | None = None,
        group: str = GROUP_DEFAULT,
        priority: int = 0,
        after: tuple[str, ...] = (),
        not_before: float | None = None,
        retries: int = 0,
        retry_delay_s: float = RETRY_DELAY_DEFAULT_S,
    ) -> None:
        init(self, "argv", argv)
        init(self, "cwd", cwd)
        init(self, "name", name)
        init(self, "key", key)
        init(self, "env", {} if env is _NEW_DICT else env)
        init(self, "idempotent", idempotent)
        init(self, "max_releases", max_releases)
        init(self, "timeout_s", timeout_s)
        init(self, "kill_grace_s", kill_grace_s)
        init(self, "heartbeat_s", heartbeat_s)
        init(self, "shell", shell)
        init(self, "pointers", pointers)
        init(self, "patch", patch)
        init(self, "pty", pty)
        init(self, "log_max_bytes", log_max_bytes)
        init(self, "group", group)
        init(self, "priority", priority)
        init(self, "after", after)
        init(self, "not_before", not_before)
        init(self, "retries", retries)
        init(self, "retry_delay_s", retry_delay_s)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "argv": list(self.argv),
            "name": self.name,
            "key": self.key,
            "cwd": self.cwd,
            "env": dict(self.env),
            "idempotent": self.idempotent,
            "max_releases": self.max_releases,
            "timeout_s": self.timeout_s,
            "kill_grace_s": self.kill_grace_s,
            "heartbeat_s": self.heartbeat_s,
            "shell": self.shell,
            "pointers": [{"path": path, "sha256": sha} for path, sha in self.pointers],
            "patch": None
            if self.patch is None
            else {"path": self.patch.path, "sha256": self.patch.sha256},
        }
        for name, default in _OPTIONAL_DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                data[name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], *, strict: bool = False, validate: bool = True
    ) -> TaskSpec:
        """Build and validate a spec. ``strict`` refuses unknown keys (user input such
        as a ``submit --from`` line); the default ignores them (a journal written by a
        newer version). ``validate=False`` only for ferry's own snapshots."""
        if strict and isinstance(data, Mapping):
            unknown = sorted(set(data) - _FIELD_NAMES)
            if unknown:
                raise UsageError(
                    f"unknown task option(s): {', '.join(unknown)}",
                    code="usage.bad_spec",
                    details={"unknown": unknown},
                )
        check_shape(data)
        argv, env, patch = data["argv"], data.get("env") or {}, data.get("patch")
        pointers, after = data.get("pointers") or [], data.get("after") or ()
        spec = cls(
            argv=tuple(argv),
            cwd=data["cwd"],
            name=data.get("name"),
            key=data.get("key"),
            env=dict(env),
            idempotent=data.get("idempotent", False),
            max_releases=data.get("max_releases", MAX_RELEASES_DEFAULT),
            timeout_s=data.get("timeout_s"),
            kill_grace_s=data.get("kill_grace_s", KILL_GRACE_DEFAULT_S),
            heartbeat_s=data.get("heartbeat_s", HEARTBEAT_DEFAULT_S),
            shell=data.get("shell", False),
            pointers=tuple((p["path"], p["sha256"]) for p in pointers),
            patch=None if patch is None else PatchRef(patch["path"], patch["sha256"]),
            pty=data.get("pty", False),
            log_max_bytes=data.get("log_max_bytes"),
            group=data.get("group", GROUP_DEFAULT),
            priority=data.get("priority", 0),
            after=tuple(after),
            not_before=data.get("not_before"),
            retries=data.get("retries", 0),
            retry_delay_s=data.get("retry_delay_s", RETRY_DELAY_DEFAULT_S),
        )
        if validate:
            validate_spec(spec)
        return spec


def check_shape(data: Any) -> None:
    """What building a TaskSpec from ``data`` needs of its shape (UsageError otherwise):
    an object with ``argv`` and ``cwd``, and each structured field of its type. After
    this, ``TaskSpec.from_json(data, validate=False)`` cannot fail (a snapshot's records
    are checked so when it is read, and decoded later: ``ferry.core.live``)."""
    if not isinstance(data, Mapping):
        raise UsageError("a task spec must be a JSON object", code="usage.bad_spec")
    for required in ("argv", "cwd"):
        if required not in data:
            raise UsageError(f"task spec lacks {required!r}", code="usage.bad_spec")
    if not isinstance(data["argv"], list | tuple):
        raise UsageError("argv must be a list of strings", code="usage.bad_argv")
    if not isinstance(data.get("env") or {}, Mapping):
        raise UsageError("env must be an object of strings", code="usage.bad_env")
    pointers = data.get("pointers") or []
    if not isinstance(pointers, list | tuple) or not all(
        isinstance(p, Mapping) and "path" in p and "sha256" in p for p in pointers
    ):
        raise UsageError("pointers must be [{path, sha256}]", code="usage.bad_pointer")
    patch = data.get("patch")
    if patch is not None and not (
        isinstance(patch, Mapping) and "path" in patch and "sha256" in patch
    ):
        raise UsageError("patch must be {path, sha256}", code="usage.bad_patch")
    if not isinstance(data.get("after") or (), list | tuple):
        raise UsageError("after must be a list of task ids", code="usage.bad_after")


_FIELD_NAMES = frozenset(TaskSpec._FIELDS)
# Written into a record only when not the default: a task that uses none of them is
# journaled exactly as before they existed.
_OPTIONAL_DEFAULTS: dict[str, Any] = {
    "pty": False,
    "log_max_bytes": None,
    "group": GROUP_DEFAULT,
    "priority": 0,
    "after": (),
    "not_before": None,
    "retries": 0,
    "retry_delay_s": RETRY_DELAY_DEFAULT_S,
}
_GROUP_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _bad(code: str, message: str, **details: Any) -> UsageError:
    return UsageError(message, code=code, details=details)


def check_text(value: object, what: str, code: str) -> None:
    """A label a user gives (a task's name or key, a host id): a non-empty string of
    printable characters (no control character, no byte that is not UTF-8), at most
    ``TEXT_CHARS_MAX`` of them; else UsageError ``code``."""
    _check_text(value, what, code, optional=False)


def _check_text(value: object, what: str, code: str, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise _bad(code, f"{what} must be a non-empty string", value=repr(value))
    if len(value) > TEXT_CHARS_MAX:
        raise _bad(code, f"{what} is longer than {TEXT_CHARS_MAX} characters")
    if any(not char.isprintable() for char in value):
        raise _bad(code, f"{what} must be printable (no control characters)", value=value)


def _check_seconds(value: object, what: str, *, minimum_s: float, inclusive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad("usage.bad_number", f"{what} must be a number of seconds", value=repr(value))
    number = float(value)
    too_small = number < minimum_s if inclusive else number <= minimum_s
    if math.isnan(number) or too_small or number > SECONDS_MAX:
        bound = ">=" if inclusive else ">"
        raise _bad(
            "usage.bad_number",
            f"{what} must be {bound} {minimum_s:g} and at most {SECONDS_MAX:g} seconds",
            value=repr(value),
        )


def validate_spec(spec: TaskSpec) -> None:
    """Raise UsageError (``usage.*``) unless the spec can be run as written."""
    if not isinstance(spec.argv, tuple) or not spec.argv:
        raise _bad("usage.missing_command", "no command given (put it after --)")
    for arg in spec.argv:
        if not isinstance(arg, str) or "\0" in arg:
            raise _bad("usage.bad_argv", "command arguments must be strings without NUL")
    if not spec.argv[0]:
        raise _bad("usage.bad_argv", "the command name is empty")
    if not isinstance(spec.cwd, str) or not spec.cwd or "\0" in spec.cwd:
        raise _bad("usage.bad_cwd", "cwd must be a non-empty path", value=repr(spec.cwd))
    _check_text(spec.name, "name", "usage.bad_name", optional=True)
    _check_text(spec.key, "key", "usage.bad_key", optional=True)
    for env_key, env_value in spec.env.items():
        if not isinstance(env_key, str) or not env_key or "=" in env_key or "\0" in env_key:
            raise _bad("usage.bad_env", f"bad environment name {env_key!r}", key=env_key)
        if not isinstance(env_value, str) or "\0" in env_value:
            raise _bad("usage.bad_env", f"bad value for environment {env_key!r}", key=env_key)
    for flag in ("idempotent", "shell", "pty"):
        if not isinstance(getattr(spec, flag), bool):
            raise _bad("usage.bad_spec", f"{flag} must be true or false")
    releases = spec.max_releases
    if isinstance(releases, bool) or not isinstance(releases, int):
        raise _bad("usage.bad_number", "max_releases must be an integer", value=repr(releases))
    if not 0 <= releases <= MAX_RELEASES_MAX:
        raise _bad(
            "usage.bad_number", f"max_releases must be 0..{MAX_RELEASES_MAX}", value=releases
        )
    if spec.timeout_s is not None:
        _check_seconds(spec.timeout_s, "timeout", minimum_s=0.0, inclusive=False)
    size = spec.log_max_bytes
    if size is not None and (
        isinstance(size, bool)
        or not isinstance(size, int)
        or not LOG_MAX_BYTES_MIN <= size <= LOG_MAX_BYTES_MAX
    ):
        raise _bad(
            "usage.bad_size",
            f"log max must be a number of bytes, at least {LOG_MAX_BYTES_MIN}",
            value=repr(size),
        )
    _check_seconds(spec.kill_grace_s, "kill grace", minimum_s=0.0, inclusive=True)
    _check_seconds(spec.heartbeat_s, "heartbeat", minimum_s=HEARTBEAT_MIN_S, inclusive=True)
    for pointer in spec.pointers:
        if not (isinstance(pointer, tuple) and len(pointer) == 2):
            raise _bad("usage.bad_pointer", "a pointer is (path, sha256)")
        path, sha = pointer
        if not isinstance(path, str) or not path or "\0" in path:
            raise _bad("usage.bad_pointer", "pointer path must be a non-empty path")
        if not is_sha256_hex(sha):
            raise _bad("usage.bad_pointer", f"pointer {path!r}: not a SHA-256 hex digest")
    _validate_queue_options(spec)
    if spec.patch is not None:
        if not isinstance(spec.patch.path, str) or not spec.patch.path:
            raise _bad("usage.bad_patch", "patch path must be a non-empty path")
        if not is_sha256_hex(spec.patch.sha256):
            raise _bad("usage.bad_patch", "patch sha256 is not a SHA-256 hex digest")


def check_group(name: object) -> str:
    """A group's name: 1 to 64 of letters, digits, ``.``, ``_`` and ``-`` (a word in
    a table, a shell and a SQL row alike), not starting with ``.`` or ``-``."""
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= GROUP_CHARS_MAX
        or not set(name) <= _GROUP_CHARS
        or name[0] in ".-"
    ):
        raise _bad(
            "usage.bad_group",
            f"bad group name {name!r}: 1 to {GROUP_CHARS_MAX} letters, digits, '.', '_'"
            " or '-', not starting with '.' or '-'",
            value=repr(name),
        )
    return name


def _validate_queue_options(spec: TaskSpec) -> None:
    check_group(spec.group)
    priority = spec.priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise _bad("usage.bad_number", "priority must be an integer", value=repr(priority))
    if not -PRIORITY_MAX <= priority <= PRIORITY_MAX:
        raise _bad("usage.bad_number", f"priority must be within ±{PRIORITY_MAX}", value=priority)
    if not isinstance(spec.after, tuple) or len(spec.after) > AFTER_MAX:
        raise _bad("usage.bad_after", f"after: at most {AFTER_MAX} task ids")
    if not all(isinstance(dep, str) and is_task_id(dep) for dep in spec.after):
        raise _bad("usage.bad_after", "after must hold task ids", value=repr(spec.after))
    if len(set(spec.after)) != len(spec.after):
        raise _bad("usage.bad_after", "after names a task twice", value=repr(spec.after))
    moment = spec.not_before
    if moment is not None and (
        isinstance(moment, bool)
        or not isinstance(moment, int | float)
        or not 0 <= moment <= NOT_BEFORE_MAX  # (NaN fails this too)
    ):
        raise _bad("usage.bad_time", "not_before must be a time (Unix seconds)", value=repr(moment))
    retries = spec.retries
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise _bad("usage.bad_number", "retries must be an integer", value=repr(retries))
    if not 0 <= retries <= RETRIES_MAX:
        raise _bad("usage.bad_number", f"retries must be 0..{RETRIES_MAX}", value=retries)
    _check_seconds(spec.retry_delay_s, "retry delay", minimum_s=0.0, inclusive=True)


# Unix seconds: not_before is a moment (checked like any seconds value, plus this bound:
# the year 2400, far past any plan, far below float trouble).
NOT_BEFORE_MAX = 13_569_465_600.0


def is_sha256_hex(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _SHA256_HEX
