"""Shared test fixtures: a private state directory per test and process hygiene."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


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
