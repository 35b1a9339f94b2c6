"""The report page's pure parts (``ferry.cli.report_page``) and ``--since``'s parsing
(``ferry.cli.report_command``): made from hand-made task objects, read back with the
standard library's HTML parser. The command end to end: tests/integration/test_report.py."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import re
from html.parser import HTMLParser
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.cli import report_page
from ferry.cli.report_command import active_since, parse_since
from ferry.core.errors import UsageError

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
UTC = dt.UTC


def at(offset_s: float | None) -> str | None:
    if offset_s is None:
        return None
    moment = dt.datetime.fromtimestamp(T0 + offset_s, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def task(
    number: int,
    state: str,
    *,
    created: float = 0.0,
    started: float | None = None,
    ended: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "id": f"01task{number:010d}",
        "number": number,
        "name": None,
        "argv": ["true"],
        "shell": False,
        "state": state,
        "reason": None,
        "attempt": 1,
        "exit_code": None,
        "signal": None,
        "created_at": at(created),
        "started_at": at(started),
        "ended_at": at(ended),
        "host": None,
    }
    obj.update(extra)
    return obj


class Bars(HTMLParser):
    """Each bar's class and left/width (percent), by row."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.bars: list[tuple[str, float | None, float | None]] = []
        self.rows: list[str] = []
        self.scripts: list[str] = []
        self._script = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        classes = (named.get("class") or "").split()
        if "row" in classes:
            self.rows.append(named.get("data-state") or "")
        if "bar" in classes:
            style = named.get("style") or ""
            left = re.search(r"left:(?:calc\()?([\d.]+)%", style)
            width = re.search(r"width:([\d.]+)%", style)
            self.bars.append(
                (
                    " ".join(classes),
                    float(left.group(1)) if left else None,
                    float(width.group(1)) if width else None,
                )
            )
        self._script = tag == "script" and "type" not in named

    def handle_data(self, data: str) -> None:
        if self._script:
            self.scripts.append(data)
            self._script = False


def build(tasks: list[dict[str, Any]], now: float = 100.0) -> str:
    return report_page.build(tasks, now_s=T0 + now, tz=UTC)


def test_each_task_is_one_bar_placed_on_one_time_axis() -> None:
    page = build(
        [
            task(1, "SUCCEEDED", started=0.0, ended=50.0),
            task(2, "FAILED", created=0.0, started=50.0, ended=100.0, exit_code=2),
            task(3, "RUNNING", created=10.0, started=60.0),  # to now (100), open
            task(4, "QUEUED", created=80.0),  # an outline from submission to now
            task(5, "CANCELLED", created=20.0, ended=40.0),  # never ran: a mark
        ],
        now=100.0,
    )
    bars = Bars(page)
    assert bars.rows == ["SUCCEEDED", "FAILED", "RUNNING", "QUEUED", "CANCELLED"]
    assert bars.bars == [
        ("bar", 0.0, 50.0),
        ("bar", 50.0, 50.0),
        ("bar open", 60.0, 40.0),
        ("bar pending", 80.0, 20.0),
        ("bar mark", 40.0, None),
    ]
    # Time waited in the queue, before the run: task 2 waited 50 s, drawn 0..50%.
    assert 'class="wait" style="left:0.000%;width:50.000%"' in page


def test_a_wait_from_long_before_is_clipped_to_the_axis() -> None:
    """A task retried today was created last month: its wait must not squash the axis."""
    page = build(
        [
            task(1, "SUCCEEDED", created=-30 * 86400, started=0.0, ended=10.0),
            task(2, "SUCCEEDED", created=0.0, started=10.0, ended=20.0),
        ],
        now=20.0,
    )
    assert Bars(page).bars == [("bar", 0.0, 50.0), ("bar", 50.0, 50.0)]
    assert 'class="wait" style="left:0.000%;width:0.000%"' in page


def test_the_summary_counts_states_and_times() -> None:
    page = build(
        [
            task(1, "SUCCEEDED", started=0.0, ended=30.0),
            task(2, "SUCCEEDED", started=10.0, ended=70.0, name="slow one"),
            task(3, "FAILED", started=20.0, ended=25.0),
        ]
    )
    summary = page[page.index('id="summary"') : page.index("</dl>")]
    cards = dict(re.findall(r"<dt>(?:<span[^>]*></span>)?([^<]+)</dt><dd>([^<]+)</dd>", summary))
    assert cards == {
        "Tasks": "3",
        "SUCCEEDED": "2",
        "FAILED": "1",
        "Wall time": "1m10s",
        "Task time (sum)": "1m35s",
        "First start": "2023-11-14 22:13:20",
        "Last end": "2023-11-14 22:14:30",
        "Longest: #2 slow one": "1m00s",
    }


def test_the_script_is_the_one_the_policy_allows() -> None:
    page = build([task(1, "SUCCEEDED", started=0.0, ended=1.0)])
    [script] = Bars(page).scripts
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in page


def test_no_tasks() -> None:
    page = build([])
    assert Bars(page).bars == [] and "No tasks." in page and "Tasks</dt><dd>0</dd>" in page


@given(st.lists(st.text(), max_size=5))
def test_embedded_json_is_inert_in_a_script_and_reads_back(texts: list[str]) -> None:
    value = [{"name": t, "argv": [t, "</script>", "<!--"]} for t in texts]
    embedded = report_page.embed_json(value)
    assert not set(embedded) & set("<>&\u2028\u2029")
    assert orjson.loads(embedded) == value


@pytest.mark.parametrize(
    ("given_text", "expected"),
    [
        ("90s", T0 - 90),
        ("30m", T0 - 1800),
        ("2h", T0 - 7200),
        ("1.5h", T0 - 5400),
        ("7d", T0 - 7 * 86400),
        ("2w", T0 - 14 * 86400),
        ("0s", T0),
        ("2023-11-14T22:13:20Z", T0),
        ("2023-11-14T23:13:20+01:00", T0),
        ("2023-11-14T22:13:20.500Z", T0 + 0.5),
    ],
)
def test_since_takes_a_duration_or_an_rfc3339_time(given_text: str, expected: float) -> None:
    assert parse_since(given_text, T0) == expected


def test_since_without_an_offset_is_local_time() -> None:
    local = dt.datetime(2023, 11, 14, 12, 0, 0).timestamp()
    assert parse_since("2023-11-14T12:00:00", T0) == local
    assert parse_since("2023-11-14", T0) == dt.datetime(2023, 11, 14).timestamp()


@pytest.mark.parametrize("bad", ["", "soon", "2 h", "-2h", "2y", "h", "2023-13-01", "1e3s"])
def test_since_refuses_anything_else(bad: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_since(bad, T0)
    assert caught.value.code == "usage.bad_since"


class _Task:
    def __init__(
        self, created: float, started: float | None, ended: float | None, terminal: bool
    ) -> None:
        self.created_at, self.started_at, self.ended_at = created, started, ended
        self.terminal = terminal


def test_active_since_keeps_what_was_not_settled_before() -> None:
    old = _Task(0.0, 1.0, 2.0, True)
    spans = _Task(0.0, 1.0, 20.0, True)  # started before, ended after
    later = _Task(15.0, 16.0, 17.0, True)
    running = _Task(0.0, 1.0, None, False)
    queued = _Task(0.0, None, None, False)
    no_end = _Task(0.0, None, None, True)  # settled, no end time: its creation counts
    kept = active_since([old, spans, later, running, queued, no_end], 10.0)  # type: ignore[list-item]
    assert kept == [spans, later, running, queued]


def test_the_longest_task_still_running_is_said_to_be_so_far() -> None:
    page = build(
        [
            task(1, "SUCCEEDED", started=0.0, ended=30.0),
            task(2, "RUNNING", started=10.0, name="long job"),  # 90 s by now
        ],
        now=100.0,
    )
    assert "Longest: #2 long job</dt><dd>1m30s (so far)</dd>" in page


def test_the_number_column_holds_the_widest_number() -> None:
    """Past #99 the names moved right by a digit's width, row by row (seen in the
    screenshot of 200 tasks): the column is now as wide as the widest "#N"."""
    page = build([task(n, "SUCCEEDED", started=0.0, ended=1.0) for n in (1, 99, 200)])
    assert '<div class="timeline" style="--n:4.5ch">' in page
    assert "min-width: var(--n" in page and "tabular-nums" in page


def test_control_and_direction_characters_are_shown_escaped() -> None:
    """A task's argv or name may hold an escape sequence or a direction override
    (U+202E makes ``report-\\u202egpj.sh`` read ``report-hs.jpg``): shown escaped, as
    ``ls`` shows them; the page held them raw (found by a review). The embedded JSON
    keeps the exact strings."""
    argv = ["echo", "\x1b]0;owned\x07", "report-\u202egpj.sh"]
    page = build([task(1, "SUCCEEDED", argv=argv), task(2, "QUEUED", name="n\u202eame\x1b[2J")])
    shown = re.sub(r"(?s)<script.*?</script>", "", page)
    assert not {"\x1b", "\x07", "\u202e"} & set(shown), [
        c for c in shown if not c.isprintable() and c not in "\n"
    ]
    assert "\\x1b]0;owned\\x07" in shown and "report-\\u202egpj.sh" in shown
