"""``ferry ls``'s table: number, id, state, reason, exit, start time (local time zone,
``TZ``), duration and name (and group and priority when a task listed uses them: a
queue without groups or priorities lists as it always did); fitted to the terminal's width (``COLUMNS``), states in
colour on a terminal (never with ``NO_COLOR`` set, never into a pipe or a file).

Fitting: the name column is cut first (to 12 characters at least), then the reason
column is left out (it stays in ``show`` and ``--json``), then the id (the number names
the task), then the start time; narrower still, each line is cut. Into a pipe or a file,
nothing is cut unless ``COLUMNS`` says so: a script that reads the table gets it whole.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from ferry.cli.render import duration, task_label_text
from ferry.core.spec import GROUP_DEFAULT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HEADER = ("#", "ID", "STATE", "REASON", "EXIT", "STARTED", "DURATION", "NAME/COMMAND")
# Left out in this order when the name would get fewer than _NAME_MIN characters: the
# reason (show has it), the id (the number names the task), the start time.
_LEFT_OUT = ("REASON", "ID", "STARTED")
_STATE = HEADER.index("STATE")
_QUEUE_AT = HEADER.index("EXIT") + 1  # where GROUP and PRI go
_NAME_MIN = 12
_GAP = "  "
# ANSI SGR colours per state (bold red for FAILED: what a reader looks for first).
_COLOURS = {
    "SUCCEEDED": "32", "FAILED": "1;31", "CANCELLED": "33", "RUNNING": "36",
    "DISPATCHING": "36", "CLAIMED": "36", "STALE": "35",
}  # fmt: skip


def table(tasks: Sequence[Any], *, now: float | None = None) -> str:
    if not tasks:
        return ""
    now = time.time() if now is None else now
    queue = any(t.spec.group != GROUP_DEFAULT or t.spec.priority for t in tasks)
    rows = [_queue_cells(HEADER, ("GROUP", "PRI"), queue)]
    rows += [_queue_cells(_row(t, now), (t.spec.group, str(t.spec.priority)), queue) for t in tasks]
    width = _width()
    columns = list(range(len(rows[0])))
    if width is not None and _line_length(rows, columns) > width:
        for name in _LEFT_OUT:  # (each only while the name still gets too little room)
            if width - _line_length(rows, columns[:-1]) - len(_GAP) >= _NAME_MIN:
                break
            columns.remove(rows[0].index(name))
    widths = {i: max(_cells(row[i]) for row in rows) for i in columns}
    if width is not None:
        fixed = sum(widths[i] + len(_GAP) for i in columns[:-1])
        shown = {rows[0][i] for i in columns}
        least = _NAME_MIN if shown & set(_LEFT_OUT) else 4  # (none left to give way)
        widths[columns[-1]] = max(least, width - fixed)
    state_at = sum(widths[i] + len(_GAP) for i in columns[: columns.index(_STATE)])
    colour = _colour_wanted()
    lines = []
    for n, row in enumerate(rows):
        cells = [row[i].ljust(widths[i]) for i in columns[:-1]]
        cells.append(_cut(row[-1], widths[columns[-1]]))
        line = _GAP.join(cells).rstrip()
        if width is not None and _cells(line) > width:
            line = _take(line, width).rstrip()  # (narrower than the fewest columns: as ps)
        state = row[_STATE]
        if colour and n > 0 and state in _COLOURS and len(line) >= state_at + len(state):
            coloured = f"\x1b[{_COLOURS[state]}m{state}\x1b[0m"
            line = line[:state_at] + coloured + line[state_at + len(state) :]
        lines.append(line)
    return "\n".join(lines)


def _queue_cells(row: tuple[str, ...], cells: tuple[str, str], used: bool) -> tuple[str, ...]:
    return (*row[:_QUEUE_AT], *cells, *row[_QUEUE_AT:]) if used else row


def _row(task: Any, now: float) -> tuple[str, ...]:
    if task.exit_code is not None:
        exit_text = str(task.exit_code)
    else:
        exit_text = f"sig{task.signal}" if task.signal else "-"
    started = "-"
    took = "-"
    if task.started_at is not None:
        started = time.strftime("%m-%d %H:%M:%S", time.localtime(task.started_at))
        end = task.ended_at if task.ended_at is not None else (None if task.terminal else now)
        if end is not None:
            took = duration(max(0.0, end - task.started_at))
    return (
        str(task.number or "-"), task.id, str(task.state),
        "-" if task.reason is None else str(task.reason), exit_text, started, took,
        task_label_text(task),  # (escaped: a newline must not break the table)
    )  # fmt: skip


def _line_length(rows: Sequence[tuple[str, ...]], columns: Sequence[int]) -> int:
    return sum(max(_cells(row[i]) for row in rows) for i in columns) + len(_GAP) * (
        len(columns) - 1
    )


def _cut(text: str, width: int) -> str:
    return text if _cells(text) <= width else _take(text, max(0, width - 3)) + "..."


def _cells(text: str) -> int:
    """The terminal cells ``text`` takes: 2 for a wide character (CJK, most emoji), 0
    for a combining one (names and commands are any text)."""
    if text.isascii():
        return len(text)
    return sum(map(_cell, text))


def _cell(char: str) -> int:
    import unicodedata  # (lazy: a table of ASCII needs none)

    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _take(text: str, width: int) -> str:
    """The longest start of ``text`` that takes at most ``width`` cells."""
    if text.isascii():
        return text[:width]
    used = 0
    for index, char in enumerate(text):
        used += _cell(char)
        if used > width:
            return text[:index]
    return text


def _width() -> int | None:
    """The width to fit: ``COLUMNS`` if set, else the terminal's; None into a pipe."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and len(columns) <= 6 and int(columns) > 0:
        return int(columns)
    try:
        if sys.stdout.isatty():  # (0: a terminal whose size nobody set: not known)
            return os.get_terminal_size(sys.stdout.fileno()).columns or None
    except (OSError, ValueError):
        pass
    return None


def _colour_wanted() -> bool:
    """On a terminal, unless NO_COLOR is set (to anything non-empty: no-color.org) or
    the terminal is dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stdout.isatty()
    except ValueError:
        return False
