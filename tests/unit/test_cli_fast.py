"""ferry.cli.fast.parse agrees with click: on every command line it accepts, click
accepts it too and hands the command's body (``run``, ``submit``, ``ls``, ``show``,
``work``)
exactly the same values; whatever click refuses, it leaves to click. And the plain
lines a CI job, a shell loop or an operator writes take the fast path."""

from __future__ import annotations

from typing import Any

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.cli import commands as cli_commands
from ferry.cli import plain
from ferry.cli.fast import parse
from ferry.cli.tree import cli


def click_parse(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...] | None:
    """What click hands the body of ``run``, ``submit``, ``ls``, ``show`` or ``work`` for
    ``args`` (None: click refused, or another command or form)."""
    seen: list[tuple[Any, ...]] = []

    def capture(command: str) -> Any:
        def body(ctx: Any, *args: Any) -> int:
            values = tuple(dict(a) if isinstance(a, dict) else a for a in args)
            seen.append((command, ctx.home, ctx.as_json, ctx.verbosity, values))
            return 0

        return body

    monkeypatch.setattr(cli_commands, "run_command", capture("run"))
    for command in ("submit", "ls", "show", "work"):
        monkeypatch.setattr(plain, command, capture(command))
    try:
        cli.main(args=list(args), prog_name="ferry", standalone_mode=False)
    except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        return None
    return seen[0] if seen else None


def fast_parse(args: list[str]) -> tuple[Any, ...] | None:
    fast = parse(list(args))
    if fast is None:
        return None
    return (fast.command, fast.home, fast.as_json, fast.verbosity, fast.args)


PLAIN_LINES = [
    ["run", "--", "true"],
    ["run", "make", "test"],
    ["run", "--key", "build-1", "--timeout", "3600", "--", "make", "test"],
    ["--home", "/nonexistent/ferry", "--json", "run", "--name=ci", "--", "sh", "-c", "x"],
    ["-q", "run", "--idempotent", "--env", "A=1", "--env", "B=2", "--cwd", "/", "--", "ls"],
    ["--verbose", "run", "--kill-grace", "0", "--heartbeat", "0.5", "--max-releases", "7",
     "--shell", "--", "echo $A"],
    ["run", "--pointer", "README.md", "--", "cat", "README.md"],
    ["run", "--", "-weird-program", "--", "--x"],
    ["run", "--pty", "--name", "t", "--", "pytest", "-q"],
    ["run", "--log-max", "1M", "--key", "k", "--", "make", "test"],
    ["run", "--log-max=64K", "--", "make"],
    ["submit", "--", "true"],
    ["-q", "submit", "--key", "k", "--idempotent", "--group", "arm", "--priority", "5",
     "--after", "01jq3", "--after", "last", "--retries", "2", "--retry-delay", "0.5",
     "--not-before", "+60", "--", "make", "test"],
    ["--json", "submit", "--name=x", "--", "sh", "-c", "exit 1"],
    ["ls"],
    ["--json", "ls", "--limit", "100"],
    ["ls", "--state", "failed", "--state=RUNNING", "--limit=0"],
    ["show", "01jq3"],
    ["show", "12", "--show-env", "last"],
    ["work"],
    ["-q", "work", "--drain", "-j", "2"],
    ["--json", "work", "--jobs=8", "--drain"],
    ["work", "--jobs", "256"],
]  # fmt: skip


@pytest.mark.parametrize("args", PLAIN_LINES, ids=" ".join)
def test_plain_lines_take_the_fast_path_and_agree(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = fast_parse(args)
    assert fast is not None
    assert fast == click_parse(args, monkeypatch)


LEFT_TO_CLICK = [
    [],
    ["run"],
    ["run", "--"],
    ["run", "--help"],
    ["run", "-h", "--", "x"],
    ["--version"],
    ["run", "--timeout", "abc", "--", "x"],
    ["run", "--timeout", "0", "--", "x"],
    ["run", "--timeout", "320000000", "--", "x"],  # (over ten years: click's bound)
    ["submit", "--kill-grace", "1000000000", "--", "x"],
    ["run", "--max-releases", "1001", "--", "x"],
    ["run", "--patch-file", "p.diff", "--pointer", "a", "--", "x"],
    ["run", "--name", "a", "--name", "b", "--", "x"],
    ["run", "--shell=yes", "--", "x"],
    ["run", "--json", "--", "x"],
    ["-v", "-q", "run", "--", "x"],
    ["submit", "x"],
    ["submit", "--from", "-"],
    ["submit", "--priority", "-1", "--", "x"],
    ["submit", "--patch-file", "p", "--", "x"],
    ["run", "--group", "g", "--", "x"],
    ["ls", "--state", "nope"],
    ["ls", "--limit", "-1"],
    ["ls", "x"],
    ["ls", "--help"],
    ["show"],
    ["show", "--", "x"],
    ["show", "-h", "x"],
    ["work", "-j", "0"],
    ["work", "-j", "257"],
    ["work", "-j", "2", "-j", "3"],
    ["work", "--drain", "--drain"],
    ["work", "--drain=1"],
    ["work", "-j2"],
    ["work", "-j=2"],  # (click reads "=2" as the value: a review found the fast path took it)
    ["work", "--drain", "-j=4"],
    ["work", "--poll", "0.1"],
    ["work", "--halt", "soon", "--drain"],
    ["work", "--help"],
    ["work", "x"],
    # (int() refuses more than 4,300 digits: the fast path failed internal, 125)
    ["ls", "--limit", "9" * 4400],
    ["work", "-j", "9" * 4400],
    ["run", "--max-releases", "9" * 4400, "--", "true"],
    ["submit", "--priority", "9" * 4400, "--", "true"],
]


def test_the_fast_path_knows_the_seconds_bound_click_has() -> None:
    from ferry.cli import fast
    from ferry.core import spec

    assert fast.SECONDS_MAX == spec.SECONDS_MAX


@pytest.mark.parametrize("args", LEFT_TO_CLICK, ids=lambda a: " ".join(a) or "(none)")
def test_doubtful_lines_are_left_to_click(args: list[str]) -> None:
    assert fast_parse(args) is None


GLOBAL = ["--home", "/nonexistent/h", "--home=/", "--home=", "/etc/hostname", "--json", "-v",
          "-q", "--verbose", "--quiet", "--version", "-h", "run", "--", "x"]  # fmt: skip
OPTION_NAMES = ["--name", "--key", "--cwd", "--timeout", "--kill-grace", "--heartbeat",
                "--max-releases", "--env", "--pointer", "--patch-file", "--idempotent",
                "--shell", "--pty", "--log-max", "--help", "-h", "--bogus", "-x", "--json",
                "--group", "--priority", "--after", "--not-before", "--retries",
                "--retry-delay", "--from", "--lines", "--state", "--limit",
                "--show-env", "-j", "--jobs", "--drain", "--poll", "--halt",
                "--lease-ttl"]  # fmt: skip
VALUES = ["", "0", "1", "1.5", "1.", ".5", "-1", "1e3", "inf", "nan", "1000", "1001",
          "1000000000", "1000000001", "315360000", "315360001", "abc", "K=V", "=x", "-x", "--", "1_0", " 2", "0.0",
          "٣", "1.٣", "-", "true", "64K", "1M", "failed", "QUEUED", "Stale", "\u017ftale",
          "last", "01jq3", "9" * 4400]  # fmt: skip
OPTION = st.one_of(
    st.sampled_from(OPTION_NAMES).map(lambda name: [name]),
    st.tuples(st.sampled_from(OPTION_NAMES), st.sampled_from(VALUES)).map(list),
    st.tuples(st.sampled_from(OPTION_NAMES), st.sampled_from(VALUES)).map(
        lambda pair: [f"{pair[0]}={pair[1]}"]
    ),
)
LINE = st.tuples(
    st.lists(st.sampled_from(GLOBAL), max_size=4),
    st.sampled_from([["run"], ["submit"], ["ls"], ["show"], ["work"]]),
    st.lists(OPTION, max_size=5).map(lambda parts: [token for part in parts for token in part]),
    st.lists(st.sampled_from(["--", "true", "-", "-n", "echo", "x y", "12"]), max_size=4),
).map(lambda parts: [token for part in parts for token in part])


@settings(max_examples=600, deadline=None)
@given(
    st.one_of(
        LINE,
        st.lists(
            st.sampled_from(GLOBAL + OPTION_NAMES + VALUES + ["submit", "ls", "show", "work"]),
            max_size=8,
        ),
    )
)
def test_whatever_the_fast_path_accepts_click_parses_the_same(args: list[str]) -> None:
    fast = fast_parse(args)
    if fast is None:
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert click_parse(args, monkeypatch) == fast


def test_the_lease_ttl_default_of_the_commands_is_the_store_s() -> None:
    """(The cli layer may not import ferry.storage: its copies, checked here.)"""
    from ferry.cli import fast
    from ferry.storage import LEASE_TTL_S

    assert fast.LEASE_TTL_S == LEASE_TTL_S
    for name in ("claim", "work", "recover"):
        command = cli.commands[name]
        assert isinstance(command, click.Command)
        [ttl] = [p for p in command.params if p.name == "lease_ttl"]
        assert ttl.default == LEASE_TTL_S, name
