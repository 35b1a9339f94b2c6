"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clikit import Ferry


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
