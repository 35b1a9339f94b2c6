"""docs/cli.md cannot drift from ``--help``.

The part of docs/cli.md between the GENERATED markers is every command's ``--help``
(rendered at a fixed width of 100 columns); the prose around it is free. These tests
check each command's heading, first help line, every option name and its example, then
compare the whole generated part. After changing a command, regenerate with:

    .venv/bin/python tests/acceptance/test_cli_docs.py --write
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from ferry.cli import cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
BEGIN = "<!-- BEGIN GENERATED: python tests/acceptance/test_cli_docs.py --write -->"
END = "<!-- END GENERATED -->"
WIDTH = 100


def commands() -> Iterator[tuple[str, click.Command, click.Context]]:
    """(``ferry sub``, command, its context) for the group and every (sub)command."""
    root = click.Context(cli, info_name="ferry", terminal_width=WIDTH, **cli.context_settings)
    yield "ferry", cli, root

    def walk(
        group: click.Group, parent: click.Context
    ) -> Iterator[tuple[str, click.Command, click.Context]]:
        for name in sorted(group.commands):
            command = group.commands[name]
            ctx = click.Context(
                command, info_name=name, parent=parent, terminal_width=WIDTH,
                **command.context_settings,
            )  # fmt: skip
            yield f"{parent.command_path} {name}", command, ctx
            if isinstance(command, click.Group):
                yield from walk(command, ctx)

    yield from walk(cli, root)


def render() -> str:
    parts = [BEGIN, ""]
    for path, command, ctx in commands():
        parts += [f"### `{path}`", "", "```text", command.get_help(ctx).rstrip(), "```", ""]
    parts.append(END)
    return "\n".join(parts)


def generated_part(text: str) -> str:
    assert BEGIN in text and END in text, f"{DOC} lost its GENERATED markers"
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def normalized(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


ALL = [pytest.param(path, command, ctx, id=path) for path, command, ctx in commands()]


@pytest.mark.parametrize(("path", "command", "ctx"), ALL)
def test_each_command_is_documented_with_its_help(
    doc: str, path: str, command: click.Command, ctx: click.Context
) -> None:
    assert f"### `{path}`" in doc, f"docs/cli.md has no section for {path}"
    first_line = (command.help or "").strip().splitlines()[0]
    assert normalized(first_line) in normalized(doc), (path, first_line)
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            for name in param.opts + param.secondary_opts:
                assert name in doc, f"{path}: option {name} is not in docs/cli.md"


@pytest.mark.parametrize(("path", "command", "ctx"), ALL)
def test_each_command_has_an_example_that_is_documented(
    doc: str, path: str, command: click.Command, ctx: click.Context
) -> None:
    epilog = command.epilog or ""
    assert "Example" in epilog, f"{path}: --help shows no example"
    examples = [line.strip() for line in epilog.splitlines()[1:] if line.strip() not in ("", "\b")]
    assert examples, path
    for example in examples:
        assert example in doc, f"{path}: example {example!r} is not in docs/cli.md"


def test_no_section_for_a_command_that_does_not_exist(doc: str) -> None:
    documented = set(re.findall(r"^### `(ferry[^`]*)`", doc, flags=re.MULTILINE))
    assert documented == {path for path, _, _ in commands()}


def test_the_generated_part_matches_help_exactly(doc: str) -> None:
    assert generated_part(doc) == render(), (
        "docs/cli.md is out of date with --help; regenerate it with "
        "'.venv/bin/python tests/acceptance/test_cli_docs.py --write'"
    )


def _write() -> None:
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text.replace(generated_part(text), render()), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_cli_docs.py --write")
    _write()
