"""An import budget for ``ferry run`` (issue: start-up within 4 times a bare
interpreter): the modules ``ferry run -- true`` may load are listed in
``run_import_budget.txt`` beside this file. A change that makes ``run`` load another
module (click's whole command tree, the database driver, the report page, a standard
library package pulled in by a convenience import) fails here and says which; add it
to the list only if ``run`` needs it, and measure (``python bench/run.py run-overhead``).

The commands typed most (``run``, ``submit``, ``ls``, ``show``) are also held to what
was taken off their path, each a measured cost: ferry imports no ``dataclasses`` (with
``inspect``), no ``socket``, none of the journal's damage and maintenance machinery;
and only ``run`` (whose supervisor spawns) loads ``subprocess`` and the supervisor's
modules, and those in the supervisor only, after the fork.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

BUDGET = Path(__file__).with_name("run_import_budget.txt")
# Never on run's path, whatever the list says: each is a start-up cost run does not need.
NEVER = ("click", "rich", "psycopg", "ferry.cli.tree", "ferry.cli.commands",
         "ferry.storage.postgres", "ferry.app.worker", "ferry.app.recoverer",
         "ferry.cli.report_page", "asyncio", "email", "http", "logging", "argparse", "ssl",
         "orjson")  # fmt: skip
PROBE = (
    "import sys\n"
    "from ferry.cli import main\n"
    "code = main(['run', '--', 'true'])\n"
    "sys.stderr.write(repr(sorted(sys.modules)) + '\\n')\n"
    "sys.exit(code)\n"
)


BARE = "import sys\nsys.stderr.write(repr(sorted(sys.modules)) + '\\n')\n"

# Which modules ferry's own code imports (each import statement it executes, whether
# or not the module was loaded already: orjson's extension loads some of these itself).
TRACED = (
    "import builtins, sys\n"
    "imported = set()\n"
    "plain_import = builtins.__import__\n"
    "def traced(name, globals=None, locals=None, fromlist=(), level=0):\n"
    "    if (globals or {}).get('__name__', '').split('.')[0] in ('ferry', 'journal'):\n"
    "        imported.add(name)\n"
    "    return plain_import(name, globals, locals, fromlist, level)\n"
    "builtins.__import__ = traced\n"
    "from ferry.cli import main\n"
    "code = main(ARGS)\n"
    "sys.stderr.write(repr(sorted(imported)) + '\\n')\n"
    "sys.stderr.write(repr(sorted(sys.modules)) + '\\n')\n"
    "sys.exit(code)\n"
)
# Loaded by none of them, nor by a supervisor: the json package compiles regular
# expressions at import, and re cost run 2 ms with it (journal._json uses the C codec).
REGEXLESS = ("json", "re")
# Never imported by ferry on the path of run, submit, ls and show: orjson (15 ms: it
# imports dataclasses, inspect, uuid, platform and datetime; journal._json uses the
# standard library's json until a process has much to parse).
NOT_IMPORTED = ("dataclasses", "inspect", "socket", "orjson", *REGEXLESS)
# Never loaded by them: only a damaged journal or a maintenance command needs these.
NOT_LOADED = ("journal._repair", "journal._salvage", "journal._verify", "journal._view")
# Never loaded by submit, ls and show, nor by run's own process: its supervisor (a
# fork) loads ferry's, its own module at once (while run opens the store), the spawn's
# once it has sent its plan (while run writes the intent); subprocess and selectors
# nobody on these paths (the supervisor spawns with os.posix_spawn, waits with epoll).
SPAWNING = ("subprocess", "selectors", "ferry.proc.supervise", "ferry.proc._spawn",
            "ferry.proc._taskloop", "ferry.proc._sink", "ferry.app.supervisor",
            "ferry.proc.logorder")  # fmt: skip
# Loaded by none of them, nor by a supervisor: importing typing costs each 4 to 7 ms here
# (a tenth of a submit). ferry's type-only names are imported under ``if TYPE_CHECKING:``
# with TYPE_CHECKING a plain False (docs/architecture.md, "Start-up").
UNTYPED = ("typing",)
# Loaded by none of them, nor by a supervisor: pathlib imports urllib.parse (with
# ipaddress), fnmatch and ntpath, 1.9 ms of run and 1.4 of submit here. Their paths are
# ``str`` and ``os.path`` (docs/architecture.md, "Start-up").
PATHLESS = ("pathlib", "urllib.parse", "ipaddress")
# An editable install's finder loads pathlib (and re) as the interpreter starts: a probe
# forgets those modules first, so that whatever imports one of them again loads it again.
FORGET = f"import sys\nfor name in {PATHLESS + REGEXLESS!r}: sys.modules.pop(name, None)\n"
TYPED_MOST = [["run", "--", "true"], ["submit", "--", "true"], ["ls"], ["show", "last"],
              ["--json", "ls", "--limit", "100"]]  # fmt: skip


def _lists(code: str, home: Path) -> list[list[str]]:
    """The JSON lists the probe wrote on its last lines of stderr, one per line."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={"FERRY_HOME": str(home), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    return [ast.literal_eval(line) for line in lines]


def _loaded(code: str, home: Path) -> set[str]:
    return set(_lists(code, home)[-1])


def modules_of_run(home: Path) -> set[str]:
    """What ``ferry run -- true`` loads beyond what this interpreter loads for
    nothing (its start-up: site hooks of the environment, which differ between
    a venv and tox's)."""
    return _loaded(PROBE, home) - _loaded(BARE, home)


def _home_in_use(home: Path) -> None:
    """A task run, then a compaction: its end is in an archive, which a home in use
    has (the table then reads its history through ``ferry.storage.local.history``)."""
    _loaded(PROBE, home)
    subprocess.run(
        [sys.executable, "-m", "ferry.cli", "--home", str(home), "journal", "compact"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert any((home / "archive").iterdir())


@pytest.mark.parametrize("in_use", [False, True], ids=["new home", "home with an archive"])
def test_ferry_run_loads_only_what_its_budget_lists(in_use: bool, tmp_path: Path) -> None:
    home = tmp_path / "home"
    if in_use:
        _home_in_use(home)
    loaded = modules_of_run(home)
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


@pytest.mark.parametrize("in_use", [False, True], ids=["new home", "home with an archive"])
@pytest.mark.parametrize("args", TYPED_MOST, ids=" ".join)
def test_the_commands_typed_most_keep_off_what_was_taken_off_their_path(
    args: list[str], in_use: bool, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    _home_in_use(home) if in_use else _loaded(PROBE, home)  # (a task for show)
    imported, loaded = _lists(FORGET + TRACED.replace("ARGS", repr(args)), home)
    assert sorted(set(imported) & set(NOT_IMPORTED)) == []
    assert sorted(set(imported) & set(PATHLESS)) == [], "ferry imports pathlib"
    assert sorted(set(loaded) & set(PATHLESS)) == [], "what ferry imports loads pathlib"
    assert sorted(set(loaded) & set(REGEXLESS)) == [], "what ferry imports loads re"
    assert sorted(set(loaded) & set(NOT_LOADED)) == []
    assert sorted(set(loaded) & set(SPAWNING)) == []
    assert sorted(set(loaded) & set(UNTYPED)) == []
    if args[0] != "run":
        assert "ferry.app.launch" not in loaded and "ferry.app.supervisor" not in loaded


def test_a_supervisor_loads_no_typing_no_subprocess_no_pathlib_and_no_re(tmp_path: Path) -> None:
    """What a supervisor imports after its fork (its task's spawn and watch): those
    imports are the last step on ``run``'s critical path (docs/architecture.md,
    start-up). ``subprocess`` (with ``locale``) cost it 1.7 ms; the spawn is
    ``os.posix_spawn``'s."""
    probe = FORGET + "import ferry.app.supervisor, ferry.proc.supervise\n" + BARE
    unwanted = {*UNTYPED, *PATHLESS, *REGEXLESS, "subprocess", "locale", "selectors"}
    assert sorted(_loaded(probe, tmp_path) & unwanted) == []


def test_a_plain_work_never_loads_click(tmp_path: Path) -> None:
    """``work [-j N] [--drain]`` is parsed without click too (``ferry.cli.fast``): click
    and its command tree cost an empty ``work --drain`` 12 ms (69 -> 57)."""
    home = tmp_path / "home"
    _loaded(PROBE, home)  # (a home with a task in it)
    args = ["-q", "work", "--drain", "-j", "2"]
    loaded = _loaded(PROBE.replace("['run', '--', 'true']", repr(args)), home)
    clicky = ("click", "ferry.cli.tree", "ferry.cli.commands")
    assert sorted(m for m in loaded if m.split(".")[0] == "click" or m in clicky) == []
    # (beyond the interpreter's start-up: an editable install's finder loads typing)
    assert sorted((loaded - _loaded(BARE, home)) & set(UNTYPED)) == [], "typing: 2 ms more"


def test_the_collector_s_pace_is_slower_for_start_up_only(tmp_path: Path) -> None:
    """The ``ferry`` console collects the youngest generation every START_UP_YOUNG new
    objects while it starts (``ferry run -- true``: 1.9 ms), and a launcher and its
    supervisor go back to Python's pace for their long lives: the launcher at the fork
    (a ``work`` raising through a database outage keeps its exceptions' cycles for the
    collector), the supervisor once it has planned its task (its own start-up, after
    the fork). The collector is on throughout."""
    probe = (
        "import gc, json, sys\n"
        "import ferry.cli as cli, ferry.proc.supervise as sup\n"
        "usual = gc.get_threshold()\n"
        "seen = {}\n"
        "spawn = sup.supervise\n"
        "def supervised(*args, **kwargs):\n"
        "    with open(sys.argv[1], 'w') as f:\n"
        "        json.dump([gc.isenabled(), *gc.get_threshold()], f)\n"
        "    return spawn(*args, **kwargs)\n"
        "sup.supervise = supervised\n"
        "run = cli.main\n"
        "def ran():\n"
        "    seen['start'] = [gc.isenabled(), *gc.get_threshold()]\n"
        "    code = run(['-q', 'run', '--', 'true'])\n"
        "    print(json.dumps([list(usual), seen['start'], [gc.isenabled(), *gc.get_threshold()]]))\n"
        "    return code\n"
        "cli.main = ran\n"
        "cli.console()\n"
    )
    env = dict(os.environ, FERRY_HOME=str(tmp_path / "home"))
    child = tmp_path / "supervisor.json"
    done = subprocess.run(
        [sys.executable, "-c", probe, str(child)], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    from ferry.app.collector import START_UP_YOUNG

    usual, start, after = json.loads(done.stdout)
    assert usual[0] < START_UP_YOUNG
    assert start == [True, START_UP_YOUNG, *usual[1:]], "start-up"
    assert after == [True, *usual], "the launcher, after the fork"
    assert json.loads(child.read_text()) == [True, *usual], "the supervisor"


# What filelock 4 loaded to take the lease's short lock (13 ms of each `work`, `claim`
# and `recover`, and their teardown: logging registers an exit handler).
LEASE_LOCK_COST = ("filelock", "logging", "secrets", "decimal")


@pytest.mark.parametrize("args", [["-q", "work", "--drain"], ["recover"]], ids=" ".join)
def test_taking_the_lease_loads_no_lock_library(args: list[str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    _loaded(PROBE, home)  # (a home with a task in it)
    loaded = _loaded(PROBE.replace("['run', '--', 'true']", repr(args)), home)
    assert sorted(m for m in loaded if m.split(".")[0] in LEASE_LOCK_COST) == []


# Add what run loads to the list: python tests/integration/test_import_budget.py
if __name__ == "__main__":
    # (Run it in an editable install and in tox's: an editable install's finder loads
    # some modules at start-up, which are then not counted as run's; the list holds both.)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        names = set(BUDGET.read_text().split()) | modules_of_run(Path(scratch) / "new")
        _home_in_use(Path(scratch) / "in-use")
        names |= modules_of_run(Path(scratch) / "in-use")
    BUDGET.write_text("\n".join(sorted(names)) + "\n")
    print(f"{len(names)} modules written to {BUDGET}")
