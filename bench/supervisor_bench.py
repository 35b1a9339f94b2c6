"""What a task's supervisor costs (ferry/supervisor.py: one per task, forked by its
launcher, never exec'd).

supervisor-cost: `ferry work -j 4 --drain` over 8 tasks that sleep 2 s; while they run,
each supervisor (a child of the worker) is read from /proc: its memory (USS: the pages
only it holds, Private_Clean + Private_Dirty of /proc/PID/smaps_rollup; PSS: its share
of every page, the shared copy-on-write pages split among the processes that map them)
and its CPU time so far (/proc/PID/schedstat, read again just before its task ends:
the fork's own work, the plan, the spawn, the watching; what is left, the end's
record, is a few more messages).
Baseline: a bare interpreter (`python -c` sleeping), read the same way. ratio = the
supervisor's USS / the bare interpreter's USS (lower is better: what one more running
task costs in memory, against starting a new interpreter for it, which the issue rules
out). Also printed: `pss`, `cpu_ms` per supervisor, the worker's own USS.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchkit import Figure, Options, scratch

PY = sys.executable
TASKS = 8
JOBS = 4


def _smaps(pid: int) -> dict[str, int]:
    """kB values of /proc/PID/smaps_rollup."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            values[key] = int(parts[0])
    return values


def _uss_pss_kib(pid: int) -> tuple[int, int]:
    m = _smaps(pid)
    return m["Private_Clean"] + m["Private_Dirty"], m["Pss"]


def _cpu_ms(pid: int) -> float:
    """Time on a CPU so far (/proc/PID/schedstat, in ns: finer than utime's ticks)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(name))
    return found


def _ferry() -> list[str]:
    script = Path(PY).parent / "ferry"
    return [str(script)] if script.exists() else [PY, "-m", "ferry.cli"]


def supervisor_cost(options: Options) -> Figure:
    uss: list[int] = []
    pss: list[int] = []
    cpu: list[float] = []
    worker_uss: list[int] = []
    bare: list[int] = []
    for _ in range(max(1, options.runs // 2)):
        with scratch("supervisor-cost-") as tmp:
            env = {**os.environ, "FERRY_HOME": str(tmp / "home")}
            env.pop("FERRY_FAILPOINTS", None)
            lines = "".join('{"argv": ["sleep", "2"]}\n' for _ in range(TASKS)).encode()
            subprocess.run([*_ferry(), "submit", "--from", "-"], env=env, input=lines,
                           stdout=subprocess.DEVNULL, check=True)  # fmt: skip
            worker = subprocess.Popen([*_ferry(), "work", "-j", str(JOBS), "--drain"], env=env)
            try:
                for _wave in range(TASKS // JOBS):
                    deadline = time.monotonic() + 10
                    while len(_children(worker.pid)) < JOBS and time.monotonic() < deadline:
                        time.sleep(0.02)
                    time.sleep(1.0)  # planned, spawned, beating: mid-life
                    supervisors = _children(worker.pid)
                    for pid in supervisors:
                        try:
                            u, p = _uss_pss_kib(pid)
                        except (OSError, KeyError):
                            continue
                        uss.append(u)
                        pss.append(p)
                    worker_uss.append(_uss_pss_kib(worker.pid)[0])
                    time.sleep(0.8)  # just before the tasks end
                    for pid in supervisors:
                        try:
                            cpu.append(_cpu_ms(pid))
                        except OSError:
                            continue
                    time.sleep(0.5)
            finally:
                worker.wait(timeout=60)
        interpreter = subprocess.Popen([PY, "-c", "import time; time.sleep(3)"])
        try:
            time.sleep(1.0)
            bare.append(_uss_pss_kib(interpreter.pid)[0])
        finally:
            interpreter.kill()
            interpreter.wait()
    uss_kib, bare_kib = statistics.median(uss), statistics.median(bare)
    extra = {
        "pss": f"{statistics.median(pss) / 1024:.1f}MiB",
        "cpu_ms": f"{statistics.median(cpu):.1f}ms/task",
        "worker_uss": f"{statistics.median(worker_uss) / 1024:.1f}MiB",
        "supervisors_measured": str(len(uss)),
    }
    return Figure(
        "supervisor-cost", uss_kib / bare_kib, f"{uss_kib / 1024:.1f}MiB(uss)",
        f"{bare_kib / 1024:.1f}MiB(uss,bare-python)", extra,
    )  # fmt: skip


BENCHMARKS = {"supervisor-cost": supervisor_cost}
