"""``--json`` after the command word means what it means before it (``ferry ls
--json``), but never when it is the task's: a word of CMD (``ferry run echo hello
--json``, CMD given without ``--``), or an option's value (``--name --json``). Found by
a review: ferry took it out of the task's argv and answered in JSON."""

from __future__ import annotations

import click
import pytest

from ferry.cli import TASK_VALUED_OPTIONS, hoist_json


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
    ],
)  # fmt: skip
def test_json_is_hoisted_from_ferry_s_options_only(args: list[str], hoisted: list[str]) -> None:
    assert hoist_json(args) == hoisted


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
