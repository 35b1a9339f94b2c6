"""Human tables and --json output. The only module that writes command results.

With ``--json`` exactly one JSON document goes to stdout (JSON Lines for streams);
human text goes to stdout for listings and to stderr for notices.

What ferry says never decides what it does. Once nobody reads stderr (EPIPE: ``2>&1 |
head -1``; EIO: its terminal closed; a full disk under a redirect), or stdout (EPIPE),
what would have been written there goes to /dev/null, and the command goes on to its
own end and exit status: a ``run`` runs its task in the foreground and exits with its
status, a ``work`` drains its queue. (A review found a notice's BrokenPipeError ending
``run`` with status 0, and under ``run -v`` coming between the intent and the go: the
task was given back to the queue, to run later under whichever ``work`` came next.)
Other errors on stdout (``ls > /dev/full``: ENOSPC) are :class:`OutputLost`, whose
code is the errno's (``io.no_space``): the command's, for a command whose output is
its result; stdout then goes to /dev/null too, so that the error's own JSON document,
which cannot be written either, raises nothing more (its line is on stderr). ``run``
passes its task's status through all the same (a warning says the document is lost),
``work`` goes on, and ``submit`` names the tasks it queued in its error. ``logs``
writes a task's bytes itself (it stops when its reader goes).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from ferry.core.errors import FerryError, ResourceError, from_os_error
from journal import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def dumps(obj: Any) -> bytes:
    try:
        return _json.dumps_sorted(obj)
    except (TypeError, ValueError):  # a str with undecodable bytes (a path, an argument)
        return _json.dumps_sorted(_readable_json(obj))


# Python's repr of an undecodable byte (argv and paths hold them as surrogate escapes),
# not preceded by an escaped backslash: '\udcff' is shown as the byte it is, '\xff'.
_REPR_SURROGATE = r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])"  # (compiled when first used)


def readable(text: str) -> str:
    """``text`` as a user can read it: the bytes that are not UTF-8 (kept as surrogate
    escapes, raw or as Python's repr wrote them into a message) as ``\\xff``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # (a surrogate no byte stands for)
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if "\\udc" not in text:
        return text
    import re  # (only such a text gets here: re is not on the start-up path)

    return re.sub(_REPR_SURROGATE, r"\1\\x\2", text)


def _readable_json(obj: Any) -> Any:
    if isinstance(obj, str):
        return readable(obj)
    if isinstance(obj, Mapping):
        return {readable(str(key)): _readable_json(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [_readable_json(value) for value in obj]
    return obj


def write_json(obj: Any) -> None:
    _out(dumps(obj) + b"\n")


def emit(*, as_json: bool, human: str | None, payload: Any) -> None:
    if as_json:
        write_json(payload)
    elif human:
        _out(human if human.endswith("\n") else human + "\n")


class OutputLost(ResourceError):
    """stdout could not be written, though its reader did not go (a full disk under a
    redirect, a device error): the output is lost; coded by its errno (``io.*``)."""


def _out(data: bytes | str) -> None:
    """Onto stdout; nowhere once its reader went; :class:`OutputLost` if it cannot be
    written otherwise (see the module's docstring)."""
    try:
        if isinstance(data, str):
            sys.stdout.write(data)
        else:
            sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        nowhere(sys.stdout)
    except OSError as exc:
        nowhere(sys.stdout)  # (what is left in its buffer: never written, never again)
        coded = from_os_error(exc)
        raise OutputLost(
            f"cannot write to stdout: {exc.strerror or exc}",
            code=coded.code,
            details={"errno": exc.errno, "stream": "stdout"},
        ) from None


def _err(text: str) -> None:
    """Onto stderr; nowhere once it cannot be written (see the module's docstring)."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        nowhere(sys.stderr)


def nowhere(stream: Any) -> None:
    """From now on ``stream`` writes to /dev/null (what its buffer holds included)."""
    import contextlib
    import os

    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # (closed, or not a file)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


def notice(message: str) -> None:
    """A human notice: always stderr, so stdout stays clean for data."""
    _err(f"ferry: {message}\n")


def escaped(text: str) -> str:
    """``text`` for a terminal: what is not printable (a control character, an escape
    sequence's start, DEL, a C1 control, a direction override) shown escaped, never
    sent (a task's argv or cwd may hold any of them)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error(err: FerryError, *, as_json: bool) -> None:
    """The one error line; under --json also the error object on stdout. What the user
    gave is echoed as its bytes (never a surrogate, never a traceback over one), and
    escaped (``escaped``)."""
    message = escaped(readable(" ".join(err.message.splitlines())))
    _err(f"ferry: error[{err.code}]: {message}\n")
    if as_json:
        from ferry.core.model import times_as_rfc3339

        shown = {**err.to_json(), "message": readable(err.message)}
        shown["details"] = times_as_rfc3339(shown["details"])  # (a lease's expires_at...)
        import contextlib

        # (stdout that cannot take it: the line above says the error all the same)
        with contextlib.suppress(OutputLost):
            write_json({"error": _readable_json(shown)})


def task_json(task: Any, *, show_env_values: bool = False) -> dict[str, Any]:
    from ferry.core.model import task_to_json

    return task_to_json(task, show_env_values=show_env_values)


def groups_table(groups: Sequence[Mapping[str, Any]]) -> str:
    """``ferry group``: one row per group (JOBS 0: no limit of its own)."""
    rows = [("GROUP", "JOBS", "PAUSED", "QUEUED", "RUNNING")]
    for info in groups:
        rows.append((str(info["group"]), str(info["jobs"] or "-"),
                     "yes" if info["paused"] else "no", str(info["queued"]),
                     str(info["running"])))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# ---- work and wait: each settled task, the progress, the summary -------------------


def settled_line(task: Any) -> str:
    """One settled task: number, id, state, exit status or signal (and the reason when
    they do not tell it), duration, name or command."""
    from ferry.core.model import Reason

    parts = []
    if task.exit_code is not None:
        parts.append(f"exit {task.exit_code}")
    elif task.signal is not None:
        parts.append(f"signal {task.signal}")
    if task.reason is not None and task.reason not in (Reason.EXIT_NONZERO, Reason.SIGNALLED):
        parts.append(str(task.reason))
    ended = ", ".join(parts) or "-"
    took = "-"
    if task.started_at is not None and task.ended_at is not None:
        took = duration(max(0.0, task.ended_at - task.started_at))
    label = task_label_text(task, 80)
    number = f"#{task.number}" if task.number else "#-"
    return f"{number:<5} {task.id}  {task.state:<9}  {ended:<12}  {took:>6}  {label}"


def _task_label(task: Any) -> str:
    number = f"#{task.number} " if task.number else ""
    return f"task {number}{task.id}"


def task_label_text(task: Any, limit: int | None = None) -> str:
    """The task's name, or its command, for a line on a terminal: cut at ``limit``
    characters; its control characters shown escaped (argv may hold any: an escape
    sequence, a newline must never reach the terminal, nor split a line)."""
    label = escaped(task.spec.name or " ".join(task.spec.argv))
    return label if limit is None or len(label) <= limit else label[: limit - 3] + "..."


def run_started_text(task: Any) -> str:
    """``run -v``, as its task starts: ``task #12 01jq3... started: make test``."""
    return f"{_task_label(task)} started: {task_label_text(task, 80)}"


def run_ended_text(task: Any, exit_status: int, verbose: bool) -> str:
    """``run``'s line about its task's end: ``task #12 01jq3... failed: EXIT_NONZERO
    (exit 3)``; the state, then the reason (the state when there is none), the signal
    if one ended it, and ``run``'s exit status; with -v also how long it ran."""
    from ferry.core.model import State

    state = str(task.state).lower()
    how = [f"signal {task.signal}"] if task.signal is not None else []
    how.append(f"exit {exit_status}")
    if task.state is State.SUCCEEDED:
        text = f"{_task_label(task)} {state} ({', '.join(how)})"
    else:
        reason = str(task.reason) if task.reason is not None else str(task.state)
        text = f"{_task_label(task)} {state}: {reason} ({', '.join(how)})"
    if verbose and task.started_at is not None and task.ended_at is not None:
        text += f" in {duration(max(0.0, task.ended_at - task.started_at))}"
    return text


def duration(seconds: float) -> str:
    """A short human duration: 0.42s, 12.3s, 4m05s, 2h07m, 3d04h."""
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def progress_text(progress: Any) -> str:
    """``work``'s live line: done/total, running, failed, the time left at the pace so
    far (? before the first task settled)."""
    eta = progress.eta_s
    left = "?" if eta is None else duration(eta)
    return (
        f"{progress.done}/{progress.total} done, {progress.running} running,"
        f" {progress.failed} failed, ETA {left}"
    )


def summary(report: Any) -> str:
    """``N succeeded[, M failed][, K cancelled] in T s`` (a work's or a wait's report):
    the counts beyond succeeded only when not zero."""
    text = f"{report.succeeded} succeeded"
    if report.failed:
        text += f", {report.failed} failed"
    if report.cancelled:
        text += f", {report.cancelled} cancelled"
    text = f"{text} in {report.elapsed_s:.1f} s"
    stopped_by = getattr(report, "stopped_by", None)  # (a work's report)
    if stopped_by is not None:
        import signal

        left = report.left_queued
        queued = "" if left is None else f", {left} left queued"
        text += f"; stopped by {signal.Signals(stopped_by).name}{queued}"
    return text


def stderr_line(text: str) -> None:
    _err(text + "\n")


def stderr_is_terminal() -> bool:
    """Whether a live line may be redrawn in place on stderr (not on a dumb one)."""
    import os

    try:
        return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    except ValueError:  # (closed)
        return False


def redraw(text: str) -> None:
    """Replace the live line on stderr with ``text`` (empty: clear it): back to the
    line's start, clear to its end, write, no newline. Cut to the terminal's width: a
    line that wrapped could not be redrawn in place."""
    import os

    try:
        width = os.get_terminal_size(sys.stderr.fileno()).columns or 80  # (0: not set)
    except (OSError, ValueError):
        width = 80
    _err("\r\x1b[K" + text[: max(0, width - 1)])


def detail(obj: Mapping[str, Any]) -> str:
    lines = []
    for key, value in obj.items():
        if isinstance(value, (dict, list)):
            text = _json.dumps_sorted(value).decode()
        else:
            text = "-" if value is None else str(value)
        lines.append(f"{key + ':':<14} {escaped(text)}")
    return "\n".join(lines)


def lease_text(info: Mapping[str, Any] | None) -> str:
    if not info or not info.get("holder"):
        epoch = (info or {}).get("epoch", 0)
        return f"no leader (epoch {epoch})"
    holder = info["holder"]
    state = "alive" if info.get("holder_alive") else info.get("holder_liveness", "?")
    return (
        f"leader pid {holder.get('pid')} on {holder.get('host')} ({state}), epoch {info['epoch']}\n"
        f"since   {_when(info.get('acquired_at'))}\nexpires {_when(info.get('expires_at'))}"
    )


def _when(ts: Any) -> str:
    """Unix seconds as RFC 3339, as task times are shown (anything else as it is)."""
    from ferry.core.model import rfc3339

    return str(rfc3339(ts) if isinstance(ts, int | float) else ts)


def recover_text(report: Any, verbosity: int) -> str | None:
    lines = [f"{d['task']}: its kept end delivered ({d['outcome']})" for d in report.delivered]
    lines += [
        f"{d['task']}: {d['decision']} -> {d['state']} ({d['reason'] or '-'})"
        for d in report.decisions
    ]
    lines += [f"{t}: quarantined orphan still alive" for t in report.orphans_alive]
    if verbosity > 0 and not lines:
        lines.append(f"nothing to recover (epoch {report.epoch})")
    return "\n".join(lines) or None


def recover_json(report: Any) -> dict[str, Any]:
    return {
        "epoch": report.epoch,
        "dry_run": report.dry_run,
        "decisions": list(report.decisions),
        "orphans_alive": list(report.orphans_alive),
        "delivered": list(report.delivered),
        "exit_code": report.exit_code,
    }


def verify_json(report: Mapping[str, Any]) -> dict[str, Any]:
    return dict(report)


def verify_text(report: Mapping[str, Any]) -> str:
    status = report["status"]
    text = f"journal {status}: {report['records']} records, last seq {report['last_seq']}"
    if status == "torn":
        torn = report["torn"]
        text += (
            f"; torn tail of {torn['bytes']} bytes in {torn['segment']} at offset "
            f"{torn['offset']} (run 'ferry journal repair' to cut it)"
        )
    elif status == "corrupt":
        text += f"; {report['error']['message']}"
    elif skipped := report.get("anomalies") or []:
        seqs = ", ".join(str(anomaly["seq"]) for anomaly in skipped[:10])
        more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
        records = "record" if len(skipped) == 1 else "records"
        text += (
            f"; {len(skipped)} {records} skipped as illegal or malformed events"
            f" (seq {seqs}{more}; --json says why)"
        )
    for damaged in report.get("damaged_snapshots") or []:
        name = damaged["path"].rsplit("/", 1)[-1]
        text += f"; {name} is damaged ({damaged['why']}): not used (an older snapshot or"
        text += " the records stand in), and the next compaction replaces it"
    return text


def repair_text(report: Mapping[str, Any]) -> str:
    if not report.get("cut_bytes"):
        return "nothing to repair"
    return (
        f"cut {report['cut_bytes']} torn bytes from {report['segment']}; "
        f"copy kept in {report['broken_copy']}"
    )


def salvage_text(report: Mapping[str, Any]) -> str:
    """What ``journal salvage`` did (or, ``--dry-run``, would do), and what was lost."""
    lines = list(report.get("finished") or ())
    kept = report["kept"]
    if report["salvaged"] or report["dry_run"]:
        base = kept["snapshot_seq"]
        since = f"the snapshot at seq {base}" if base is not None else "seq 1"
        verb = "would keep" if report["dry_run"] else "kept"
        lines.append(f"{verb} the journal from {since} to seq {kept['last_seq']}")
        if report["damaged_copy"]:
            lines.append(f"the damaged journal is kept whole in {report['damaged_copy']}")
        lines.extend(f"damage: {found['message']}" for found in report["damage"])
        lost = report["lost_records"]
        if lost:
            first, last = report["lost_seqs"]
            readable = report["lost_readable"]
            lines.append(
                f"lost: {lost} record(s), seq {first} to {last}"
                f" ({readable} of them still readable in the damaged copy)"
            )
            if report["lost_guessed"]:
                seqs = ", ".join(map(str, report["lost_guessed"]))
                lines.append(f"  (the damaged record, seq {seqs}, read as it probably was)")
            if report.get("dropped_with_the_damage"):
                first, last = report["dropped_with_the_damage"]
                lines.append(
                    f"  (seq {first} to {last}, before the damage, go with it: they are of its"
                    " batch, which is kept whole or not at all)"
                )
        else:
            lines.append("lost: no record")
        lines.extend(_archive_line(item, report["dry_run"]) for item in report["archives"])
        older = [t for t in report["tasks"] if t["after"] is not None]
        gone = [t for t in report["tasks"] if t["after"] is None]
        if older:
            lines.append(f"tasks whose state is now older ({len(older)}):")
            lines.extend(
                f"  {t['task']}  {t['before']} (attempt {t['attempt_before']}) -> "
                f"{t['after']} (attempt {t['attempt_after']})"
                for t in older
            )
        if gone:
            lines.append(f"tasks now gone ({len(gone)}):")
            lines.extend(
                f"  {t['task']}  was {t['before']}"
                if t["before"] is not None
                else f"  {t['task']}  was in a state not known (its submission is lost too)"
                for t in gone
            )
        unknown = report["tasks_unknown"]
        if unknown:
            lines.append(
                "more tasks may be lost than these, and are not known:"
                if older or gone
                else "no task is known to be lost, but some may be, and are not known:"
            )
            lines.extend(f"  {why}" for why in unknown)
        elif not older and not gone:
            lines.append("no task's state changed")
    elif report["finished"] and report["kept_aside"]:
        lines.append("kept aside in archive/ by salvages (remove them once you are done):")
        lines.extend(f"  {name}" for name in report["kept_aside"])
    return "\n".join(lines)


_CHECKED_BY = {"sha256": "its SHA-256 in a readable snapshot", "index": "its index"}


def _archive_line(item: Mapping[str, Any], dry_run: bool) -> str:
    """A settled-task archive the salvaged journal no longer names: what it is, what of
    it is lost, and where it is kept (only what is, or would be, there)."""
    status = item["status"]
    what = {
        "whole": f"whole, checked by {_CHECKED_BY.get(item['checked_by'], '?')}",
        "damaged": "damaged",
        "missing": "missing",
        "unverified": "nothing can check it",
    }.get(status, status)
    if item["tasks"] is not None:
        what += f"; {item['tasks']} task(s), {item['lost']} of them lost"
    kept = "would be kept" if dry_run else "kept"
    where = [f"{kept} as {item['kept_as']}"] if item["kept_as"] else []
    if item["index_kept_as"]:
        where.append(f"its index {kept} as {item['index_kept_as']}")
    head = "lost" if status in ("damaged", "missing") else "not in the new journal"
    return f"{head}: settled-task archive {item['name']} ({what})" + (
        ": " + ", ".join(where) if where else ""
    )


def compact_text(report: Mapping[str, Any]) -> str:
    if report.get("skipped"):
        return f"nothing done: {report['skipped']} (it does the work)"
    return f"snapshot at seq {report['snapshot_seq']}; removed {len(report['removed'])} segment(s)"


def db_status_text(report: dict[str, Any]) -> str:
    lines = [f"schema version {report['schema_version']}; this host: {report['host']}"]
    tasks = report["tasks"]
    lines.append("tasks: " + (", ".join(f"{n} {s}" for s, n in tasks.items()) or "none"))
    for host in report["hosts"]:
        state = "live until" if host["live"] else "expired at"
        lines.append(
            f"host {host['host']}: epoch {host['epoch']}, lease {state} {host['expires_at']}"
        )
    return "\n".join(lines)
