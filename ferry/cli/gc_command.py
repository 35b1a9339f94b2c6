"""``ferry gc``: forget settled tasks older than a cut-off and free what they held (the
use case is :mod:`ferry.app.gc`); this module parses and renders."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ferry.core.units import human_bytes, parse_duration

if TYPE_CHECKING:
    from ferry.app.gc import GcReport

_SETTLED = ("SUCCEEDED", "FAILED", "CANCELLED")


def _tasks(count: int) -> str:
    return f"{count:,} task" + ("" if count == 1 else "s")


def gc_text(report: GcReport, verbosity: int) -> str:
    """What gc freed (or would free): a summary line, each task it kept and why, and
    under -v each task it forgot."""
    from ferry.cli import render
    from ferry.core.model import rfc3339

    dry = report.dry_run
    before = str(rfc3339(report.cutoff_s))[:19].replace("T", " ") + " UTC"
    lines = []
    if report.forgotten:
        counts = dict.fromkeys(_SETTLED, 0)
        for task in report.forgotten:
            counts[task.state.value] += 1
        by_state = ", ".join(f"{n:,} {state}" for state, n in counts.items() if n)
        logs = human_bytes(sum(report.log_bytes.values()))
        line = f"{'would forget' if dry else 'forgot'} {_tasks(len(report.forgotten))}"
        line += f" ({by_state}) that ended before {before}"
        if dry:
            line += f": would free {logs} of logs"
            line += ", and their history when compacted" if report.compacts else ""
        elif report.compacted:
            line += f": freed {logs} of logs"
            if report.history_bytes:  # (a shared database has no history to free here)
                line += f" and {human_bytes(report.history_bytes)} of history"
        else:
            line += f": freed {logs} of logs; their history goes at the next compaction"
            failed = report.compaction_error
            line += (
                " (another one is running)" if failed is None else f" (this one failed: {failed})"
            )
        lines.append(line)
    else:
        states = "/".join(report.states)
        lines.append(f"nothing to forget: no {states} task ended before {before}")
        if report.history_bytes:  # (what an earlier gc, killed, left to the compaction)
            lines.append(f"freed {human_bytes(report.history_bytes)} of history")
    if report.earlier:
        size = human_bytes(sum(report.earlier.values()))
        verb = "would remove" if dry else "removed"
        count = _tasks(len(report.earlier))
        lines.append(f"{verb} the files of {count} forgotten earlier ({size})")
    if report.kept:
        lines.append(f"kept {_tasks(len(report.kept))}:")
        lines.extend(f"  {render.settled_line(k.task)}  ({k.why})" for k in report.kept)
    if verbosity > 0:
        lines.extend(f"  {render.settled_line(task)}" for task in report.forgotten)
    return "\n".join(lines)


def register(cli: click.Group) -> None:
    """Attach ``gc`` to the ``cli`` group."""

    @cli.command(
        epilog="Example:\n\n\b\n"
        "  ferry gc                       # settled tasks older than 7 days\n"
        "  ferry gc --older-than 12h --state SUCCEEDED --dry-run"
    )
    @click.option(
        "--older-than",
        "older_than",
        metavar="DURATION",
        default="7d",
        show_default=True,
        help="Forget the settled tasks that ended longer ago than this: a number with a"
        " unit, s, m, h, d or w (90s, 30m, 12h, 7d); 0s: every settled task.",
    )
    @click.option(
        "--state",
        type=click.Choice(_SETTLED, case_sensitive=False),
        multiple=True,
        help="Only tasks in this state (repeatable: any of them; default: all three).",
    )
    @click.option(
        "--dry-run", is_flag=True, help="Print what would go; journal and remove nothing."
    )
    @click.pass_obj
    def gc(ctx: Any, older_than: str, state: tuple[str, ...], dry_run: bool) -> None:
        """Forget settled tasks and free their logs, archives and history (journaled).

        Never a task queued or in flight, nor a quarantined task whose orphan may still
        live, nor the latest task of a --key that ended unsafe (retry or resolve it
        first), nor a task that a task not SUCCEEDED comes after (--after: it needs it
        to run, now or once retried). A key whose task SUCCEEDED stays succeeded once the task is forgotten: it
        is never run again. Prints what it freed; -v also each task it forgot.
        """
        from ferry.app.gc import describe
        from ferry.cli import render

        older_than_s = parse_duration(older_than)
        states = sorted({s.upper() for s in state}) or list(_SETTLED)
        report = ctx.service(make=False).gc(
            older_than_s=older_than_s, states=states, dry_run=dry_run
        )
        human = None if ctx.verbosity < 0 else gc_text(report, ctx.verbosity)
        render.emit(as_json=ctx.as_json, human=human, payload=describe(report))
