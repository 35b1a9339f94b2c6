"""``ferry report --html FILE``: one self-contained HTML page of the tasks (a summary, a
timeline coloured by state, details on hover, a filter by state), for a person or a CI
artifact. The tasks are ``ls``'s (the same service call, so both backends); the page is
:mod:`ferry.cli.report_page`'s; this module parses, chooses the tasks and writes the file
atomically."""

from __future__ import annotations

import errno
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from ferry.core.errors import ResourceError, UsageError
from ferry.core.ids import shown
from ferry.core.model import State, Task

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now_s: float) -> float:
    """``--since``: a duration back from now (``90s``, ``30m``, ``2h``, ``7d``, ``2w``) or
    an RFC 3339 time (``2024-05-01T12:00:00Z``; without an offset, in the local zone; a
    date alone is its local midnight); as Unix seconds."""
    import datetime as dt

    given = text.strip()
    match = _DURATION.fullmatch(given)
    if match:
        return now_s - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        moment = dt.datetime.fromisoformat(given)
    except ValueError:
        raise UsageError(
            f"--since: {shown(text)} is neither a duration (30m, 2h, 7d) nor an RFC 3339 time"
            " (2024-05-01T12:00:00Z)",
            code="usage.bad_since",
        ) from None
    try:
        return moment.timestamp()  # naive: the local zone's
    except (ValueError, OverflowError, OSError):
        # A local time at the very edge of what a date can name (0001-01-01, the last
        # second of 9999), whose zone's offset takes it past the edge: read as UTC. Off
        # by that offset (hours, at year 1 or 9999), it selects the same tasks.
        return moment.replace(tzinfo=dt.UTC).timestamp()


def active_since(tasks: Sequence[Task], since_s: float) -> list[Task]:
    """The tasks not settled before ``since_s``: submitted, running or ended since then,
    or not ended at all."""
    kept = []
    for task in tasks:
        last = task.ended_at
        if last is None and task.terminal:  # settled without an end time: its last sign
            last = task.started_at if task.started_at is not None else task.created_at
        if last is None or last >= since_s:
            kept.append(task)
    return kept


def _is_special(path: str) -> bool:
    """``path`` exists and is neither a regular file nor a directory (links followed)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _names_stdout(path: str) -> bool:
    """``path`` is the file ferry's stdout is (``/dev/stdout``, ``/proc/self/fd/1``)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(1))
    except OSError:
        return False


def _unwritable(path: str, error: OSError) -> ResourceError:
    reason = error.strerror or str(error)
    return ResourceError(
        f"cannot write the report to {path}: {reason}",
        code="report.unwritable",
        details={"errno": error.errno, "path": path},
    )


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temporary file beside it, fsynced,
    renamed over it, the directory fsynced. A crash leaves the old file (or none) and at
    most a ``.NAME.*.tmp`` beside it; a reader never sees half a page.

    A ``path`` that is (or links to) a device, a FIFO or a socket (``/dev/stdout``,
    ``/dev/null``) is written into, as a shell's ``>`` would: a rename would replace
    it with a regular file."""
    if path.endswith(os.sep) or os.path.isdir(path):  # (a rename over it: EBUSY, ENOTDIR)
        raise _unwritable(path, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
    if _is_special(path):
        try:
            with open(path, "wb") as stream:
                stream.write(data)
        except OSError as error:
            raise _unwritable(path, error) from None
        return
    directory = os.path.dirname(os.path.abspath(path))
    import secrets  # (lazy: every click command imports this module to register it)

    temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as error:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise _unwritable(path, error) from None
    try:  # the rename itself durable; a directory that cannot be opened is no error
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _scope(states: Sequence[str], since: str | None) -> str:
    parts = []
    if states:
        parts.append("state " + " or ".join(states))
    if since:
        parts.append(f"not settled before --since {since}")
    return "; ".join(parts)


def register(cli: click.Group) -> None:
    """Attach ``report`` to the ``cli`` group."""

    @cli.command(
        epilog="Example:\n\n\b\n"
        "  ferry report --html ferry-report.html\n"
        "  ferry report --html failed.html --state FAILED --since 24h"
    )
    @click.option(
        "--html",
        "html_path",
        required=True,
        metavar="FILE",
        help="Write the page here (replaced atomically; - for stdout).",
    )
    @click.option(
        "--since",
        metavar="TIME",
        help="Only tasks not settled before TIME: a duration back from now (90s, 30m, 2h,"
        " 7d, 2w) or an RFC 3339 time (2024-05-01T12:00:00Z; no offset: local time).",
    )
    @click.option(
        "--state",
        type=click.Choice([s.value for s in State], case_sensitive=False),
        multiple=True,
        help="Only tasks in this state (repeatable: any of them).",
    )
    @click.pass_obj
    def report(ctx: Any, html_path: str, since: str | None, state: tuple[str, ...]) -> None:
        """Write one self-contained HTML page of the tasks: a summary, a timeline.

        Each task is a bar from its start to its end, coloured by its state, with its
        details on hover; checkboxes filter by state. The page needs no network to open
        (inline styles and script, no URL; the task objects as ls --json prints them are
        embedded as JSON), so it can be kept as a CI artifact. Every task is in it
        (no --limit); --state and --since narrow it.
        """
        from ferry.cli import render, report_page

        to_stdout = html_path == "-" or _names_stdout(html_path)
        if to_stdout and ctx.as_json:
            raise UsageError(
                f"--html {html_path} writes the page to stdout: it cannot also carry --json"
            )
        now_s = time.time()
        since_s = None if since is None else parse_since(since, now_s)
        states = sorted({s.upper() for s in state}) or None
        tasks, _ = ctx.service(reading=True, tolerant=True).ls(state=states, limit=0)
        if since_s is not None:
            tasks = active_since(tasks, since_s)
        objs = [render.task_json(task) for task in tasks]
        damage = ctx.damage()
        page = report_page.build(objs, now_s=now_s, scope=_scope(states or [], since),
                                 damage=None if damage is None else damage.message)  # fmt: skip
        data = page.encode()
        if html_path == "-":
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return
        write_atomically(html_path, data)
        if to_stdout:  # (/dev/stdout, say: the page alone, as with "-")
            return
        count = f"{len(objs):,} task" + ("" if len(objs) == 1 else "s")
        render.emit(
            as_json=ctx.as_json,
            human=None if ctx.verbosity < 0 else f"wrote {html_path}: {count}",
            payload={"path": os.path.abspath(html_path), "tasks": len(objs), "bytes": len(data)},
        )
