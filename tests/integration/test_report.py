"""``ferry report --html FILE`` (contract.md, "Daily use"): one self-contained page of the
tasks, made by the real command from real tasks, on both backends. The page itself is
read with the standard library's HTML parser; ``test_report_browser.py`` renders it in
a real browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pytest
from clikit import Ferry

pytestmark = pytest.mark.timeout(120)

EVIL_NAME = "</script><script>alert(1)</script>"


class Page(HTMLParser):
    """What a report page is made of: its tags (with attributes), the text of each
    script element, and the rows and bars of its timeline."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._in_script: dict[str, str | None] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = dict(attrs)
            self.scripts.append((self._in_script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = None

    def handle_data(self, data: str) -> None:
        if self._in_script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def classed(self, name: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.tags if name in (a.get("class") or "").split()]

    def tasks(self) -> list[dict[str, Any]]:
        """The embedded task objects."""
        [text] = [t for a, t in self.scripts if a.get("type") == "application/json"]
        tasks: list[dict[str, Any]] = orjson.loads(text)
        return tasks


def report(ferry: Ferry, path: Path, *args: str) -> Page:
    result = ferry.ok("report", "--html", str(path), *args)
    page = Page(path.read_text(encoding="utf-8"))
    count = len(page.tasks())
    assert result.text == f"wrote {path}: {count} task{'' if count == 1 else 's'}\n"
    return page


def four_tasks(ferry: Ferry) -> dict[str, str]:
    """One task of each kind: SUCCEEDED, FAILED (exit 3), CANCELLED before it ran, and
    one still QUEUED. Their ids by kind."""
    ferry.ok("run", "--name", "ok", "--", "true")
    ferry.ok("run", "--name", "bad", "--", "sh", "-c", "exit 3", codes=(3,))
    cancelled = ferry.ok("submit", "--name", "never", "--", "sleep", "60").text.strip()
    ferry.ok("cancel", cancelled)
    queued = ferry.ok("submit", "--name", "waiting", "--", "true").text.strip()
    ids = {t["name"]: t["id"] for t in ferry.tasks()}
    assert ids["never"] == cancelled and ids["waiting"] == queued
    return ids


def test_the_page_holds_every_task_its_summary_and_one_bar_each(
    ferry: Ferry, tmp_path: Path
) -> None:
    ids = four_tasks(ferry)
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    page = report(ferry, out)
    # The embedded JSON is ls --json's task objects, all of them, in submission order.
    listed = ferry.json("ls", "--limit", "0")
    embedded = page.tasks()
    assert [t["id"] for t in embedded] == [t["id"] for t in listed] == list(ids.values())
    settled = [t for t in embedded if t["state"] != "QUEUED"]
    assert settled == [t for t in listed if t["state"] != "QUEUED"]
    by_name = {t["name"]: t for t in embedded}
    assert by_name["ok"]["state"] == "SUCCEEDED" and by_name["ok"]["exit_code"] == 0
    assert by_name["bad"]["state"] == "FAILED" and by_name["bad"]["exit_code"] == 3
    assert by_name["never"]["state"] == "CANCELLED" and by_name["never"]["started_at"] is None
    assert by_name["waiting"]["state"] == "QUEUED"
    # One row and one bar per task, each row saying its state; the two that ran are
    # drawn from start to end, the cancelled one as a mark, the queued one as pending.
    rows = page.classed("row")
    assert [r["data-state"] for r in rows] == ["SUCCEEDED", "FAILED", "CANCELLED", "QUEUED"]
    bars = page.classed("bar")
    assert len(bars) == 4
    assert [b["class"] for b in bars] == ["bar", "bar", "bar mark", "bar pending"]
    # The summary counts each state; the table fallback has a row per task too.
    text = out.read_text()
    summary = text[text.index('id="summary"') : text.index("</dl>")]
    for state in ("SUCCEEDED", "FAILED", "CANCELLED", "QUEUED"):
        assert re.search(rf"{state}</dt><dd>1</dd>", summary), state
    assert "Tasks</dt><dd>4</dd>" in summary
    assert len([1 for tag, a in page.tags if tag == "tr" and "data-state" in a]) == 4
    # Written whole: nothing else in its directory (no temporary file left).
    assert os.listdir(out.parent) == ["report.html"]


def test_a_task_name_cannot_inject_markup_or_script(ferry: Ferry, tmp_path: Path) -> None:
    ferry.ok("run", "--name", EVIL_NAME, "--", "echo", "<!--", "</script>", "&amp;", "\u2028")
    ferry.ok("run", "--shell", "--", "echo '<script>alert(2)</script>' # <b>")
    out = tmp_path / "r.html"
    page = report(ferry, out)
    # Exactly the page's own two scripts: the data, then the code; the data is inert.
    assert [a.get("type") for a, _ in page.scripts] == ["application/json", None]
    assert out.read_text().lower().count("<script") == 2
    [data, code] = [t for _, t in page.scripts]
    assert "data-ready" in code  # (the page's own)
    assert "<" not in data and ">" not in data and "&" not in data and "\u2028" not in data
    # The user's text comes back exactly.
    embedded = page.tasks()
    assert embedded[0]["name"] == EVIL_NAME
    assert embedded[0]["argv"] == ["echo", "<!--", "</script>", "&amp;", "\u2028"]
    assert embedded[1]["argv"] == ["echo '<script>alert(2)</script>' # <b>"]
    # No tag came from the user's text: only the page's own (no <b> in a label).
    assert {tag for tag, _ in page.tags} <= {
        "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "dl", "div",
        "dt", "dd", "span", "fieldset", "label", "input", "i", "details", "summary",
        "table", "thead", "tbody", "tr", "th", "td", "script",
    }  # fmt: skip
    assert EVIL_NAME.replace("<", "&lt;").replace(">", "&gt;") in out.read_text()


def test_the_page_fetches_nothing(ferry: Ferry, tmp_path: Path) -> None:
    """No URL in any attribute or style (a task's command may mention one as text), and
    a Content-Security-Policy that forbids every fetch anyway."""
    ferry.ok("run", "--", "echo", "https://example.com/x.js", "//cdn.example.com/y.css")
    out = tmp_path / "r.html"
    page = report(ferry, out)
    for tag, attrs in page.tags:
        for name, value in attrs.items():
            assert name not in ("src", "href", "action", "srcset", "poster", "data"), tag
            if name != "title":  # a row's details are text, shown as text
                assert not re.search(r"(https?:)?//", value or ""), (tag, name, value)
    text = out.read_text()
    assert "url(" not in text and "@import" not in text
    [csp] = [a["content"] for t, a in page.tags if a.get("http-equiv") == "Content-Security-Policy"]
    assert csp is not None and "default-src 'none'" in csp and "script-src 'sha256-" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]


def test_state_and_since_narrow_the_page(ferry: Ferry, tmp_path: Path) -> None:
    ids = four_tasks(ferry)
    out = tmp_path / "r.html"
    page = report(ferry, out, "--state", "FAILED", "--state", "cancelled")
    assert [t["id"] for t in page.tasks()] == [ids["bad"], ids["never"]]
    assert len(page.classed("bar")) == 2
    assert "state CANCELLED or FAILED" in out.read_text()
    # --since: the tasks not settled before then. A duration: 1h is all of them; 0s (now)
    # only the one not settled at all.
    assert len(report(ferry, out, "--since", "1h").tasks()) == 4
    assert [t["id"] for t in report(ferry, out, "--since", "0s").tasks()] == [ids["waiting"]]
    # An RFC 3339 time: the queued task's submission, after the others ended.
    created = ferry.task(ids["waiting"])["created_at"]
    assert [t["id"] for t in report(ferry, out, "--since", created).tasks()] == [ids["waiting"]]
    # Both at once; and the JSON (ls --json) agrees on the states.
    page = report(ferry, out, "--since", "7d", "--state", "SUCCEEDED")
    assert [t["id"] for t in page.tasks()] == [ids["ok"]]
    result = ferry.refused(2, "usage.bad_since", "report", "--html", str(out), "--since", "soon")
    assert "2h" in result.err
    ferry.refused(2, "usage.invalid", "report", "--html", str(out), "--state", "DONE")
    ferry.refused(2, "usage.invalid", "report")  # --html is required


def test_no_tasks_is_a_page_that_says_so(ferry: Ferry, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    page = report(ferry, out, "--state", "RUNNING")
    assert page.tasks() == [] and page.classed("bar") == []
    assert "No tasks." in out.read_text()


def test_stdout_and_json(ferry: Ferry, tmp_path: Path) -> None:
    ferry.ok("run", "--", "true")
    result = ferry.ok("report", "--html", "-")
    assert result.out.startswith(b"<!DOCTYPE html>") and result.err == ""
    assert len(Page(result.text).tasks()) == 1
    out = tmp_path / "r.html"
    obj = ferry.json("report", "--html", str(out))
    assert obj == {"path": str(out), "tasks": 1, "bytes": out.stat().st_size}
    assert ferry.ok("report", "--html", str(out), "--json").json() == obj  # --json after
    assert ferry.ok("-q", "report", "--html", str(out)).out == b""
    ferry.refused(2, "usage.invalid", "--json", "report", "--html", "-")


def test_an_unwritable_file_is_one_coded_error_and_the_old_page_stays(
    ferry: Ferry, tmp_path: Path
) -> None:
    ferry.ok("run", "--", "true")
    missing = tmp_path / "no-such-dir" / "r.html"
    result = ferry.refused(125, "report.unwritable", "report", "--html", str(missing))
    assert f"cannot write the report to {missing}: No such file or directory" in result.err
    # A directory however it is named (``.``, ``..`` and ``DIR/``, which renaming over
    # answered "Device or resource busy" and "Not a directory").
    for directory in (str(tmp_path), f"{tmp_path}/.", f"{tmp_path}/..", f"{tmp_path}/"):
        result = ferry.refused(125, "report.unwritable", "report", "--html", directory)
        assert f"cannot write the report to {directory}: Is a directory" in result.err
    # A page replaced by a new one that cannot be written: the old one is left whole, and
    # no temporary file.
    out = tmp_path / "keep" / "r.html"
    out.parent.mkdir()
    out.write_text("old page")
    if os.geteuid() != 0:  # root writes into a read-only directory all the same
        out.parent.chmod(0o500)
        try:
            result = ferry.refused(125, "report.unwritable", "report", "--html", str(out))
            assert "Permission denied" in result.err
        finally:
            out.parent.chmod(0o700)
        assert out.read_text() == "old page" and os.listdir(out.parent) == ["r.html"]


def test_a_file_that_is_a_device_is_written_into_never_replaced(
    ferry: Ferry, tmp_path: Path
) -> None:
    """FILE a character device (or a FIFO; here through a symlink, so that no test
    touches /dev itself) is written into, as a shell's ``>`` would: renaming a page over
    it replaced the device with a regular file (as root, ``--html /dev/full`` left a
    file at /dev/full, and said it wrote it)."""
    ferry.ok("run", "--", "true")
    null, full = tmp_path / "null.html", tmp_path / "full.html"
    null.symlink_to("/dev/null")
    full.symlink_to("/dev/full")
    ferry.ok("report", "--html", str(null))
    result = ferry.refused(125, "report.unwritable", "report", "--html", str(full))
    assert "No space left on device" in result.err
    assert null.is_symlink() and full.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["full.html", "home", "null.html"]


def test_a_page_written_to_stdout_by_its_name_is_the_page_alone(ferry: Ferry) -> None:
    """``--html /dev/stdout`` (a CI step that names it so) is the page and nothing
    more, as ``--html -``: "wrote /dev/stdout: 1 task" followed the page into it."""
    ferry.ok("run", "--", "true")
    named = ferry.ok("report", "--html", "/dev/stdout").out
    assert named.rstrip().endswith(b"</html>") and named.count(b"<!DOCTYPE html>") == 1


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (apt-get install strace)")
def test_a_crash_or_a_failed_rename_leaves_the_old_page_whole(ferry: Ferry, tmp_path: Path) -> None:
    """The page is written beside the file and renamed over it: killed just before the
    rename, or the rename failing, the reader still has the old page, whole."""
    ferry.ok("run", "--", "true")
    out = tmp_path / "r.html"
    out.write_text("old page")
    strace = ["strace", "-f", "-qq", "-o", "/dev/null", "-e"]
    # rename(2) or renameat(2) by Python's os.replace: the first rename ferry makes.
    killed = ferry(
        "report", "--html", str(out),
        command=[*strace, "inject=rename,renameat,renameat2:signal=SIGKILL:when=1",
                 *ferry.command],
    )  # fmt: skip
    assert killed.code == -9 or killed.code == 137, killed
    assert out.read_text() == "old page"
    left = sorted(os.listdir(tmp_path))
    assert left[0].startswith(".r.html.") and left[0].endswith(".tmp") and left[1:] == [
        "home", "r.html",
    ], left  # fmt: skip
    os.unlink(tmp_path / left[0])
    failed = ferry(
        "report", "--html", str(out),
        command=[*strace, "inject=rename,renameat,renameat2:error=EIO:when=1", *ferry.command],
    )  # fmt: skip
    assert failed.code == 125 and failed.error_code() == "report.unwritable", failed
    assert out.read_text() == "old page"
    assert sorted(os.listdir(tmp_path)) == ["home", "r.html"]
    ferry.ok("report", "--html", str(out))  # and without a fault, it is replaced
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_a_page_of_a_damaged_journal_says_it_is_not_the_whole_story(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A bit flipped in the second task's record: ``report`` writes the page of what it
    could read and exits 4, naming the damage on stderr; the page itself (the artifact a
    CI job keeps and mails) said "1 task" and nothing of the damage (found by a review)."""
    for _ in range(4):
        ferry.ok("run", "--", "true")
    segment = sorted((ferry.home / "journal").glob("*.jsonl"))[0]
    data = segment.read_bytes()
    second = data.index(b'"type":"SUBMITTED"', data.index(b'"type":"SUBMITTED"') + 1)
    segment.write_bytes(data[:second] + b"X" + data[second + 1 :])
    page = tmp_path / "r.html"
    ferry.refused(4, "journal.corrupt", "report", "--html", str(page))
    text = page.read_text()
    assert '<p class="damage" role="alert">' in text
    assert "The journal is damaged" in text and "ferry journal salvage" in text
    assert "1 task" in text  # (what could be read)


def test_the_same_page_from_a_shared_database(pg_url: str, tmp_path: Path) -> None:
    """The command reads tasks through the same seam as ls: on PostgreSQL too, with the
    same filters."""
    ferry = Ferry(tmp_path / "a")
    ferry.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    try:
        ferry.ok("db", "init")
        ids = four_tasks(ferry)
        out = tmp_path / "r.html"
        page = report(ferry, out)
        assert [t["id"] for t in page.tasks()] == list(ids.values())
        assert len(page.classed("bar")) == 4
        assert page.tasks()[0]["host"] == "a"
        page = report(ferry, out, "--state", "FAILED", "--state", "CANCELLED")
        assert [t["id"] for t in page.tasks()] == [ids["bad"], ids["never"]]
        assert [t["id"] for t in report(ferry, out, "--since", "0s").tasks()] == [ids["waiting"]]
    finally:
        ferry.close()


def test_the_help_shows_an_example() -> None:
    out = subprocess.run(
        [*Ferry(Path("/nonexistent")).command, "report", "--help"],
        capture_output=True, check=True, text=True,
    ).stdout  # fmt: skip
    assert "ferry report --html ferry-report.html" in out
