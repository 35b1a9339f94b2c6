"""Queue control on a shared PostgreSQL database (docs/postgres.md): groups and their
limits across hosts, pause, --after and DEPENDENCY_FAILED, priorities, retries, each
decided in the transaction that claims (``ferry/storage/postgres/queue.py``); and
``db init`` upgrading a version 2 database."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from clikit import Ferry
from queuekit import Stamps, gated, stamped
from test_postgres import Hosts, hosts  # noqa: F401  (the fixture)

from ferry.storage.postgres import schema

pytestmark = pytest.mark.timeout(180)


def submit(ferry: Ferry, *args: str) -> str:
    return str(ferry.json("submit", *args)["id"])


def test_priorities_and_groups_order_the_claims_on_the_database(
    hosts: Hosts, tmp_path: Path
) -> None:
    a = hosts("a")
    stamps = Stamps(tmp_path / "stamps")
    low = submit(a, "--", *stamped(stamps, "low"))
    high = submit(a, "--priority", "5", "--group", "g", "--", *stamped(stamps, "high"))
    mid = submit(a, "--priority", "2", "--", *stamped(stamps, "mid"))
    a.ok("work", "--drain", "-j", "1")
    assert stamps.starts() == ["high", "mid", "low"]
    assert {t["id"]: t["state"] for t in a.tasks()} == dict.fromkeys((low, high, mid), "SUCCEEDED")
    listed = {g["group"]: g for g in a.json("group")}
    assert listed["g"]["queued"] == 0 and listed["default"]["queued"] == 0
