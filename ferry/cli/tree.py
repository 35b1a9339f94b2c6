"""The click command tree: the group, its global options, the TASK OPTIONS, and
:func:`invoke`, which runs it and answers click's own exceptions (usage errors, help,
``--version``). Imported only when :mod:`ferry.cli.fast` hands a command line over
(everything but the plain forms of ``ferry run``); errors of every other kind go back to
:func:`ferry.cli.main`.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ferry.cli.context import Ctx, ended, report
from ferry.core import errors

F = TypeVar("F", bound=Callable[..., Any])


def _pos_float(name: str) -> click.FloatRange:
    from ferry.cli.commands import Seconds
    from ferry.core.spec import SECONDS_MAX

    return Seconds(min=0.0, max=SECONDS_MAX, min_open=name != "kill-grace")


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
        click.option(
            "--shell",
            is_flag=True,
            help="Run CMD through /bin/sh -c (never implied): its first word the command"
            " line, the others its $0, $1...",
        ),
        click.option(
            "--log-max",
            metavar="BYTES",
            help="Keep only the first and the last BYTES/2 of each stream in the task's log"
            " (64K, 1M, 2G; 1024-based; at least 16K); the evidence says how much was dropped."
            " Output passed through to run's terminal stays whole.",
        ),
        click.option(
            "--pty",
            is_flag=True,
            help="Give the task a pseudo-terminal as stdout and stderr (held by its"
            " supervisor), so tools keep their colours; its output is logged as stdout.",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def queue_options(f: F) -> F:
    """The queue's options of ``submit`` (contract.md, "Queue control and housekeeping")."""
    opts = [
        click.option(
            "--group",
            metavar="NAME",
            help="The task's group (default: default): 'ferry group set NAME --jobs N' limits"
            " how many of a group's tasks run at once; 'ferry pause NAME' holds them.",
        ),
        click.option(
            "--priority",
            type=click.IntRange(-(10**9), 10**9),
            default=0,
            show_default=True,
            help="Higher is claimed first; first in, first out within a priority.",
        ),
        click.option(
            "--after",
            multiple=True,
            metavar="ID",
            help="Claim only once task ID SUCCEEDED (repeatable: each of them); if one ends"
            " otherwise, this task is CANCELLED with reason DEPENDENCY_FAILED.",
        ),
        click.option(
            "--not-before",
            metavar="TIME",
            help="Queue now, claim no sooner than TIME: RFC 3339 with its zone"
            " (2026-05-01T02:00:00Z) or +SECONDS from now.",
        ),
        click.option(
            "--retries",
            type=click.IntRange(0, 100),
            default=0,
            show_default=True,
            help="Queue a new attempt, up to N times, when the task fails EXIT_NONZERO or"
            " TIMEOUT (never after a crash: that is recovery's).",
        ),
        click.option(
            "--retry-delay",
            type=_pos_float("kill-grace"),
            default=1.0,
            show_default=True,
            help="Seconds before the first retry, doubled for each one after, with jitter"
            " (up to half as long again).",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


class _Carried(Exception):
    """What click's ``main`` answers its own way, carried past it: stdout's reader went
    (EPIPE: ``ferry group | head -0``; click's answer is sys.exit(1), nothing said: the
    code of a refusal) and Ctrl-C (click writes an empty line first: an error is one
    line). :func:`invoke` hands on the exception it was (its ``__cause__``), to be
    answered as for the commands ferry parses itself (:func:`ferry.cli.main`)."""


class _Root(click.Group):
    """The group, with EPIPE and Ctrl-C carried past click (help included)."""

    def make_context(self, *args: Any, **kw: Any) -> click.Context:
        try:
            return super().make_context(*args, **kw)
        except (BrokenPipeError, KeyboardInterrupt) as error:
            raise _Carried from error

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (BrokenPipeError, KeyboardInterrupt) as error:
            raise _Carried from error


def _emit(ctx: Ctx, human: str | None, payload: Any) -> None:
    from ferry.cli import render

    render.emit(as_json=ctx.as_json, human=human, payload=payload)


@click.group(
    cls=_Root,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Example:\n\n\b\n  ferry --home /var/lib/ferry ls --state RUNNING",
)
@click.option(
    "--home",
    type=click.Path(),  # (a file here is the state directory check's to refuse: 125)
    metavar="DIRECTORY",
    help="State directory (default: $FERRY_HOME, else $XDG_STATE_HOME/ferry, else "
    "~/.local/state/ferry).",
)
@click.option(
    "--database",
    metavar="URL",
    help="A shared PostgreSQL database (postgresql://...) for the queue of many hosts "
    "(default: $FERRY_DATABASE_URL, else the local journal in the state directory).",
)
@click.option(
    "--host-id",
    metavar="ID",
    help="This host's name in the shared database (default: $FERRY_HOST_ID, else the machine id).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option("--verbose", "-v", "verbosity", flag_value=1, help="Say more on stderr.")
@click.option("--quiet", "-q", "verbosity", flag_value=-1, help="Say only errors.")
@click.version_option(package_name="ferry", message="ferry %(version)s")
@click.pass_context
def cli(
    click_ctx: click.Context,
    home: str | None,
    database: str | None,
    host_id: str | None,
    as_json: bool,
    verbosity: int | None,
) -> None:
    """ferry: a crash-safe task runner.

    Every task goes through an append-only journal that records the intent durably
    before each side effect, so that after kill -9, OOM or a reboot `ferry recover`
    can tell the truth about it.
    """
    click_ctx.obj = Ctx(home, as_json, verbosity or 0, database, host_id)


from ferry.cli import commands as _commands  # noqa: E402  (registers the commands)

_commands.register(cli, task_options, _emit, queue_options)

from ferry.cli import report_command as _report  # noqa: E402  (ferry report --html)

_report.register(cli)

from ferry.cli import gc_command as _gc  # noqa: E402  (ferry gc)

_gc.register(cli)


def invoke(args: list[str], *, as_json: bool, command: str) -> int:
    """Run the command line through click; click's own exceptions end here."""
    try:
        result = cli.main(args=args, prog_name="ferry", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # pragma: no cover - click >= 8.2
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        if as_json:  # --json promises an error object on stdout for every error
            from ferry.cli import render

            missing = errors.UsageError("missing command", code="usage.missing_command")
            render.write_json({"error": missing.to_json()})
        return errors.EX_USAGE
    except click.UsageError as exc:
        # The command that refused, subcommand included ('ferry journal dump --help').
        path = exc.ctx.command_path if exc.ctx is not None else "ferry"
        hint = f" (see '{path} --help')"
        missing_cmd = (
            isinstance(exc, click.MissingParameter) and getattr(exc.param, "name", "") == "argv"
        )
        code = "usage.missing_command" if missing_cmd else "usage.invalid"
        report(errors.UsageError(exc.format_message() + hint, code=code), as_json)
        return errors.EX_USAGE
    except click.exceptions.Abort:
        report(errors.FerryError("interrupted", code="interrupted", exit_code=130), as_json)
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except _Carried as carried:
        if isinstance(carried.__cause__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        raise BrokenPipeError(errno.EPIPE, "stdout's reader went") from None
    return ended(Ctx.current, result)
