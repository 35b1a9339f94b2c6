"""Naming a task on the command line: what the store resolves (an id or a unique prefix
of it, a number, ``last``), and, when that names nothing, which tasks carry it as their
``--name``. A name is never taken as an id (names need not be unique, and a name could
read as an id prefix or a number); the error line says which task to name instead, so
``ferry show item-3`` answers ``... task #3 is named so``, not only "not found"."""

from __future__ import annotations

from ferry.core.errors import NotFoundError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ferry.core.model import Task
    from ferry.storage import TaskStore

NAMED_LISTED_MAX = 10


def resolve(store: TaskStore, reference: str) -> Task:
    """The task ``reference`` names (``store.resolve``); not found: the error says which
    tasks are named ``reference``, if any."""
    try:
        return store.resolve(reference)
    except NotFoundError as error:
        if error.code == NotFoundError.code:
            error.message += _named(store, reference)
        raise


def _named(store: TaskStore, reference: str) -> str:
    """``; task #3 is named so ...``, or "" (no task is). Reads every task: only on the
    way to an error."""
    if not reference or len(reference) > 1000:
        return ""
    named = [task for task in store.newest(0) if task.spec.name == reference]
    if not named:
        return ""
    listed = [f"#{task.number}" if task.number else task.id for task in named]
    text = ", ".join(listed[-NAMED_LISTED_MAX:])  # (the latest: the likeliest meant)
    if len(listed) > NAMED_LISTED_MAX:
        text = f"{len(listed) - NAMED_LISTED_MAX} more and {text}"
    which = f"task {text} is" if len(named) == 1 else f"tasks {text} are"
    return f"; {which} named so (a name is not an id: give the number, the id or 'last')"
