"""journal._json in a process that has not imported the ``json`` package (``run``'s,
``submit``'s: test_import_budget.py keeps it off their path): invalid JSON is refused
with the ValueError the package gives, as in a process that has imported it.

On Python 3.11 the C scanner raises its JSONDecodeError only if ``json.decoder`` is
already in ``sys.modules``; otherwise it returns NULL without an exception and the
caller gets a SystemError (not a ValueError: ``submit --from``, a lease file, a journal
line that checks but does not parse are then internal errors)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = (
    "import sys\n"
    "for name in ('json', 'json.decoder', 'json.scanner', 'json.encoder'):\n"
    "    sys.modules.pop(name, None)\n"
    "from journal import _json\n"
    "try:\n"
    "    _json.loads(sys.argv[1])\n"
    "except ValueError as error:\n"
    "    print(type(error).__name__, error)\n"
    "else:\n"
    "    print('accepted')\n"
)
# Each refused by the C scanner itself (not at the top level: there the scanner raises
# StopIteration, which journal._json turns into the error).
MALFORMED = ["{x}", '{"a" 1}', "[1 2]", '"abc', '"\\x"', '["\x01"]', '{"a":1,}']


@pytest.mark.parametrize("text", MALFORMED)
def test_invalid_json_is_a_value_error_before_the_json_package_is_imported(text: str) -> None:
    import json

    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        expected = f"JSONDecodeError {error}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, text], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr


def test_submit_from_a_file_with_a_malformed_line_is_a_usage_error(tmp_path: Path) -> None:
    source = tmp_path / "tasks.jsonl"
    source.write_bytes(b"{oops}\n")
    done = subprocess.run(
        [sys.executable, "-m", "ferry.cli", "--home", str(tmp_path / "home"), "submit",
         "--from", str(source)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "usage.bad_from_line" in done.stderr and "SystemError" not in done.stderr
