"""``ferry run`` without click, for the command lines a CI job actually writes.

Importing click and building the command tree (every command, every option) costs
``ferry run -- true`` about as much as everything else it does before the task starts.
:func:`parse_run` reads ``ferry [--home DIR] [--json] [-v|-q] run [TASK OPTIONS] [--]
CMD [ARG...]`` and returns exactly what click would hand the ``run`` command, or None for
anything else: then click parses the whole line as always, so help, ``--version``,
``--patch-file``, every unusual spelling and every usage error (with its message) come
from click. The rule is to accept only what is certain and to leave all doubt to click;
``tests/unit/test_cli_fast.py`` checks the two agree on every line this accepts.
"""

from __future__ import annotations

import os
from typing import Any

SECONDS_MAX = 10**9  # the click FloatRange bound of --timeout/--kill-grace/--heartbeat
MAX_RELEASES_MAX = 1000  # the click IntRange bound of --max-releases

_TEXT = ("--name", "--key", "--cwd")
_SECONDS = {"--timeout": "timeout", "--kill-grace": "kill_grace", "--heartbeat": "heartbeat"}
_MULTIPLE = {"--env": "env", "--pointer": "pointers"}
_FLAGS = {"--idempotent": "idempotent", "--shell": "shell", "--pty": "pty"}
_VERBOSITY = {"--verbose": 1, "-v": 1, "--quiet": -1, "-q": -1}


class FastRun:
    """What the ``run`` command receives (a plain class: a NamedTuple compiles code at
    import, which is what this module exists to avoid)."""

    __slots__ = ("argv", "as_json", "home", "kw", "verbosity")

    def __init__(
        self,
        home: str | None,
        as_json: bool,
        verbosity: int,
        kw: dict[str, Any],
        argv: tuple[str, ...],
    ) -> None:
        self.home = home
        self.as_json = as_json
        self.verbosity = verbosity
        self.kw = kw
        self.argv = argv


def _defaults() -> dict[str, Any]:
    return {
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


def parse_run(args: list[str]) -> FastRun | None:
    """What click would parse ``args`` into for ``run``, or None (let click parse)."""
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
        if arg == "run":
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
    kw = _defaults()
    seen: set[str] = set()
    i += 1
    while i < len(args):  # the task options, up to -- or the first non-option
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not (arg.startswith("-") and len(arg) > 1):
            break
        name, has_value, value = arg.partition("=")
        if name in _FLAGS:
            if has_value:
                return None
            kw[_FLAGS[name]] = True
            i += 1
            continue
        if not has_value:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        if value.startswith("-") or (name in seen and name not in _MULTIPLE):
            return None
        seen.add(name)
        if name in _TEXT:
            kw[name[2:]] = value
        elif name == "--log-max":  # (a string for click too: build_spec parses it)
            kw["log_max"] = value
        elif name in _MULTIPLE:
            kw[_MULTIPLE[name]] = (*kw[_MULTIPLE[name]], value)
        elif name in _SECONDS:
            seconds = _seconds(value, zero_ok=name == "--kill-grace")
            if seconds is None:
                return None
            kw[_SECONDS[name]] = seconds
        elif name == "--max-releases":
            if not (value.isascii() and value.isdigit()) or int(value) > MAX_RELEASES_MAX:
                return None
            kw["max_releases"] = int(value)
        else:  # --patch-file, -h/--help, anything unknown: click
            return None
    argv = tuple(args[i:])
    if not argv:
        return None
    return FastRun(home, as_json, verbosity or 0, kw, argv)
