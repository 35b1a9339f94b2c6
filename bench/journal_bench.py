"""Benchmarks of the journal/ write-ahead log against raw I/O and SQLite.

journal-append        one committed record per fsync vs a raw os.write+os.fsync loop of
                      the same bytes on an O_APPEND fd (the physical limit).
journal-vs-sqlite     the same single-record commits vs SQLite (WAL, synchronous=FULL),
                      one row per transaction.
journal-group-commit  8 threads, each append waiting for its commit, vs SQLite with the
                      same 8 threads sharing one connection under a lock. That is
                      SQLite's best case here: it has no group commit, and 8 connections
                      contending for its write lock measured slower (its busy handler
                      sleeps). Note the ceiling: with 8 waiting appenders at most 8
                      records share an fsync, so the ratio cannot pass about 8x the
                      journal-vs-sqlite ratio.
journal-replay        stream and verify 1,000,000 records (journal.read_records:
                      checksum, seq chain and fields of every line) vs a raw loop reading
                      the same segment files line by line with orjson.loads of each.
                      Extra fields: the same raw loop plus a crc32 check of each line (the
                      floor for any reader of this format), Journal.open followed by a full
                      read (what a process pays at start-up: open checks every segment),
                      and the peak RSS of open+read in a fresh interpreter for 1/10 of the
                      records and for all of them (bounded memory: the two should match).
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from benchkit import Figure, Options, fmt_rate, interleaved, rate, scratch, timed

import journal

PAYLOAD_TEXT = "x" * 160  # with the envelope, a line of roughly 250 bytes


def payload(i: int) -> dict[str, Any]:
    return {"i": i, "task": f"t{i:08d}", "note": PAYLOAD_TEXT}


# --------------------------------------------------------------------------- sides


def journal_steps(j: journal.Journal) -> Callable[[range], None]:
    """Single appends, each durable on return."""

    def step(indices: range) -> None:
        for i in indices:
            j.append("bench", payload(i))

    return step


def segment_lines(directory: Path) -> list[bytes]:
    """The exact record lines a journal wrote, in order (for the raw side)."""
    lines: list[bytes] = []
    for path in sorted(directory.glob("*.jsonl")):
        lines += path.read_bytes().splitlines(keepends=True)
    return lines


def raw_steps(fd: int, lines: list[bytes]) -> Callable[[range], None]:
    """One os.write + os.fsync per line on an O_APPEND descriptor."""

    def step(indices: range) -> None:
        for i in indices:
            os.write(fd, lines[i])
            os.fsync(fd)

    return step


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS rec (seq INTEGER PRIMARY KEY, type TEXT, data BLOB)")
    return conn


def sqlite_insert(conn: sqlite3.Connection, i: int) -> None:
    # The same payload as the journal, serialised the same way; one row per transaction.
    conn.execute("BEGIN")
    conn.execute("INSERT INTO rec(type, data) VALUES (?, ?)", ("bench", orjson.dumps(payload(i))))
    conn.execute("COMMIT")


def sqlite_steps(conn: sqlite3.Connection) -> Callable[[range], None]:
    """One row per transaction."""

    def step(indices: range) -> None:
        for i in indices:
            sqlite_insert(conn, i)

    return step


def run_threads(threads: int, per_thread: int, work: Any) -> float:
    """Seconds for `threads` threads each calling work(thread_no, i) per_thread times."""
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def body(t: int) -> None:
        barrier.wait()
        try:
            for i in range(per_thread):
                work(t, i)
        except BaseException as exc:  # reported after join: a failed run is no figure
            errors.append(exc)

    pool = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    seconds = timed(lambda: (barrier.wait(), [thread.join() for thread in pool]))
    if errors:
        raise errors[0]
    return seconds


# --------------------------------------------------------------------------- benchmarks


CHUNKS = 20  # slices per run, alternating sides: both see the same disk weather


def chunk_interleaved(
    n: int, ours_step: Callable[[range], None], base_step: Callable[[range], None]
) -> tuple[float, float]:
    """Seconds each side takes for n records, measured in CHUNKS alternating slices.

    Other processes' fsyncs come and go within seconds on a shared machine; slicing
    the run finely puts both sides under the same load (a whole-run alternation lets
    one side take a quiet minute and the other a busy one)."""
    size = max(1, n // CHUNKS)
    seconds = {"ours": 0.0, "base": 0.0}
    steps = {"ours": ours_step, "base": base_step}
    for number, start in enumerate(range(0, n, size)):
        indices = range(start, min(n, start + size))
        order = ("ours", "base") if number % 2 == 0 else ("base", "ours")
        for side in order:
            started = time.perf_counter()
            steps[side](indices)
            seconds[side] += time.perf_counter() - started
    return seconds["ours"], seconds["base"]


def bench_append(options: Options) -> Figure:
    n = max(50, int(2000 * options.scale))
    with scratch("append-") as root:
        # The raw side writes lines of exactly the journal's format and sizes.
        lines = segment_lines_of_fresh_journal(root / "lines", n)
        ours_rates: list[float] = []
        base_rates: list[float] = []
        for run in range(options.runs):
            j = journal.Journal.open(root / f"j{run}")
            fd = os.open(root / f"raw{run}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                ours_s, base_s = chunk_interleaved(n, journal_steps(j), raw_steps(fd, lines))
            finally:
                j.close()
                os.close(fd)
            ours_rates.append(rate(n, ours_s))
            base_rates.append(rate(n, base_s))
    ours_rate, base_rate = statistics.median(ours_rates), statistics.median(base_rates)
    return Figure(
        "journal-append",
        ours_rate / base_rate,
        fmt_rate(ours_rate),
        fmt_rate(base_rate),
        {"records": str(n), "target": ">=0.9"},
    )


def segment_lines_of_fresh_journal(directory: Path, n: int) -> list[bytes]:
    j = journal.Journal.open(directory)
    try:
        j.append_batch([("bench", payload(i)) for i in range(n)])
    finally:
        j.close()
    return segment_lines(directory)


def bench_vs_sqlite(options: Options) -> Figure:
    n = max(50, int(2000 * options.scale))
    with scratch("sqlite-") as root:
        ours_rates: list[float] = []
        base_rates: list[float] = []
        for run in range(options.runs):
            j = journal.Journal.open(root / f"j{run}")
            conn = sqlite_connect(root / f"s{run}.db")
            try:
                ours_s, base_s = chunk_interleaved(n, journal_steps(j), sqlite_steps(conn))
            finally:
                j.close()
                conn.close()
            ours_rates.append(rate(n, ours_s))
            base_rates.append(rate(n, base_s))
    ours_rate, base_rate = statistics.median(ours_rates), statistics.median(base_rates)
    return Figure(
        "journal-vs-sqlite",
        ours_rate / base_rate,
        fmt_rate(ours_rate),
        fmt_rate(base_rate),
        {"records": str(n), "target": ">=1.3"},
    )


def bench_group_commit(options: Options, threads: int = 8) -> Figure:
    per_thread = max(20, int(1000 * options.scale))
    total = threads * per_thread
    with scratch("group-") as root:
        ours_rates: list[float] = []
        base_rates: list[float] = []
        for run in range(options.runs):
            j = journal.Journal.open(root / f"j{run}")
            conn = sqlite_connect(root / f"s{run}.db")
            lock = threading.Lock()

            def ours(t: int, i: int, j: journal.Journal = j) -> None:
                j.append("bench", payload(i))

            def base(
                t: int, i: int, conn: sqlite3.Connection = conn, lock: threading.Lock = lock
            ) -> None:
                with lock:  # one connection: SQLite serialises its writers anyway
                    sqlite_insert(conn, i)

            try:
                # Each side's threads run per slice, the sides alternating (see
                # chunk_interleaved): every slice is `threads` threads x per-slice appends.
                ours_s, base_s = chunk_interleaved(
                    per_thread,
                    lambda indices: run_threads_for(threads, indices, ours),
                    lambda indices: run_threads_for(threads, indices, base),
                )
            finally:
                j.close()
                conn.close()
            ours_rates.append(rate(total, ours_s))
            base_rates.append(rate(total, base_s))
    ours_rate, base_rate = statistics.median(ours_rates), statistics.median(base_rates)
    return Figure(
        "journal-group-commit",
        ours_rate / base_rate,
        fmt_rate(ours_rate),
        fmt_rate(base_rate),
        {"threads": str(threads), "records": str(total), "target": ">=50"},
    )


def run_threads_for(threads: int, indices: range, work: Callable[[int, int], None]) -> None:
    """`threads` threads, each calling work(thread_no, i) for every i in indices."""
    run_threads(threads, len(indices), lambda t, k: work(t, indices[k]))


# -- replay


def prepare_journal(directory: Path, n: int, batch: int = 5000) -> None:
    """Write n records in batches (setup, not timed)."""
    j = journal.Journal.open(directory)
    try:
        for start in range(0, n, batch):
            j.append_batch([("bench", payload(i)) for i in range(start, min(n, start + batch))])
    finally:
        j.close()


def journal_replay(directory: Path) -> int:
    """Stream every record through the library's reader: checksum, seq chain, fields."""
    count = 0
    for _ in journal.read_records(directory):
        count += 1
    return count


def journal_open_and_replay(directory: Path) -> int:
    """What a process starting up pays: Journal.open (which checks every segment) and
    then a full read."""
    with journal.Journal.open(directory) as j:
        count = 0
        for _ in j.read():
            count += 1
        return count


def raw_replay(directory: Path) -> int:
    count = 0
    for path in sorted(directory.glob("*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                orjson.loads(line)
                count += 1
    return count


def raw_replay_with_crc(directory: Path) -> int:
    """The raw loop plus the one check the format cannot do without: each line's crc32
    (an informational floor: no seq chain, no field checks, no damage handling)."""
    count = 0
    crc32 = zlib.crc32
    for path in sorted(directory.glob("*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                if b"%08x" % crc32(line[:-19]) != line[-11:-3]:
                    raise RuntimeError(f"checksum mismatch in {path}")
                orjson.loads(line)
                count += 1
    return count


_RSS_CHILD = """
import resource, sys
sys.path.insert(0, sys.argv[2])
import journal_bench
count = journal_bench.journal_open_and_replay(__import__("pathlib").Path(sys.argv[1]))
print(count, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def replay_peak_rss(directory: Path) -> tuple[int, int]:
    """(records, peak RSS in bytes) of a replay in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(directory), str(Path(__file__).parent)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout.split()
    return int(out[0]), int(out[1])


def bench_replay(options: Options) -> Figure:
    n = max(1000, int(1_000_000 * options.scale))
    small = max(100, n // 10)
    with scratch("replay-") as root:
        big_dir, small_dir = root / "big", root / "small"
        prepare_journal(big_dir, n)
        prepare_journal(small_dir, small)

        medians = interleaved(
            {
                "ours": lambda: rate(n, timed(lambda: check_count(journal_replay(big_dir), n))),
                "base": lambda: rate(n, timed(lambda: check_count(raw_replay(big_dir), n))),
                "crc": lambda: rate(n, timed(lambda: check_count(raw_replay_with_crc(big_dir), n))),
                "open": lambda: rate(
                    n, timed(lambda: check_count(journal_open_and_replay(big_dir), n))
                ),
            },
            options.runs,
        )
        _, rss_small = replay_peak_rss(small_dir)
        _, rss_big = replay_peak_rss(big_dir)
    ours_rate, base_rate = medians["ours"], medians["base"]
    return Figure(
        "journal-replay",
        ours_rate / base_rate,
        fmt_rate(ours_rate),
        fmt_rate(base_rate),
        {
            "records": str(n),
            "open_then_read": fmt_rate(medians["open"]),
            "raw_plus_crc32": fmt_rate(medians["crc"]),
            f"peak_rss_{small}": f"{rss_small / 2**20:.1f}MiB",
            f"peak_rss_{n}": f"{rss_big / 2**20:.1f}MiB",
            "target": ">=0.7",
        },
    )


def check_count(got: int, want: int) -> None:
    if got != want:
        raise RuntimeError(f"replay read {got} records, expected {want}")


BENCHMARKS = {
    "journal-append": bench_append,
    "journal-vs-sqlite": bench_vs_sqlite,
    "journal-group-commit": bench_group_commit,
    "journal-replay": bench_replay,
}
