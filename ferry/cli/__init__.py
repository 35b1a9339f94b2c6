"""The command line: parse, call one use case, render. Nothing else.

May import ``ferry.app`` (the use cases), ``ferry.core`` (errors, the model it renders)
and the standard library; never ``ferry.storage``, ``ferry.proc`` or ``journal``
directly.

This module is the ``ferry`` entry point: the one place that maps errors to exit codes.

The command line itself is click (:mod:`ferry.cli.tree` and :mod:`ferry.cli.commands`:
parse, call one service function, render; every command's help ends with an example;
``docs/cli.md`` is checked against ``--help`` by ``tests/acceptance/test_cli_docs.py``).
This module imports no click: ``ferry run`` in its plain forms is parsed by
:mod:`ferry.cli.fast` (importing click and building the command tree costs about as much
as the rest of ``ferry run -- true``), and everything else, including every usage error
of ``run``, goes to click. Errors of every kind leave through :func:`main`, which prints
``ferry: error[<code>]: <message>`` and picks the exit code (via
:func:`ferry.core.errors.exit_code_for`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from ferry.cli.context import Ctx, ended, report, run_command
from ferry.core import errors

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Commands that run a task in the foreground: their failures before the task starts exit
# 125 (see ferry.core.errors.exit_code_for).
_RUNS_TASK = {"run", "claim"}


_VALUED_GLOBALS = ("--home", "--database", "--host-id")


def command_index(args: list[str]) -> int | None:
    """Where the subcommand's name is, for what must be known before parsing."""
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in _VALUED_GLOBALS:
            skip = True
        elif arg == "--":
            break
        elif not arg.startswith("-"):
            return index
    return None


def command_word(args: list[str]) -> str:
    """The subcommand's name, for messages before anything is parsed."""
    index = command_index(args)
    return "" if index is None else args[index]


# The options of ``run`` and ``submit`` that take a value (a unit test keeps this the
# click tree's): their CMD starts at the first word that is neither one of their
# options nor such an option's value.
TASK_VALUED_OPTIONS = frozenset(
    ("--after", "--cwd", "--env", "--from", "--group", "--heartbeat", "--key",
     "--kill-grace", "--lines", "--log-max", "--max-releases", "--name", "--not-before",
     "--patch-file", "--pointer", "--priority", "--retries", "--retry-delay", "--timeout")
)  # fmt: skip


# The global flags that may also come after the command word.
HOISTED = frozenset(("--json", "-v", "--verbose", "-q", "--quiet"))


def hoist_globals(args: list[str]) -> list[str]:
    """``--json``, ``-v`` and ``-q`` after the command (``ferry ls --json``) mean what
    they mean before it: moved to the front, in their order. Never a word of the task's:
    after ``--``, or (``run``, ``submit``) from CMD's first word on, or an option's value
    (``--name --json``)."""
    index = command_index(args)
    if index is None:
        return args
    end = args.index("--") if "--" in args else len(args)
    if args[index] in ("run", "submit"):
        found = _task_option_words(args, index + 1, end)
    else:
        found = [i for i in range(index + 1, end) if args[i] in HOISTED]
    if not found:
        return args
    return [*(args[i] for i in found), *(arg for i, arg in enumerate(args) if i not in found)]


def _task_option_words(args: list[str], start: int, end: int) -> list[int]:
    """Where a hoisted flag is one of ``run``'s or ``submit``'s options (not a value),
    up to CMD's first word (or ``end``)."""
    found, i = [], start
    while i < end and args[i].startswith("-") and args[i] != "-":
        if args[i] in HOISTED:
            found.append(i)
        i += 2 if args[i] in TASK_VALUED_OPTIONS else 1
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ferry`` console script; returns the exit code."""
    args = hoist_globals(list(sys.argv[1:] if argv is None else argv))
    index = command_index(args)
    as_json = "--json" in args[: len(args) if index is None else index]
    command = command_word(args)
    Ctx.current = None
    try:
        from ferry.cli.fast import parse

        fast = parse(args)
        if fast is not None:
            return _fast(fast)
        from ferry.cli.tree import invoke

        return invoke(args, as_json=as_json, command=command)
    except errors.FerryError as exc:
        ctx = Ctx.current
        damage = ctx.damage() if ctx else None
        if damage is not None and damage is not exc and damage.message != exc.message:
            from ferry.cli import render  # (it failed, and what it read was damaged too)

            render.notice(f"warning: {damage.message}")
        runs_task = ctx.runs_task if ctx else command in _RUNS_TASK
        with contextlib.suppress(BrokenPipeError):  # (its reader went: the code still says)
            report(exc, ctx.as_json if ctx else as_json)
        return errors.exit_code_for(exc, runs_task=runs_task)
    except KeyboardInterrupt:
        report(errors.FerryError("interrupted", code="interrupted", exit_code=130), as_json)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # ferry's own I/O: disk full, read-only, out of descriptors
        if os.environ.get("FERRY_DEBUG"):
            import traceback

            traceback.print_exc()
        ctx = Ctx.current
        error = errors.from_os_error(exc)
        report(error, ctx.as_json if ctx else as_json)
        return errors.exit_code_for(
            error, runs_task=ctx.runs_task if ctx else command in _RUNS_TASK
        )
    except Exception as exc:  # the last net: no traceback reaches a user
        import traceback

        if os.environ.get("FERRY_DEBUG"):
            traceback.print_exc()
        report(errors.InternalError(f"internal error: {type(exc).__name__}: {exc}"), as_json)
        return errors.EX_FERRY_FAILED


def console() -> None:
    """The ``ferry`` console script and ``python -m ferry.cli``: :func:`main`, then the
    process ends. When the command left nothing for the interpreter's teardown to do
    (one thread, no ``atexit`` handler: ferry writes its files with ``os.write`` and
    closes them, durable before it answers), it ends at once with ``os._exit`` once
    stdout and stderr are flushed: the teardown (every module and object freed) cost
    ``ferry run -- true`` 14 of its 130 ms here (medians of 40 interleaved runs). A
    flush that fails for another reason than a reader that went leaves it to the usual
    exit."""
    import atexit
    import threading

    from ferry.app import collector

    collector.start_up()
    _open_standard_descriptors()
    _children_reported()
    code = main()
    lost = False
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # (ferry was started with it closed)
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            # Its reader went (``| head``): what is left goes nowhere, and the exit
            # status stays the command's (the interpreter's own last flush would fail
            # again and exit 120).
            from ferry.cli.render import nowhere

            nowhere(stream)
        except (OSError, ValueError):
            lost = True  # (a full disk, say: the usual exit says output was lost)
    handlers = getattr(atexit, "_ncallbacks", lambda: 1)()
    if threading.active_count() == 1 and handlers == 0 and not lost:
        os._exit(code)
    sys.exit(code)


def _children_reported() -> None:
    """SIGCHLD at its default if ferry was started with it ignored (a parent's setting,
    kept across exec): ferry waits for its children (a supervisor for its task, a
    launcher for its supervisor) to learn how they ended, and with SIGCHLD ignored the
    kernel reaps them at once and ``waitpid`` finds none (ECHILD). Its tasks start
    with it at the default too (a task that wants it ignored says so itself)."""
    import signal

    if signal.getsignal(signal.SIGCHLD) is signal.SIG_IGN:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _open_standard_descriptors() -> None:
    """Started with descriptor 0, 1 or 2 closed (``>&-``, some daemons): /dev/null
    there, and Python's stream for it. Otherwise the first file ferry opens takes the
    free number, and what ferry or its task writes as output lands in it; and Python,
    which found it closed, left ``sys.stdout`` (or stdin, stderr) None. (Output asked
    to go nowhere goes nowhere; the exit status still tells.)"""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # (the lowest free number: fd itself)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


def _fast(fast: Any) -> int:
    """A command line :mod:`ferry.cli.fast` parsed: its command's body, as click would
    call it (and end it: :func:`ferry.cli.context.ended`)."""
    ctx = Ctx(fast.home, fast.as_json, fast.verbosity)
    if fast.command == "run":
        return run_command(ctx, *fast.args)
    from ferry.cli import plain

    bodies: dict[str, Callable[..., Any]] = {
        "submit": plain.submit, "ls": plain.ls, "show": plain.show, "work": plain.work
    }  # fmt: skip
    body = bodies[fast.command]
    return ended(ctx, body(ctx, *fast.args))


def __getattr__(name: str) -> Any:
    """``ferry.cli.cli``: the click group, built on first use (see the module docstring)."""
    if name == "cli":
        from ferry.cli.tree import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
