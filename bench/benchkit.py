"""Shared helpers for ferry's benchmarks (see bench/README.md).

A benchmark module is any `bench/*_bench.py` that defines

    BENCHMARKS: dict[str, Callable[[Options], Figure]]

`bench/run.py` finds the modules, runs the benchmarks named on its command line (or all)
and prints one line per benchmark, `Figure.line()`:

    NAME ratio=X.XX ours=<value><unit> base=<value><unit> [key=value ...]

Rules every benchmark follows: ours and the baseline are measured side by side in the
same process run (interleaved, `side_by_side`), each figure is the median of
`options.runs` runs, and files go to `work_dir()`, which is on the same file system as
the repository (never tmpfs), so both sides pay the same fsync.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK_ROOT = REPO / "bench" / ".work"  # git-ignored


@dataclass(frozen=True)
class Options:
    runs: int = 5  # median of this many measurements per side
    scale: float = 1.0  # multiply record counts (e.g. 0.1 for a quick smoke run)


@dataclass(frozen=True)
class Figure:
    name: str
    ratio: float
    ours: str  # value with unit, no spaces: "11834rec/s"
    base: str
    extra: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        parts = [f"{self.name} ratio={self.ratio:.2f} ours={self.ours} base={self.base}"]
        parts += [f"{k}={v}" for k, v in self.extra.items()]
        return " ".join(parts)


def work_dir() -> Path:
    """A directory for benchmark files on the repository's file system (not tmpfs)."""
    WORK_ROOT.mkdir(parents=True, exist_ok=True)
    return WORK_ROOT


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A fresh directory under work_dir(), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=work_dir()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def same_filesystem_as_repo(path: Path) -> bool:
    return os.stat(path).st_dev == os.stat(REPO).st_dev


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of fn takes (monotonic clock)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(
    ours: Callable[[], float], base: Callable[[], float], runs: int
) -> tuple[float, float]:
    """Medians of `runs` interleaved measurements of each side (whatever unit they return).

    The order alternates (ours first, then base first) so that slow drift on a shared,
    noisy machine (another process's fsyncs, page-cache state) falls on both sides.
    """
    ours_values: list[float] = []
    base_values: list[float] = []
    for i in range(runs):
        if i % 2 == 0:
            ours_values.append(ours())
            base_values.append(base())
        else:
            base_values.append(base())
            ours_values.append(ours())
    return statistics.median(ours_values), statistics.median(base_values)


def interleaved(sides: dict[str, Callable[[], float]], runs: int) -> dict[str, float]:
    """Like side_by_side for any number of sides: medians of `runs` measurements each,
    the order rotated every run so drift on a noisy machine falls on every side."""
    values: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(runs):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            values[name].append(sides[name]())
    return {name: statistics.median(v) for name, v in values.items()}


def children_cpu_s() -> float:
    """User and system CPU of every child process reaped so far (and of theirs)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def fmt_rate(per_s: float, unit: str = "rec/s") -> str:
    return f"{per_s:.0f}{unit}"


def fmt_mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:.1f}MiB"
