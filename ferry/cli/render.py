"""Human tables and --json output. The only module that writes command results.

With ``--json`` exactly one JSON document goes to stdout (JSON Lines for streams);
human text goes to stdout for listings and to stderr for notices.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ferry.core.errors import FerryError


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def write_json(obj: Any) -> None:
    sys.stdout.buffer.write(dumps(obj) + b"\n")
    sys.stdout.flush()


def emit(*, as_json: bool, human: str | None, payload: Any) -> None:
    if as_json:
        write_json(payload)
    elif human:
        sys.stdout.write(human if human.endswith("\n") else human + "\n")
        sys.stdout.flush()


def notice(message: str) -> None:
    """A human notice: always stderr, so stdout stays clean for data."""
    sys.stderr.write(f"ferry: {message}\n")
    sys.stderr.flush()


def error(err: FerryError, *, as_json: bool) -> None:
    message = " ".join(err.message.splitlines())
    sys.stderr.write(f"ferry: error[{err.code}]: {message}\n")
    sys.stderr.flush()
    if as_json:
        write_json({"error": err.to_json()})


def task_json(task: Any, *, show_env_values: bool = False) -> dict[str, Any]:
    from ferry.core.model import task_to_json

    return task_to_json(task, show_env_values=show_env_values)


def _short_time(rfc3339: str | None) -> str:
    return rfc3339[5:19].replace("T", " ") if rfc3339 else "-"


def table(tasks: Sequence[Any]) -> str:
    header = ("#", "ID", "STATE", "REASON", "ATT", "EXIT", "CREATED", "NAME/COMMAND")
    rows = [header]
    for task in tasks:
        obj = task_json(task)
        exit_text = (
            str(obj["exit_code"])
            if obj["exit_code"] is not None
            else (f"sig{obj['signal']}" if obj["signal"] else "-")
        )
        label = obj["name"] or " ".join(obj["argv"])
        rows.append(
            (
                str(obj["number"] or "-"),
                obj["id"],
                obj["state"],
                obj["reason"] or "-",
                str(obj["attempt"]),
                exit_text,
                _short_time(obj["created_at"]),
                label if len(label) <= 60 else label[:57] + "...",
            )
        )
    if len(rows) == 1:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    )


def detail(obj: Mapping[str, Any]) -> str:
    lines = []
    for key, value in obj.items():
        if isinstance(value, (dict, list)):
            text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        else:
            text = "-" if value is None else str(value)
        lines.append(f"{key + ':':<14} {text}")
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
    lines = [
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
        "exit_code": report.exit_code,
    }


def verify_json(report: Mapping[str, Any]) -> dict[str, Any]:
    return dict(report)


def verify_text(report: Mapping[str, Any]) -> str:
    status = report["status"]
    base = f"journal {status}: {report['records']} records, last seq {report['last_seq']}"
    if status == "torn":
        torn = report["torn"]
        return (
            f"{base}; torn tail of {torn['bytes']} bytes in {torn['segment']} at offset "
            f"{torn['offset']} (run 'ferry journal repair' to cut it)"
        )
    if status == "corrupt":
        return f"{base}; {report['error']['message']}"
    skipped = report.get("anomalies") or []
    if skipped:
        seqs = ", ".join(str(anomaly["seq"]) for anomaly in skipped[:10])
        more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
        records = "record" if len(skipped) == 1 else "records"
        base += (
            f"; {len(skipped)} {records} skipped as illegal or malformed events"
            f" (seq {seqs}{more}; --json says why)"
        )
    return base


def repair_text(report: Mapping[str, Any]) -> str:
    if not report.get("cut_bytes"):
        return "nothing to repair"
    return (
        f"cut {report['cut_bytes']} torn bytes from {report['segment']}; "
        f"copy kept in {report['broken_copy']}"
    )


def compact_text(report: Mapping[str, Any]) -> str:
    return f"snapshot at seq {report['snapshot_seq']}; removed {len(report['removed'])} segment(s)"


def db_status_text(report: dict[str, Any]) -> str:
    lines = [f"schema version {report['schema_version']}; this host: {report['host']}"]
    tasks = report["tasks"]
    lines.append("tasks: " + (", ".join(f"{n} {s}" for s, n in tasks.items()) or "none"))
    for host in report["hosts"]:
        state = "live" if host["live"] else "expired"
        lines.append(
            f"host {host['host']}: epoch {host['epoch']}, lease {state} until {host['expires_at']}"
        )
    return "\n".join(lines)
