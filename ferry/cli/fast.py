"""The commands typed most, without click: ``run``, ``submit``, ``ls``, ``show`` and
``work`` in their plain forms (what a CI job, a shell loop or an operator writes).

Importing click and building the command tree (every command, every option) costs
``ferry run -- true`` about as much as everything else it does before the task starts,
and more than half of a ``submit`` or an ``ls``. :func:`parse` reads ``ferry [--home
DIR] [--json] [-v|-q] COMMAND ...`` and returns exactly what click would hand the
command's body (:func:`ferry.cli.context.run_command`, :mod:`ferry.cli.plain`), or None
for anything else: then click parses the whole line as always, so help, ``--version``,
``--patch-file``, ``submit --from``, every unusual spelling and every usage error (with
its message) come from click. The rule is to accept only what is certain and to leave
all doubt to click; ``tests/unit/test_cli_fast.py`` checks the two agree on every line
this accepts.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The click FloatRange bound of --timeout/--kill-grace/--heartbeat: ten years, as
# ferry.core.spec.SECONDS_MAX (not imported: this module exists to import little).
SECONDS_MAX = 315_360_000
MAX_RELEASES_MAX = 1000  # the click IntRange bound of --max-releases
PRIORITY_MAX = 10**9  # ... of --priority (a negative one starts with "-": click's)
RETRIES_MAX = 100  # ... of --retries
JOBS_MAX = 256  # ... of work's -j
# The defaults of work's --poll and --lease-ttl (ferry.storage.LEASE_TTL_S, which the cli
# layer may not import: tests/unit/test_cli_fast.py checks they are the same)
POLL_S, LEASE_TTL_S = 1.0, 30.0
# ls --state's choices (click's Choice, case-insensitive: it hands over these spellings)
STATES = frozenset(
    ("QUEUED", "CLAIMED", "DISPATCHING", "RUNNING", "STALE", "SUCCEEDED", "FAILED", "CANCELLED")
)

_TEXT = ("--name", "--key", "--cwd")
_SECONDS = {"--timeout": "timeout", "--kill-grace": "kill_grace", "--heartbeat": "heartbeat"}
_MULTIPLE = {"--env": "env", "--pointer": "pointers"}
_REPEATABLE = {*_MULTIPLE, "--after"}
# submit's queue options (tree.queue_options)
_QUEUE_TEXT = {"--group": "group", "--not-before": "not_before"}
_QUEUE_INTS = {"--priority": ("priority", PRIORITY_MAX), "--retries": ("retries", RETRIES_MAX)}
_FLAGS = {"--idempotent": "idempotent", "--shell": "shell", "--pty": "pty"}
_VERBOSITY = {"--verbose": 1, "-v": 1, "--quiet": -1, "-q": -1}


class Fast:
    """A command line parsed without click: the command, the global options, and what
    its body receives (``args``: ``run``/``submit``: (kw, argv); ``ls``: (states,
    limit); ``show``: (ids, show_env); ``work``: its body's seven values). A plain
    class: a NamedTuple compiles code at import, which is what this module exists to
    avoid."""

    __slots__ = ("args", "as_json", "command", "home", "verbosity")

    def __init__(
        self, command: str, home: str | None, as_json: bool, verbosity: int, args: tuple[Any, ...]
    ) -> None:
        self.command = command
        self.home = home
        self.as_json = as_json
        self.verbosity = verbosity
        self.args = args


def _defaults(command: str) -> dict[str, Any]:
    queue = {"group": None, "priority": 0, "after": (), "not_before": None, "retries": 0,
             "retry_delay": 1.0}  # fmt: skip
    return {
        **(queue if command == "submit" else {}),
        "name": None,
        "key": None,
        "idempotent": False,
        "max_releases": 3,
        "timeout": None,
        "kill_grace": 10.0,
        "heartbeat": 5.0,
        "cwd": None,
        "env": (),
        "pointers": (),
        "patch_file": None,
        "shell": False,
        "pty": False,
        "log_max": None,
    }


def _seconds(text: str, *, zero_ok: bool) -> float | None:
    """Plain decimal seconds within the option's range, else None (click decides)."""
    whole, _, fraction = text.partition(".")
    if not (whole.isascii() and whole.isdigit()) or not (
        fraction.isascii() and (not fraction or fraction.isdigit())
    ):
        return None
    value = float(text)
    if value > SECONDS_MAX or (value == 0 and not zero_ok):
        return None
    return value


def _home_ok(path: str) -> bool:
    """click.Path() would accept it: missing, or readable (a file too: the state
    directory check refuses that, as for $FERRY_HOME)."""
    try:
        os.stat(path)
    except OSError:
        return True
    return os.access(path, os.R_OK)


def parse(args: list[str]) -> Fast | None:
    """What click would parse ``args`` into, or None (let click parse)."""
    if "_FERRY_COMPLETE" in os.environ:  # click's shell completion
        return None
    home: str | None = None
    as_json = False
    verbosity: int | None = None
    i = 0
    while True:  # the global options, up to the command word
        if i >= len(args):
            return None
        arg = args[i]
        if arg in _PARSERS:
            break
        if arg == "--home" or arg.startswith("--home="):
            value = args[i + 1] if arg == "--home" and i + 1 < len(args) else arg[7:]
            if home is not None or not value or value.startswith("-") or not _home_ok(value):
                return None
            home = value
            i += 2 if arg == "--home" else 1
        elif arg == "--json" and not as_json:
            as_json = True
            i += 1
        elif arg in _VERBOSITY and verbosity is None:
            verbosity = _VERBOSITY[arg]
            i += 1
        else:
            return None
    parsed = _PARSERS[arg](arg, args[i + 1 :])
    return None if parsed is None else Fast(arg, home, as_json, verbosity or 0, parsed)


def _task(command: str, args: list[str]) -> tuple[Any, ...] | None:
    """``run``/``submit``: TASK OPTIONS (and submit's queue options), then the command.
    ``submit`` only with ``--`` (click lets its options and CMD mix)."""
    kw = _defaults(command)
    seen: set[str] = set()
    i = 0
    while i < len(args):  # the options, up to -- or the first non-option
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not (arg.startswith("-") and len(arg) > 1):
            break
        name, has_value, _ = arg.partition("=")
        if name in _FLAGS:
            if has_value:
                return None
            kw[_FLAGS[name]] = True
            i += 1
            continue
        found = _valued(args, i)
        if found is None:
            return None
        name, value, i = found
        if value.startswith("-") or (name in seen and name not in _REPEATABLE):
            return None
        seen.add(name)
        if not _task_option(command, kw, name, value):
            return None
    if command == "submit" and args[i - 1 : i] != ["--"]:
        return None
    argv = tuple(args[i:])
    return (kw, argv) if argv else None


def _valued(args: list[str], i: int) -> tuple[str, str, int] | None:
    """The option at ``args[i]``, its value (``--name=value`` or ``--name value``) and
    the index after them; None when the value is missing."""
    name, has_value, value = args[i].partition("=")
    if has_value:
        return name, value, i + 1
    return None if i + 1 >= len(args) else (name, args[i + 1], i + 2)


def _task_option(command: str, kw: dict[str, Any], name: str, value: str) -> bool:
    """Set option ``name`` to ``value`` as click would; False: leave it to click."""
    if name in _TEXT:
        kw[name[2:]] = value
    elif name == "--log-max":  # (a string for click too: build_spec parses it)
        kw["log_max"] = value
    elif name in _MULTIPLE:
        kw[_MULTIPLE[name]] = (*kw[_MULTIPLE[name]], value)
    elif name in _SECONDS or (name == "--retry-delay" and command == "submit"):
        seconds = _seconds(value, zero_ok=name == "--kill-grace")
        if seconds is None:
            return False
        kw[_SECONDS.get(name, "retry_delay")] = seconds
    elif name == "--max-releases":
        if not _count(value, MAX_RELEASES_MAX):
            return False
        kw["max_releases"] = int(value)
    elif command != "submit":  # --patch-file, -h/--help, anything unknown: click
        return False
    elif name in _QUEUE_TEXT:
        kw[_QUEUE_TEXT[name]] = value
    elif name == "--after":
        kw["after"] = (*kw["after"], value)
    elif name in _QUEUE_INTS and _count(value, _QUEUE_INTS[name][1]):
        kw[_QUEUE_INTS[name][0]] = int(value)
    else:
        return False
    return True


def _count(text: str, most: int) -> bool:
    """A decimal of ASCII digits no larger than ``most`` (a length first: ``int`` refuses
    more than 4,300 digits, and thousands of them name no count)."""
    return text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= most


def _ls(command: str, args: list[str]) -> tuple[Any, ...] | None:
    """``ls [--state STATE]... [--limit N]``."""
    states: tuple[str, ...] = ()
    limit: int | None = None
    i = 0
    while i < len(args):
        found = _valued(args, i)
        if found is None:
            return None
        name, value, i = found
        if name == "--state" and value.isascii() and value.upper() in STATES:
            states = (*states, value.upper())
        elif name == "--limit" and limit is None and _count(value, 1 << 62):
            limit = int(value)
        else:
            return None
    return states, 100 if limit is None else limit


def _show(command: str, args: list[str]) -> tuple[Any, ...] | None:
    """``show [--show-env] ID...``."""
    ids: list[str] = []
    show_env = False
    for arg in args:
        if arg == "--show-env":
            show_env = True
        elif arg.startswith("-") or not arg:
            return None
        else:
            ids.append(arg)
    return (tuple(ids), show_env) if ids else None


def _work(command: str, args: list[str]) -> tuple[Any, ...] | None:
    """``work [-j N] [--drain]`` (each at most once); its other options keep their
    defaults (as click's, checked by the tests)."""
    jobs: int | None = None
    drain = False
    i = 0
    while i < len(args):
        if args[i] == "--drain" and not drain:
            drain = True
            i += 1
            continue
        if args[i].startswith("-j="):  # (click takes "=2" as -j's value: refused)
            return None
        found = _valued(args, i)
        if found is None:
            return None
        name, value, i = found
        if name not in ("-j", "--jobs") or jobs is not None or not _count(value, JOBS_MAX):
            return None
        jobs = int(value)
        if jobs < 1:
            return None
    return 1 if jobs is None else jobs, drain, None, POLL_S, LEASE_TTL_S, None, False


_PARSERS = {"run": _task, "submit": _task, "ls": _ls, "show": _show, "work": _work}
