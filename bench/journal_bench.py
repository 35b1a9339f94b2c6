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
import subprocess
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

import orjson
from benchkit import Figure, Options, fmt_rate, interleaved, rate, scratch, side_by_side, timed

import journal

PAYLOAD_TEXT = "x" * 160  # with the envelope, a line of roughly 250 bytes


def payload(i: int) -> dict[str, Any]:
    return {"i": i, "task": f"t{i:08d}", "note": PAYLOAD_TEXT}


# --------------------------------------------------------------------------- sides


def journal_appends(directory: Path, n: int) -> float:
    """Seconds for n single-record appends (each durable on return) to a fresh journal."""
    j = journal.Journal.open(directory)
    try:
        return timed(lambda: [j.append("bench", payload(i)) for i in range(n)])
    finally:
        j.close()


def segment_lines(directory: Path) -> list[bytes]:
    """The exact record lines a journal wrote, in order (for the raw side)."""
    lines: list[bytes] = []
    for path in sorted(directory.glob("*.jsonl")):
        lines += path.read_bytes().splitlines(keepends=True)
    return lines


def raw_appends(path: Path, lines: list[bytes]) -> float:
    """Seconds for one os.write + os.fsync per line on an O_APPEND descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:

        def loop() -> None:
            for line in lines:
                os.write(fd, line)
                os.fsync(fd)

        return timed(loop)
    finally:
        os.close(fd)


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


def sqlite_appends(path: Path, n: int) -> float:
    conn = sqlite_connect(path)
    try:
        return timed(lambda: [sqlite_insert(conn, i) for i in range(n)])
    finally:
        conn.close()


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


def bench_append(options: Options) -> Figure:
    n = max(50, int(2000 * options.scale))
    with scratch("append-") as root:
        counter = iter(range(10**9))
        last_lines: list[bytes] = []

        def ours() -> float:
            directory = root / f"j{next(counter)}"
            seconds = journal_appends(directory, n)
            last_lines[:] = segment_lines(directory)
            return rate(n, seconds)

        def base() -> float:
            if not last_lines:  # base ran first: produce the same bytes, untimed
                last_lines[:] = segment_lines_of_fresh_journal(root / f"s{next(counter)}", n)
            return rate(n, raw_appends(root / f"raw{next(counter)}", last_lines))

        ours_rate, base_rate = side_by_side(ours, base, options.runs)
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
        counter = iter(range(10**9))
        ours_rate, base_rate = side_by_side(
            lambda: rate(n, journal_appends(root / f"j{next(counter)}", n)),
            lambda: rate(n, sqlite_appends(root / f"s{next(counter)}.db", n)),
            options.runs,
        )
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
        counter = iter(range(10**9))

        def ours() -> float:
            j = journal.Journal.open(root / f"j{next(counter)}")
            try:
                return rate(
                    total,
                    run_threads(threads, per_thread, lambda t, i: j.append("bench", payload(i))),
                )
            finally:
                j.close()

        def base() -> float:
            conn = sqlite_connect(root / f"s{next(counter)}.db")
            lock = threading.Lock()

            def insert(t: int, i: int) -> None:
                with lock:  # one connection: SQLite serialises writers anyway
                    sqlite_insert(conn, i)

            try:
                return rate(total, run_threads(threads, per_thread, insert))
            finally:
                conn.close()

        ours_rate, base_rate = side_by_side(ours, base, options.runs)
    return Figure(
        "journal-group-commit",
        ours_rate / base_rate,
        fmt_rate(ours_rate),
        fmt_rate(base_rate),
        {"threads": str(threads), "records": str(total), "target": ">=50"},
    )


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
