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


# Without CPython's C module (another interpreter; or one whose C functions take other
# arguments, which journal._json meets the same way): the json package's codec.
WITHOUT_C = (
    "import sys\n"
    "sys.modules['_json'] = None\n"
    "from journal import _json\n"
    "assert _json._encode.__self__.__class__.__name__ == 'JSONEncoder'\n"
    "doc = {'b': [1, 2.5, 'é', None, True], 'a': {'x': -0.0}}\n"
    "print(_json.dumps(doc).decode(), _json.dumps_sorted(doc).decode(), _json.loads(b' [1] \\n'))\n"
    "for bad in ('{x}', '1e400', 'NaN', '[1] 2', '\"\\\\ud800\"'):\n"
    "    try:\n"
    "        _json.loads(bad)\n"
    "    except ValueError as error:\n"
    "        print(type(error).__name__)\n"
)


def test_without_the_c_module_the_json_package_codes_alike() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_C], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [
        '{"b":[1,2.5,"é",null,true],"a":{"x":-0.0}} {"a":{"x":-0.0},"b":[1,2.5,"é",null,true]} [1]',
        "JSONDecodeError", "ValueError", "ValueError", "JSONDecodeError", "UnicodeEncodeError",
    ]  # fmt: skip
