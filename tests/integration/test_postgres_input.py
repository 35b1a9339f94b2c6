"""Bad input on a shared database (a sixteenth-session review): a home whose path is
not UTF-8, the server's refusals of a role or a database, URLs libpq refuses, host ids
that are no names. Each: one coded line, the contract's exit status, no traceback."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from clikit import Ferry, wait_until
from crashkit import most_at_once, stamping_task, wait_task_gone

from ferry.proc.process import read_stat

pytestmark = pytest.mark.timeout(120)


def test_a_home_not_utf8_names_its_claims_and_keeps_its_survivors(
    pg_url: str, tmp_path: Path
) -> None:
    """``work`` in a home whose path is not UTF-8 failed every claim; its claims now
    name the home losslessly (``runner.home``), so a work restarted there under a new
    host id still counts a survivor stopped before its alive-lock was made (the case
    where only ``runner.home`` tells)."""
    home = Path(os.fsdecode(os.fsencode(tmp_path) + b"/a-\xff"))
    a = Ferry(home, tmp_path)
    a.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    try:
        a.ok("db", "init")
        stamps = tmp_path / "stamps"
        x = a.ok("submit", "--", *stamping_task(stamps, 0, 0.2)).out.decode().strip()
        a.ok("submit", "--", *stamping_task(stamps, 1, 0.2))
        first = a.start(
            "work", "-j", "1", "--poll", "0.05", failpoints="supervisor:before:spawn=stop"
        )
        supervisor = wait_until(lambda: (t := a.task(x))["state"] == "DISPATCHING"
                                and t["runner"]["pid"], what="x's claim")  # fmt: skip
        wait_until(lambda: read_stat(supervisor).state == "T", what="x's supervisor to stop")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        a.env["FERRY_HOST_ID"] = "a-renamed"
        second = a.start("work", "-j", "1", "--drain", "--poll", "0.05")
        try:
            assert second.stderr is not None
            notice = second.stderr.readline()
            assert b"1 task(s) still run under an earlier work's supervisors" in notice, notice
        finally:
            os.kill(supervisor, signal.SIGCONT)
        assert second.wait(timeout=60) == 0
        wait_task_gone(x)
        assert [t["state"] for t in a.tasks()] == ["SUCCEEDED"] * 2
        assert most_at_once(stamps) == 1
    finally:
        a.close()
