"""Shared test fixtures: a private state directory per test, process hygiene, and a
private PostgreSQL server for the tests that ask for one (``pg_server``, ``pg_url``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from jsonmodes import using
from pgserver import PgServer, PgServerError

# No timing thresholds in tests: hypothesis's per-example deadline (200 ms) failed a
# property test on a loaded machine. Examples are bounded by pytest-timeout instead.
settings.register_profile("ferry", deadline=None)
settings.load_profile("ferry")


@pytest.fixture
def ferry_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh, private FERRY_HOME for one test (created by ferry on first use)."""
    home = tmp_path / "ferry-home"
    monkeypatch.setenv("FERRY_HOME", str(home))
    monkeypatch.delenv("FERRY_FAILPOINTS", raising=False)
    yield home


@pytest.fixture(autouse=True)
def _no_inherited_failpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    # A failpoint set in the developer's shell must never leak into a test run.
    if "FERRY_FAILPOINTS" in os.environ:
        monkeypatch.delenv("FERRY_FAILPOINTS")


# ---- JSON: the standard library's codec, or orjson (journal._json) ----
# A process uses the standard library's until it has handled BULK_AFTER_ITEMS records,
# then orjson: a test run would soon test only the second. Tests of what JSON the
# journal writes and reads take this fixture, and run once in each mode.
@pytest.fixture(scope="module", params=["stdlib", "orjson"])
def json_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    with using(request.param):
        yield request.param


# ---- PostgreSQL ----
# One server per pytest process, started the first time a test asks for it. Under
# pytest-xdist each worker is a process of its own and so starts its own server (about
# 2 s of initdb, in parallel): a test that restarts or crashes the server then
# disturbs only its own worker, and no worker has to outlive or wait for another to
# stop a shared one. $FERRY_TEST_DATABASE_URL names a server to use instead.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that uses the server is marked, so that `-m "not postgres"` deselects
    # them all and none is forgotten (the fixture closure includes pg_url's pg_server).
    for item in items:
        if "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """This session's PostgreSQL server. If none can be started the tests that use it
    FAIL (CI must not skip them): install PostgreSQL's server (Debian: `postgresql`;
    .ci/run does) and the `postgres` extra, or set FERRY_TEST_DATABASE_URL."""
    problem = ""
    try:
        server = PgServer.from_environment()
    except ImportError as exc:
        problem = f"PostgreSQL tests need psycopg (pip install -e '.[postgres]'): {exc}"
    except PgServerError as exc:
        problem = f"no PostgreSQL server for the tests: {exc}"
    if problem:  # failed outside the except clause: one message, no chained traceback
        pytest.fail(problem, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A postgresql:// URL of a new, empty database of its own for this test; dropped
    after it (a database is about 7.5 MB, and a session makes many)."""
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.drop_database(name)
