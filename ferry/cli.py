"""The command line: parse, call one service function, render. No logic lives here.

Every command's help ends with an example; ``docs/cli.md`` is checked against ``--help``
by ``tests/acceptance/test_cli_docs.py``.  Errors of every kind leave through
:func:`main`, the one place that prints ``ferry: error[<code>]: <message>`` and picks
the exit code (via :func:`ferry.errors.exit_code_for`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from ferry import errors

F = TypeVar("F", bound=Callable[..., Any])

# Commands that run a task in the foreground: their failures before the task starts exit
# 125 (see ferry.errors.exit_code_for).
_RUNS_TASK = {"run", "claim"}


class Ctx:
    """What the global options say, handed to every command. ``runs_task`` is set by
    ``run`` and ``claim``: their failures before the task starts exit 125."""

    current: Ctx | None = None  # the invocation in progress, for main()'s error mapping

    def __init__(self, home: str | None, as_json: bool, verbosity: int) -> None:
        self.home = home
        self.as_json = as_json
        self.verbosity = verbosity
        self.runs_task = False
        Ctx.current = self

    def service(self) -> Any:
        from ferry.service import Service  # lazy: keeps `ferry --help` cheap

        return Service.open(self.home, verbosity=self.verbosity)


def _pos_float(name: str) -> click.FloatRange:
    return click.FloatRange(min=0.0, max=10**9, min_open=name != "kill-grace")


def task_options(f: F) -> F:
    """The TASK OPTIONS shared by ``run`` and ``submit`` (contract.md)."""
    opts = [
        click.option("--name", help="A human name for the task."),
        click.option(
            "--key",
            help="Idempotency key: a task with this key that SUCCEEDED is not run again "
            "(exit 0); one in flight is refused (exit 75).",
        ),
        click.option(
            "--idempotent",
            is_flag=True,
            help="Safe to re-run after a crash (default: the task may mutate state).",
        ),
        click.option(
            "--max-releases",
            type=click.IntRange(0, 1000),
            default=3,
            show_default=True,
            help="How many times recovery may requeue an idempotent task.",
        ),
        click.option(
            "--timeout", type=_pos_float("timeout"), help="Kill the task after SECONDS (exit 124)."
        ),
        click.option(
            "--kill-grace",
            type=_pos_float("kill-grace"),
            default=10.0,
            show_default=True,
            help="Seconds between SIGTERM and SIGKILL to the task's process group.",
        ),
        click.option(
            "--heartbeat",
            type=_pos_float("heartbeat"),
            default=5.0,
            show_default=True,
            help="How often (seconds) the runner proves it is alive.",
        ),
        click.option("--cwd", help="Working directory of the task (default: the current one)."),
        click.option(
            "--env", "env", multiple=True, metavar="KEY=VALUE", help="Set a variable (repeatable)."
        ),
        click.option(
            "--pointer",
            "pointers",
            multiple=True,
            metavar="PATH[=SHA256]",
            help="Pin a file's SHA-256 (taken now unless given); a change fails the task "
            "POINTER_STALE before it runs (repeatable).",
        ),
        click.option(
            "--patch-file",
            type=click.Path(dir_okay=False),
            help="A unified diff covering every pointer: lets an --idempotent task run in "
            "self-contained mode when pointers are stale.",
        ),
        click.option("--shell", is_flag=True, help="Run CMD through /bin/sh -c (never implied)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _emit(ctx: Ctx, human: str | None, payload: Any) -> None:
    from ferry import render

    render.emit(as_json=ctx.as_json, human=human, payload=payload)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Example:\n\n\b\n  ferry --home /var/lib/ferry ls --state RUNNING",
)
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    help="State directory (default: $FERRY_HOME, else $XDG_STATE_HOME/ferry, else "
    "~/.local/state/ferry).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option("--verbose", "-v", "verbosity", flag_value=1, help="Say more on stderr.")
@click.option("--quiet", "-q", "verbosity", flag_value=-1, help="Say only errors.")
@click.version_option(package_name="ferry", message="ferry %(version)s")
@click.pass_context
def cli(click_ctx: click.Context, home: str | None, as_json: bool, verbosity: int | None) -> None:
    """ferry: a crash-safe task runner.

    Every task goes through an append-only journal that records the intent durably
    before each side effect, so that after kill -9, OOM or a reboot `ferry recover`
    can tell the truth about it.
    """
    click_ctx.obj = Ctx(home, as_json, verbosity or 0)


from ferry import cli_commands as _commands  # noqa: E402  (registers the commands)

_commands.register(cli, task_options, _emit)


def _report(error: errors.FerryError, as_json: bool) -> None:
    from ferry import render

    render.error(error, as_json=as_json)


def _command_word(args: list[str]) -> str:
    """The subcommand's name, for messages before click has parsed anything."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--home":
            skip = True
        elif arg == "--":
            break
        elif not arg.startswith("-"):
            return arg
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ferry`` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    command = _command_word(args)
    Ctx.current = None
    try:
        result = cli.main(args=args, prog_name="ferry", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # pragma: no cover - click >= 8.2
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        if as_json:  # --json promises an error object on stdout for every error
            from ferry import render

            missing = errors.UsageError("missing command", code="usage.missing_command")
            render.write_json({"error": missing.to_json()})
        return errors.EX_USAGE
    except click.UsageError as exc:
        known = command in cli.commands
        hint = f" (see 'ferry {command} --help')" if known else " (see 'ferry --help')"
        _report(errors.UsageError(exc.format_message() + hint), as_json)
        return errors.EX_USAGE
    except click.exceptions.Abort:
        _report(errors.FerryError("interrupted", code="interrupted", exit_code=130), as_json)
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except errors.FerryError as exc:
        ctx = Ctx.current
        _report(exc, ctx.as_json if ctx else as_json)
        runs_task = ctx.runs_task if ctx else command in _RUNS_TASK
        return errors.exit_code_for(exc, runs_task=runs_task)
    except KeyboardInterrupt:
        _report(errors.FerryError("interrupted", code="interrupted", exit_code=130), as_json)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # ferry's own I/O: disk full, read-only, out of descriptors
        import os

        if os.environ.get("FERRY_DEBUG"):
            import traceback

            traceback.print_exc()
        ctx = Ctx.current
        error = errors.from_os_error(exc)
        _report(error, ctx.as_json if ctx else as_json)
        return errors.exit_code_for(
            error, runs_task=ctx.runs_task if ctx else command in _RUNS_TASK
        )
    except Exception as exc:  # the last net: no traceback reaches a user
        import os
        import traceback

        if os.environ.get("FERRY_DEBUG"):
            traceback.print_exc()
        _report(errors.InternalError(f"internal error: {type(exc).__name__}: {exc}"), as_json)
        return errors.EX_FERRY_FAILED
    return int(result or 0)


if __name__ == "__main__":  # python -m ferry.cli
    sys.exit(main())
