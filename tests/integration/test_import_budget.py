"""An import budget for ``ferry run`` (issue: start-up within 4 times a bare
interpreter): the modules ``ferry run -- true`` may load are listed in
``run_import_budget.txt`` beside this file. A change that makes ``run`` load another
module (click's whole command tree, the database driver, the report page, a standard
library package pulled in by a convenience import) fails here and says which; add it
to the list only if ``run`` needs it, and measure (``python bench/run.py run-overhead``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

BUDGET = Path(__file__).with_name("run_import_budget.txt")
# Never on run's path, whatever the list says: each is a start-up cost run does not need.
NEVER = ("click", "rich", "psycopg", "ferry.cli.tree", "ferry.cli.commands",
         "ferry.storage.postgres", "ferry.app.worker", "ferry.app.recoverer",
         "ferry.cli.report_page", "asyncio", "email", "http", "logging", "argparse", "ssl")  # fmt: skip
PROBE = (
    "import json, sys\n"
    "from ferry.cli import main\n"
    "code = main(['run', '--', 'true'])\n"
    "sys.stderr.write(json.dumps(sorted(sys.modules)) + '\\n')\n"
    "sys.exit(code)\n"
)


BARE = "import json, sys\nsys.stderr.write(json.dumps(sorted(sys.modules)) + '\\n')\n"


def _loaded(code: str, home: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={"FERRY_HOME": str(home), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return set(loaded)


def modules_of_run(home: Path) -> set[str]:
    """What ``ferry run -- true`` loads beyond what this interpreter loads for
    ``import json`` (its start-up: site hooks of the environment, which differ between
    a venv and tox's)."""
    return _loaded(PROBE, home) - _loaded(BARE, home)


def test_ferry_run_loads_only_what_its_budget_lists(tmp_path: Path) -> None:
    loaded = modules_of_run(tmp_path / "home")
    never = sorted(m for m in loaded if m.split(".")[0] in NEVER or m.startswith(NEVER))
    assert never == [], f"ferry run loads {never}: keep them off its path (lazy imports)"
    budget = set(BUDGET.read_text().split())
    extra = sorted(loaded - budget)
    assert extra == [], (
        f"ferry run now loads {len(extra)} module(s) beyond its budget: {extra}. Import"
        f" them lazily where they are used, or add them to {BUDGET.name} if run needs them"
    )


@pytest.mark.parametrize(
    "args",
    [["submit", "--", "true"], ["--json", "ls", "--limit", "100"], ["show", "last"]],
    ids=" ".join,
)
def test_the_plain_commands_typed_most_never_load_click(args: list[str], tmp_path: Path) -> None:
    """``submit``, ``ls`` and ``show`` in their plain forms are parsed without click
    (``ferry.cli.fast``): click and its command tree cost more than half of them."""
    home = tmp_path / "home"
    _loaded(PROBE, home)  # (a task for show)
    probe = PROBE.replace("['run', '--', 'true']", repr(args))
    loaded = _loaded(probe, home) - _loaded(BARE, home)
    never = sorted(m for m in loaded if m.split(".")[0] in NEVER or m.startswith(NEVER))
    assert never == [], f"ferry {' '.join(args)} loads {never}"


# Add what run loads to the list: python tests/integration/test_import_budget.py
if __name__ == "__main__":
    # (Run it in an editable install and in tox's: an editable install's finder loads
    # some modules at start-up, which are then not counted as run's; the list holds both.)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        names = modules_of_run(Path(scratch) / "home") | set(BUDGET.read_text().split())
    BUDGET.write_text("\n".join(sorted(names)) + "\n")
    print(f"{len(names)} modules written to {BUDGET}")
