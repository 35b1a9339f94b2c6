"""The page ``ferry report --html`` writes: one static HTML file from the tasks' JSON.

Pure: the task objects (as ``ls --json`` prints them), the time of the report and the
filters that chose them in; the page's text out. No I/O.

Self-contained, for a CI artifact opened offline: inline CSS and JavaScript, the task
objects embedded as JSON in ``<script type="application/json" id="ferry-tasks">``, no
URL anywhere (no font, image, stylesheet or script to fetch), and a
Content-Security-Policy that forbids every fetch and every script but ours (allowed by
its hash), so even markup that slipped through could neither call out nor run.

Task names and commands are user input: every text goes through :func:`html.escape`,
and the embedded JSON has ``<``, ``>`` and ``&`` written as ``\\u003c`` ... (a name
``</script>`` cannot end the JSON's element early).

The timeline's bars are drawn here, on the server side, so the page reads with
JavaScript off (the details of a task are then each row's ``title``); the script adds
only the state filter and the details on hover, without delay.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ferry.cli.render import duration, escaped
from ferry.core.model import State
from journal import _json

# The states in their order of life; each one's colour.
STATE_ORDER = [state.value for state in State]
_COLOURS = {
    "QUEUED": "#8250df",
    "CLAIMED": "#bf8700",
    "DISPATCHING": "#9a6700",
    "RUNNING": "#0969da",
    "STALE": "#e16f24",
    "SUCCEEDED": "#1a7f37",
    "FAILED": "#cf222e",
    "CANCELLED": "#6e7781",
}
_SETTLED = {"SUCCEEDED", "FAILED", "CANCELLED"}
# Axis steps, in seconds: about 6 to 12 ticks across whatever the span is.
_STEPS_S = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
]  # fmt: skip
_TICKS_MAX = 12

_CSS = """
:root { --label: 320px; --row: 20px; }
* { box-sizing: border-box; }
body { margin: 0; padding: 20px 24px 40px; color: #1f2328; background: #fff;
  font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 20px; margin: 0 0 2px; }
h2 { font-size: 15px; margin: 22px 0 8px; }
.meta { color: #59636e; margin: 0 0 14px; }
.damage { background: #fff1e5; border: 1px solid #bc4c00; padding: 8px 12px; margin: 0 0 14px; }
.mono, code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12px; }
.summary { display: flex; flex-wrap: wrap; gap: 8px; margin: 0; }
.card { border: 1px solid #d1d9e0; border-radius: 6px; padding: 6px 12px; min-width: 96px; }
.card dt { color: #59636e; font-size: 12px; }
.card dd { margin: 0; font-size: 16px; font-weight: 600; white-space: nowrap; }
.sw { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 5px; vertical-align: baseline; }
#filters { border: 0; padding: 0; margin: 0 0 8px; display: flex; flex-wrap: wrap;
  gap: 4px 16px; align-items: center; }
#filters label { cursor: pointer; user-select: none; }
#shown { color: #59636e; }
.timeline { position: relative; border: 1px solid #d1d9e0; border-radius: 6px; }
.axis { position: sticky; top: 0; z-index: 2; height: 24px; background: #f6f8fa;
  border-bottom: 1px solid #d1d9e0; border-radius: 6px 6px 0 0; }
.axis .tick { position: absolute; top: 4px; transform: translateX(-50%);
  color: #59636e; font-size: 11px; white-space: nowrap; }
.lines { position: absolute; top: 0; bottom: 0; left: var(--label); right: 12px;
  pointer-events: none; }
.lines i { position: absolute; top: 0; bottom: 0; border-left: 1px solid #eef1f4; }
.ticks { position: absolute; top: 0; bottom: 0; left: var(--label); right: 12px; }
.row { position: relative; display: flex; height: var(--row); align-items: center; }
.row:nth-child(even) { background: rgba(31,35,40,.025); }
.row:hover, .row:focus { background: rgba(9,105,218,.09); outline: none; }
.row.off, tr.off { display: none; }
.label { flex: 0 0 var(--label); padding: 0 10px; overflow: hidden; white-space: nowrap;
  text-overflow: ellipsis; font-size: 12px; }
.label .n { color: #59636e; display: inline-block; min-width: var(--n, 3.5ch);
  margin-right: .6em; font-variant-numeric: tabular-nums; }
.track { position: relative; flex: 1 1 auto; height: 100%; margin-right: 12px; }
.bar { position: absolute; top: 5px; height: 10px; min-width: 3px; border-radius: 2px; }
.bar.open { border-radius: 2px 0 0 2px; background-image: repeating-linear-gradient(
  -45deg, transparent 0 4px, rgba(255,255,255,.45) 4px 7px); }
.bar.pending { background: transparent !important; border: 1.5px dashed; }
.bar.mark { width: 3px; min-width: 3px; top: 2px; height: 16px; }
.wait { position: absolute; top: 9px; height: 2px; background: #dde3e9; }
.empty { padding: 24px; color: #59636e; text-align: center; }
#tip { position: fixed; z-index: 10; max-width: 560px; padding: 8px 10px; display: none;
  background: #1f2328; color: #fff; border-radius: 6px; font-size: 12px;
  box-shadow: 0 4px 16px rgba(0,0,0,.25); pointer-events: none; }
#tip div { white-space: pre-wrap; word-break: break-all; }
#tip b { color: #9fb3c8; font-weight: 500; display: inline-block; min-width: 6.5em; }
details { margin-top: 22px; }
summary { cursor: pointer; font-weight: 600; }
table { border-collapse: collapse; margin-top: 8px; font-size: 12px; }
th, td { text-align: left; padding: 3px 10px 3px 0; border-bottom: 1px solid #eef1f4;
  vertical-align: top; }
th { color: #59636e; font-weight: 500; }
td.cmd { max-width: 640px; word-break: break-all; }
"""

# The script: filter by state, the details on hover or focus. It reads only the page's
# own markup (each row's data-state and title), never the JSON: user text reaches the
# tooltip through textContent, never as markup.
_JS = """
(function () {
  "use strict";
  var rows = Array.prototype.slice.call(document.querySelectorAll("[data-state]"));
  var bars = document.querySelectorAll(".timeline .row");
  var shown = document.getElementById("shown");
  var boxes = document.querySelectorAll("#filters input[type=checkbox]");
  var filters = document.getElementById("filters");
  if (filters) { filters.hidden = false; }
  function apply() {
    var on = {};
    Array.prototype.forEach.call(boxes, function (box) { on[box.value] = box.checked; });
    var count = 0;
    rows.forEach(function (row) {
      var off = on[row.getAttribute("data-state")] === false;
      row.classList.toggle("off", off);
      if (!off && row.classList.contains("row")) { count += 1; }
    });
    if (shown) { shown.textContent = count + " of " + bars.length + " shown"; }
  }
  Array.prototype.forEach.call(boxes, function (box) {
    box.addEventListener("change", apply);
  });
  var tip = document.getElementById("tip");
  Array.prototype.forEach.call(bars, function (row) {
    row.setAttribute("data-tip", row.getAttribute("title") || "");
    row.removeAttribute("title");
  });
  function fill(row) {
    tip.textContent = "";
    row.getAttribute("data-tip").split("\\n").forEach(function (line) {
      var div = document.createElement("div");
      var cut = line.indexOf(": ");
      if (cut > 0) {
        var key = document.createElement("b");
        key.textContent = line.slice(0, cut);
        div.appendChild(key);
        div.appendChild(document.createTextNode(line.slice(cut + 2)));
      } else {
        div.textContent = line;
      }
      tip.appendChild(div);
    });
    tip.style.display = "block";
  }
  function place(x, y) {
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var left = x + 14, top = y + 14;
    if (left + w > window.innerWidth - 4) { left = Math.max(4, x - w - 14); }
    if (top + h > window.innerHeight - 4) { top = Math.max(4, y - h - 14); }
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  }
  var timeline = document.querySelector(".timeline");
  if (timeline) {
    timeline.addEventListener("mousemove", function (event) {
      var row = event.target.closest ? event.target.closest(".row") : null;
      if (!row) { tip.style.display = "none"; return; }
      fill(row);
      place(event.clientX, event.clientY);
    });
    timeline.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    timeline.addEventListener("focusin", function (event) {
      var row = event.target.closest ? event.target.closest(".row") : null;
      if (!row) { return; }
      fill(row);
      var box = row.getBoundingClientRect();
      place(box.left + 40, box.bottom);
    });
    timeline.addEventListener("focusout", function () { tip.style.display = "none"; });
  }
  apply();
  document.body.setAttribute("data-ready", String(bars.length));
})();
"""


def _hash(source: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()


# Nothing may be fetched (default-src 'none'); styles are inline (the bars' positions are
# style attributes); the one script that may run is ours.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; "
    f"script-src '{_hash(_JS)}'; base-uri 'none'; form-action 'none'"
)


def embed_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` (only
    ever inside JSON strings) and the two JavaScript line separators as \\u escapes, so
    no text of a task can close the element or open a comment."""
    text = _json.dumps_sorted(value).decode()
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 string of a task object, as Unix seconds."""
    if not text:
        return None
    return dt.datetime.fromisoformat(text).timestamp()


def command_text(task: Mapping[str, Any]) -> str:
    """The command as a user would type it (a --shell task's argv is the one string),
    what is not printable shown escaped, as ``ls`` shows it."""
    argv = [str(arg) for arg in task.get("argv") or []]
    return escaped(" ".join(argv) if task.get("shell") else shlex.join(argv))


def _label(task: Mapping[str, Any]) -> str:
    return escaped(str(task.get("name") or "")) or command_text(task)


def _exit_text(task: Mapping[str, Any]) -> str:
    if task.get("exit_code") is not None:
        return str(task["exit_code"])
    if task.get("signal") is not None:
        return f"signal {task['signal']}"
    return "-"


class _Clock:
    """Times as the page shows them: in one zone (the report's host's, unless told)."""

    def __init__(self, tz: dt.tzinfo | None) -> None:
        self.tz = tz

    def moment(self, ts: float) -> dt.datetime:
        moment = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
        return moment.astimezone(self.tz) if self.tz is not None else moment.astimezone()

    def full(self, ts: float | None) -> str:
        if ts is None:
            return "-"
        moment = self.moment(ts)
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"

    def zone(self, ts: float) -> str:
        offset = self.moment(ts).strftime("%z")
        return "UTC" if offset in ("", "+0000") else f"UTC{offset[:3]}:{offset[3:]}"

    def tick(self, ts: float, step_s: float, span_s: float) -> str:
        moment = self.moment(ts)
        if span_s >= 86400 * 2:
            return moment.strftime("%m-%d %H:%M")
        return moment.strftime("%H:%M" if step_s >= 60 else "%H:%M:%S")


class _Span:
    """A task's times, and what its row draws."""

    def __init__(self, task: Mapping[str, Any], now_s: float) -> None:
        self.created = parse_time(task.get("created_at"))
        self.started = parse_time(task.get("started_at"))
        self.ended = parse_time(task.get("ended_at"))
        self.settled = task.get("state") in _SETTLED
        # Not ended yet (or settled without an end time): drawn up to the report's time.
        self.open = self.ended is None
        self.end = self.ended if self.ended is not None else now_s
        if self.settled and self.ended is None:
            self.end = self.started if self.started is not None else (self.created or now_s)
        self.first = self.started if self.started is not None else (self.created or self.end)

    @property
    def took_s(self) -> float | None:
        if self.started is None:
            return None
        return max(0.0, self.end - self.started)


def _ticks(start_s: float, span_s: float) -> tuple[float, list[float]]:
    """The axis step and the tick times in [start, start + span] (on whole steps of the
    step in UTC: good enough for a zone that differs from UTC by whole hours)."""
    step = next((s for s in _STEPS_S if span_s / s <= _TICKS_MAX), _STEPS_S[-1])
    while span_s / step > _TICKS_MAX:
        step *= 2
    first = (start_s // step + 1) * step if start_s % step else start_s
    ticks = []
    moment = first
    while moment <= start_s + span_s:
        ticks.append(moment)
        moment += step
    return float(step), ticks


def _pct(value: float) -> str:
    return f"{max(0.0, min(100.0, value)):.3f}%"


def _details(task: Mapping[str, Any], span: _Span, clock: _Clock) -> str:
    """A row's details: one ``key: value`` per line (the title, and the tooltip)."""
    lines = [
        f"#{task.get('number') or '-'}  {task.get('id')}",
        f"name: {escaped(str(task.get('name') or '-'))}",
        f"state: {task.get('state')}" + (f" ({task['reason']})" if task.get("reason") else ""),
        f"exit: {_exit_text(task)}",
        f"attempt: {task.get('attempt')}",
        f"created: {clock.full(span.created)}",
        f"started: {clock.full(span.started)}",
        f"ended: {clock.full(span.ended)}",
    ]
    took = span.took_s
    if took is not None:
        lines.append(f"duration: {duration(took)}" + (" (so far)" if span.open else ""))
    if span.created is not None and span.started is not None:
        lines.append(f"waited: {duration(max(0.0, span.started - span.created))}")
    if task.get("host"):
        lines.append(f"host: {task['host']}")
    lines.append(f"command: {command_text(task)}")
    return "\n".join(lines)


def _summary(
    tasks: Sequence[Mapping[str, Any]], spans: Sequence[_Span], clock: _Clock
) -> list[str]:
    counts = {state: 0 for state in STATE_ORDER}
    for task in tasks:
        counts[str(task.get("state"))] = counts.get(str(task.get("state")), 0) + 1
    starts = [s.started for s in spans if s.started is not None]
    ends = [s.ended for s in spans if s.ended is not None]
    busy = sum(s.took_s or 0.0 for s in spans)
    cards: list[tuple[str, str, str | None]] = [("Tasks", f"{len(tasks):,}", None)]
    cards += [(state, f"{n:,}", state) for state, n in counts.items() if n]
    first, last = (min(starts) if starts else None), (max(ends) if ends else None)
    wall = duration(last - first) if first is not None and last is not None else "-"
    cards += [
        ("Wall time", wall, None),
        ("Task time (sum)", duration(busy) if starts else "-", None),
        ("First start", clock.full(first)[:19] if first else "-", None),
        ("Last end", clock.full(last)[:19] if last else "-", None),
    ]
    timed = [(s.took_s, s, t) for s, t in zip(spans, tasks, strict=True) if s.took_s is not None]
    if timed:
        took, span, slowest = max(timed, key=lambda each: each[0] or 0.0)
        name = f"#{slowest.get('number') or '-'} {_label(slowest)}"
        name = name if len(name) <= 40 else name[:39] + "…"
        so_far = " (so far)" if span.open else ""  # (still running: not its duration yet)
        cards.append((f"Longest: {name}", duration(took or 0.0) + so_far, None))
    out = ['<dl class="summary" id="summary">']
    for title, value, state in cards:
        swatch = f'<span class="sw" style="background:{_COLOURS[state]}"></span>' if state else ""
        out.append(
            f'<div class="card"><dt>{swatch}{html.escape(title)}</dt>'
            f"<dd>{html.escape(value)}</dd></div>"
        )
    out.append("</dl>")
    return out


def _filters(tasks: Sequence[Mapping[str, Any]]) -> list[str]:
    present = [s for s in STATE_ORDER if any(t.get("state") == s for t in tasks)]
    out = ['<fieldset id="filters" hidden><span>Show:</span>']
    for state in present:
        count = sum(1 for t in tasks if t.get("state") == state)
        out.append(
            f'<label><input type="checkbox" value="{state}" checked> '
            f'<span class="sw" style="background:{_COLOURS[state]}"></span>'
            f"{state} ({count:,})</label>"
        )
    out.append('<span id="shown"></span></fieldset>')
    return out


def _timeline(
    tasks: Sequence[Mapping[str, Any]], spans: Sequence[_Span], clock: _Clock, now_s: float
) -> list[str]:
    if not tasks:
        return ['<div class="timeline"><div class="empty">No tasks.</div></div>']
    start = min(s.first for s in spans)
    stop = max(max(s.end for s in spans), start)
    span_s = max(stop - start, 1.0)
    step, ticks = _ticks(start, span_s)

    def at(ts: float) -> float:
        return (ts - start) / span_s * 100.0

    # The number column as wide as the widest "#N" (the names then line up past #99).
    widest = max(len(str(task.get("number") or "-")) for task in tasks) + 1
    out = [f'<div class="timeline" style="--n:{widest + 0.5}ch">',
           '<div class="axis"><div class="ticks">']  # fmt: skip
    out += [
        f'<span class="tick" style="left:{_pct(at(t))}">{clock.tick(t, step, span_s)}</span>'
        for t in ticks
    ]
    out.append('</div></div><div class="lines">')
    out += [f'<i style="left:{_pct(at(t))}"></i>' for t in ticks]
    out.append('</div><div class="rows">')
    for index, (task, span) in enumerate(zip(tasks, spans, strict=True)):
        state = str(task.get("state"))
        colour = _COLOURS.get(state, "#6e7781")
        parts = []
        if span.started is not None or span.settled:
            # Time in the queue (clipped to the axis), then the run, or a mark at the end
            # of a task that never ran (cancelled while queued, refused before spawn).
            begin = span.started if span.started is not None else span.end
            if span.created is not None and span.created < begin:
                left = at(max(span.created, start))
                parts.append(
                    f'<div class="wait" style="left:{_pct(left)};'
                    f'width:{_pct(at(begin) - left)}"></div>'
                )
            if span.started is not None:
                kind = "bar open" if span.open else "bar"
                left, right = at(span.started), at(span.end)
                style = f"left:{_pct(left)};width:{_pct(right - left)}"
            else:
                kind = "bar mark"
                style = f"left:calc({_pct(at(span.end))} - 1px)"
        else:
            # Waiting (never started, not settled): an outline from submission to now.
            kind = "bar pending"
            left = at(span.created if span.created is not None else now_s)
            style = f"left:{_pct(left)};width:{_pct(at(now_s) - left)}"
        colour_style = (
            f"border-color:{colour}" if kind == "bar pending" else f"background-color:{colour}"
        )
        parts.append(f'<div class="{kind}" style="{style};{colour_style}"></div>')
        number = task.get("number") or "-"
        out.append(
            f'<div class="row" tabindex="0" data-state="{html.escape(state)}" data-i="{index}"'
            f' title="{html.escape(_details(task, span, clock))}">'
            f'<div class="label"><span class="n">#{number}</span>'
            f"{html.escape(_label(task))}</div>"
            f'<div class="track">{"".join(parts)}</div></div>'
        )
    out.append("</div></div>")
    return out


def _table(tasks: Sequence[Mapping[str, Any]], spans: Sequence[_Span], clock: _Clock) -> list[str]:
    head = ("#", "id", "state", "reason", "exit", "started", "duration", "name", "command")
    out = [
        "<details><summary>All tasks as a table</summary>",
        "<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>",
    ]
    for task, span in zip(tasks, spans, strict=True):
        took = span.took_s
        cells = [
            str(task.get("number") or "-"),
            str(task.get("id")),
            str(task.get("state")),
            str(task.get("reason") or "-"),
            _exit_text(task),
            clock.full(span.started)[:19] if span.started is not None else "-",
            "-" if took is None else duration(took),
            escaped(str(task.get("name") or "-")),
        ]
        out.append(
            f'<tr data-state="{html.escape(str(task.get("state")))}">'
            + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
            + f'<td class="cmd mono">{html.escape(command_text(task))}</td></tr>'
        )
    out.append("</tbody></table></details>")
    return out


def _damage(damage: str | None) -> list[str]:
    if damage is None:
        return []
    text = (
        f"The journal is damaged ({escaped(damage)}): this page shows the tasks as far as"
        " it could be read, and the others are missing. 'ferry journal verify' says where;"
        " 'ferry journal salvage' keeps what can be kept."
    )
    return [f'<p class="damage" role="alert">{html.escape(text)}</p>']


def build(
    tasks: Sequence[Mapping[str, Any]],
    *,
    now_s: float,
    scope: str = "",
    tz: dt.tzinfo | None = None,
    damage: str | None = None,
) -> str:
    """The page for ``tasks`` (task objects in submission order) at time ``now_s``;
    ``scope`` says which tasks these are (the filters), in words; ``tz``: the zone
    times are shown in (None: this host's); ``damage``: what stopped the journal's
    reading (the page then says it shows what came before it)."""
    clock = _Clock(tz)
    spans = [_Span(task, now_s) for task in tasks]
    count = f"{len(tasks):,} task" + ("" if len(tasks) == 1 else "s")
    meta = (
        f"{count}{' (' + scope + ')' if scope else ''}, reported {clock.full(now_s)[:19]};"
        f" times in {clock.zone(now_s)}. Hover over a row for its details."
    )
    page = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>ferry report: {html.escape(count)}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>ferry report</h1>",
        f'<p class="meta">{html.escape(meta)}</p>',
        *_damage(damage),
        *_summary(tasks, spans, clock),
        "<h2>Timeline</h2>",
        *_filters(tasks),
        *_timeline(tasks, spans, clock, now_s),
        *_table(tasks, spans, clock),
        '<div id="tip" role="tooltip"></div>',
        '<script type="application/json" id="ferry-tasks">',
        embed_json(list(tasks)),
        "</script>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(page) + "\n"
