"""The import graph is one-way: journal/ never imports ferry/, and ferry's pure core
(model, events, state, fold, recovery, patch, ids, spec) imports no I/O module.

Checked statically with ast so that a lazy import inside a function is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_CORE = {
    "model", "events", "state", "fold", "recovery", "patch", "pinning", "ids", "spec", "errors",
}  # fmt: skip
# Modules the pure core must not import (I/O, processes, time, randomness, the disk).
IO_MODULES = {
    "os",
    "io",
    "subprocess",
    "socket",
    "shutil",
    "tempfile",
    "pathlib",
    "signal",
    "select",
    "selectors",
    "fcntl",
    "psutil",
    "filelock",
    "click",
    "journal",
    "time",
    "random",
    "secrets",
}
IO_FERRY_MODULES = {
    "store",
    "lease",
    "process",
    "liveness",
    "runner",
    "supervise",
    "service",
    "cli",
    "cli_app",
    "cli_commands",
    "cli_fast",
    "render",
    "statedir",
    "failpoints",
    "pointers",
    "alivelock",
    "intake",
    "logs",
    "leader",
    "recoverer",
    "journal_ops",
    "_outputs",
    "_sink",
    "_splice",
    "_spawn",
    "_taskloop",
    "_tasktree",
    "_supervise_types",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import inside a package
                base = path.parent.name
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "journal").glob("*.py")), ids=lambda p: p.name)
def test_journal_never_imports_ferry(path: Path) -> None:
    bad = {m for m in imported_modules(path) if m == "ferry" or m.startswith("ferry.")}
    assert not bad, f"{path.name} imports {bad}: journal/ must stay independent of ferry/"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in (ROOT / "ferry").glob("*.py") if p.stem in PURE_CORE),
    ids=lambda p: p.name,
)
def test_pure_core_does_no_io(path: Path) -> None:
    bad = set()
    for name in imported_modules(path):
        top = name.split(".")[0]
        if top in IO_MODULES:
            bad.add(name)
        if top == "ferry" and name.split(".")[-1] in IO_FERRY_MODULES:
            bad.add(name)
    assert not bad, f"{path.name} is pure core but imports {bad}"
