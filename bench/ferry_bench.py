"""Benchmarks of the ferry command against what a user would otherwise run.

run-overhead      `ferry run -- true` wall time vs `python -c pass` (same interpreter):
                  the ratio is ours/base (lower is better; target <= 4), on a new
                  home. Also printed: steady= and steady_ratio=, the same in a home
                  with a history (6,000 settled tasks, 30,000 records, compacted as
                  `run` does on its own: the snapshot covers them, but the active
                  8 MiB segment still holds them; start-up must not read them) and
                  as many records after the snapshot as a round leaves room for before
                  `run` compacts again (every command folds those; none when a round
                  adds more than the threshold, SNAPSHOT_TAIL_RECORDS: its runs then
                  compact as they go, as in a home in use).
run-capture       1 GiB of task output through `ferry run -- cat FILE` (ferry keeps the
                  full log and fdatasyncs it) vs `cat FILE`, both writing into the
                  same sink: a pipe drained by a reader process (what a terminal or
                  a CI log collector is). Throughput ratio ours/base (higher is
                  better; target >= 0.5). Also printed: the ratio against
                  `cat FILE > /dev/null` (never touches a pipe or a disk: a bound no
                  tool that keeps a log can approach) and against
                  `cat FILE | tee LOG > /dev/null` (the like-for-like with a log; tee
                  does not fsync its log, ferry does).
work-throughput   `ferry -q work --drain -j 2` over 1,000 queued `true` tasks, every
                  transition durably journaled, vs GNU parallel -j 2 over the same
                  commands: ratio = parallel's time per task / ours (higher is better;
                  target >= 2); also the same against `xargs -P 2` (no durability at
                  all). Without GNU parallel the line says base=missing(...) and the
                  ratio is nan. cpu_ours= and cpu_parallel=: the CPU (user + system)
                  of every process of each side, per task.
recover-time      `ferry recover` on a journal of 1,000,000 settled records plus 10
                  in-flight tasks vs on a journal with only the 10: ratio ours/base
                  (lower is better; target <= 5). Both journals are compacted first,
                  as a leader does on its own; the first, uncompacted recover is
                  reported too.

Before measuring, the ferry and journal packages are byte-compiled (as `pip install`
does), so neither side pays for compiling source.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from benchkit import (
    Figure,
    Options,
    children_cpu_s,
    interleaved,
    scratch,
    side_by_side,
    timed,
)
from ferrykit import PY, compile_packages, env_for, ferry_cmd, journal_with, run

import journal
from ferry.storage.local.store import SNAPSHOT_TAIL_RECORDS

STEADY_SETTLED_TASKS = 6000  # run-overhead's steady home: 30,000 records


def run_overhead(options: Options) -> Figure:
    compile_packages()
    n = max(5, int(20 * options.scale))
    settled = max(100, int(STEADY_SETTLED_TASKS * options.scale))
    with scratch("run-overhead-") as tmp:
        env, steady = env_for(tmp / "home"), env_for(tmp / "steady")
        ferry = ferry_cmd()
        run([*ferry, "run", "--", "true"], env)  # create the state directory once
        # A home in use for a while: its history compacted away, but the active segment
        # still holds the records before the snapshot, and as many records after it as
        # a round leaves room for before `run` compacts again (see the module
        # docstring). Each round starts from a copy of it (each run adds 5 records).
        template = tmp / "steady-template"
        journal_with(template, settled, 0)
        run([*ferry, "journal", "compact"], env_for(template), stdout=subprocess.DEVNULL)
        tail = max(0, SNAPSHOT_TAIL_RECORDS - 5 * n - 50) // 5
        journal_with(template, tail, 0)

        def runs_in(home_env: dict[str, str]) -> float:
            cmd = [*ferry, "run", "--", "true"]
            return timed(lambda: [run(cmd, home_env) for _ in range(n)]) / n

        def in_steady_home() -> float:
            shutil.rmtree(tmp / "steady", ignore_errors=True)
            shutil.copytree(template, tmp / "steady")
            # The copy's dirty pages are the benchmark's, not a run's: written out now,
            # else ext4 (data=ordered) flushes them inside the next runs' fsyncs, and
            # the side timed after this one paid for them (ours 82.6 ms with this side,
            # 50.3 without it, in one hour).
            os.sync()
            return runs_in(steady)

        def base() -> float:
            return timed(lambda: [run([PY, "-c", "pass"]) for _ in range(n)]) / n

        medians = interleaved(
            {"ours": lambda: runs_in(env), "steady": in_steady_home, "base": base},
            options.runs,
        )
    ours_s, steady_s, base_s = medians["ours"], medians["steady"], medians["base"]
    return Figure(
        "run-overhead", ours_s / base_s, f"{ours_s * 1000:.1f}ms", f"{base_s * 1000:.1f}ms",
        {"steady": f"{steady_s * 1000:.1f}ms", "steady_ratio": f"{steady_s / base_s:.2f}",
         "steady_records": f"{settled * 5}+{tail * 5}", "target": "<=4"},
    )  # fmt: skip


def _into_drained_pipe(cmd: list[str], env: dict[str, str] | None, reader: list[str]) -> float:
    """Seconds for ``cmd`` to write its output into a pipe that ``reader`` (a separate
    process) drains, until both have exited. The reader starts before the clock."""
    drain = subprocess.Popen(reader, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert drain.stdin is not None
    start = time.perf_counter()
    writer = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=drain.stdin)
    drain.stdin.close()
    codes = writer.wait(), drain.wait()
    seconds = time.perf_counter() - start
    if codes != (0, 0):
        raise RuntimeError(f"{cmd} | {reader} exited {codes}")
    return seconds


def run_capture(options: Options) -> Figure:
    """The headline compares both sides writing into the same realistic sink, a pipe
    drained by a reader process (a terminal or a CI log collector is one). Against
    `cat FILE > /dev/null` (no pipe, no disk: the kernel only copies page cache into
    nothing) no runner that keeps a log can reach 0.5, so that ratio is printed as a
    bound, not as the target; `cat | tee LOG` is the like-for-like with a log."""
    compile_packages()
    size = int((1 << 30) * options.scale)
    with scratch("run-capture-") as tmp:
        data = tmp / "data.bin"
        with data.open("wb") as out:
            block = os.urandom(1 << 20)
            for _ in range(max(1, size >> 20)):
                out.write(block)
        size = data.stat().st_size
        env = env_for(tmp / "home")
        ferry = ferry_cmd()
        log = tmp / "tee.log"

        def ours() -> float:
            shutil.rmtree(tmp / "home" / "logs", ignore_errors=True)
            return size / _into_drained_pipe([*ferry, "run", "--", "cat", str(data)], env, ["cat"])

        def pipe() -> float:
            return size / _into_drained_pipe(["cat", str(data)], None, ["cat"])

        def devnull() -> float:
            with open(os.devnull, "wb") as sink:
                return size / timed(lambda: run(["cat", str(data)], stdout=sink))

        def tee() -> float:
            log.unlink(missing_ok=True)
            return size / _into_drained_pipe(["cat", str(data)], None, ["tee", str(log)])

        sides = {"ours": ours, "pipe": pipe, "devnull": devnull, "tee": tee}
        bps = interleaved(sides, options.runs)
        log.unlink(missing_ok=True)

    def mib_s(side: str) -> str:
        return f"{bps[side] / 2**20:.0f}MiB/s"

    extra = {
        "bytes": str(size),
        "target": ">=0.5",
        "devnull": mib_s("devnull"),
        "ratio_vs_devnull": f"{bps['ours'] / bps['devnull']:.2f}",
        "tee_log": mib_s("tee"),
        "ratio_vs_tee_log": f"{bps['ours'] / bps['tee']:.2f}",
    }
    return Figure(
        "run-capture", bps["ours"] / bps["pipe"], mib_s("ours"), mib_s("pipe") + "(cat|reader)",
        extra,
    )  # fmt: skip


def _have(tool: str) -> bool:
    return shutil.which(tool) is not None


def work_throughput(options: Options) -> Figure:
    compile_packages()
    n = max(20, int(1000 * options.scale))
    with scratch("work-throughput-") as tmp:
        ferry = ferry_cmd()
        lines = "".join('{"argv": ["true"]}\n' for _ in range(n)).encode()
        commands = "".join("true\n" for _ in range(n)).encode()
        round_no = [0]
        cpu: dict[str, list[float]] = {"ours": [], "parallel": []}

        def ours() -> float:
            round_no[0] += 1
            env = env_for(tmp / f"home{round_no[0]}")
            run([*ferry, "submit", "--from", "-"], env, input=lines, stdout=subprocess.DEVNULL)
            before = children_cpu_s()
            seconds = timed(
                lambda: run(
                    # -q: no line per settled task (GNU parallel prints none either)
                    [*ferry, "-q", "work", "--drain", "-j", "2"],
                    env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            cpu["ours"].append((children_cpu_s() - before) / n)
            # Each run's home stays until the end (scratch removes them all): deleting
            # its ~4,000 files here made the next run's file creations 2-3x slower, as
            # ext4 skips recently deleted inodes when it allocates one (perf showed
            # recently_deleted() under ext4_create/ext4_mkdir taking 45% of the CPU).
            # A state directory in use does not see thousands of deletions a second.
            return seconds / n

        def parallel() -> float:
            before = children_cpu_s()
            seconds = timed(
                lambda: run(
                    ["parallel", "--will-cite", "-j", "2"],
                    input=commands,
                    stdout=subprocess.DEVNULL,
                )
            )
            cpu["parallel"].append((children_cpu_s() - before) / n)
            return seconds / n

        def xargs() -> float:
            seconds = timed(
                lambda: run(["xargs", "-P", "2", "-I{}", "sh", "-c", "{}"], input=commands)
            )
            return seconds / n

        sides = {"ours": ours, "xargs": xargs}
        if _have("parallel"):
            sides["parallel"] = parallel
        # At least three rounds: one run of each side is a single draw from a noisy
        # machine (one round measured anywhere from 1.3 to 2.1 here).
        per_task = interleaved(sides, max(3, options.runs))
    ours_s, xargs_s = per_task["ours"], per_task["xargs"]
    extra = {
        "tasks": str(n),
        "target": ">=2",
        "xargs": f"{xargs_s * 1000:.2f}ms/task",
        "ratio_vs_xargs": f"{xargs_s / ours_s:.2f}",
    }
    # CPU of every process of each side (user + system, reaped descendants included),
    # per task: on 2 cores, time per task can never be below half of it.
    for side, values in cpu.items():
        if values:
            extra[f"cpu_{side}"] = f"{statistics.median(values) * 1000:.2f}ms/task"
    if "parallel" in per_task:
        base_s, base = per_task["parallel"], f"{per_task['parallel'] * 1000:.2f}ms/task(parallel)"
    else:
        base_s, base = float("nan"), "missing(GNU-parallel-not-installed:apt-get-install-parallel)"
    return Figure("work-throughput", base_s / ours_s, f"{ours_s * 1000:.2f}ms/task", base, extra)


def recover_time(options: Options) -> Figure:
    compile_packages()
    settled = max(1000, int(1_000_000 * options.scale)) // 5
    with scratch("recover-time-") as tmp:
        ferry = ferry_cmd()
        big, small = tmp / "big", tmp / "small"
        build_s = timed(lambda: journal_with(big, settled, 10))
        journal_with(small, 0, 10)
        records = journal.Journal.open(big / "journal").last_seq
        first = timed(
            lambda: run(
                [*ferry, "recover", "--dry-run"],
                env_for(big),
                check=False,
                stdout=subprocess.DEVNULL,
            )
        )
        for home in (big, small):  # compact, as a leader does on its own
            run([*ferry, "journal", "compact"], env_for(home), stdout=subprocess.DEVNULL)

        def side(home: Path) -> float:
            # exit 3: the 10 dead mutating tasks would need an operator (expected)
            return timed(
                lambda: run(
                    [*ferry, "recover", "--dry-run"],
                    env_for(home),
                    check=False,
                    stdout=subprocess.DEVNULL,
                )
            )

        ours_s, base_s = side_by_side(lambda: side(big), lambda: side(small), options.runs)
    return Figure(
        "recover-time", ours_s / base_s, f"{ours_s * 1000:.0f}ms", f"{base_s * 1000:.0f}ms",
        {"records": str(records), "uncompacted_first": f"{first * 1000:.0f}ms",
         "build": f"{build_s:.0f}s", "target": "<=5"},
    )  # fmt: skip


BENCHMARKS = {
    "run-overhead": run_overhead,
    "run-capture": run_capture,
    "work-throughput": work_throughput,
    "recover-time": recover_time,
}
