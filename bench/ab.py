"""Compare installs of ferry on one command, interleaved: an A/B of start-up costs.

    python3.11 -m venv /tmp/a && /tmp/a/bin/pip install /path/to/old/checkout
    python3.11 -m venv /tmp/b && /tmp/b/bin/pip install .
    python bench/ab.py --runs 200 /tmp/a /tmp/b                  # ferry -q run -- true
    python bench/ab.py --runs 100 /tmp/a /tmp/b -- -q submit -- true  # ferry's arguments

Each round runs the command once with each venv's ``ferry`` (each in a home of its
own, kept across rounds) and ``python -c pass`` with the first venv's interpreter, in
turn, so that a machine's slow and fast phases fall on every side alike; it prints
each side's median and mean wall time and its ratio to ``python -c pass``. Not a
benchmark of ``run.py`` (no target): a differences finder for a change whose effect
is a few percent, under the noise of one ``run.py`` figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venvs", nargs="+", help="virtual environments with ferry installed")
    parser.add_argument("--runs", type=int, default=100, help="rounds (default 100)")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :] or ["-q", "run", "--", "true"]
    timings: dict[str, list[float]] = {venv: [] for venv in args.venvs}
    timings["python -c pass"] = []
    with tempfile.TemporaryDirectory(prefix="ferry-ab-") as scratch:
        homes = {venv: os.path.join(scratch, str(i)) for i, venv in enumerate(args.venvs)}
        for _ in range(args.runs):
            for venv in args.venvs:
                env = dict(os.environ, FERRY_HOME=homes[venv])
                timings[venv].append(_timed([os.path.join(venv, "bin", "ferry"), *command], env))
            python = os.path.join(args.venvs[0], "bin", "python")
            timings["python -c pass"].append(_timed([python, "-c", "pass"], dict(os.environ)))
        for home in homes.values():
            shutil.rmtree(home, ignore_errors=True)
    base = statistics.median(timings["python -c pass"])
    for side, values in timings.items():
        median = statistics.median(values)
        print(f"{side:30s} median {median * 1000:7.2f} ms  mean "
              f"{statistics.mean(values) * 1000:7.2f} ms  ratio {median / base:.2f}")  # fmt: skip


def _timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
