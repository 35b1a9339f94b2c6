"""The bodies of the commands :mod:`ferry.cli.fast` also parses (``submit``, ``work``,
``ls``, ``show``; ``run`` is :func:`ferry.cli.context.run_command`): no click here, so that
their plain command lines never import it. Their click commands call the same
functions with what click parsed, and the fast parser's test checks that both hand
them the same values."""

from __future__ import annotations

from collections.abc import Sequence

from ferry.cli import many, render
from ferry.cli.context import Ctx, task_opts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROGRESS_S = 0.25  # how often work's live progress line is redrawn, at most


def submit(ctx: Ctx, kw: dict[str, Any], argv: tuple[str, ...]) -> None:
    """``ferry submit [TASK OPTIONS] -- CMD [ARG...]``: one task."""
    submitted(ctx, ctx.service().submit([task_opts(kw, argv)]), many=False)


def submitted(ctx: Ctx, tasks: Sequence[Any], *, many: bool) -> None:
    """What ``submit`` prints: the ids, one per line (--json: the task, or an array)."""
    try:
        if ctx.as_json:
            objs = [render.task_json(t) for t in tasks]
            render.write_json(objs if many else objs[0])
        else:
            render.emit(as_json=False, human="".join(t.id + "\n" for t in tasks), payload=None)
    except render.OutputLost as lost:
        # The tasks are queued whatever stdout takes: the error names them, so that a
        # script that submits again on failure knows (--key makes that safe).
        ids = [t.id for t in tasks]
        named = ", ".join(ids) if len(ids) <= 10 else f"{', '.join(ids[:10])} ... {ids[-1]}"
        lost.message += f"; queued all the same: {named}"
        lost.details["queued"] = ids
        raise


def work(
    ctx: Ctx,
    jobs: int,
    drain: bool,
    halt: str | None,
    poll: float,
    lease_ttl: float,
    stale_after: float | None,
    kill_stale: bool,
) -> int:
    """``ferry work``: the leader loop (see its help); exit 1 if it halted, or if with
    --drain a task it settled did not succeed."""
    reporter = ctx.reporter
    reporter.json_lines = True
    draw = drain and ctx.verbosity >= 0 and render.stderr_is_terminal()
    try:
        report = ctx.service().work(
            jobs=jobs,
            drain=drain,
            poll_s=poll,
            lease_ttl_s=lease_ttl,
            stale_after_s=stale_after,
            kill_stale=kill_stale,
            halt=halt,
            progress_s=PROGRESS_S if draw else None,
        )
    finally:
        reporter.end_progress()
    if ctx.verbosity >= 0:
        render.stderr_line(render.summary(report))
    if drain and report.stopped_by is not None:
        return 128 + report.stopped_by  # (the queue not drained: as a command Ctrl-C stops)
    failed = report.halted_after is not None or (drain and not report.all_succeeded)
    return 1 if failed else 0


def ls(ctx: Ctx, state: Sequence[str], limit: int) -> None:
    """``ferry ls``: the tasks in submission order (see its help)."""
    states = sorted({s.upper() for s in state}) or None
    tasks, total = ctx.service(reading=True, tolerant=True).ls(state=states, limit=limit)
    from ferry.cli.table import table

    render.emit(as_json=ctx.as_json, human=table(tasks),
                payload=[render.task_json(t) for t in tasks])  # fmt: skip
    if total > len(tasks) and ctx.verbosity >= 0:
        render.notice(f"{len(tasks):,} of {total:,} shown; --limit 0 for all")


def show(ctx: Ctx, task_ids: Sequence[str], show_env: bool) -> int:
    """``ferry show``: each task whole, a blank line between (--json: an array)."""
    service, shown = ctx.service(reading=True, tolerant=True), []

    def one(task_id: str) -> tuple[str | None, Any]:
        obj = render.task_json(service.show(task_id), show_env_values=show_env)
        shown.append(task_id)
        return ("\n" if len(shown) > 1 else "") + render.detail(obj), obj

    return many.for_each(ctx, task_ids, one, many=False)
