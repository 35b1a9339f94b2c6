"""``ferry ls``'s table (contract.md, "Daily use"): local start time (``TZ``), duration,
fitted to ``COLUMNS``, states in colour on a terminal only, never with ``NO_COLOR``."""

from __future__ import annotations

import os
import pty
import subprocess

import pytest
from clikit import Ferry

pytestmark = pytest.mark.timeout(120)


def settled_tasks(ferry: Ferry) -> None:
    ferry.ok("run", "--name", "x" * 150, "--", "sleep", "0.3")
    ferry.ok("run", "--", "false", codes=(1,))


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_start_times_are_local_and_durations_are_shown(ferry: Ferry) -> None:
    settled_tasks(ferry)
    ferry.env["TZ"] = "UTC"
    utc = rows(ferry.ok("ls").out.decode())
    ferry.env["TZ"] = "Asia/Tokyo"  # UTC+9, no daylight saving
    tokyo = rows(ferry.ok("ls").out.decode())
    assert utc[0][:8] == ["#", "ID", "STATE", "REASON", "EXIT", "STARTED", "DURATION",
                          "NAME/COMMAND"]  # fmt: skip
    hour_utc, hour_tokyo = int(utc[1][6][:2]), int(tokyo[1][6][:2])
    assert (hour_utc + 9) % 24 == hour_tokyo
    took = utc[1][7]
    assert took.endswith("s") and float(took[:-1]) >= 0.3
    assert utc[2][2:5] == ["FAILED", "EXIT_NONZERO", "1"]


def test_the_table_fits_columns_and_is_whole_into_a_pipe(ferry: Ferry) -> None:
    settled_tasks(ferry)
    whole = ferry.ok("ls").out.decode()
    assert "x" * 150 in whole  # into a pipe, nothing is cut
    ferry.env["COLUMNS"] = "120"
    fitted = ferry.ok("ls").out.decode().splitlines()
    assert max(len(line) for line in fitted) <= 120 and fitted[1].endswith("...")
    assert "REASON" in fitted[0]
    ferry.env["COLUMNS"] = "80"  # too narrow for the reason too: it goes (show has it)
    narrow = ferry.ok("ls").out.decode().splitlines()
    assert "REASON" not in narrow[0] and max(len(line) for line in narrow) <= 80


def on_a_terminal(ferry: Ferry, *args: str) -> bytes:
    """The command's stdout, written to a pseudo-terminal."""
    main, sub = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*ferry.command, *args], stdout=sub, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL, env={**ferry.env, "TERM": "xterm"},
        )  # fmt: skip
        os.close(sub)
        sub = -1
        out = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # (EIO: the terminal's last writer is gone)
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=60) == 0
        return out
    finally:
        os.close(main)
        if sub >= 0:
            os.close(sub)


def test_states_in_colour_on_a_terminal_only_and_never_with_no_color(ferry: Ferry) -> None:
    settled_tasks(ferry)
    coloured = on_a_terminal(ferry, "ls")
    assert b"\x1b[32mSUCCEEDED\x1b[0m" in coloured and b"\x1b[1;31mFAILED\x1b[0m" in coloured
    ferry.env["NO_COLOR"] = "1"
    assert b"\x1b[" not in on_a_terminal(ferry, "ls")
    del ferry.env["NO_COLOR"]
    assert b"\x1b[" not in ferry.ok("ls").out  # a pipe


@pytest.mark.parametrize("columns", [70, 60, 50, 40, 20])
def test_a_narrow_terminal_gets_a_table_that_still_fits(ferry: Ferry, columns: int) -> None:
    """Below ~80 columns the reason, then the id (the number names the task), then the
    start time give way; below what is left, each line is cut (as ps does)."""
    settled_tasks(ferry)
    ferry.env["COLUMNS"] = str(columns)
    lines = ferry.ok("ls").out.decode().splitlines()
    assert len(lines) == 3 and max(len(line) for line in lines) <= columns, lines
    header = lines[0].split()
    assert header[:2] == ["#", "STATE"] and "ID" not in header, header
    if columns >= 50:
        assert header[-1] == "NAME/COMMAND" and lines[2].split()[:3] == ["2", "FAILED", "1"]


@pytest.mark.parametrize("columns", [80, 60, 40])
def test_wide_characters_take_two_cells_and_still_fit(ferry: Ferry, columns: int) -> None:
    """CJK and emoji take two cells of a terminal, combining marks none: the table is
    measured in cells (was: in code points, and rows of CJK names were up to 95 cells
    wide at COLUMNS=80, wrapping; found by a review)."""
    import unicodedata

    def cells(text: str) -> int:
        return sum(
            0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
            for c in text
        )

    for name in ("構築とテストと配布" * 4, "🚀 deploy " * 8, "e\u0301" * 60):
        ferry.ok("submit", "--name", name, "--", "true")
    ferry.env["COLUMNS"] = str(columns)
    lines = ferry.ok("ls").out.decode().splitlines()
    assert len(lines) == 4 and max(cells(line) for line in lines) <= columns, lines
    assert all(line.endswith("...") for line in lines[1:]), lines
