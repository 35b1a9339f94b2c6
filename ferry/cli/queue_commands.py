"""Queue control's commands: ``group`` (list), ``group set``, ``pause``, ``resume``.
Each parses, calls one use case (``ferry.app.queueing``, through the service), renders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

Emit = Callable[[Any, str | None, Any], None]


def _example(text: str) -> str:
    return "Example:\n\n\b\n" + "\n".join("  " + line for line in text.strip().splitlines())


def register_queue(cli: click.Group, emit: Emit) -> None:
    from ferry.cli import render

    @cli.group(
        invoke_without_command=True,
        epilog=_example("ferry group\nferry --json group | jq '.[] | select(.paused)'"),
    )
    @click.pass_context
    def group(click_ctx: click.Context) -> None:
        """List the groups: each one's jobs limit (0: none), paused, queued and running.

        A task's group is its submit --group (default: default). Groups set, paused,
        or with tasks queued or in flight are listed.
        """
        if click_ctx.invoked_subcommand is not None:
            return
        ctx = click_ctx.obj
        found = ctx.service(reading=True, tolerant=True).groups()
        emit(ctx, render.groups_table(found), found)

    @group.command(
        name="set",
        epilog=_example("ferry group set arm64 --jobs 2   # a running work applies it at --poll"),
    )
    @click.argument("name")
    @click.option(
        "--jobs",
        type=click.IntRange(0, 100_000),
        required=True,
        help="At most this many of the group's tasks in flight at once (0: no limit of its"
        " own; work -j stays the overall limit).",
    )
    @click.pass_obj
    def group_set(ctx: Any, name: str, jobs: int) -> None:
        """Set a group's limit (journaled; a running work applies it within its --poll)."""
        info = ctx.service().group_set(name, jobs)
        emit(ctx, render.groups_table([info]), info)

    @cli.command(epilog=_example("ferry pause arm64   # running tasks go on\nferry pause"))
    @click.argument("groups", nargs=-1, metavar="[GROUP]...")
    @click.pass_obj
    def pause(ctx: Any, groups: tuple[str, ...]) -> None:
        """Stop claiming the groups' queued tasks (no GROUP: every group); running ones go on.

        Journaled: it holds across restarts until 'ferry resume'.
        """
        found = ctx.service().pause(list(groups))
        _note_empty(ctx, groups, found, "has no tasks: paused for those submitted to it")
        emit(ctx, render.groups_table(found) if found else None, found)

    @cli.command(epilog=_example("ferry resume arm64\nferry resume   # every group"))
    @click.argument("groups", nargs=-1, metavar="[GROUP]...")
    @click.pass_obj
    def resume(ctx: Any, groups: tuple[str, ...]) -> None:
        """Claim the groups' queued tasks again (no GROUP: every group, each one's own
        pause forgotten)."""
        found = ctx.service().resume(list(groups))
        _note_empty(ctx, groups, found, "has no tasks and is not paused")
        emit(ctx, render.groups_table(found) if found else None, found)


def _note_empty(ctx: Any, names: tuple[str, ...], found: list[dict[str, Any]], says: str) -> None:
    """A note for each group named that has no tasks (a typo, perhaps): ``pause`` and
    ``resume`` of it still do what they say, for tasks to come."""
    busy = {info["group"] for info in found if info["queued"] or info["running"]}
    for name in dict.fromkeys(names):
        if name not in busy:
            ctx.reporter.notice(f"note: group {name!r} {says} (a typo?)")
