"""Run ferry's benchmarks. Not tests: figures, each against a baseline measured alongside.

    python bench/run.py                  # every benchmark
    python bench/run.py journal-append   # just these (names or fnmatch patterns)
    python bench/run.py --list           # the names
    python bench/run.py --runs 3 --scale 0.1 'journal-*'   # a quick smoke run

Each benchmark prints exactly one line on stdout:

    NAME ratio=X.XX ours=<value><unit> base=<value><unit> [key=value ...]

Benchmarks live in `bench/*_bench.py` modules, each with a `BENCHMARKS` dict mapping a
name to a function `(Options) -> Figure` (see bench/benchkit.py and bench/README.md).
A new module plugs in just by existing; names must be unique across modules.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from benchkit import Figure, Options  # noqa: E402

Benchmark = Callable[[Options], Figure]


def discover() -> dict[str, Benchmark]:
    """Every benchmark in bench/*_bench.py, by name, in module then definition order.

    A module that fails to import is reported on stderr and skipped: the others run."""
    registry: dict[str, Benchmark] = {}
    for path in sorted(BENCH_DIR.glob("*_bench.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            print(f"bench: cannot import {path.name}; its benchmarks are skipped", file=sys.stderr)
            traceback.print_exc()
            continue
        for name, fn in getattr(module, "BENCHMARKS", {}).items():
            if name in registry:
                raise SystemExit(f"bench: {name} is defined twice (second in {path.name})")
            registry[name] = fn
    return registry


def select(registry: dict[str, Benchmark], patterns: list[str]) -> list[str]:
    if not patterns:
        return list(registry)
    chosen: list[str] = []
    for pattern in patterns:
        hits = [n for n in registry if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise SystemExit(f"bench: no benchmark named {pattern!r}; try --list")
        chosen += [n for n in hits if n not in chosen]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmark names or patterns (default: all)")
    parser.add_argument("--runs", type=int, default=5, help="runs per side; the median is shown")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply record counts")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    registry = discover()
    if args.list:
        print("\n".join(registry))
        return 0
    options = Options(runs=args.runs, scale=args.scale)
    failed: list[str] = []
    for name in select(registry, args.names):
        try:
            figure = registry[name](options)
        except Exception:
            # No line for a figure that was not measured; the others still run.
            print(f"bench: {name} failed", file=sys.stderr)
            traceback.print_exc()
            failed.append(name)
            continue
        print(figure.line(), flush=True)
    if failed:
        print(f"bench: failed: {' '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
