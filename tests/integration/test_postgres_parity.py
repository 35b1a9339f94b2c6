"""The same commands on the local journal and on PostgreSQL, the same answers (a
twentieth-session review ran about 190 sequences on both and diffed them): what the
word ``last`` names once gc forgot the newest task, an ambiguous prefix's count,
``lease.held``'s details, and the not-found message of an empty store. (Task numbers
after a submit that died in its write differ, as docs/postgres.md says.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry, Hosts, says_once_when_no_work_runs, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def both(pg_url: str, tmp_path: Path) -> Iterator[dict[str, Ferry]]:
    """A local home and a host of a fresh database, side by side."""
    local = Ferry(tmp_path / "local", tmp_path)
    pg = Ferry(tmp_path / "pg", tmp_path)
    pg.env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID="a")
    pg.ok("db", "init")
    try:
        yield {"local": local, "pg": pg}
    finally:
        local.close()
        pg.close()


def answers(ferries: dict[str, Ferry], *args: str) -> dict[str, tuple[int, str]]:
    """Each backend's exit status and error code (or "") for one command."""
    found = {}
    for name, ferry in ferries.items():
        result = ferry("--json", *args)
        found[name] = (result.code, result.error_code() if result.code else "")
    return found


def test_last_names_the_newest_task_even_once_gc_forgot_it(both: dict[str, Ferry]) -> None:
    """On the database, ``last`` was the newest task still there: ``cancel last`` after
    gc forgot the newest cancelled a task nobody named."""
    for ferry in both.values():
        ferry.ok("submit", "--", "sleep", "60")
        ferry.ok("submit", "--", "true")
        ferry.ok("cancel", "2")
        ferry.ok("gc", "--older-than", "0s", "--state", "cancelled")
    assert answers(both, "cancel", "last") == dict.fromkeys(both, (5, "task.not_found"))
    assert answers(both, "show", "last") == dict.fromkeys(both, (5, "task.not_found"))
    for ferry in both.values():
        assert ferry.task("1")["state"] == "QUEUED"


def test_an_ambiguous_prefix_counts_every_match(both: dict[str, Ferry]) -> None:
    lines = b"".join(b'{"argv": ["true"]}\n' for _ in range(25))
    errors = {}
    for name, ferry in both.items():
        ferry.ok("submit", "--from", "-", stdin=lines)
        prefix = ferry.tasks()[0]["id"][:2]  # (every id of this second starts so)
        errors[name] = ferry.refused(5, "task.ambiguous", "--json", "show", prefix).json()
    counts = {name: error["error"]["details"]["count"] for name, error in errors.items()}
    assert counts == dict.fromkeys(both, 25), counts
    assert all(e["error"]["message"].endswith("and 15 more") for e in errors.values()), errors


def test_lease_held_says_the_same_of_its_holder(both: dict[str, Ferry]) -> None:
    keys = {}
    for name, ferry in both.items():
        ferry.start("work", "--poll", "0.1")
        held = wait_until(lambda f=ferry: (r := f("--json", "recover")).code == 75 and r,
                          what=f"{name}'s work to hold the lease")  # fmt: skip
        details = held.json()["error"]["details"]
        assert held.error_code() == "lease.held"
        assert details["holder_liveness"] == "ALIVE"
        keys[name] = set(details) - {"host"}  # (a database names its host: documented)
    assert keys["pg"] == keys["local"], keys


def test_an_empty_store_says_none_was_submitted(both: dict[str, Ferry]) -> None:
    for args in (["show", "last"], ["show", "1"]):
        messages = {
            name: ferry.refused(5, "task.not_found", *args).err for name, ferry in both.items()
        }
        assert all("(none submitted yet)" in text for text in messages.values()), messages


def test_wait_says_when_no_host_runs_work_to_start_a_queued_task(hosts: Hosts) -> None:
    """As on the local journal (``test_wait.py``): once, that no ``work`` runs to start
    a queued task; not while some host's ``work`` leads (another host's, by its
    lease's expiry on the database's clock)."""
    says_once_when_no_work_runs(hosts("a"), hosts("b"))
