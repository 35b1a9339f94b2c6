"""docs/reliability.md and the tests it cites stay in step, both ways: every test the
page names exists, and every test in the hardening files is named on the page (a case
added without an entry, or an entry whose test was renamed or removed, fails here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
# The files whose every test must have an entry (the hardening catalogue's own).
OWNED = (
    "tests/integration/test_bad_input.py",
    "tests/integration/test_bad_input_state.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_security.py",
    "tests/property/test_fuzz_readers.py",
    "tests/integration/test_write_races.py",
)
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")
SECTIONS = (
    "## Bad input", "## Resource faults", "## Security", "## Fuzzing", "## Crash points",
    "## Races",
)  # fmt: skip


def cited() -> set[tuple[str, str]]:
    """(file, test) for every table row's test reference."""
    refs = set()
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            refs.update(REFERENCE.findall(line))
    return refs


def defined_tests(relative: str) -> set[str]:
    """Names of the test functions defined at module level in a test file."""
    tree = ast.parse((ROOT / relative).read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_the_page_has_its_sections_and_cites_tests() -> None:
    text = DOC.read_text(encoding="utf-8")
    for heading in SECTIONS:
        assert heading in text, heading
    assert len(cited()) > 50


@pytest.mark.parametrize("relative", OWNED)
def test_every_test_of_a_hardening_file_has_an_entry(relative: str) -> None:
    named = {test for file, test in cited() if file == relative}
    missing = sorted(defined_tests(relative) - named)
    assert not missing, f"add a row to docs/reliability.md for {relative}::{missing}"


def test_every_entry_names_a_test_that_exists() -> None:
    dangling = sorted(
        f"{file}::{test}"
        for file, test in cited()
        if not (ROOT / file).is_file() or test not in defined_tests(file)
    )
    assert not dangling, f"docs/reliability.md names tests that do not exist: {dangling}"


def test_every_row_says_its_result() -> None:
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and REFERENCE.search(line):
            result = line.rstrip().rstrip("|").rsplit("|", 1)[-1].strip()
            assert result in ("pass", "skip", "xfail"), line
