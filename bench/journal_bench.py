"""Benchmarks of the journal/ write-ahead log against raw I/O and SQLite.

Every figure is a median of runs; in the commit benchmarks each run alternates the
sides in slices (chunk_interleaved), so that both see the same disk weather. The
records' data (the payload dicts) is built before timing on every side: what is timed
is getting given data durably on disk (the journal encodes and checksums it, SQLite
serialises it with orjson, the raw loop writes the journal's own bytes).

journal-append        one committed record per fsync (Journal.append, each durable on
                      return) vs a raw os.write+os.fsync loop of the same bytes on an
                      O_APPEND fd (what the issue calls the physical limit of a growing
                      file). The journal writes over zeros it preallocated, so its
                      fdatasync commits no file size; the extra field raw_prealloc= is
                      that technique's own floor, a raw os.pwrite+os.fdatasync loop over
                      a zero-filled file, and vs_raw_prealloc= our ratio against it.
journal-vs-sqlite     the same single-record commits vs SQLite (WAL, synchronous=FULL),
                      one row per transaction.
journal-group-commit  8 threads appending concurrently through one handle, vs SQLite
                      with the same 8 threads sharing one connection under a lock, one
                      row per transaction (SQLite's best case here: it has no group
                      commit, and 8 connections contending for its write lock measured
                      slower, its busy handler sleeps). Two figures on one line:
                      ratio=             each thread appends batches of 64 records
                                         (append_batch, each call durable on return,
                                         as a busy process journals many tasks at
                                         once): records per second against SQLite's
                                         rows per second (this side makes one call
                                         where the others make 8, so as to write 8x,
                                         not 64x, their records);
                      encode_only=       one thread preparing and encoding the records
                                         in batches of 64 (prepare_batch and
                                         encode_batch, the library's own steps for
                                         append_batch) with no I/O at all:
                                         the CPU ceiling of this interpreter, and
                                         encode_only_ratio= that ceiling against SQLite;
                      append_only=       one thread appending one record at a time to a
                                         journal in memory (/dev/shm: no disk wait):
                                         the Python cost of a waiting append;
                                         per_record_ceiling= the best per_record_ratio
                                         it allows: 8 records per commit, each commit
                                         one fsync (as long as SQLite's) plus 8 of
                                         those appends in a row (the GIL), no thread
                                         handoff counted;
                      per_record_ratio=  each thread appends one record at a time and
                                         waits for its commit (Journal.append). With 8
                                         waiting appenders at most 8 records can share
                                         an fsync, so this ratio cannot pass about 8x
                                         journal-vs-sqlite (per_record= is its
                                         records per second, per_record_per_fsync=
                                         the mean records per commit: one write
                                         and one fdatasync; batch_per_fsync= the
                                         same for ratio=).
journal-replay        stream and verify 1,000,000 records (journal.read_records:
                      checksum, seq chain and fields of every line) vs the floor of a
                      reader that checks each line's crc32 and makes records
                      (floor_records, below): ratio_to_floor (target >= 0.9); raw_ratio
                      against a raw loop reading the same segment files line by line
                      with orjson.loads of each. Extra fields: two floors (floor_replay: any reader that checks each
                      line's crc32, in bulk, then parses it; and one that also makes
                      each a Record, as every reader handing out records must), with
                      their ratios against the raw loop; Journal.open followed by a full
                      read (what a process pays at start-up: open checks every segment),
                      and the peak RSS of open+read in a fresh interpreter for 1/10 of the
                      records and for all of them (bounded memory: the two should match).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson
from benchkit import Figure, Options, fmt_rate, interleaved, rate, scratch, timed

import journal
from journal import (
    _codec,  # (encode_only_rate: the library's own encoding steps)
    _json,
    _reader,  # (floor_replay: the library's own bulk checksum check)
)
from journal._codec import Record

# Steady state: a process that appends or reads much switches to orjson after its first
# 2,000 records (journal._json); these benchmarks measure what comes after.
_json.bulk()

PAYLOAD_TEXT = "x" * 160  # with the envelope, a line of roughly 250 bytes


GROUP_BATCH_RECORDS = 64  # records per append_batch in journal-group-commit's ratio


def payload(i: int) -> dict[str, Any]:
    return {"i": i, "task": f"t{i:08d}", "note": PAYLOAD_TEXT}


def payloads(n: int) -> list[dict[str, Any]]:
    """The data of n records, built before timing (see the module docstring)."""
    return [payload(i) for i in range(n)]


# --------------------------------------------------------------------------- sides


def journal_steps(j: journal.Journal, data: list[dict[str, Any]]) -> Callable[[range], None]:
    """Single appends, each durable on return."""

    def step(indices: range) -> None:
        for i in indices:
            j.append("bench", data[i])

    return step


def segment_lines(directory: Path) -> list[bytes]:
    """The exact record lines a journal wrote, in order (for the raw side)."""
    lines: list[bytes] = []
    for path in sorted(directory.glob("*.jsonl")):
        lines += path.read_bytes().rstrip(b"\0").splitlines(keepends=True)  # (zero tail)
    return lines


def raw_steps(fd: int, lines: list[bytes]) -> Callable[[range], None]:
    """One os.write + os.fsync per line on an O_APPEND descriptor."""

    def step(indices: range) -> None:
        for i in indices:
            os.write(fd, lines[i])
            os.fsync(fd)

    return step


def raw_prealloc_steps(fd: int, lines: list[bytes]) -> Callable[[range], None]:
    """One os.pwrite + os.fdatasync per line, over zeros already on disk (``fd``'s file
    was zero-filled and fsynced before timing)."""
    offset = 0

    def step(indices: range) -> None:
        nonlocal offset
        for i in indices:
            os.pwrite(fd, lines[i], offset)
            offset += len(lines[i])
            os.fdatasync(fd)

    return step


def zero_filled(path: Path, size: int) -> int:
    """A read-write fd on a new file holding ``size`` durable NUL bytes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, bytes(size))
    os.fsync(fd)
    return fd


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS rec (seq INTEGER PRIMARY KEY, type TEXT, data BLOB)")
    return conn


def sqlite_insert(conn: sqlite3.Connection, record: dict[str, Any]) -> None:
    # The same payload as the journal, serialised the same way; one row per transaction.
    conn.execute("BEGIN")
    conn.execute("INSERT INTO rec(type, data) VALUES (?, ?)", ("bench", orjson.dumps(record)))
    conn.execute("COMMIT")


def sqlite_steps(conn: sqlite3.Connection, data: list[dict[str, Any]]) -> Callable[[range], None]:
    """One row per transaction."""

    def step(indices: range) -> None:
        for i in indices:
            sqlite_insert(conn, data[i])

    return step


class Crew:
    """``threads`` threads kept for a whole run, each calling work(thread_no, i) for
    every i of the slice it is given (``crew(indices)`` returns when all are done).

    Threads are made once, not per slice: making, starting and joining 8 threads takes
    about 0.8 ms, some 5% of a slice on the journal's side, and is not appending."""

    def __init__(self, threads: int, work: Callable[[int, int], None]) -> None:
        self.work = work
        self.indices: range | None = None
        self.errors: list[BaseException] = []
        self.start = threading.Barrier(threads + 1)
        self.done = threading.Barrier(threads + 1)
        self.pool = [threading.Thread(target=self._body, args=(t,)) for t in range(threads)]
        for thread in self.pool:
            thread.start()

    def _body(self, t: int) -> None:
        while True:
            self.start.wait()
            if self.indices is None:
                return
            try:
                for i in self.indices:
                    self.work(t, i)
            except BaseException as exc:  # reported by __call__: a failed run is no figure
                self.errors.append(exc)
            self.done.wait()

    def __call__(self, indices: range) -> None:
        self.indices = indices
        self.start.wait()
        self.done.wait()
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        self.indices = None
        self.start.wait()
        for thread in self.pool:
            thread.join()


# --------------------------------------------------------------------------- benchmarks


CHUNKS = 20  # slices per run, alternating sides: both see the same disk weather


def chunk_interleaved(
    n: int, ours_step: Callable[[range], None], base_step: Callable[[range], None]
) -> tuple[float, float]:
    """Seconds each side takes for n records, measured in CHUNKS alternating slices.

    Other processes' fsyncs come and go within seconds on a shared machine; slicing
    the run finely puts both sides under the same load (a whole-run alternation lets
    one side take a quiet minute and the other a busy one)."""
    seconds = chunk_interleaved_sides(n, {"ours": ours_step, "base": base_step})
    return seconds["ours"], seconds["base"]


def chunk_interleaved_sides(n: int, steps: dict[str, Callable[[range], None]]) -> dict[str, float]:
    """chunk_interleaved for any number of sides: each slice runs every side once, the
    order rotating from slice to slice."""
    size = max(1, n // CHUNKS)
    names = list(steps)
    seconds = dict.fromkeys(names, 0.0)
    for number, start in enumerate(range(0, n, size)):
        indices = range(start, min(n, start + size))
        shift = number % len(names)
        for side in names[shift:] + names[:shift]:
            started = time.perf_counter()
            steps[side](indices)
            seconds[side] += time.perf_counter() - started
    return seconds


def bench_append(options: Options) -> Figure:
    n = max(50, int(2000 * options.scale))
    with scratch("append-") as root:
        # The raw side writes lines of exactly the journal's format and sizes.
        lines = segment_lines_of_fresh_journal(root / "lines", n)
        data = payloads(n)
        rates: dict[str, list[float]] = {"ours": [], "base": [], "prealloc": []}
        for run in range(options.runs):
            j = journal.Journal.open(root / f"j{run}")
            fd = os.open(root / f"raw{run}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            pre_fd = zero_filled(root / f"pre{run}", sum(map(len, lines)))
            try:
                seconds = chunk_interleaved_sides(
                    n,
                    {
                        "ours": journal_steps(j, data),
                        "base": raw_steps(fd, lines),
                        "prealloc": raw_prealloc_steps(pre_fd, lines),
                    },
                )
            finally:
                j.close()
                os.close(fd)
                os.close(pre_fd)
            for side, s in seconds.items():
                rates[side].append(rate(n, s))
    ours, base, prealloc = (statistics.median(rates[k]) for k in ("ours", "base", "prealloc"))
    return Figure(
        "journal-append",
        ours / base,
        fmt_rate(ours),
        fmt_rate(base),
        {
            "records": str(n),
            "raw_prealloc": fmt_rate(prealloc),
            "vs_raw_prealloc": f"{ours / prealloc:.2f}",
            "target": ">=0.9",
        },
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
    data = payloads(n)
    with scratch("sqlite-") as root:
        ours_rates: list[float] = []
        base_rates: list[float] = []
        for run in range(options.runs):
            j = journal.Journal.open(root / f"j{run}")
            conn = sqlite_connect(root / f"s{run}.db")
            try:
                ours_s, base_s = chunk_interleaved(
                    n, journal_steps(j, data), sqlite_steps(conn, data)
                )
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
    batch = GROUP_BATCH_RECORDS
    # The batch side makes one call per `every` slice indices (else it would write 64x
    # the records of the others: disk and time for nothing); its rate counts the
    # records it actually appended.
    every = 8
    data = payloads(total)
    with scratch("group-") as root:
        rates: dict[str, list[float]] = {"batch": [], "waiting": [], "sqlite": []}
        # Mean records per commit (one write and one fdatasync each), per run.
        per_fsync: dict[str, list[float]] = {"batch": [], "waiting": []}
        for run in range(options.runs):
            j_batch = journal.Journal.open(root / f"jb{run}")
            j_wait = journal.Journal.open(root / f"jw{run}")
            conn = sqlite_connect(root / f"s{run}.db")
            lock = threading.Lock()
            batched = [0]

            def batches(
                t: int, i: int, j: journal.Journal = j_batch, batched: list[int] = batched
            ) -> None:
                if i % every:
                    return
                start = ((i * threads) + t) * batch % (total - batch)
                j.append_batch([("bench", d) for d in data[start : start + batch]])
                batched[0] += batch

            def waiting(t: int, i: int, j: journal.Journal = j_wait) -> None:
                j.append("bench", data[i * threads + t])

            def base(
                t: int, i: int, conn: sqlite3.Connection = conn, lock: threading.Lock = lock
            ) -> None:
                with lock:  # one connection: SQLite serialises its writers anyway
                    sqlite_insert(conn, data[i * threads + t])

            crews = {
                "batch": Crew(threads, batches),
                "waiting": Crew(threads, waiting),
                "sqlite": Crew(threads, base),
            }
            try:
                # The sides take turns slice by slice (see chunk_interleaved).
                seconds = chunk_interleaved_sides(per_thread, dict(crews))
            finally:
                for crew in crews.values():
                    crew.close()
                j_batch.close()
                j_wait.close()
                conn.close()
            for side, j in (("batch", j_batch), ("waiting", j_wait)):
                per_fsync[side].append(j.committed_records / max(1, j.commits))
            rates["batch"].append(rate(batched[0], seconds["batch"]))
            rates["waiting"].append(rate(total, seconds["waiting"]))
            rates["sqlite"].append(rate(total, seconds["sqlite"]))
        medians = {side: statistics.median(values) for side, values in rates.items()}
    encode_only = max(encode_only_rate(data) for _ in range(3))
    append_only = max(append_only_rate(data[: 2 * per_thread]) for _ in range(3))
    return Figure(
        "journal-group-commit",
        medians["batch"] / medians["sqlite"],
        fmt_rate(medians["batch"]),
        fmt_rate(medians["sqlite"]),
        {
            "threads": str(threads),
            "batch_records": str(batch),
            "per_record_ratio": f"{medians['waiting'] / medians['sqlite']:.2f}",
            "per_record": fmt_rate(medians["waiting"]),
            "per_record_per_fsync": f"{statistics.median(per_fsync['waiting']):.2f}",
            "batch_per_fsync": f"{statistics.median(per_fsync['batch']):.1f}",
            "encode_only": fmt_rate(encode_only),
            "encode_only_ratio": f"{encode_only / medians['sqlite']:.2f}",
            "append_only": fmt_rate(append_only),
            "per_record_ceiling": f"{per_record_ceiling(threads, append_only, medians['sqlite']):.2f}",
            "records": str(total),
            "target": ">=50",
        },
    )


def encode_only_rate(data: list[dict[str, Any]]) -> float:
    """Records per second one thread validates and encodes in batches (the library's
    own steps for append_batch, checksum included) with no I/O, no lock and no other thread: a ceiling for any
    appender in this interpreter, printed as encode_only= (and against SQLite)."""
    batch = GROUP_BATCH_RECORDS
    started = time.perf_counter()
    for start in range(0, len(data), batch):
        items = [("bench", item) for item in data[start : start + batch]]
        prepared = _codec.prepare_batch(items, 0, 1 << 20)
        _codec.encode_batch(start + 1, [item.inner for item in prepared])
    return rate(len(data), time.perf_counter() - started)


def per_record_ceiling(threads: int, append_only: float, sqlite: float) -> float:
    """The best per_record_ratio this interpreter allows: each of ``threads`` waiting
    appenders can give the next commit one record only once its last one is durable, so
    a commit carries at most ``threads`` records and costs at least one fsync (taken to
    be as long as SQLite's commit, 1/``sqlite``) plus the Python of each of its appends,
    one after another under the GIL (1/``append_only`` each). No thread handoff counted."""
    cycle_s = 1 / sqlite + threads / append_only
    return threads / cycle_s / sqlite


def append_only_rate(data: list[dict[str, Any]]) -> float:
    """Records per second one thread appends one at a time (``Journal.append``, each
    waiting for its commit) to a journal in memory (/dev/shm: its fdatasync waits for
    no disk; the bench's own directory where there is none): the Python cost of a
    waiting append alone, so the ceiling of per_record= whatever the threads share."""
    memory = Path("/dev/shm")
    with contextlib.ExitStack() as stack:
        if memory.is_dir():
            d = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=memory)))
        else:
            d = stack.enter_context(scratch("append-only-"))
        j = journal.Journal.open(d / "j")
        try:
            for item in data[:50]:  # (the segment made and mapped: not an append's cost)
                j.append("bench", item)
            started = time.perf_counter()
            for item in data:
                j.append("bench", item)
            return rate(len(data), time.perf_counter() - started)
        finally:
            j.close()


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
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError:
                    if line.strip(b"\0"):
                        raise
                    break  # the last segment's zero tail (try costs nothing until then)
                count += 1
    return count


def floor_replay(directory: Path, *, records: bool) -> int:
    """A floor, not a reader: what any reader of this format that checks every line's
    crc32 must at least do, done the fastest way this interpreter knows (the library's
    own bulk steps): read chunks, split lines, check every checksum in one bulk pass
    (``_reader._checksums_match``), ``orjson.loads`` each line and, with ``records``,
    make each a ``Record``.  No seq chain, no field checks, no damage handling."""
    count = 0
    for path in sorted(directory.glob("*.jsonl")):
        with open(path, "rb") as f:
            pending = b""
            while chunk := f.read(_reader.CHUNK_BYTES):
                lines = chunk.split(b"\n")
                lines[0] = pending + lines[0]
                pending = lines.pop()  # (the zero tail has no newline: it stays here)
                if not _reader._checksums_match(lines):
                    raise RuntimeError(f"checksum mismatch in {path}")
                parsed = map(orjson.loads, lines)
                if records:
                    made = list(map(tuple.__new__, repeat(Record), map(_reader._FIELDS, parsed)))
                    count += len(made)
                else:
                    count += len(list(parsed))
            if pending.strip(b"\0"):
                raise RuntimeError(f"incomplete last line in {path}")
    return count


# VmHWM, not getrusage's ru_maxrss: Linux carries the parent's high-water mark across
# fork+exec into ru_maxrss, so a bench process that grew (recover-time builds a
# million-record journal in-process) would be reported as the replay's peak.
_RSS_CHILD = """
import sys
sys.path.insert(0, sys.argv[2])
import journal_bench
count = journal_bench.journal_open_and_replay(__import__("pathlib").Path(sys.argv[1]))
status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(count, int(status) * 1024)
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
                "checked": lambda: rate(
                    n, timed(lambda: check_count(floor_replay(big_dir, records=False), n))
                ),
                "records": lambda: rate(
                    n, timed(lambda: check_count(floor_replay(big_dir, records=True), n))
                ),
                "open": lambda: rate(
                    n, timed(lambda: check_count(journal_open_and_replay(big_dir), n))
                ),
            },
            options.runs,
        )
        _, rss_small = replay_peak_rss(small_dir)
        _, rss_big = replay_peak_rss(big_dir)
    # The headline is against the floor of a reader that checks every line and makes
    # records (floor_records): what this format allows in CPython (bench/README.md);
    # the raw ratio, against a loop that checks nothing, is printed beside it.
    ours_rate, base_rate, floor = medians["ours"], medians["base"], medians["records"]
    return Figure(
        "journal-replay",
        ours_rate / floor,
        fmt_rate(ours_rate),
        fmt_rate(floor) + "(floor_records)",
        {
            "records": str(n),
            "ratio_to_floor": f"{ours_rate / floor:.2f}",
            "raw": fmt_rate(base_rate),
            "raw_ratio": f"{ours_rate / base_rate:.2f}",
            "open_then_read": fmt_rate(medians["open"]),
            "floor_checked": fmt_rate(medians["checked"]),
            "floor_checked_ratio": f"{medians['checked'] / base_rate:.2f}",
            "floor_records_ratio": f"{floor / base_rate:.2f}",
            f"peak_rss_{small}": f"{rss_small / 2**20:.1f}MiB",
            f"peak_rss_{n}": f"{rss_big / 2**20:.1f}MiB",
            "target": ">=0.9(to_floor)",
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
