"""Commands that take several tasks (``show``, ``logs``, ``cancel``, ``retry``, ``kill``;
``cancel`` and ``retry`` also ``--state STATE``): each task on its own, in the order
given, and one that fails does not stop the others.

Output: one id given, exactly as before (its line, its JSON object, or its error and
exit code). Several ids, or ``--state``: a line per task on stdout, a coded error line
on stderr per task that failed; ``--json`` prints one array (a task's object, or
``{"id": ..., "error": {...}}`` for one that failed); the exit code is 0 if every task
went through, else the first failure's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ferry.core.errors import (
    EX_NOT_FOUND,
    EX_OPERATOR,
    EX_USAGE,
    FerryError,
    RefusedError,
    UsageError,
    exit_code_for,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ferry.app.service import Service

    Action = Callable[[str], tuple[str | None, Any]]


class OneService:
    """The command's service, opened at its first use and kept for every task after:
    opening it reads the journal's tail (once per task, ``cancel --state QUEUED`` of
    1,000 tasks took 44 s). Each write is still decided under the lock. A failure of
    the store itself (a write that failed: its journal handle is done) drops it: the
    next task opens another, as each did before."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.opened: Service | None = None

    def __call__(self) -> Service:
        if self.opened is None:
            self.opened = self.ctx.service(make=False)
        return self.opened

    def failed(self, error: FerryError) -> None:
        if exit_code_for(error, runs_task=False) not in _TASK_EXITS:
            self.opened = None


# The exits of a failure about one task (refused, usage, operator needed, not found):
# the store that said so is still good for the next.
_TASK_EXITS = frozenset((RefusedError.exit_code, EX_USAGE, EX_OPERATOR, EX_NOT_FOUND))


def targets(ctx: Any, ids: Sequence[str], state: str | None, service: OneService) -> list[str]:
    """The ids given, or every task now in ``state`` (in submission order). Each write
    is still decided under the lock, task by task: one that moved meanwhile is refused
    and reported, never acted on as it was read here."""
    if state is not None and ids:
        raise UsageError("give task ids or --state, not both", code="usage.invalid")
    if state is None and not ids:
        raise UsageError("give a task id (or several), or --state STATE", code="usage.missing_id")
    if state is None:
        return list(ids)
    tasks, _ = service().ls(state=[state.upper()], limit=0)
    return [task.id for task in tasks]


def for_each(
    ctx: Any, ids: Sequence[str], action: Action, *, many: bool, service: OneService | None = None
) -> int:
    """Run ``action`` (id -> its human line and JSON object) for each id; see the
    module. ``many``: several results even for one id (``--state``); ``service``: the
    one the actions use, told of each failure."""
    from ferry.cli import render

    if len(ids) == 1 and not many:
        human, payload = action(ids[0])  # (its error is the command's, as before)
        render.emit(as_json=ctx.as_json, human=human, payload=payload)
        return 0
    results: list[Any] = []
    failed: FerryError | None = None
    for task_id in ids:
        try:
            human, payload = action(task_id)
        except FerryError as error:
            if service is not None:
                service.failed(error)
            render.error(error, as_json=False)
            results.append({"id": task_id, "error": error.to_json()})
            failed = failed or error
            continue
        results.append(payload)
        if not ctx.as_json and human:
            render.emit(as_json=False, human=human, payload=None)
    if ctx.as_json:
        render.write_json(results)
    return 0 if failed is None else exit_code_for(failed, runs_task=False)
