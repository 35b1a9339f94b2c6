"""Keyed batches on a shared PostgreSQL database: the key locks a write takes
(``ferry/storage/postgres/store.py``, ``_lock_keys``): one lock per key for a few keys,
a bounded set of hashed buckets for many, so that a ``submit --from`` of any size fits
a stock server's lock table (it overflowed at about 24,000 keys: "out of shared
memory", said as "cannot be reached", exit 75), and writers of the same key still go
one after the other."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from clikit import Ferry, Hosts, finish, wait_stopped, wait_until

from ferry.storage.postgres import store

pytestmark = pytest.mark.timeout(300)


def lines(path: Path, keys: list[str]) -> Path:
    path.write_text("".join(json.dumps({"argv": ["true"], "key": k}) + "\n" for k in keys))
    return path


def count(pg_url: str, sql: str) -> int:
    with psycopg.connect(pg_url) as conn:
        return int(conn.execute(sql).fetchone()[0])


def bucket_of(pg_url: str, key: str) -> int:
    """The key's bucket (``store.KEY_BUCKETS``), as the server hashes it."""
    return count(pg_url, f"SELECT hashtextextended('{key}', 0) & {store.KEY_BUCKETS - 1}")


def first_key(pg_url: str, prefix: str, wanted: Callable[[int], bool]) -> str:
    """The first of ``prefix``0, ``prefix``1, ... whose bucket is ``wanted``."""
    return next(f"{prefix}{n}" for n in range(100_000) if wanted(bucket_of(pg_url, f"{prefix}{n}")))


def the_second_waits(
    pg_url: str, stopped: subprocess.Popen[bytes], host: Ferry, free_key: str, held_key: str
) -> subprocess.Popen[bytes]:
    """While ``stopped`` (a writer stopped inside its transaction) holds its locks: a
    ``submit --key free_key`` is not held up, one of ``held_key`` waits (returned, still
    waiting once ``stopped`` is continued and has ended)."""
    try:
        host.ok("submit", "--key", free_key, "--", "true")
        waiting = host.start("submit", "--key", held_key, "--", "true")
        wait_until(lambda: waiting_on_a_lock(pg_url) == 1, what="the second submit to wait")
        assert waiting.poll() is None
    finally:
        stopped.send_signal(signal.SIGCONT)
    assert finish(stopped)[0] == 0
    return waiting


def keys_in_16_buckets(pg_url: str, count: int) -> list[str]:
    """``count`` keys whose buckets (``store.KEY_BUCKETS``) are among the first 16."""
    with psycopg.connect(pg_url) as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT k FROM (SELECT 'k' || n AS k FROM generate_series(1, 1000000) AS n) AS c"
                " WHERE hashtextextended(k, 0) & %s < 16 LIMIT %s",
                (store.KEY_BUCKETS - 1, count),
            )
        ]


def waiting_on_a_lock(pg_url: str) -> int:
    """How many sessions wait for an advisory lock now."""
    return count(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'")


@pytest.mark.soak  # (about 20 s)
def test_a_keyed_submit_from_of_30000_lines_is_queued(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """30,000 keyed lines in one write: all queued (was: out of shared memory past about
    24,000, exit 75; and the key check, quadratic in the batch, took most of a minute
    between two statements of the open transaction)."""
    a = hosts("a")
    a.timeout_s = 240
    source = lines(tmp_path / "lines", [f"k{n}" for n in range(30_000)])
    started = time.monotonic()
    result = a.ok("submit", "--from", str(source))
    assert len(result.text.split()) == 30_000, result.err
    assert count(pg_url, "SELECT count(*) FROM ferry_tasks WHERE state = 'QUEUED'") == 30_000
    assert time.monotonic() - started < 200
    # The keys hold: one of them again is refused (in flight), a new one is queued.
    a.refused(75, "task.key_in_flight", "submit", "--key", "k29999", "--", "true")
    a.ok("submit", "--key", "k30000", "--", "true")


def test_a_batch_of_many_keys_and_a_write_of_one_of_them_go_one_after_the_other(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """A ``submit --from`` of more keys than take a lock each (``KEYS_ONE_BY_ONE``: its
    buckets are held, exclusive), all in the first 16 buckets, stopped inside its
    transaction, and a ``submit --key`` of one of them on another host: the second
    waits, then is refused (the first's task is in flight: queued). A key in no bucket
    the batch holds is not held up."""
    a, b = hosts("a"), hosts("b")
    keys = keys_in_16_buckets(pg_url, store.KEYS_ONE_BY_ONE + 1)
    free = first_key(pg_url, "free", lambda bucket: bucket >= 16)
    one_of_them = keys[42]
    big = a.start(
        "submit", "--from", str(lines(tmp_path / "lines", keys)), failpoints="before:SUBMITTED=stop"
    )
    wait_stopped(big, what="the batch to stop inside its transaction")
    one = the_second_waits(pg_url, big, b, free, one_of_them)
    code, err = finish(one)
    assert code == 75 and "task.key_in_flight" in err, err
    assert count(pg_url, f"SELECT count(*) FROM ferry_tasks WHERE key = '{one_of_them}'") == 1


def test_writers_of_one_key_go_one_after_the_other_and_others_do_not_wait(
    hosts: Hosts, pg_url: str
) -> None:
    """A few keys: a lock per key (under its bucket's, shared). A ``resolve`` of key K's
    task stopped inside its write holds K: a ``submit --key K`` waits for it; a key of
    the same bucket does not (no bucket held exclusively by a writer of a few keys)."""
    a, b = hosts("a"), hosts("b")
    bucket = bucket_of(pg_url, "K")
    neighbour = first_key(pg_url, "n", lambda other: other == bucket)
    failed = a.ok("submit", "--key", "K", "--", "false").text.strip()
    a.ok("claim", codes=(1,))
    resolving = a.start("resolve", failed, "--as", "failed", failpoints="before:RESOLVED=stop")
    wait_stopped(resolving, what="the resolve to stop inside its write")
    same = the_second_waits(pg_url, resolving, b, neighbour, "K")  # (same bucket: not held up)
    code, err = finish(same)
    assert code == 0, err


def fill_lock_table(hog: psycopg.Connection[object], leave: int) -> None:
    """Fill the server's lock table with ``hog``'s session advisory locks, then let
    ``leave`` of them go: room for that many more locks, in all the server."""
    taken = 0
    try:
        while True:
            hog.execute(
                "SELECT count(pg_advisory_lock(n)) FROM generate_series(%s::bigint, %s::bigint) AS n",
                (taken + 1, taken + 1000),
            )
            taken += 1000
    except psycopg.errors.OutOfMemory:
        pass  # (a session's advisory locks stay taken when its statement fails)
    hog.execute(
        "SELECT count(pg_advisory_unlock(n)) FROM generate_series(1, %s::bigint) AS n", (leave,)
    )


def test_a_keyed_batch_fits_a_lock_table_with_little_room(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """6,000 keyed lines while the server's lock table has room for 3,000 more locks
    (another session holds the rest): queued, taking a few hundred at most (was: one
    per key: "out of shared memory", said as "cannot be reached", exit 75)."""
    a = hosts("a")
    source = lines(tmp_path / "lines", [f"k{n}" for n in range(6_000)])
    with psycopg.connect(pg_url, autocommit=True) as hog:
        fill_lock_table(hog, leave=3_000)
        result = a("submit", "--from", str(source))
        hog.execute("SELECT pg_advisory_unlock_all()")
    assert result.code == 0, result.err
    assert len(result.text.split()) == 6_000


def test_a_batch_of_many_keys_after_a_task_and_a_cancel_of_that_task_both_end(
    hosts: Hosts, pg_url: str, tmp_path: Path
) -> None:
    """A ``submit --from`` of more keys than take a lock each (its buckets exclusive),
    each line ``--after`` a task X with a key of one of those buckets, and a ``cancel`` of X on another host, which
    locks X's row, then its key. Made to meet: a session holds X's bucket, the batch
    waits for it, the cancel starts, the session lets go. Both end, exit 0 (was: the
    batch held its buckets and waited for X's row, FOR SHARE, while the cancel held
    X's row and waited for X's bucket: the server broke the cycle, one of them exit 75
    "deadlock"). Every writer now locks the rows it reads before any key."""
    a, b = hosts("a"), hosts("b")
    keys = keys_in_16_buckets(pg_url, store.KEYS_ONE_BY_ONE + 2)
    x_key = keys.pop()
    bucket = bucket_of(pg_url, x_key)
    x = a.ok("submit", "--key", x_key, "--", "true").text.strip()
    source = tmp_path / "lines"
    source.write_text(
        "".join(json.dumps({"argv": ["true"], "key": k, "after": [x]}) + "\n" for k in keys)
    )
    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (store.KEY_SPACE, bucket))
        big = a.start("submit", "--from", str(source))
        wait_until(lambda: locked_out(pg_url) == 1, what="the batch to wait")
        cancel = b.start("cancel", x)
        wait_until(lambda: locked_out(pg_url) == 2, what="the cancel to wait")
        holder.rollback()
    code, err = finish(big)
    assert code == 0, err
    code, err = finish(cancel)
    assert code == 0, err
    # (the batch's tasks, then X, cancelled: it committed first)
    assert count(pg_url, f"SELECT count(*) FROM ferry_tasks WHERE id <> '{x}'") == len(keys)
    assert a.task(x)["state"] == "CANCELLED"


def locked_out(pg_url: str) -> int:
    """How many other sessions wait for a lock (a row's or an advisory one) now."""
    return count(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
