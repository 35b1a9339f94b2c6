"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry, Hosts


@pytest.fixture
def ferry(tmp_path: Path) -> Iterator[Ferry]:
    """A private state directory, ferry run as ``python -m ferry.cli`` from the test
    runner's current directory; every ferry process started on it, and every task
    process left behind, is ended and reaped at the end (``Ferry.close``). A module
    that needs another ``ferry`` fixture defines its own, which takes precedence."""
    f = Ferry(tmp_path / "home")
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
def hosts(pg_url: str, tmp_path: Path) -> Iterator[Hosts]:
    """``hosts("a")``: the ferry command of simulated host ``a`` (its own state
    directory, ``FERRY_HOST_ID=a``), all on the test's database, initialised; every
    host's processes ended at the end."""
    made: dict[str, Ferry] = {}

    def host(name: str) -> Ferry:
        if name not in made:
            made[name] = Ferry(tmp_path / name)
            made[name].env.update(FERRY_DATABASE_URL=pg_url, FERRY_HOST_ID=name)
        return made[name]

    host("admin").ok("db", "init")
    try:
        yield host
    finally:
        for ferry in made.values():
            ferry.close()
