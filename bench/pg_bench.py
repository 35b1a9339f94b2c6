"""Benchmarks of ferry on PostgreSQL (docs/postgres.md), on a private server started for
the run the way the tests start theirs (tests/pgserver.py: initdb into the temporary
directory, which must be on a real disk, fsync and synchronous_commit on), with
pg_stat_statements loaded to count the statements. Each side gets databases of its own.

pg-throughput     four `ferry -q work -j 2 --drain` processes (`-q`: no line per
                  settled task, as procrastinate's workers at WARNING), four simulated
                  hosts (FERRY_HOST_ID h1..h4, each its own state directory) over 2,000 `true`
                  tasks submitted up front (one `ferry submit --from -`), against the
                  same jobs through procrastinate: four `procrastinate worker
                  --concurrency 2 --one-shot` processes, its task a sync function
                  running the same subprocess `true`. Tasks/s from the workers' start
                  until the last one exited; ratio = ferry's / procrastinate's (higher
                  is better; target >= 1). Four host ids, not two: a second `work` on a
                  host waits as a standby for the host's lease (as on one machine), so
                  two workers per host would run half the slots (measured: each host's
                  second worker got the lease only after the first had drained the
                  queue). Also printed, for both sides, counted by the server over the
                  workers' run (submission excluded): `commits_per_task` (transactions
                  committed in the database, read-only ones in autocommit included;
                  pg_stat_database.xact_commit), `writes_per_task` (transactions that
                  got a transaction id, rolled-back ones included: each one's COMMIT
                  waits for a WAL flush; a row lock is enough to get one),
                  `round_trips_per_task` (statements executed, BEGIN and COMMIT
                  included: pg_stat_statements calls; the connections' start-up not
                  counted), `wal_syncs_per_task` (WAL fsyncs, several commits may share
                  one), `sessions`, `cpu_ms_per_task` (the side's own processes: the
                  children's rusage) and `db_cpu_ms_per_task` (the server's backends).
pg-claim-latency  eight claimer processes (hosts c1..c8, each its own PgStore connection
                  and its host's lease, as `ferry work` claims) drain a queue of 2,000
                  tasks; each claim is timed from asking until `store.claim_next(...)`
                  returned it claimed (CLAIMED + DISPATCHING, durable). Baseline:
                  eight processes, each its own psycopg connection, doing the same
                  number of bare `INSERT` statements in autocommit (each its own
                  transaction: one round trip, one durable COMMIT). ours/base = p99
                  in ms; ratio = ours p99 / base p99 (lower is better); also p50_ms=,
                  base_p50_ms=; the issue's target is p99 <= 5 ms (target_met=).
                  Steady state: each claimer is set up as `ferry work` is (orjson,
                  its start-up's objects frozen), and each connection's first 10
                  claims (and each inserter's first 10 INSERTs) are its warm-up,
                  left out of p50/p99 and printed apart (`cold_p99_ms=`,
                  `base_cold_p99_ms=`: every claim); the server's WAL segments are
                  recycled ones, as on a server in service (`_recycled_wal`).
                  Why it is where it is: the eight claimers claim back to back, so the
                  run is a closed loop bound by CPU on this machine's cores: a claim
                  waits for the others' CPU (theirs and their backends'). Printed:
                  `solo_p50_ms=`/`solo_p99_ms=` (one claimer alone, the same number of
                  claims as each of the eight), `cpu_ms_per_claim=` (a claimer's own
                  CPU in its loop, plus its backend's: the server's backends' CPU per
                  claim), and `cpu_bound_p50_ms=`, eight claims' CPU shared by the
                  cores: what a claim waits at the median, whatever the disk.

`python bench/pg_bench.py claim|insert ...` is the child process of pg-claim-latency.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:  # (run as a child script)
    sys.path.insert(0, str(BENCH_DIR))

from benchkit import (  # noqa: E402
    REPO,
    Figure,
    Options,
    children_cpu_s,
    rate,
    scratch,
    side_by_side,
)

PY = sys.executable
THROUGHPUT_TASKS = 2000
THROUGHPUT_WORKERS = 4
THROUGHPUT_JOBS = 2  # per worker: `ferry work -j 2`, procrastinate --concurrency 2
THROUGHPUT_RUNS_MAX = 3  # a run of both sides takes a minute or two here
CLAIM_TASKS = 2000
CLAIMERS = 8
# Each claimer's (and inserter's) first claims are its connection's warm-up, outside
# the steady figures (printed apart: cold_p99_ms): the server plans the function's
# statements for that backend (custom plans for five calls, then its choice), psycopg
# prepares the statement at its sixth call.
WARM_UP_CLAIMS = 10
CLAIM_TARGET_P99_MS = 5.0
WORKER_TIMEOUT_S = 900
PROCRASTINATE_APP = "_procrastinate_app"


# ---- the server ------------------------------------------------------------------------


def _pgserver() -> Any:
    """tests/pgserver.py, imported by path (the tests are not a package the bench imports)."""
    name = "ferry_bench_pgserver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "pgserver.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@contextlib.contextmanager
def _server() -> Iterator[Any]:
    """A private server for this benchmark, with pg_stat_statements loaded if the
    installation has it (a restart: shared_preload_libraries)."""
    server = _pgserver().PgServer.start()
    try:
        available = server.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_stat_statements'"
        )[0][0]
        if available:
            server.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            server.restart("fast")
            server.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        _recycled_wal(server)
        yield server
    finally:
        server.stop()


def _recycled_wal(server: Any, segments: int = 6) -> None:
    """WAL segments to recycle, as on a server in service: a new cluster has one or
    two, and each new 16 MiB segment is written full of zeros before use, while every
    commit waits (a stall of about 60 ms of all eight claimers here, at each segment
    2,000 claims fill). Switched through, then checkpointed: the checkpoint keeps them
    (min_wal_size) for reuse under new names."""
    server.execute("CREATE TABLE IF NOT EXISTS bench_wal (n int)")
    for _ in range(segments):
        server.execute("INSERT INTO bench_wal VALUES (1)")  # (a switch needs a record)
        server.execute("SELECT pg_switch_wal()")
    server.execute("CHECKPOINT")


class Counters:
    """What the server counted for one database over one side's run: read before and
    after, once that side's sessions are all gone (a backend reports its transaction
    counts when it exits)."""

    FIELDS = ("commits", "writes", "round_trips", "wal_syncs", "sessions", "db_cpu_ms")

    def __init__(self, server: Any, dbname: str) -> None:
        self.server, self.dbname = server, dbname
        self.postmaster = _postmaster_pid(server)
        self.statements = bool(
            server.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
            )[0][0]
        )
        self.before = self._read()

    def _read(self) -> dict[str, int]:
        execute, db = self.server.execute, self.dbname
        stats = execute(
            "SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = %s", (db,)
        )[0]
        counts = {"commits": int(stats[0]), "sessions": int(stats[1])}
        # The next transaction id (this statement takes one itself: counted out below).
        counts["writes"] = int(execute("SELECT pg_current_xact_id()::text::bigint")[0][0])
        counts["wal_syncs"] = int(execute("SELECT wal_sync FROM pg_stat_wal")[0][0])
        # The server's processes that exited (backends, autovacuum workers), reaped by
        # the postmaster: its children's CPU.
        fields = Path(f"/proc/{self.postmaster}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[13]) + int(fields[14])  # cutime, cstime
        counts["db_cpu_ms"] = ticks * 1000 // os.sysconf("SC_CLK_TCK")
        counts["round_trips"] = 0
        if self.statements:
            counts["round_trips"] = int(
                execute(
                    "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                    " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
                    (db,),
                )[0][0]
            )
        return counts

    def per_task(self, tasks: int) -> dict[str, float]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = self.server.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.dbname,)
            )[0][0]
            if not left:
                break
            time.sleep(0.05)
        after = self._read()
        delta = {name: after[name] - self.before[name] for name in self.FIELDS}
        delta["writes"] -= 1  # (the pg_current_xact_id() of the first read)
        result = {name: delta[name] / tasks for name in self.FIELDS if name != "sessions"}
        result["sessions"] = delta["sessions"]
        if not self.statements:
            result["round_trips"] = float("nan")
        return result


def _postmaster_pid(server: Any) -> int:
    """The server's postmaster: the parent of a backend, read while that backend's
    connection is open (once it closes, the backend exits and its /proc entry goes)."""
    import psycopg

    with psycopg.connect(server.url(), autocommit=True, connect_timeout=10) as conn:
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        status = Path(f"/proc/{backend}/status").read_text()
    return int(status.split("PPid:", 1)[1].split()[0])


def _median_counts(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


# ---- pg-throughput -----------------------------------------------------------------------


def _ferry_cmd() -> list[str]:
    script = Path(PY).parent / "ferry"
    return [str(script)] if script.exists() else [PY, "-m", "ferry.cli"]


def _ferry_env(url: str, home: Path, host: str = "admin") -> dict[str, str]:
    env = dict(os.environ)
    env.update(FERRY_DATABASE_URL=url, FERRY_HOME=str(home), FERRY_HOST_ID=host)
    env.pop("FERRY_FAILPOINTS", None)
    return env


def _quiet(cmd: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
    )


def _wait_all(procs: list[subprocess.Popen[bytes]], what: str, log: Path) -> None:
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    try:
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    codes = [proc.returncode for proc in procs]
    if any(codes):
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{what} exited {codes}; its stderr (tail):\n{tail}")


def _ferry_run(server: Any, tmp: Path, n: int, run_no: int) -> tuple[float, dict[str, float]]:
    """One run of ferry's side: seconds from the workers' start until all exited, and
    the server's counts per task."""
    dbname = server.create_database()
    url = server.url(dbname)
    root = tmp / f"ferry{run_no}"
    ferry = _ferry_cmd()
    admin = _ferry_env(url, root / "admin")
    subprocess.run([*ferry, "db", "init"], env=admin, check=True, stdout=subprocess.DEVNULL)
    lines = b'{"argv": ["true"]}\n' * n
    subprocess.run([*ferry, "submit", "--from", "-"], env=admin, input=lines, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    counters = Counters(server, dbname)
    log = (root / "workers.log").open("wb")
    with log:
        cpu = children_cpu_s()
        start = time.perf_counter()
        # -q: no line per settled task (procrastinate's workers log at WARNING: none)
        work = [*ferry, "-q", "work", "-j", str(THROUGHPUT_JOBS), "--drain"]
        procs = [
            _quiet(work, _ferry_env(url, root / f"h{i}", f"h{i}"), log)
            for i in range(1, THROUGHPUT_WORKERS + 1)
        ]
        _wait_all(procs, "ferry work", root / "workers.log")
        seconds = time.perf_counter() - start
        cpu = children_cpu_s() - cpu
    counts = counters.per_task(n)
    counts["cpu_ms"] = cpu * 1000 / n
    done = server.execute(
        "SELECT count(*) FROM ferry_tasks WHERE state = 'SUCCEEDED'", dbname=dbname
    )[0][0]
    if done != n:
        raise RuntimeError(f"ferry: {done} of {n} tasks SUCCEEDED")
    return seconds, counts


def _procrastinate_run(
    server: Any, tmp: Path, n: int, run_no: int
) -> tuple[float, dict[str, float]]:
    """One run of procrastinate's side, set up as its documentation has it: the schema
    applied, the jobs deferred in one batch, workers with the concurrency asked for and
    logging at WARNING (INFO logs two lines per job)."""
    from _procrastinate_app import URL_ENV, make_app

    dbname = server.create_database()
    url = server.url(dbname)
    app = make_app(url)
    with app.open():
        app.schema_manager.apply_schema()
        app.tasks["run_true"].batch_defer(*({} for _ in range(n)))
    counters = Counters(server, dbname)
    env = dict(os.environ)
    env[URL_ENV] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR), env.get("PYTHONPATH")]))
    cmd = [PY, "-m", "procrastinate", "--log-level=warning", f"--app={PROCRASTINATE_APP}.app",
           "worker", f"--concurrency={THROUGHPUT_JOBS}", "--one-shot"]  # fmt: skip
    log_path = tmp / f"procrastinate{run_no}.log"
    with log_path.open("wb") as log:
        cpu = children_cpu_s()
        start = time.perf_counter()
        procs = [_quiet(cmd, env, log) for _ in range(THROUGHPUT_WORKERS)]
        _wait_all(procs, "procrastinate worker", log_path)
        seconds = time.perf_counter() - start
        cpu = children_cpu_s() - cpu
    counts = counters.per_task(n)
    counts["cpu_ms"] = cpu * 1000 / n
    done = server.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'", dbname=dbname
    )[0][0]
    if done != n:
        raise RuntimeError(f"procrastinate: {done} of {n} jobs succeeded")
    return seconds, counts


def _have_procrastinate() -> bool:
    return importlib.util.find_spec("procrastinate") is not None


def _count_fields(prefix: str, counts: dict[str, float]) -> dict[str, str]:
    return {
        f"{prefix}commits_per_task": f"{counts['commits']:.2f}",
        f"{prefix}writes_per_task": f"{counts['writes']:.2f}",
        f"{prefix}round_trips_per_task": f"{counts['round_trips']:.2f}",
        f"{prefix}wal_syncs_per_task": f"{counts['wal_syncs']:.2f}",
        f"{prefix}sessions": f"{counts['sessions']:.0f}",
        f"{prefix}cpu_ms_per_task": f"{counts['cpu_ms']:.1f}",
        f"{prefix}db_cpu_ms_per_task": f"{counts['db_cpu_ms']:.1f}",
    }


def pg_throughput(options: Options) -> Figure:
    n = max(40, int(THROUGHPUT_TASKS * options.scale))
    runs = max(1, min(options.runs, THROUGHPUT_RUNS_MAX))
    ours_counts: list[dict[str, float]] = []
    base_counts: list[dict[str, float]] = []
    with _server() as server, scratch("pg-throughput-") as tmp:
        # Every run's databases and state directories stay until the end (see
        # work-throughput in bench/README.md: deleting thousands of files just before
        # a run slows its file creations down).
        run_no = [0]

        def measured(
            side: Callable[[Any, Path, int, int], tuple[float, dict[str, float]]],
            counts: list[dict[str, float]],
        ) -> float:
            run_no[0] += 1
            seconds, per_task = side(server, tmp, n, run_no[0])
            counts.append(per_task)
            return rate(n, seconds)

        def ours() -> float:
            return measured(_ferry_run, ours_counts)

        if _have_procrastinate():
            ours_rate, base_rate = side_by_side(
                ours, lambda: measured(_procrastinate_run, base_counts), runs
            )
            base = f"{base_rate:.1f}tasks/s(procrastinate)"
        else:
            ours_rate = statistics.median(ours() for _ in range(runs))
            base_rate, base = float("nan"), "missing(procrastinate-not-installed)"
    extra = {"tasks": str(n), "runs": str(runs), "target": ">=1"}
    extra.update(_count_fields("", _median_counts(ours_counts)))
    if base_counts:
        extra.update(_count_fields("base_", _median_counts(base_counts)))
    extra["loadavg"] = _loadavg()
    return Figure("pg-throughput", ours_rate / base_rate, f"{ours_rate:.1f}tasks/s", base, extra)


# ---- pg-claim-latency ----------------------------------------------------------------


def _claimer(url: str, host: str) -> dict[str, Any]:
    """Child: claim as a worker of ``host`` does (``PgStore.claim_next``: CLAIMED +
    DISPATCHING in one call of ``ferry_claim``, one transaction, under the host's lease)
    until the queue is empty; each claim's seconds, its connection's warm-up first
    (WARM_UP_CLAIMS). Set up as ``ferry work`` is: its start-up at the console's
    collector pace, orjson from the start (``_json.bulk``), its start-up's objects
    frozen once it has started (``collector.settle``, at work's first fork). (A claim
    is never refused: the function skips the rows other claimers hold.)"""
    from ferry.app import collector

    collector.start_up()
    from ferry.core.ids import new_claim_token
    from ferry.proc.process import self_identity
    from ferry.storage.postgres.lease import PgLeases
    from ferry.storage.postgres.store import PgStore
    from journal import _json

    _json.bulk()
    store = PgStore.open(url, host)
    me = self_identity()
    epoch = PgLeases(store.db, host, ttl_s=600).acquire(me).epoch
    runner = me.to_json()
    collector.settle()
    latencies: list[float] = []
    _ready()
    cpu = time.process_time()
    while True:
        start = time.perf_counter()
        token = new_claim_token(os.urandom(10))
        if store.claim_next(runner, token, by="work", epoch=epoch) is None:
            break
        latencies.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu
    store.close()
    return {"latencies_s": latencies, "refused": 0, "cpu_s": cpu}


def _inserter(url: str, count: int) -> dict[str, Any]:
    """Child: ``count`` bare INSERTs, each its own durable transaction (autocommit);
    each one's seconds, its connection's warm-up first (as a claimer's)."""
    import psycopg

    latencies: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        _ready()
        for i in range(count):
            start = time.perf_counter()
            conn.execute("INSERT INTO bench_commits (n) VALUES (%s)", (i,))
            latencies.append(time.perf_counter() - start)
    return {"latencies_s": latencies, "refused": 0}


def _ready() -> None:
    """Tell the parent this child is connected, then wait for its go (one line)."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()


def _children(args: list[list[str]]) -> list[dict[str, Any]]:
    """Start one child per argument list, let them all go at once, their results."""
    procs = [
        subprocess.Popen([PY, __file__, *a], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for a in args
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline() != b"ready\n":
                raise RuntimeError(f"a child {args[0][0]} failed to start")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=WORKER_TIMEOUT_S)
            if proc.returncode:
                raise RuntimeError(f"a child {args[0][0]} exited {proc.returncode}")
            results.append(json.loads(out))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, min(len(sorted_values), math.ceil(fraction * len(sorted_values))))
    return sorted_values[rank - 1]


def _queue_of(url: str, n: int) -> None:
    import psycopg

    from ferry.core import events as ev
    from ferry.core.ids import new_task_id
    from ferry.core.spec import TaskSpec
    from ferry.storage.postgres import schema
    from ferry.storage.postgres.store import PgStore

    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn)
    store = PgStore.open(url, "submitter")
    spec = TaskSpec(argv=("true",), cwd="/")
    batch = [ev.Submitted(new_task_id(time.time_ns(), os.urandom(4)), spec, time.time())
             for _ in range(n)]  # fmt: skip
    for start in range(0, n, 500):
        store.commit(*batch[start : start + 500])
    store.close()


def pg_claim_latency(options: Options) -> Figure:
    n = max(CLAIMERS * 10, int(CLAIM_TASKS * options.scale))
    stats: dict[str, list[tuple[float, float]]] = {"ours": [], "base": [], "solo": []}
    refusals: list[int] = []
    cpu_per_claim: list[float] = []
    cold_p99: dict[str, list[float]] = {"ours": [], "base": []}
    with _server() as server:

        def steady(results: list[dict[str, Any]]) -> list[float]:
            """The latencies after each child's warm-up, sorted."""
            return sorted(v for r in results for v in r["latencies_s"][WARM_UP_CLAIMS:])

        def summary(side: str, results: list[dict[str, Any]]) -> float:
            values = steady(results)
            if len(values) != n:
                raise RuntimeError(f"{side}: {len(values)} of {n} commits after warm-up")
            p50, p99 = _percentile(values, 0.50), _percentile(values, 0.99)
            stats[side].append((p50, p99))
            cold = sorted(v for r in results for v in r["latencies_s"])
            cold_p99[side].append(_percentile(cold, 0.99))
            return p99

        def claims(count: int, claimers: int) -> tuple[list[dict[str, Any]], float]:
            """``claimers`` claimers over a queue of ``count`` tasks after their warm-ups;
            their results, and the claims' CPU per claim (theirs and the server's) in
            ms."""
            total = count + claimers * WARM_UP_CLAIMS
            dbname = server.create_database()
            url = server.url(dbname)
            _queue_of(url, total)
            counters = Counters(server, dbname)
            results = _children([["claim", url, f"c{i}"] for i in range(1, claimers + 1)])
            db_ms = counters.per_task(total)["db_cpu_ms"]
            return results, sum(r["cpu_s"] for r in results) * 1000 / total + db_ms

        def ours() -> float:
            results, cpu_ms = claims(n, CLAIMERS)
            refusals.append(sum(r["refused"] for r in results))
            cpu_per_claim.append(cpu_ms)
            solo, _ = claims(n // CLAIMERS, 1)
            solo_values = steady(solo)
            stats["solo"].append((_percentile(solo_values, 0.50), _percentile(solo_values, 0.99)))
            return summary("ours", results)

        def base() -> float:
            dbname = server.create_database()
            server.execute(
                "CREATE TABLE bench_commits (id bigint GENERATED ALWAYS AS IDENTITY"
                " PRIMARY KEY, n bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())",
                dbname=dbname,
            )
            shares = [n // CLAIMERS + (1 if i < n % CLAIMERS else 0) + WARM_UP_CLAIMS
                      for i in range(CLAIMERS)]  # fmt: skip
            url = server.url(dbname)
            return summary("base", _children([["insert", url, str(k)] for k in shares]))

        ours_p99, base_p99 = side_by_side(ours, base, options.runs)
    cores = len(os.sched_getaffinity(0))
    ours_p50 = statistics.median(p50 for p50, _ in stats["ours"])
    base_p50 = statistics.median(p50 for p50, _ in stats["base"])
    extra = {
        "claims": str(n),
        "claimers": str(CLAIMERS),
        "p50_ms": f"{ours_p50 * 1000:.2f}",
        "p99_ms": f"{ours_p99 * 1000:.2f}",
        "base_p50_ms": f"{base_p50 * 1000:.2f}",
        "base_p99_ms": f"{base_p99 * 1000:.2f}",
        "cold_p99_ms": f"{statistics.median(cold_p99['ours']) * 1000:.2f}",
        "base_cold_p99_ms": f"{statistics.median(cold_p99['base']) * 1000:.2f}",
        "refused_per_claim": f"{statistics.median(refusals) / n:.2f}",
        "solo_p50_ms": f"{statistics.median(p50 for p50, _ in stats['solo']) * 1000:.2f}",
        "solo_p99_ms": f"{statistics.median(p99 for _, p99 in stats['solo']) * 1000:.2f}",
        "cpu_ms_per_claim": f"{statistics.median(cpu_per_claim):.2f}",
        "cpu_bound_p50_ms": f"{statistics.median(cpu_per_claim) * CLAIMERS / cores:.2f}",
        "target": f"p99<={CLAIM_TARGET_P99_MS:g}ms",
        "target_met": "yes" if ours_p99 * 1000 <= CLAIM_TARGET_P99_MS else "no",
        "loadavg": _loadavg(),
    }
    return Figure(
        "pg-claim-latency", ours_p99 / base_p99, f"{ours_p99 * 1000:.2f}ms(p99)",
        f"{base_p99 * 1000:.2f}ms(p99,INSERT)", extra,
    )  # fmt: skip


def _loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


BENCHMARKS = {
    "pg-throughput": pg_throughput,
    "pg-claim-latency": pg_claim_latency,
}


def _child(argv: list[str]) -> int:
    role, url, arg = argv
    result = _claimer(url, arg) if role == "claim" else _inserter(url, int(arg))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
