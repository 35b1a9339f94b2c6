"""Output capture throughput of ferry.proc.supervise (the process-and-bytes part of `run`).

supervise-capture: a task that writes 1 GiB (times --scale) to its stdout, supervised
with passthrough on (ferry's fd 1 is /dev/null) and the log on the repository's file
system, fdatasync included; against `cat` of the same bytes to /dev/null. The ratio is
throughput (base time / our time). `vs_tee` compares with `cat FILE | tee LOG
>/dev/null`, which does the same work as ferry (a pipe, a log file, a passthrough) but
without the fdatasync.

supervise-spawn: supervising `true` in-process (spawn, pidfd, loop, reap; no output, so
no fsync) against `subprocess.run(["true"])`: the cost ferry adds to starting a task.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchkit import REPO, Figure, Options, scratch, side_by_side, timed

CHUNK = 1 << 20

SUPERVISE = r"""
import os, sys
from pathlib import Path
from ferry.proc.supervise import SuperviseSpec, supervise
src, out = sys.argv[1], Path(sys.argv[2])
for p in (out / "task.out", out / "task.err"):
    p.unlink(missing_ok=True)
spec = SuperviseSpec(argv=["cat", src], cwd=str(out), env=dict(os.environ), timeout_s=None,
    kill_grace_s=5.0, heartbeat_s=5.0, stdout_log=out / "task.out",
    stderr_log=out / "task.err", heartbeat_path=out / "task.hb", passthrough=True)
outcome = supervise(spec, on_spawned=lambda pid, pgid: None)
sys.exit(outcome.exit_code or 0)
"""


def _payload(path: Path, n_bytes: int) -> None:
    block = os.urandom(CHUNK)
    with path.open("wb") as f:
        for _ in range(n_bytes // CHUNK):
            f.write(block)


def bench_capture(options: Options) -> Figure:
    n_bytes = max(CHUNK, int((1 << 30) * options.scale) // CHUNK * CHUNK)
    with scratch("supervise-") as work:
        source = work / "payload.bin"
        _payload(source, n_bytes)
        env = {**os.environ, "PYTHONPATH": str(REPO)}

        def ours() -> float:
            cmd = [sys.executable, "-c", SUPERVISE, str(source), str(work)]
            return timed(
                lambda: subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env, check=True)
            )

        def cat() -> float:
            return timed(
                lambda: subprocess.run(["cat", str(source)], stdout=subprocess.DEVNULL, check=True)
            )

        def tee() -> float:
            log = work / "tee.log"
            script = f"cat '{source}' | tee '{log}' >/dev/null"
            return timed(lambda: subprocess.run(["sh", "-c", script], check=True))

        ours_s, cat_s = side_by_side(ours, cat, options.runs)
        ours_again_s, tee_s = side_by_side(ours, tee, options.runs)
        assert (work / "task.out").stat().st_size == n_bytes
    mib = n_bytes / 2**20
    return Figure(
        name="supervise-capture",
        ratio=cat_s / ours_s,
        ours=f"{mib / ours_s:.0f}MiB/s",
        base=f"{mib / cat_s:.0f}MiB/s",
        extra={"vs_tee": f"{tee_s / ours_again_s:.2f}", "bytes": str(n_bytes)},
    )


def bench_spawn(options: Options) -> Figure:
    from ferry.proc.supervise import SuperviseSpec, supervise

    n = max(10, int(200 * options.scale))
    with scratch("supervise-spawn-") as work:
        spec = SuperviseSpec(
            argv=["true"],
            cwd=str(work),
            env=dict(os.environ),
            timeout_s=None,
            kill_grace_s=5.0,
            heartbeat_s=5.0,
            stdout_log=work / "task.out",
            stderr_log=work / "task.err",
            heartbeat_path=work / "task.hb",
        )

        def ours() -> float:
            return timed(lambda: [supervise(spec, on_spawned=lambda p, g: None) for _ in range(n)])

        def base() -> float:
            return timed(lambda: [subprocess.run(["true"], check=True) for _ in range(n)])

        ours_s, base_s = side_by_side(ours, base, options.runs)
    return Figure(
        name="supervise-spawn",
        ratio=base_s / ours_s,
        ours=f"{ours_s / n * 1000:.2f}ms",
        base=f"{base_s / n * 1000:.2f}ms",
        extra={"tasks": str(n)},
    )


BENCHMARKS = {"supervise-capture": bench_capture, "supervise-spawn": bench_spawn}
