"""The import graph is one-way and shows the architecture (docs/architecture.md):

    ferry.cli -> ferry.app -> ferry.storage -> ferry.proc -> ferry.failpoints -> ferry.core
                                   |
                                   +-> journal (only through the storage seam)

A module may import its own package and the ones the table below allows, nothing else;
no module sits on an import cycle anywhere in ferry/ or journal/; the pure core does no
I/O; journal/ never imports ferry/. Read statically with ast, so a lazy import inside a
function and an import only for type checking count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What each layer may import, besides itself (and the ``ferry`` package's own root).
ALLOWED = {
    "ferry.cli": {"ferry.app", "ferry.core"},
    "ferry.app": {"ferry.storage", "ferry.proc", "ferry.failpoints", "ferry.core"},
    "ferry.storage": {"ferry.proc", "ferry.failpoints", "ferry.core", "journal"},
    "ferry.proc": {"ferry.failpoints", "ferry.core"},
    "ferry.failpoints": {"ferry.core"},
    "ferry.core": set(),
    "journal": set(),
}
# Leaves any layer may import: pure, and importing only the standard library (checked
# below). journal._json: JSON as the journal writes it, the standard library's codec
# until a process has much to handle, then orjson (whose import costs every command
# 15 ms); ferry's own JSON (the control channel, --json, the lease) is the same.
SHARED_LEAVES = {"journal._json"}
# The use cases reach the local backend only where they must: opening it (session), a
# supervisor writing alone, the journal maintenance commands, files of the state
# directory (stored patches), and the lease's type.
LOCAL_BACKEND_USERS = {
    "ferry.app.session", "ferry.app.supervisor", "ferry.app.service", "ferry.app.pointers",
    "ferry.app.leader", "ferry.app.outbox",  # (the state directory's files: per host)
}  # fmt: skip
# The standard library's I/O, clocks and randomness, which the pure core must not touch.
IO_MODULES = {
    "os", "io", "subprocess", "socket", "shutil", "tempfile", "pathlib", "signal", "select",
    "selectors", "fcntl", "psutil", "filelock", "click", "time", "random", "secrets",
    "threading", "multiprocessing", "ctypes", "mmap",
}  # fmt: skip


def module_files(root: Path, packages: Iterable[str] = ("ferry", "journal")) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> tuple[set[str], set[str]]:
    """(the known modules ``name`` imports, the other top-level modules it imports)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = {f"{module}.{a.name}" for a in node.names} & set(known)
            targets.update(submodules)
            if len(submodules) < len(node.names):  # (names from the module itself)
                targets.add(module)
    inside, outside = set(), set()
    for target in targets:
        probe = target
        while probe and probe not in known:
            probe = probe.rpartition(".")[0]
        if probe:
            if probe != name:
                inside.add(probe)
        else:
            outside.add(target.split(".")[0])
    return inside, outside


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    known = module_files(root)
    graph, external = {}, {}
    for name, path in known.items():
        graph[name], external[name] = imports_of(name, path, known)
    return graph, external


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), and any module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(name: str) -> str | None:
    for layer in ALLOWED:
        if name == layer or name.startswith(layer + "."):
            return layer
    return None  # (the ``ferry`` package root: its version)


def violations(graph: Mapping[str, set[str]], external: Mapping[str, set[str]]) -> list[str]:
    found = []
    for name in sorted(graph):
        layer = layer_of(name)
        if layer is None:
            continue
        for target in sorted(graph[name]):
            other = layer_of(target)
            if other is None or other == layer or target in SHARED_LEAVES:
                continue
            if other not in ALLOWED[layer]:
                found.append(f"{name} imports {target}: {layer} may not import {other}")
            elif (
                layer == "ferry.app"
                and target.startswith("ferry.storage.local.")
                and name not in LOCAL_BACKEND_USERS
            ):
                found.append(f"{name} imports {target}: use cases go through the seam")
        if layer == "ferry.core":
            found += [
                f"{name} imports {m}: the core does no I/O" for m in external[name] & IO_MODULES
            ]
    return found


def test_ferry_has_no_import_cycle() -> None:
    graph, _ = import_graph(ROOT)
    assert cycles(graph) == []


def test_every_import_follows_the_layers() -> None:
    assert violations(*import_graph(ROOT)) == []


def test_a_shared_leaf_imports_nothing_of_ours_and_no_io() -> None:
    graph, external = import_graph(ROOT)
    for leaf in SHARED_LEAVES:
        assert graph[leaf] <= {"journal"}, graph[leaf]  # (its package: journal/__init__)
        assert not external[leaf] & IO_MODULES


def test_every_module_is_in_a_layer() -> None:
    graph, _ = import_graph(ROOT)
    assert [name for name in graph if layer_of(name) is None] == ["ferry"]


@pytest.mark.parametrize("package", ["ferry.cli", "ferry.app", "ferry.storage", "ferry.proc",
                                     "ferry.core", "ferry.storage.local"])  # fmt: skip
def test_every_package_says_what_it_may_import(package: str) -> None:
    path = ROOT.joinpath(*package.split("."), "__init__.py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert "import" in doc, (
        f"{package}: its docstring must say what lives there and what it may import"
    )


# ---- the checker itself: it must see what it is for ------------------------------------


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for package in ("ferry", "journal"):
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return root


def test_the_checker_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "ferry/core/__init__.py": "",
        "ferry/core/a.py": "from ferry.core import b\n",
        "ferry/core/b.py": "def f():\n    from .c import x\n",
        "ferry/core/c.py": "import ferry.core.a\nx = 1\n",
    })  # fmt: skip
    graph, _ = import_graph(root)
    assert cycles(graph) == [["ferry.core.a", "ferry.core.b", "ferry.core.c"]]


def test_the_checker_finds_an_upward_and_an_io_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "ferry/core/__init__.py": "",
        "ferry/core/m.py": "import os\n",
        "ferry/proc/__init__.py": "",
        "ferry/proc/p.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from ferry.app.service import Service\n",
        "ferry/app/__init__.py": "",
        "ferry/app/service.py": "",
        "ferry/app/worker.py": "from ferry.storage.local import store\n",
        "ferry/storage/__init__.py": "",
        "ferry/storage/local/__init__.py": "",
        "ferry/storage/local/store.py": "import journal\n",
    })  # fmt: skip
    assert violations(*import_graph(root)) == [
        "ferry.app.worker imports ferry.storage.local.store: use cases go through the seam",
        "ferry.core.m imports os: the core does no I/O",
        "ferry.proc.p imports ferry.app.service: ferry.proc may not import ferry.app",
    ]
