"""Benchmarks of the commands an operator types most, against a plain Python process.

ls-history   `ferry ls --json --limit 100` and `ferry show ID` (an old task, from the
             middle of the history) on a home with 100,000 settled tasks (500,000
             records, compacted: the snapshot and its archive hold them, as `run`
             leaves a home in use), each against a plain read of the same number of
             records: a fresh interpreter that reads that many JSON lines from a file
             and prints them as one JSON array (100 for ls, 1 for show). Ratio ours/base
             (lower is better; target <= 3, both). Also printed: the same `ls` on a home
             with 10,000 settled tasks (`ls_10k`) and the ratio of the two
             (`history_growth`: 100,000 vs 10,000; independent of history means ~1).
submit-loop  200 sequential `ferry submit -- true` processes (each one durable journal
             write) vs 200 `python -c pass`: ratio ours/base (lower is better; target
             <= 4). Also printed: the same loop into a home that holds 10,000 queued
             tasks in its snapshot (`queued_10k`), and the ratio of the two
             (`queue_growth`: a submit that does not depend on the queue's length is ~1).

Every side is one process per measurement, started the same way (same interpreter);
the ferry and journal packages are byte-compiled first (as `pip install` does).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchkit import Figure, Options, interleaved, scratch, timed
from ferrykit import PY, compile_packages, env_for, ferry_cmd, journal_with, run

LS_LIMIT = 100
LOOP_SUBMITS = 200
DEEP_QUEUE = 10_000

# The plain read: ``n`` JSON lines from a file, printed as one JSON array.
_PLAIN_READ = (
    "import json, sys\n"
    "with open(sys.argv[1], 'rb') as f:\n"
    "    rows = [json.loads(next(f)) for _ in range(int(sys.argv[2]))]\n"
    "sys.stdout.write(json.dumps(rows))\n"
)


def _history(home: Path, settled_tasks: int) -> None:
    """A home in use: ``settled_tasks`` settled tasks, compacted."""
    journal_with(home, settled_tasks, 0)
    run([*ferry_cmd(), "journal", "compact"], env_for(home), stdout=subprocess.DEVNULL)


def _records_file(path: Path, home: Path, count: int) -> None:
    """``count`` task objects as JSON lines (what the plain read reads)."""
    out = subprocess.run(
        [*ferry_cmd(), "--json", "ls", "--limit", str(count)],
        env=env_for(home), stdin=subprocess.DEVNULL, capture_output=True, check=True,
    )  # fmt: skip
    import json

    path.write_text("".join(json.dumps(obj) + "\n" for obj in json.loads(out.stdout)))


def ls_history(options: Options) -> Figure:
    compile_packages()
    big_n = max(1000, int(100_000 * options.scale))
    small_n = max(100, big_n // 10)
    runs = options.runs
    with scratch("ls-history-") as tmp:
        big, small = tmp / "big", tmp / "small"
        build_s = timed(lambda: _history(big, big_n))
        _history(small, small_n)
        rows = tmp / "rows.jsonl"
        _records_file(rows, big, LS_LIMIT)
        ferry = ferry_cmd()
        old_id = _nth_id(big, big_n // 2)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

        def ls(home: Path) -> float:
            cmd = [*ferry, "--json", "ls", "--limit", str(LS_LIMIT)]
            return timed(lambda: run(cmd, env_for(home), **quiet))

        def show() -> float:
            return timed(lambda: run([*ferry, "--json", "show", old_id], env_for(big), **quiet))

        def plain(count: int) -> float:
            return timed(lambda: run([PY, "-c", _PLAIN_READ, str(rows), str(count)], **quiet))

        medians = interleaved(
            {"ls": lambda: ls(big), "ls_10k": lambda: ls(small), "show": show,
             "plain_ls": lambda: plain(LS_LIMIT), "plain_show": lambda: plain(1)},
            runs,
        )  # fmt: skip
    ms = {name: f"{value * 1000:.1f}ms" for name, value in medians.items()}
    return Figure(
        "ls-history", medians["ls"] / medians["plain_ls"], ms["ls"], ms["plain_ls"],
        {"tasks": str(big_n), "show": ms["show"], "plain_show": ms["plain_show"],
         "show_ratio": f"{medians['show'] / medians['plain_show']:.2f}",
         "ls_10k": ms["ls_10k"], "history_growth": f"{medians['ls'] / medians['ls_10k']:.2f}",
         "build": f"{build_s:.0f}s", "target": "<=3"},
    )  # fmt: skip


def _nth_id(home: Path, n: int) -> str:
    out = subprocess.run(
        [*ferry_cmd(), "--json", "show", str(n)],
        env=env_for(home), stdin=subprocess.DEVNULL, capture_output=True, check=True,
    )  # fmt: skip
    import json

    return str(json.loads(out.stdout)["id"])


def submit_loop(options: Options) -> Figure:
    compile_packages()
    n = max(10, int(LOOP_SUBMITS * options.scale))
    with scratch("submit-loop-") as tmp:
        ferry = ferry_cmd()
        env, deep_env = env_for(tmp / "home"), env_for(tmp / "deep")
        run([*ferry, "submit", "--", "true"], env, stdout=subprocess.DEVNULL)  # the home
        queued = b'{"argv": ["true"]}\n' * max(100, int(DEEP_QUEUE * options.scale))
        run([*ferry, "submit", "--from", "-"], deep_env, input=queued, stdout=subprocess.DEVNULL)
        run([*ferry, "journal", "compact"], deep_env, stdout=subprocess.DEVNULL)
        cmd = [*ferry, "submit", "--", "true"]

        def ours(home_env: dict[str, str]) -> float:
            return timed(lambda: [run(cmd, home_env, stdout=subprocess.DEVNULL) for _ in range(n)])

        def base() -> float:
            return timed(lambda: [run([PY, "-c", "pass"]) for _ in range(n)])

        medians = interleaved(
            {"ours": lambda: ours(env), "base": base, "deep": lambda: ours(deep_env)},
            options.runs,
        )
    per = {name: value / n for name, value in medians.items()}
    return Figure(
        "submit-loop", per["ours"] / per["base"], f"{per['ours'] * 1000:.1f}ms/submit",
        f"{per['base'] * 1000:.1f}ms/process",
        {"submits": str(n), "loop": f"{medians['ours']:.2f}s", "target": "<=4",
         "queued_10k": f"{per['deep'] * 1000:.1f}ms/submit",
         "queue_growth": f"{per['deep'] / per['ours']:.2f}"},
    )  # fmt: skip


BENCHMARKS = {
    "ls-history": ls_history,
    "submit-loop": submit_loop,
}
