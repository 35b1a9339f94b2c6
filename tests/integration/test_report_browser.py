"""``ferry report --html`` in a real browser: headless Chromium opens the page from a file
(no network), runs its script under its Content-Security-Policy, and renders it.

Marked ``browser`` and run by ``tox -e browser`` only (the default CI does not install a
browser); skipped, saying why, when no Chromium is found ($FERRY_TEST_CHROMIUM, else
``chromium``, ``chromium-browser``, ``google-chrome`` on PATH; Debian: ``apt-get install
chromium``). The screenshot and the page are kept in ``.artifacts/`` at the top of the
repository (``report.png``, ``report.html``; for a batch of 200, ``report-200.png``,
``report-200.html``; gitignored) for a person to look at.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from clikit import Ferry, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts"
WINDOW = (1400, 900)
BROWSER_S = 120.0


def chromium() -> str | None:
    named = os.environ.get("FERRY_TEST_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Dom(HTMLParser):
    """The rendered DOM as ``--dump-dom`` prints it: bars, rows, body attributes, the
    filter's line and whether the filter is shown."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.bars = self.rows = self.scripts = 0
        self.body: dict[str, str | None] = {}
        self.filters_hidden: bool | None = None
        self.shown = ""
        self._in_shown = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        classes = (named.get("class") or "").split()
        self.bars += "bar" in classes
        self.rows += "row" in classes
        self.scripts += tag == "script"
        if tag == "body":
            self.body = named
        if named.get("id") == "filters":
            self.filters_hidden = "hidden" in named
        self._in_shown = named.get("id") == "shown"

    def handle_endtag(self, tag: str) -> None:
        self._in_shown = False

    def handle_data(self, data: str) -> None:
        if self._in_shown:
            self.shown += data


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def make_twenty_tasks(ferry: Ferry) -> str:
    """Twenty tasks in every kind of state a report shows: succeeded, failed (exit and
    signal), cancelled before running, one running now (its id returned: cancel it),
    queued, and one with a hostile name."""
    lines = [f"sleep 0.{n % 4} && echo step {n}" for n in range(10)]
    lines += ["sleep 0.2; exit 1", "exit 2", "sleep 0.1; kill -9 $$", "echo 'tests <b>'"]
    ferry.ok("submit", "--lines", "-", stdin="\n".join(lines).encode())
    for name in ("skipped", "also skipped"):
        ferry.ok("cancel", ferry.ok("submit", "--name", name, "--", "true").text.strip())
    ferry.ok("work", "-j", "2", "--drain", codes=(1,))
    ferry.ok("run", "--name", "</script><script>alert(1)</script>", "--", "true")
    ferry.start("run", "--name", "running now", "--", "sleep", "120")
    running = wait_until(
        lambda: [t["id"] for t in ferry.tasks() if t["state"] == "RUNNING"],
        what="the task 'running now' to run",
    )
    for name in ("queued 1", "queued 2"):
        ferry.ok("submit", "--name", name, "--", "true")
    assert len(ferry.tasks()) == 20
    return str(running[0])


def run_browser(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         *args],
        capture_output=True, timeout=BROWSER_S, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_report_renders_one_bar_per_task_in_chromium(ferry: Ferry, tmp_path: Path) -> None:
    binary = chromium()
    if binary is None:
        pytest.skip(
            "no Chromium found (set FERRY_TEST_CHROMIUM, or apt-get install chromium): "
            "the browser test needs a real browser"
        )
    running = make_twenty_tasks(ferry)
    page = tmp_path / "report.html"
    try:
        ferry.ok("report", "--html", str(page))
    finally:  # the running task holds its `run`'s pipes: end it, so that `run` ends
        ferry.ok("cancel", running)
        [run] = ferry.background
        run.communicate(timeout=60)
    url = page.resolve().as_uri()
    profile = tmp_path / "chromium-profile"

    dumped = run_browser(binary, profile, "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr.decode(errors="replace")
    dom = Dom(dumped.stdout.decode())
    # The script ran (its hash is the one the page's policy allows) and saw 20 rows.
    assert dom.body.get("data-ready") == "20", dom.body
    assert dom.filters_hidden is False and dom.shown == "20 of 20 shown"
    assert dom.rows == 20 and dom.bars == 20
    assert dom.scripts == 2  # the page's own: no name became markup

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    width, height = WINDOW
    taken = run_browser(
        binary, profile, f"--screenshot={shot}", f"--window-size={width},{height}",
        "--hide-scrollbars", url,
    )  # fmt: skip
    assert taken.returncode == 0 and shot.exists(), taken.stderr.decode(errors="replace")
    assert png_size(shot) == WINDOW
    shutil.copyfile(page, ARTIFACTS / "report.html")
    print(f"screenshot: {shot}\npage: {ARTIFACTS / 'report.html'}")


def make_two_hundred_tasks(ferry: Ferry) -> subprocess.Popen[bytes]:
    """200 tasks as a batch leaves them: 185 run by a drain (about one in nine failing,
    one in 23 killed by a signal, ten cancelled while queued), then ten long ones
    running under a worker (returned: stop it) and five queued behind them."""
    lines = []
    for n in range(185):
        pause = ("0", "0.05", "0.1", "0.2")[n % 4]
        if n % 9 == 4:
            lines.append(f"sleep {pause}; echo step {n} failed >&2; exit {1 + n % 5}")
        elif n % 23 == 7:
            lines.append(f"sleep {pause}; kill -9 $$")
        else:
            lines.append(f"sleep {pause} && echo step {n}")
    ferry.ok("submit", "--lines", "-", stdin="\n".join(lines).encode())
    ferry.ok("cancel", *(str(number) for number in range(10, 186, 18)))
    ferry.ok("work", "-j", "4", "--drain", codes=(1,))
    long_jobs = b"".join(b'{"name": "long job %d", "argv": ["sleep", "120"]}\n' % n
                         for n in range(1, 11))  # fmt: skip
    ferry.ok("submit", "--from", "-", stdin=long_jobs)
    worker = ferry.start("work", "-j", "10", "--poll", "0.05")
    wait_until(
        lambda: sum(t["state"] == "RUNNING" for t in ferry.tasks()) == 10,
        what="the ten long jobs to run",
    )
    queued = b"".join(b'{"name": "queued %d", "argv": ["true"]}\n' % n for n in range(1, 6))
    ferry.ok("submit", "--from", "-", stdin=queued)
    states = [t["state"] for t in ferry.tasks()]
    assert len(states) == 200 and states.count("RUNNING") == 10 and states.count("QUEUED") == 5
    return worker


def test_two_hundred_tasks_render_one_bar_each(ferry: Ferry, tmp_path: Path) -> None:
    """What a batch's report looks like: the screenshot is kept as
    ``.artifacts/report-200.png`` (the first 2,000 pixels: the summary and about 85 rows)."""
    binary = chromium()
    if binary is None:
        pytest.skip("no Chromium found (set FERRY_TEST_CHROMIUM, or apt-get install chromium)")
    worker = make_two_hundred_tasks(ferry)
    page = tmp_path / "report.html"
    try:
        ferry.ok("report", "--html", str(page))
    finally:  # the long jobs end, then the worker, which would claim the queued ones
        ferry.ok("cancel", "--state", "RUNNING")
        wait_until(lambda: not ferry.json("ls", "--state", "running"), what="the cancels")
        worker.terminate()
        worker.communicate(timeout=60)
    url = page.resolve().as_uri()
    profile = tmp_path / "chromium-profile"
    dumped = run_browser(binary, profile, "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr.decode(errors="replace")
    dom = Dom(dumped.stdout.decode())
    assert dom.body.get("data-ready") == "200", dom.body
    assert dom.rows == 200 and dom.bars == 200 and dom.shown == "200 of 200 shown"

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-200.png"
    shot.unlink(missing_ok=True)
    taken = run_browser(
        binary, profile, f"--screenshot={shot}", "--window-size=1400,2000", "--hide-scrollbars",
        url,
    )  # fmt: skip
    assert taken.returncode == 0 and shot.exists(), taken.stderr.decode(errors="replace")
    assert png_size(shot) == (1400, 2000)
    shutil.copyfile(page, ARTIFACTS / "report-200.html")
    print(f"screenshot: {shot}\npage: {ARTIFACTS / 'report-200.html'}")
