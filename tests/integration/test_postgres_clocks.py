"""Host clocks do not decide on a shared database (docs/postgres.md, "What is guaranteed"):
a host whose wall clock is wrong (``skewed_ferry.py``: its ``time.time()`` shifted)
submits ``--not-before +S``, ends a task whose ``--retry-delay`` applies, ends a task
that ``gc`` later judges by its age; the database's clock decides each time (``gc``'s:
by ``settled_at``, schema version 7, which ``db init`` gives the tasks settled
before it)."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from clikit import Ferry, Hosts
from pgserver import schema_at
from psycopg.types.json import Jsonb

from ferry.core.fold import task_to_record
from ferry.core.model import Reason, State, Task
from ferry.core.spec import TaskSpec
from ferry.storage.postgres import schema

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


def test_gc_judges_ages_by_the_databases_clock(hosts: Hosts) -> None:
    """A task ends on a host eight days behind; a default ``gc`` (7 days) on a host with
    a right clock keeps it, and its key (was: forgotten, its key freed)."""
    a, b = hosts("a"), hosts("b")
    failed = b.ok("submit", "--key", "deploy-42", "--", "false").text.strip()
    skewed(a, -8 * 24 * HOUR_S, "claim", codes=(1,))
    assert b.task(failed)["state"] == "FAILED"
    report = b.json("gc")
    assert report["forgotten"] == [] and b.task(failed)["state"] == "FAILED"
    # Nor does a host eight days ahead forget it.
    skewed(a, 8 * 24 * HOUR_S, "gc")
    assert b.task(failed)["state"] == "FAILED"
    # Its age by the database's clock does decide: 0 s old is old enough for 0 s.
    b.ok("gc", "--older-than", "0s")
    b.refused(5, "task.not_found", "show", failed)


def test_db_init_gives_the_tasks_settled_before_it_their_last_write_s_time(
    pg_url: str, tmp_path: Path
) -> None:
    """A version 6 database (no ``settled_at``) holding two FAILED tasks, both ended
    eight days ago by their host's clock: one last written ten days ago by the
    database's, one just now. ``db init`` (version 7) stamps each with its last write's
    time: a default ``gc`` forgets the first, keeps the second."""
    schema_at(pg_url, 6)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ended = time.time() - 8 * 24 * HOUR_S
        ids = {"old": "01m8td000000abcd", "recent": "01m8td000000abce"}
        for number, (age, task_id) in enumerate(ids.items(), start=1):
            task = Task(
                id=task_id, spec=TaskSpec(argv=("false",), cwd="/"), state=State.FAILED,
                reason=Reason.EXIT_NONZERO, exit_code=1, submit_seq=number,
                queue_seq=number, updated_seq=number, number=number,
                created_at=ended - 1, ended_at=ended,
            )  # fmt: skip
            conn.execute(
                "INSERT INTO ferry_tasks (id, state, reason, submit_seq, queue_seq,"
                " updated_seq, body, number, updated_at) VALUES (%s, 'FAILED',"
                " 'EXIT_NONZERO', %s, %s, %s, %s, %s, now() - %s::interval)",
                (task.id, number, number, number, Jsonb(task_to_record(task)), number,
                 "10 days" if age == "old" else "0 s"),
            )  # fmt: skip
        conn.execute("SELECT setval('ferry_task_numbers', 2)")
    ferry = Ferry(tmp_path / "h")
    ferry.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="h")
    try:
        report = ferry.json("db", "init")
        assert (report["previous_version"], report["schema_version"]) == (6, schema.VERSION)
        forgotten = [t["id"] for t in ferry.json("gc")["forgotten"]]
        assert forgotten == [ids["old"]]
        assert [t["id"] for t in ferry.tasks()] == [ids["recent"]]
    finally:
        ferry.close()
