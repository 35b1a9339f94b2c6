"""``--json``, ``-v`` and ``-q`` after the command word mean what they mean before it
(``ferry ls --json``, ``ferry ls -q``), but never when they are the task's: a word of
CMD (``ferry run echo hello --json``, CMD given without ``--``), or an option's value
(``--name --json``). Found by reviews: ferry took ``--json`` out of the task's argv and
answered in JSON; ``ferry ls -q`` was a usage error."""

from __future__ import annotations

import click
import pytest

from ferry.cli import TASK_VALUED_OPTIONS, hoist_globals


@pytest.mark.parametrize(
    ("args", "hoisted"),
    [
        (["ls", "--json"], ["--json", "ls"]),
        (["show", "12", "--json"], ["--json", "show", "12"]),
        (["run", "--json", "--", "true"], ["--json", "run", "--", "true"]),
        (["run", "--name", "x", "--json", "echo", "hi"], ["--json", "run", "--name", "x", "echo", "hi"]),
        (["run", "--name=x", "--json", "--", "true"], ["--json", "run", "--name=x", "--", "true"]),
        (["--home", "h", "submit", "--idempotent", "--json", "--", "true"],
         ["--json", "--home", "h", "submit", "--idempotent", "--", "true"]),
        # the task's: left where they are
        (["run", "echo", "hello", "--json"], ["run", "echo", "hello", "--json"]),
        (["submit", "printf", "%s\\n", "a", "--json"], ["submit", "printf", "%s\\n", "a", "--json"]),
        (["run", "--name", "--json", "--", "true"], ["run", "--name", "--json", "--", "true"]),
        (["run", "--", "echo", "--json"], ["run", "--", "echo", "--json"]),
        (["submit", "--lines", "-", "--json"], ["--json", "submit", "--lines", "-"]),
        # -v and -q (and their long names) too, in the order given
        (["ls", "-q"], ["-q", "ls"]),
        (["wait", "3", "--verbose", "--json"], ["--verbose", "--json", "wait", "3"]),
        (["work", "--drain", "-j", "2", "--quiet"], ["--quiet", "work", "--drain", "-j", "2"]),
        (["submit", "-q", "--", "true"], ["-q", "submit", "--", "true"]),
        (["run", "grep", "-v", "x"], ["run", "grep", "-v", "x"]),
        (["run", "--name", "-q", "--", "true"], ["run", "--name", "-q", "--", "true"]),
        (["ls", "--", "-q"], ["ls", "--", "-q"]),
    ],
)  # fmt: skip
def test_globals_are_hoisted_from_ferry_s_options_only(args: list[str], hoisted: list[str]) -> None:
    assert hoist_globals(args) == hoisted


@pytest.mark.parametrize("command", ["run", "submit"])
def test_the_valued_options_are_the_command_s(command: str) -> None:
    from ferry.cli.tree import cli

    valued = {
        opt
        for param in cli.commands[command].params
        if isinstance(param, click.Option) and not param.is_flag
        for opt in param.opts
    }
    assert valued <= TASK_VALUED_OPTIONS, sorted(valued - TASK_VALUED_OPTIONS)
    flags = {
        opt
        for param in cli.commands[command].params
        if isinstance(param, click.Option) and param.is_flag
        for opt in param.opts
    }
    assert not flags & TASK_VALUED_OPTIONS
