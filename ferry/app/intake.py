"""User input -> validated TaskSpec: the TASK OPTIONS of ``run``/``submit`` and the JSON
lines of ``submit --from``. Everything a user can get wrong is refused here with a
``usage.*`` code (exit 2) before anything is journaled.

Decisions (also in docs/cli.md):
* argv elements must be valid UTF-8 (the journal is JSON). Bytes that are not are
  refused clearly (``usage.bad_argv``) rather than silently altered.
* ``--cwd`` is resolved to an absolute path at submit time and must be a directory.
* ``--env`` values are stored in the journal (docs say so plainly) and shown only as
  keys unless ``show --show-env`` asks for them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from ferry.core.errors import UsageError
from ferry.core.spec import (
    GROUP_DEFAULT,
    RETRY_DELAY_DEFAULT_S,
    PatchRef,
    TaskSpec,
    validate_spec,
)
from journal import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# One `submit --from` or `--lines`: at most this much input is read (as a --patch-file),
# and at most this many tasks are taken: the batch is one write, built in memory (about
# 9 KB a task: 50,000 tasks cost some 450 MB and 9 s here). A larger batch is several
# submits. (Unbounded, `--lines /dev/zero` took 5 GB in seconds.)
BATCH_BYTES_MAX = 64 << 20
BATCH_TASKS_MAX = 50_000

# Keys a `submit --from` line may carry: the task options, by their option names.
_LINE_KEYS = {
    "argv": "argv",
    "name": "name",
    "key": "key",
    "idempotent": "idempotent",
    "max_releases": "max_releases",
    "max-releases": "max_releases",
    "timeout": "timeout_s",
    "kill_grace": "kill_grace_s",
    "kill-grace": "kill_grace_s",
    "heartbeat": "heartbeat_s",
    "cwd": "cwd",
    "env": "env",
    "pointer": "pointers",
    "pointers": "pointers",
    "patch_file": "patch_file",
    "patch-file": "patch_file",
    "shell": "shell",
    "pty": "pty",
    "log_max": "log_max",
    "log-max": "log_max",
    "group": "group",
    "priority": "priority",
    "after": "after",
    "not_before": "not_before",
    "not-before": "not_before",
    "retries": "retries",
    "retry_delay": "retry_delay_s",
    "retry-delay": "retry_delay_s",
}
_DEFAULTS: dict[str, Any] = {
    "name": None,
    "key": None,
    "idempotent": False,
    "max_releases": 3,
    "timeout_s": None,
    "kill_grace_s": 10.0,
    "heartbeat_s": 5.0,
    "cwd": None,
    "env": [],
    "pointers": [],
    "patch_file": None,
    "shell": False,
    "pty": False,
    "log_max": None,
    "group": GROUP_DEFAULT,
    "priority": 0,
    "after": [],
    "not_before": None,
    "retries": 0,
    "retry_delay_s": RETRY_DELAY_DEFAULT_S,
}


# execve refuses any single argument longer than MAX_ARG_STRLEN (32 pages, its NUL
# included) with E2BIG, and an argument list (with the environment) beyond ARG_MAX.
_ARG_BYTES_MAX = 32 * os.sysconf("SC_PAGE_SIZE") - 1
_ARGV_BYTES_MAX = os.sysconf("SC_ARG_MAX")


def _check_exec_sizes(argv: Sequence[str]) -> None:
    """Refuse at submit what execve would refuse at the spawn (E2BIG)."""
    sizes = [len(arg.encode("utf-8", "surrogateescape")) for arg in argv]
    if max(sizes) > _ARG_BYTES_MAX:
        raise UsageError(
            f"an argument of {max(sizes)} bytes: execve refuses any over {_ARG_BYTES_MAX}"
            " (E2BIG); pass it in a file instead",
            code="usage.bad_argv",
        )
    if sum(sizes) + len(sizes) > _ARGV_BYTES_MAX:
        raise UsageError(
            f"arguments of {sum(sizes) + len(sizes)} bytes in all: execve refuses over"
            f" {_ARGV_BYTES_MAX} with the environment (E2BIG); pass them in a file instead",
            code="usage.bad_argv",
        )


def _check_argv(argv: Sequence[Any]) -> tuple[str, ...]:
    if not argv:
        raise UsageError("missing CMD: give the command after --", code="usage.missing_command")
    out = []
    for arg in argv:
        if not isinstance(arg, str):
            raise UsageError("argv must be a list of strings", code="usage.bad_argv")
        if not _is_utf8(arg):
            raise UsageError(
                f"argument {arg.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8; "
                "ferry journals argv as JSON and refuses to alter it",
                code="usage.bad_argv",
            )
        if "\0" in arg:
            raise UsageError("an argument contains a NUL byte", code="usage.bad_argv")
        out.append(arg)
    if out[0] == "":
        raise UsageError("the command is an empty string", code="usage.missing_command")
    _check_exec_sizes(out)
    return tuple(out)


def _is_utf8(text: str) -> bool:
    """False for a string holding undecodable bytes (surrogate escapes from argv or the
    file system): the journal is JSON and ferry refuses to alter what it stores."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_utf8_text(value: Any, what: str) -> None:
    """A --name or --key with bytes that are not UTF-8 (from argv) is refused for what
    it is: the journal is JSON (the printable check would call them control characters)."""
    if isinstance(value, str) and not _is_utf8(value):
        raise UsageError(
            f"--{what} {value.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8",
            code=f"usage.bad_{what}",
        )


def _check_key_edges(key: Any) -> None:
    """A new task's key has no white space at its ends (a shell quote gone wrong: the
    key ``' build'`` would not be ``build``), and is not blank. Checked for new input
    only: a journal that holds such a key still reads."""
    if isinstance(key, str) and key and key != key.strip():
        raise UsageError(
            f"--key {key!r} must not begin or end with white space", code="usage.bad_key"
        )


def _parse_env(items: Any) -> dict[str, str]:
    if isinstance(items, Mapping):  # (a --from line's "env": {"KEY": "VALUE"})
        for key, value in items.items():
            if not isinstance(value, str):
                raise UsageError(
                    f"env {key!r} must be a string, not {_json_type(value)}",
                    code="usage.bad_env", details={"env": key},
                )  # fmt: skip
        items = [f"{k}={v}" for k, v in items.items()]
    if not isinstance(items, list | tuple):
        raise UsageError("env must be KEY=VALUE items or an object", code="usage.bad_env")
    env: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item or item.startswith("="):
            raise UsageError(
                f"--env {item!r}: expected KEY=VALUE", code="usage.bad_env", details={"env": item}
            )
        key, _, value = item.partition("=")
        if "\0" in item:
            raise UsageError(f"--env {key}: contains a NUL byte", code="usage.bad_env")
        if not _is_utf8(item):
            raise UsageError(
                f"--env {item.encode('utf-8', 'surrogateescape')!r}: not valid UTF-8",
                code="usage.bad_env",
            )
        env[key] = value
    return env


def _resolve_cwd(cwd: Any) -> str:
    if cwd is None:
        try:
            current = os.getcwd()
        except FileNotFoundError:
            raise UsageError(
                "the current directory no longer exists; give --cwd", code="usage.bad_cwd"
            ) from None
        if not _is_utf8(current):
            raise UsageError(
                f"the current directory {current.encode('utf-8', 'surrogateescape')!r} is not "
                "valid UTF-8; give --cwd",
                code="usage.bad_cwd",
            )
        return current
    if not isinstance(cwd, str) or not cwd:
        raise UsageError("--cwd must be a path", code="usage.bad_cwd")
    path = os.path.abspath(cwd)
    if not _is_utf8(path):
        raise UsageError(
            f"--cwd {path.encode('utf-8', 'surrogateescape')!r}: not valid UTF-8",
            code="usage.bad_cwd",
        )
    if not os.path.isdir(path):
        raise UsageError(f"--cwd {cwd!r}: no such directory", code="usage.bad_cwd")
    return path


# What only a shell understands: a single CMD argument holding one of these was meant
# for /bin/sh (``ferry submit -- 'make test && make dist'``), and execve would not find it.
_SHELL_SYNTAX = ("&&", "||", "|", ";", "$", " ", "\t", ">", "<", "`", "*", "(", "\n")


def _refuse_shell_text(argv: tuple[str, ...], cwd: str) -> None:
    command = argv[0]
    if len(argv) != 1 or not any(token in command for token in _SHELL_SYNTAX):
        return
    if os.path.exists(os.path.join(cwd, command)):
        return  # a real file whose name has a space in it
    raise UsageError(
        f"{command[:80]!r} looks like a shell command, but without --shell it would be run"
        " as one program of that name; add --shell (or split it into arguments)",
        code="usage.looks_like_shell",
        details={"command": command[:200]},
    )


def _refuse_loose_words(argv: tuple[str, ...]) -> None:
    """``--shell`` runs ``/bin/sh -c CMD...``: CMD's first word is the script, the words
    after it its ``$0``, ``$1``... (how ``sh -c`` takes them: ``--shell -- 'echo "$1"' _
    x`` passes ``x`` safely). A first word with no shell syntax followed by more words
    (``--shell -- echo hello world``) would run that word alone, the others unused: a
    mistake, refused (found by a review: an empty line, exit 0)."""
    if len(argv) > 1 and not any(token in argv[0] for token in _SHELL_SYNTAX):
        raise UsageError(
            f"with --shell, CMD's first word is the whole command line for /bin/sh -c, and"
            f" the words after it are its $0, $1...: {argv[0]!r} would run without them;"
            f" give the command line as one word (--shell -- {' '.join(argv)[:60]!r}),"
            " or drop --shell",
            code="usage.shell_words",
        )


def build_spec(opts: Mapping[str, Any], home: str, *, queued: bool = False) -> TaskSpec:
    """TaskSpec from the TASK OPTIONS (``ferry.cli.context.task_opts`` shape).
    ``queued``: for a task that runs later (``submit``), a CMD that only a shell could
    run is refused now, with a hint; ``run`` says so at once anyway (exit 127)."""
    argv = opts.get("argv")
    if not isinstance(argv, list | tuple):
        raise UsageError("argv must be a list of strings", code="usage.bad_argv")
    argv_t = _check_argv(argv)
    cwd = _resolve_cwd(opts.get("cwd"))
    if queued and not opts.get("shell"):
        _refuse_shell_text(argv_t, cwd)
    if opts.get("shell"):
        _refuse_loose_words(argv_t)
    for what in ("name", "key"):
        _check_utf8_text(opts.get(what), what)
    env = _parse_env(opts.get("env") or [])
    pointer_args = opts.get("pointers") or []
    if not isinstance(pointer_args, list | tuple) or not all(
        isinstance(p, str) for p in pointer_args
    ):
        raise UsageError("pointers must be a list of PATH[=SHA256]", code="usage.bad_pointer")
    pointers: tuple[tuple[str, str], ...] = ()
    patch: PatchRef | None = None
    if pointer_args:
        from ferry.app.pointers import resolve_pointers

        resolved = resolve_pointers(pointer_args, cwd)
        pointers = tuple(p.spec_entry() for p in resolved)
        patch_file = opts.get("patch_file")
        if patch_file is not None:
            from ferry.app.pointers import prepare_patch

            if not isinstance(patch_file, str):
                raise UsageError("patch_file must be a path", code="usage.bad_patch")
            # Like any file argument, relative to where the user is, not to --cwd.
            stored, _info = prepare_patch(
                os.path.abspath(patch_file), resolved, os.path.join(home, "patches")
            )
            patch = PatchRef(stored.path, stored.sha256)
    elif opts.get("patch_file") is not None:
        raise UsageError(
            "--patch-file needs at least one --pointer: a patch stands in only for pinned files",
            code="usage.patch_without_pointer",
        )
    _check_key_edges(opts.get("key"))
    spec = TaskSpec(
        argv=argv_t,
        cwd=cwd,
        name=opts.get("name"),
        key=opts.get("key"),
        env=env,
        idempotent=bool(opts.get("idempotent")),
        max_releases=opts.get("max_releases", 3),
        timeout_s=opts.get("timeout_s"),
        kill_grace_s=opts.get("kill_grace_s", 10.0),
        heartbeat_s=opts.get("heartbeat_s", 5.0),
        shell=bool(opts.get("shell")),
        pointers=pointers,
        patch=patch,
        pty=bool(opts.get("pty")),
        log_max_bytes=_log_max(opts.get("log_max")),
        **_queue_options(opts),
    )
    validate_spec(spec)
    return spec


def _log_max(value: Any) -> int | None:
    """``--log-max``: ``1M``, ``65536`` (or a number, in a ``--from`` line)."""
    if value is None:
        return None
    from ferry.core.spec import LOG_MAX_BYTES_MIN
    from ferry.core.units import parse_bytes

    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str):
        raise UsageError("--log-max must be a number of bytes", code="usage.bad_size")
    return parse_bytes(text, minimum=LOG_MAX_BYTES_MIN)


def _queue_options(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The queue's options of ``submit`` (``after``: task ids, resolved by the caller;
    ``not_before``: Unix seconds, or the text of ``--not-before``)."""
    not_before = opts.get("not_before")
    if isinstance(not_before, str):
        from ferry.app.queueing import parse_not_before

        not_before = parse_not_before(not_before, time.time())
    return {
        "group": GROUP_DEFAULT if opts.get("group") is None else opts["group"],
        "priority": opts.get("priority", 0),
        "after": tuple(opts.get("after") or ()),
        "not_before": not_before,
        "retries": opts.get("retries", 0),
        "retry_delay_s": opts.get("retry_delay_s", RETRY_DELAY_DEFAULT_S),
    }


def read_batch(stream: Any, option: str, source: str) -> bytes:
    """The input of ``submit --from`` or ``--lines`` (``option``), read up to its bound
    (``BATCH_BYTES_MAX``): past it, ``usage.batch_too_large``, and the rest unread."""
    data: bytes = stream.read(BATCH_BYTES_MAX + 1)
    if len(data) > BATCH_BYTES_MAX:
        raise UsageError(
            f"{option} {source}: more than {BATCH_BYTES_MAX >> 20} MiB, the most one submit"
            " reads: split it into several submits",
            code="usage.batch_too_large",
            details={"bytes_max": BATCH_BYTES_MAX},
        )
    return data


def _bounded(count: int, option: str, source: str) -> None:
    if count > BATCH_TASKS_MAX:
        raise UsageError(
            f"{option} {source}: {count:,} tasks, more than the {BATCH_TASKS_MAX:,} one submit"
            " takes: split it into several submits",
            code="usage.batch_too_large",
            details={"tasks": count, "tasks_max": BATCH_TASKS_MAX},
        )


def parse_from_lines(data: bytes, source: str) -> list[tuple[int, dict[str, Any]]]:
    """``submit --from``: (line number, task options) for each line, one JSON object per
    line (blank lines skipped). Any bad line refuses the whole batch, naming the line:
    nothing is half-queued."""
    batch: list[tuple[int, dict[str, Any]]] = []
    lines = data.split(b"\n")
    _bounded(sum(1 for line in lines if line.strip()), "--from", source)
    _json.expect(len(lines))
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {number} of {source}"
        try:
            obj = _json.loads(line)
        except ValueError as error:
            raise UsageError(
                f"{where}: not JSON ({error})", code="usage.bad_from_line", details={"line": number}
            ) from None
        if not isinstance(obj, dict):
            raise UsageError(
                f"{where}: expected a JSON object", code="usage.bad_from_line",
                details={"line": number},
            )  # fmt: skip
        repeated = _repeated_name(line)
        if repeated is not None:
            raise UsageError(
                f"{where}: {repeated!r} given twice in one object", code="usage.bad_from_line",
                details={"line": number},
            )  # fmt: skip
        unknown = sorted(set(obj) - set(_LINE_KEYS))
        if unknown:
            raise UsageError(
                f"{where}: unknown key(s) {', '.join(unknown)}",
                code="usage.bad_from_line",
                details={"line": number, "unknown": unknown},
            )
        opts = dict(_DEFAULTS)
        for key, value in obj.items():
            opts[_LINE_KEYS[key]] = value
        _check_types(opts, where, number)
        batch.append((number, opts))
    if not batch:
        raise UsageError(f"{source}: no tasks", code="usage.bad_from_line")
    return batch


_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str, type(None)),
    "key": (str, type(None)),
    "idempotent": (bool,),
    "max_releases": (int,),
    "timeout_s": (int, float, type(None)),
    "kill_grace_s": (int, float),
    "heartbeat_s": (int, float),
    "cwd": (str, type(None)),
    "patch_file": (str, type(None)),
    "shell": (bool,),
    "pty": (bool,),
    "log_max": (int, str, type(None)),
    "group": (str,),
    "priority": (int,),
    "after": (list,),
    "not_before": (str, type(None)),
    "retries": (int,),
    "retry_delay_s": (int, float),
}


_JSON_TYPES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
               str: "a string", list: "an array", dict: "an object"}  # fmt: skip


def _repeated_name(line: bytes) -> str | None:
    """A name that an object of the (valid JSON) ``line`` holds twice: JSON parsers keep
    the last one, which is a guess about what was meant (refused, not guessed)."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in items]
        repeated.extend(name for name in names if names.count(name) > 1)
        return dict(items)

    import json  # (the standard library's, for its hook; not on submit's start-up path)

    json.loads(line, object_pairs_hook=pairs)
    return repeated[0] if repeated else None


def _json_type(value: Any) -> str:
    """What a JSON value is, in JSON's words (never Python's ``None``)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _check_types(opts: Mapping[str, Any], where: str, number: int) -> None:
    names: dict[str, str] = {}
    for key, option in _LINE_KEYS.items():
        names.setdefault(option, key)  # (the first spelling: max_releases, not max-releases)
    for key, types in _TYPES.items():
        value = opts[key]
        bad_bool = isinstance(value, bool) and bool not in types
        if not isinstance(value, types) or bad_bool:
            wanted = " or ".join(sorted({_JSON_TYPES[t] for t in types}))
            got = _json_type(value)
            if isinstance(value, float) and int in types:  # (1.5, 1e3: 1000.0)
                wanted, got = wanted.replace("a number", "an integer"), repr(value)
            raise UsageError(
                f"{where}: {names.get(key, key)} must be {wanted}, not {got}",
                code="usage.bad_from_line",
                details={"line": number, "key": key},
            )


def parse_shell_lines(data: bytes, source: str) -> list[tuple[int, str]]:
    """``submit --lines``: (line number, command) for each line that is not blank."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"{source} is not UTF-8 text (byte {error.start})", code="usage.bad_lines"
        ) from error
    found = [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), start=1)]
    commands = [(n, line) for n, line in found if line.strip()]
    _bounded(len(commands), "--lines", source)
    if not commands:
        raise UsageError(f"{source} has no command in it", code="usage.bad_lines")
    return commands
