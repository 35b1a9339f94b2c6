"""Host clocks do not decide on a shared database (docs/postgres.md, "What is guaranteed"):
a host whose wall clock is wrong (``skewed_ferry.py``: its ``time.time()`` shifted)
submits ``--not-before +S``, ends a task whose ``--retry-delay`` applies; the
database's clock decides each time."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from clikit import Ferry, Hosts

pytestmark = pytest.mark.timeout(180)

SKEWED = (sys.executable, str(Path(__file__).with_name("skewed_ferry.py")))
HOUR_S = 3600.0


def skewed(ferry: Ferry, skew_s: float, *args: str, codes: tuple[int, ...] = (0,)) -> str:
    """``ferry ARGS`` on ``ferry``'s host, its wall clock off by ``skew_s``: stdout."""
    ferry.env["FERRY_TEST_SKEW_S"] = str(skew_s)
    try:
        return ferry.ok(*args, command=SKEWED, codes=codes).text
    finally:
        del ferry.env["FERRY_TEST_SKEW_S"]


def moment(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_not_before_plus_seconds_is_the_databases_time(hosts: Hosts) -> None:
    """A host an hour behind submits ``--not-before +600``: the task waits 600 s by the
    database's clock (was: by its own, so it could be claimed at once)."""
    a, b = hosts("a"), hosts("b")
    before = time.time()
    later = skewed(a, -HOUR_S, "submit", "--not-before", "+600", "--", "true").strip()
    after = time.time()
    shown = moment(b.task(later)["not_before"])
    assert before + 600 - 2 <= shown <= after + 600 + 2, shown - before
    assert b.json("claim") == {"task": None}
    assert b.task(later)["state"] == "QUEUED"
    # A host an hour ahead: the same.
    early = skewed(a, HOUR_S, "submit", "--not-before", "+5", "--", "true").strip()
    assert moment(b.task(early)["not_before"]) <= time.time() + 5 + 2
    # An RFC 3339 time stays as given, whoever's clock.
    fixed = skewed(a, -HOUR_S, "submit", "--not-before", "2031-01-02T03:04:05Z", "--", "true")
    assert b.task(fixed.strip())["not_before"].startswith("2031-01-02T03:04:05")


def test_a_retry_delay_is_the_databases_time(hosts: Hosts) -> None:
    """Attempt 1 fails on a host an hour behind; ``--retry-delay 300``: attempt 2 waits
    300 s (and at most half again) by the database's clock (was: claimable at once)."""
    a, b = hosts("a"), hosts("b")
    flaky = b.ok("submit", "--retries", "1", "--retry-delay", "300", "--", "false").text.strip()
    before = time.time()
    skewed(a, -HOUR_S, "claim", codes=(1,))
    after = time.time()
    task = b.task(flaky)
    assert (task["state"], task["attempt"]) == ("QUEUED", 2)
    assert before + 300 - 2 <= moment(task["not_before"]) <= after + 450 + 2
    assert b.json("claim") == {"task": None}
