"""Concurrent compactions (cron's `ferry journal compact`, a leader's, `run`'s own) never
leave a snapshot that names a pruned archive: they are serialised by a lock. A process
that loaded an older snapshot still finds the history it needs once the archives that
snapshot named were merged and pruned."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from clikit import Ferry, finish, wait_until

from ferry.app.merge_aside import MergeAside
from ferry.core import events as ev
from ferry.core import state
from ferry.core.ids import new_task_id
from ferry.core.model import Reason, State
from ferry.core.spec import TaskSpec
from ferry.storage.local import store as store_module
from ferry.storage.local.statedir import ensure_home
from ferry.storage.local.store import SNAPSHOT_TAIL_RECORDS, Store
from journal import read_latest_snapshot

pytestmark = pytest.mark.timeout(240)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, FERRY_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "ferry.cli", *args], env=env, capture_output=True, timeout=120
    )


@pytest.mark.soak  # (10 s of racing compactions; tox -e soak)
def test_concurrent_compactions_keep_every_archive_a_snapshot_names(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for round_no in range(4):
        lines = "".join('{"argv": ["true"]}\n' for _ in range(15)).encode()
        env = dict(os.environ, FERRY_HOME=str(home))
        subprocess.run(
            [sys.executable, "-m", "ferry.cli", "submit", "--from", "-"],
            env=env, input=lines, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "ferry.cli", "work", "--drain", "-j", "2", "--poll", "0.05"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        compactors = [
            subprocess.Popen(
                [sys.executable, "-m", "ferry.cli", "journal", "compact"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for _ in range(4)
        ]
        for proc in [worker, *compactors]:
            assert proc.wait(timeout=120) == 0, f"round {round_no}: {proc.args}"
    assert cli(home, "journal", "verify").returncode == 0
    listed = cli(home, "--json", "ls", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count(b'"SUCCEEDED"') == 60


def test_a_compaction_waits_for_the_one_in_progress(tmp_path: Path) -> None:
    """The serialisation itself: while another compaction holds the lock, a second one
    does not start its snapshot (it would prune what the first is about to name)."""
    import fcntl
    import time

    home = tmp_path / "home"
    assert cli(home, "run", "--", "true").returncode == 0
    lock_path = home / "compact.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "another compaction is in progress"
    env = dict(os.environ, FERRY_HOME=str(home))
    second = subprocess.Popen(
        [sys.executable, "-m", "ferry.cli", "journal", "compact"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # it must still be waiting all this while
            assert second.poll() is None, "compacted while another compaction held the lock"
            assert not list((home / "journal").glob("snapshot-*"))
            time.sleep(0.05)
    finally:
        os.close(fd)  # releases the lock
    assert second.wait(timeout=60) == 0
    assert list((home / "journal").glob("snapshot-*"))


def test_a_runner_left_behind_by_a_compaction_still_settles_its_task(tmp_path: Path) -> None:
    """A `run` in flight reads the journal only at its heartbeats and its commits. Other
    commands write several segments and compact meanwhile: its SETTLED must still land.
    (It went into the runner's removed segment, reported committed: the task stayed
    RUNNING, and recover then failed it, or requeued it to run twice if idempotent.)"""
    import time

    home = tmp_path / "home"
    go = tmp_path / "go"
    env = dict(os.environ, FERRY_HOME=str(home))
    wait_for_go = f"while [ ! -e {go} ]; do sleep 0.05; done"
    runner = subprocess.Popen(
        [sys.executable, "-m", "ferry.cli", "run", "--heartbeat", "1000", "--", "sh", "-c",
         wait_for_go],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b'"RUNNING"' not in cli(home, "--json", "ls").stdout:
            assert time.monotonic() < deadline, "the task never ran"
            time.sleep(0.05)
        big = tmp_path / "big.jsonl"
        env = [f"V{i}=" + "x" * (100 << 10) for i in range(30)]  # 3 MiB (never run)
        big.write_text(json.dumps({"argv": ["true"], "env": env}) + "\n")
        for _ in range(8):  # ~24 MiB: the runner's segment is sealed, and two after it
            assert cli(home, "submit", "--from", str(big)).returncode == 0
        compacted = cli(home, "--json", "journal", "compact")
        assert compacted.returncode == 0, compacted.stderr
        go.touch()
        assert runner.wait(timeout=60) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=10)
    states = [t["state"] for t in json.loads(cli(home, "--json", "ls").stdout)]
    assert states.count("SUCCEEDED") == 1 and "RUNNING" not in states, states
    assert cli(home, "journal", "verify").returncode == 0
    removed = json.loads(cli(home, "--json", "journal", "compact").stdout)["removed"]
    assert removed, "with nobody behind, the sealed segments go"


SMALL_ARCHIVES = str(Path(__file__).with_name("small_archives.py"))


def compact_small(ferry: Ferry, archives_max: int = 2) -> dict[str, object]:
    """`ferry journal compact` with ARCHIVES_MAX lowered (merges after a few)."""
    report: dict[str, object] = ferry.json(
        "journal", "compact", command=(sys.executable, SMALL_ARCHIVES, str(archives_max))
    )
    return report


def archive_names(ferry: Ferry) -> set[str]:
    return {p.name for p in (ferry.home / "archive").glob("settled-*")}


def test_a_compaction_is_due_once_the_tail_outweighs_the_live_tasks(tmp_path: Path) -> None:
    """A snapshot holds every live task: writing one costs about as much as folding as
    many records. With a long queue, every compaction due by the tail alone wrote it
    all again (work looks once a second: with 100,000 tasks queued, it would have
    compacted at every look). Due now once the records after the snapshot are more
    than a quarter of the live tasks too (LIVE_PER_TAIL_RECORD)."""
    home = tmp_path / "home"
    ensure_home(home)
    store = Store.open(home)
    try:
        spec = TaskSpec(argv=("true",), cwd="/")
        now = time.time()
        count = SNAPSHOT_TAIL_RECORDS
        ids = [new_task_id(time.time_ns() + i, os.urandom(4)) for i in range(count * 9)]
        store.commit(*[ev.Submitted(task_id, spec, now) for task_id in ids[: count * 8]])
        store.compact()  # a long queue in the snapshot
        store.commit(*[ev.Submitted(task_id, spec, now) for task_id in ids[count * 8 :]])
        assert store.tail_records() >= SNAPSHOT_TAIL_RECORDS
        assert store.maybe_compact() is None  # a tail of a ninth of the live tasks: not due
        cancelled = ids[: count * 2]  # (a tail of 3 x count, 7 x count live)
        store.commit(*[ev.Settled(task_id, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER)
                       for task_id in cancelled])  # fmt: skip
        report = store.maybe_compact()
        assert report is not None and store.tail_records() == 0
    finally:
        store.close()


def test_between_turns_a_compaction_that_must_rewrite_history_is_skipped_without_io(
    ferry: Ferry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table that folded FORGOTTEN records no compaction has rewritten the archives
    for may compact only by rewriting them (a merge): not between work's turns, and
    work looks once a second, so it says no without reading anything (it read and
    parsed the snapshot at every look)."""
    store = stuck_store(ferry)
    try:

        def no_io(*args: object, **kwargs: object) -> None:
            raise AssertionError("read the journal's snapshot")

        monkeypatch.setattr(store.wal, "latest_snapshot", no_io)
        assert store.maybe_compact(merge=False) == {"merges_waiting": True}  # (work: beside)
        monkeypatch.undo()
        assert store.maybe_compact() is not None  # (one that may merge does)
    finally:
        store.close()


def stuck_store(ferry: Ferry) -> Store:
    """A store (work's, say) whose table folded FORGOTTEN records of three settled
    tasks that no compaction has rewritten the archives without (a gc, before its
    compaction), and enough records after the snapshot for a compaction to be due."""
    for _ in range(3):
        ferry.ok("run", "--", "true")
    store = Store.open(ferry.home)
    store.commit(*[ev.Forgotten(task.id, 1) for task in store.newest(3)])
    add_cancelled(store, SNAPSHOT_TAIL_RECORDS)
    assert store.table.history_needs_rewrite() and store.compaction_due()
    return store


def add_cancelled(store: Store, count: int) -> None:
    """``count`` tasks submitted and cancelled, through ``store``: two records each."""
    ids = [new_task_id(time.time_ns() + i, os.urandom(4)) for i in range(count)]
    spec = TaskSpec(argv=("true",), cwd="/")
    store.commit(*[ev.Submitted(task_id, spec, time.time()) for task_id in ids])
    store.commit(*[ev.Settled(task_id, 1, None, State.CANCELLED, Reason.CANCELLED_BY_USER)
                   for task_id in ids])  # fmt: skip


def test_between_turns_archives_are_merged_by_tiers_and_history_stays_whole(
    ferry: Ferry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """work's compactions between its turns never merged its archives (a merge of all
    history held its loop for seconds): a work service added one archive per 50 tasks
    without limit, about 2,200 an hour at 30 tasks a second, and every command reads
    their list (a review: `ls --limit 5` 181 ms over 12,000 archives, 61 over one).
    Now the newest are merged by size tiers, within a bound: few archives, and
    history as it was, a task retried since its first archive included. And the
    table lets go of the settled tasks it holds past SETTLED_HELD_MAX (a long-lived
    work's held every task it ever settled: 103 MB after 50,000), for its history."""
    monkeypatch.setattr(store_module, "SETTLED_HELD_MAX", 1_000)
    flag = tmp_path / "flag"
    retried = ferry.ok("--json", "run", "--", "test", "-e", str(flag), codes=(1,)).json()["id"]
    store = Store.open(ferry.home)
    try:
        assert store.maybe_compact(merge=False) is None  # (not due yet)
        for wave in range(70):
            add_cancelled(store, SNAPSHOT_TAIL_RECORDS // 2)  # one archive each
            if wave == 30:
                flag.touch()
                ferry.ok("retry", retried)
                ferry.ok("-q", "work", "--drain")
                store.refresh()
            assert store.maybe_compact(merge=False) is not None
            assert snapshot_archives(ferry) < 3 * 8
            assert store.table.settled_held() <= 1_000
        fresh = Store.open(ferry.home, read_only=True)
        try:
            assert store.count() == fresh.count() == 70 * SNAPSHOT_TAIL_RECORDS // 2 + 1
            assert [t.id for t in store.newest(20)] == [t.id for t in fresh.newest(20)]
            assert fresh.get(retried) == store.get(retried)
        finally:
            fresh.close()
    finally:
        store.close()
    assert ferry.task(retried)["state"] == "SUCCEEDED"
    ferry.verify_clean()


def test_a_merge_too_big_for_works_loop_is_done_beside_it(ferry: Ferry, tmp_path: Path) -> None:
    """Between its turns work merges archives only within a bound; when a bigger
    merge is due it starts `ferry journal compact` beside its loop, which merges
    without one. Here the bound is 100 records, and work compacts at most once a
    second: with waves of 125 tasks its archives are of the tier of 64 records and up,
    and eight of them are never merged by the loop."""
    tasks = tmp_path / "tasks.jsonl"
    wave = 125
    tasks.write_text('{"argv": ["true"]}\n' * wave)
    small = Ferry(ferry.home, command=(sys.executable, SMALL_ARCHIVES, "160,100"))
    worker = small.start("-v", "work", "-j", "2", "--poll", "0.05")
    ferry.background.append(worker)  # (reaped by the fixture)
    said: list[bytes] = []  # (work's stderr, drained: -v says a line per task)
    assert worker.stderr is not None
    drain = threading.Thread(target=lambda: said.extend(worker.stderr or ()), daemon=True)
    drain.start()
    started = b"a merge of the archives started beside"
    try:
        for waves in range(1, 25):
            ferry.ok("submit", "--from", str(tasks))
            wait_until(lambda waves=waves: len(ferry.json("ls", "--state", "SUCCEEDED", "--limit",
                       "0")) == waves * wave, what="the wave to run", timeout_s=120)  # fmt: skip
            if started in b"".join(said):
                break
        assert started in b"".join(said), "never started beside"
        wait_until(lambda: snapshot_archives(ferry) < 8, what="the merge beside", timeout_s=120)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=120) == 0, b"".join(said)[-2000:]
        drain.join(timeout=10)
    ferry.verify_clean()


def test_a_compaction_costs_what_changed_not_every_task_the_table_holds(
    ferry: Ferry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived table (work) holds every task settled since it started; each of its
    compactions counted them all by state, three times, and looked at each for the
    ones settled since the last snapshot: 140 ms per compaction at 125,000 tasks, once
    a second (a simulated work service), and growing for as long as work lives. The
    counts and the tasks changed since the last snapshot are now kept as they change."""
    store = Store.open(ferry.home)
    try:
        add_cancelled(store, 2 * SNAPSHOT_TAIL_RECORDS)
        assert store.maybe_compact(merge=False) is not None
        add_cancelled(store, SNAPSHOT_TAIL_RECORDS // 2)

        def scan(self: object) -> list[str]:
            raise AssertionError("looked at every settled task the table holds")

        monkeypatch.setattr(state._Settled, "ids", scan)
        assert store.maybe_compact(merge=False) is not None
        monkeypatch.undo()
        fresh = Store.open(ferry.home, read_only=True)
        try:
            assert (
                fresh.count("CANCELLED")
                == store.count("CANCELLED")
                == 5 * SNAPSHOT_TAIL_RECORDS // 2
            )
        finally:
            fresh.close()
    finally:
        store.close()


def test_a_worker_stuck_after_a_gc_whose_compaction_was_skipped_has_history_rewritten_beside(
    ferry: Ferry, tmp_path: Path
) -> None:
    """gc compacts without waiting for compact.lock: while another compaction holds it
    (the merge beside work, a cron job's), gc's is skipped, and the other writes a
    snapshot from before the FORGOTTEN records. work took it (``_adopt``), folded them
    again, and was as stuck as before: it never compacted between its turns again
    until something outside it did (a review: a tail of 6,003 records after 4 waves).
    Now its loop says a rewrite waits, and it starts one beside."""
    for _ in range(3):
        ferry.ok("run", "--", "true")
    worker = ferry.start("-q", "work", "-j", "2", "--poll", "0.05")
    try:
        wait_until(lambda: ferry.json("lease")["holder"] is not None, what="work to lead")
        other = ferry.start_stopped("-q", "journal", "compact", at="before:snapshot_write")
        assert ferry.json("gc", "--older-than", "0s")["compacted"] is False
        os.kill(other.pid, signal.SIGCONT)
        assert finish(other)[0] == 0
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text('{"argv": ["true"]}\n' * SNAPSHOT_TAIL_RECORDS)
        ferry.ok("submit", "--from", str(tasks))
        wait_until(lambda: len(ferry.json("ls", "--state", "SUCCEEDED", "--limit", "0"))
                   == SNAPSHOT_TAIL_RECORDS, what="the tasks to run", timeout_s=120)  # fmt: skip
        last = lambda: ferry.json("journal", "verify")["last_seq"]  # noqa: E731
        wait_until(lambda: last() - snapshot_seq(ferry) < SNAPSHOT_TAIL_RECORDS,
                   what="work to compact again", timeout_s=60)  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        code, err = finish(worker)
    assert code == 0, err
    ferry.verify_clean()


def test_a_stuck_table_reads_a_newest_snapshot_that_fails_its_checks_once(
    ferry: Ferry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether there is a newer snapshot to take is asked of the directory's listing;
    a newest file that fails its checks (skipped by every reader) made every look,
    once a second, take compact.lock, read the snapshots and write nothing (a review:
    372 ms of CPU a second with 26,000 live tasks). It is looked at once."""
    store = stuck_store(ferry)
    try:
        damaged = ferry.home / "journal" / f"snapshot-{store.wal.last_seq:020d}.snap"
        damaged.write_bytes(b"damaged")
        reads = []
        real = store.wal.latest_snapshot
        monkeypatch.setattr(store.wal, "latest_snapshot", lambda: reads.append(1) or real())
        for _ in range(3):
            assert store.maybe_compact(merge=False) == {"merges_waiting": True}
        assert len(reads) == 1
    finally:
        store.close()


def test_only_works_loop_lets_go_of_its_settled_tasks(
    ferry: Ferry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making the table again from the snapshot pays only in a long-lived process; in
    a one-shot compaction (journal compact, gc, the merge beside work) it cost 1.8 s
    after a full merge of 50,000 tasks, inside compact.lock (a review)."""
    monkeypatch.setattr(store_module, "SETTLED_HELD_MAX", 10)
    store = Store.open(ferry.home)
    try:
        add_cancelled(store, SNAPSHOT_TAIL_RECORDS)
        assert store.compact() is not None
        assert store.table.settled_held() == SNAPSHOT_TAIL_RECORDS
        add_cancelled(store, SNAPSHOT_TAIL_RECORDS)
        assert store.maybe_compact(merge=False) is not None
        assert store.table.settled_held() == 0
    finally:
        store.close()


def test_a_stuck_table_takes_a_snapshot_it_first_found_the_lock_held_for(
    ferry: Ferry,
) -> None:
    """The merge beside work writes its snapshot and still holds compact.lock a moment
    (its own pruning). work's look then found the newest file, counted it as looked
    at, was refused the lock, and never looked at it again; on an idle journal every
    later merge wrote its snapshot at the same seq, so work started one every second
    for ever (a review: 43 in 60 s). Looked at only once the lock was had; and a
    snapshot written again at the same seq is a new file."""
    store = stuck_store(ferry)
    try:
        ferry.ok("journal", "compact")  # (the merge beside: history rewritten)
        fd = os.open(ferry.home / "compact.lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            assert store.maybe_compact(merge=False) is None  # (the lock held: skipped)
        finally:
            os.close(fd)
        assert store.maybe_compact(merge=False) is not None
        assert not store.table.history_needs_rewrite()
    finally:
        store.close()


def test_journal_compact_no_wait_opens_nothing_while_another_compacts(ferry: Ferry) -> None:
    """It looks at the lock before it opens the store: that alone reads the snapshot
    and folds the records after it (0.55 s of CPU with 20,000 tasks queued, at every
    look of a stuck work's while a stopped compaction held the lock). Here the journal
    is damaged after the lock is taken: opening it would fail."""
    ferry.ok("run", "--", "true")
    fd = os.open(ferry.home / "compact.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        segment = sorted((ferry.home / "journal").glob("*.jsonl"))[-1]
        body = segment.read_bytes()
        segment.write_bytes(body.replace(b'"SUBMITTED"', b'"SUBMITTEX"', 1))
        assert ferry.json("journal", "compact", "--no-wait")["skipped"]
    finally:
        os.close(fd)


def test_journal_compact_no_wait_leaves_the_work_to_a_compaction_in_progress(ferry: Ferry) -> None:
    """What work starts beside its loop, and what cron may run: a compaction that holds
    compact.lock (one stopped with Ctrl-Z) does the work; waiting for it left the merge
    beside work blocked for as long, and work's exit waiting 30 s for it."""
    ferry.ok("run", "--", "true")
    other = ferry.start_stopped("-q", "journal", "compact", at="before:snapshot_write")
    try:
        report = ferry.json("journal", "compact", "--no-wait")
        assert report["skipped"] == "another compaction is running"
        said = ferry.ok("journal", "compact", "--no-wait")
        assert "nothing done: another compaction is running" in said.out.decode()
    finally:
        os.kill(other.pid, signal.SIGCONT)
        assert finish(other)[0] == 0
    assert ferry.json("journal", "compact", "--no-wait")["snapshot_seq"] is not None


def test_a_merge_beside_work_has_its_own_session_and_a_failed_one_waits_before_the_next(
    ferry: Ferry,
) -> None:
    """A Ctrl-C or a signal to work's process group stopped the merge beside it half
    done (and it printed an error into work's output); one that failed, on a damaged
    archive, was started again at every compaction of work's, with its bare error
    each time (a review: 7 in 6 waves)."""
    done = ferry.ok("--json", "run", "--", "true").json()["id"]
    ferry.ok("journal", "compact")
    store = Store.open(ferry.home)
    try:  # (gc's record, its compaction not done: the next one rewrites the archives)
        store.commit(ev.Forgotten(done, 1))
    finally:
        store.close()
    for archive in (ferry.home / "archive").glob("settled-*.jsonl"):
        archive.write_bytes(archive.read_bytes().replace(b"true", b"tru3"))
    told: list[str] = []
    aside = MergeAside(ferry.home, told.append)
    assert aside.start()
    assert not aside.start()  # (one at a time)
    assert aside.process is not None and os.getsid(aside.process.pid) == aside.process.pid
    assert aside.finish(timeout_s=60) and len(told) == 1, told
    assert "merge of the archives beside work failed (exit 4)" in told[0]
    assert not aside.start()  # (not again for RETRY_AFTER_FAILURE_S)


@pytest.mark.parametrize("loaded", [False, True], ids=["lazy_history", "history_loaded"])
def test_between_turns_a_table_that_saw_a_gc_takes_the_history_the_gc_rewrote(
    ferry: Ferry, loaded: bool
) -> None:
    """A `ferry gc` beside a long-lived `work` (the nightly gc the README suggests)
    rewrote the archives without the tasks it forgot, in its own compaction. The
    worker's table folded the FORGOTTEN records: it still remembered the ids, and
    could not count its settled tasks, so its compactions between turns were skipped
    until it restarted (a review: 11,500 records after the snapshot, `ls` 0.22 s
    against 0.05). It takes the gc's snapshot instead, and compacts again."""
    for _ in range(3):
        ferry.ok("run", "--", "true")
    kept = ferry.ok("--json", "run", "--", "false", codes=(1,)).json()["id"]
    store = Store.open(ferry.home)
    try:
        if loaded:
            assert sum(1 for _ in store.table.tasks()) == 4  # (loads history)
        ferry.ok("gc", "--older-than", "0s", "--state", "SUCCEEDED")
        store.refresh()  # (folds the FORGOTTEN records)
        assert store.table.history_needs_rewrite()
        add_cancelled(store, SNAPSHOT_TAIL_RECORDS)
        assert store.maybe_compact(merge=False) is not None
        assert not store.table.history_needs_rewrite()
        fresh = Store.open(ferry.home, read_only=True)
        try:
            for state in (None, "SUCCEEDED", "FAILED", "CANCELLED"):
                assert store.count(state) == fresh.count(state), state
            assert [t.id for t in store.newest(5)] == [t.id for t in fresh.newest(5)]
            assert store.get(kept) == fresh.get(kept)
        finally:
            fresh.close()
        assert store.count("SUCCEEDED") == 0
    finally:
        store.close()


def test_a_worker_keeps_compacting_between_its_turns_after_a_gc_beside_it(
    ferry: Ferry, tmp_path: Path
) -> None:
    """The same through the commands: work, gc beside it, then enough tasks for a
    compaction between work's turns (a review's reproduction)."""
    ferry.ok("run", "--", "true")  # a settled task for gc to forget
    worker = ferry.start("-q", "work", "-j", "2", "--poll", "0.05")
    ferry.background.append(worker)  # (reaped by the fixture)
    try:
        wait_until(lambda: ferry.json("lease")["holder"] is not None, what="work to lead")
        assert ferry.json("gc", "--older-than", "0s")["compacted"] is True
        after_gc = snapshot_seq(ferry)
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text('{"argv": ["true"]}\n' * SNAPSHOT_TAIL_RECORDS)  # five records each
        ferry.ok("submit", "--from", str(tasks))
        wait_until(lambda: snapshot_seq(ferry) > after_gc, what="work to compact after gc",
                   timeout_s=120)  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        code, err = finish(worker)
    assert code == 0, err


def snapshot_seq(ferry: Ferry) -> int:
    snapshot = read_latest_snapshot(ferry.home / "journal")
    return 0 if snapshot is None else snapshot.seq


def snapshot_archives(ferry: Ferry) -> int:
    """How many archives the newest snapshot names."""
    snapshot = read_latest_snapshot(ferry.home / "journal")
    return 0 if snapshot is None else len(json.loads(snapshot.data)["settled_archives"])


def test_a_worker_compacts_between_its_turns_without_merging_history(
    ferry: Ferry, tmp_path: Path
) -> None:
    """A merge of the archives reads and rewrites all history (seconds with a long one,
    all of it in memory): between work's turns it would hold the loop (no lease
    renewal, no answer to a supervisor) for that long. So work's compactions between
    turns only add archives; a merge that is due waits for a compaction outside the
    loop (when work ends, run, claim, recover, gc, ``journal compact``)."""
    # Waves of tasks, each once work has compacted the one before: work looks once a
    # second, and a queue drained within a second left it one compaction (a review).
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"argv": ["true"]}\n' * SNAPSHOT_TAIL_RECORDS)  # five records each
    small = Ferry(ferry.home, command=(sys.executable, SMALL_ARCHIVES, "1"))
    worker = small.start("-q", "work", "-j", "2", "--poll", "0.05")
    ferry.background.append(worker)  # (reaped by the fixture)
    try:
        for _ in range(4):
            if snapshot_archives(ferry) >= 2:
                break
            ferry.ok("submit", "--from", str(tasks))
            # Past the wave's last SUBMITTED, not the journal's end when looked at: work
            # may have run the wave and compacted before that look, and then nothing
            # more was due (one run in three failed so, four tests at once on 2 cores).
            wave = max(r["seq"] for r in ferry.records() if r["type"] == "SUBMITTED")
            wait_until(lambda wave=wave: snapshot_seq(ferry) >= wave,
                       what="work to compact the wave", timeout_s=120)  # fmt: skip
        # (With ARCHIVES_MAX 1, a compaction that may merge leaves one archive.)
        wait_until(lambda: snapshot_archives(ferry) >= 2, what="two archives, not merged",
                   timeout_s=120)  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        code, err = finish(worker)
    assert code == 0, err
    compact_small(ferry, 1)  # a compaction outside the loop merges them
    assert snapshot_archives(ferry) == 1


@pytest.mark.parametrize("compacted_past_the_leader", [False, True], ids=["caught_up", "behind"])
def test_a_leader_from_an_older_snapshot_runs_a_retry_after_its_archives_were_pruned(
    ferry: Ferry, tmp_path: Path, compacted_past_the_leader: bool
) -> None:
    """A long-running `work` loaded its snapshot, its history not yet: another process
    merges the archives that snapshot names and prunes them, then `retry`s an old task.
    The leader must run it (it skipped the RETRIED as an anomaly: archive missing; the
    task stayed QUEUED under an idle leader). "behind": a compaction also passed the
    RETRIED before the leader read it (the leader's table is older than the newest
    snapshot when it needs history)."""

    flag = tmp_path / "flag"
    old_id = ferry.ok("--json", "run", "--", "test", "-e", str(flag), codes=(1,)).json()["id"]
    compact_small(ferry)
    first_archives = archive_names(ferry)
    leader = ferry.start("work", "--poll", "0.05")
    wait_until(
        lambda: any(r["type"] == "LEASE_ACQUIRED" for r in ferry.records()),
        what="the leader to lead",
    )
    os.kill(leader.pid, signal.SIGSTOP)  # its table stays at the snapshot it loaded
    try:
        for _ in range(3):  # a merge, then a prune of what the leader's snapshot named
            ferry.ok("run", "--", "true")
            compact_small(ferry)
        assert not first_archives & archive_names(ferry), "the old archives are pruned"
        flag.touch()
        ferry.ok("retry", old_id)
        if compacted_past_the_leader:
            compact_small(ferry)
    finally:
        os.kill(leader.pid, signal.SIGCONT)

    def retried_and_settled() -> bool:
        task = ferry.task(old_id)
        return task["attempt"] == 2 and task["state"] == "SUCCEEDED"

    wait_until(retried_and_settled, what="the leader to run the retried task")
    os.kill(leader.pid, signal.SIGTERM)
    _, err = leader.communicate(timeout=60)
    assert leader.returncode == 0, err
    assert ferry.task(old_id)["state"] == "SUCCEEDED"
    assert ferry.verify_clean()["anomalies"] == []


def test_a_leader_that_cannot_load_the_history_it_needs_stops_with_the_coded_error(
    ferry: Ferry,
) -> None:
    """The rule: a history load that fails stops the command, never a skipped record.
    The archive every snapshot names is gone (real damage): the leader that reads a
    RETRIED of a task in it stops with journal.snapshot_mismatch (exit 4); the RETRIED
    stays in the journal, and the task is QUEUED again once the archive is back."""

    old_id = ferry.ok("--json", "run", "--", "false", codes=(1,)).json()["id"]
    ferry.ok("journal", "compact")
    (archive,) = (ferry.home / "archive").glob("settled-*")
    leader = ferry.start("work", "--poll", "0.05")
    wait_until(
        lambda: any(r["type"] == "LEASE_ACQUIRED" for r in ferry.records()),
        what="the leader to lead",
    )
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        ferry.ok("retry", old_id)
        body = archive.read_bytes()
        archive.unlink()
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    _, err = leader.communicate(timeout=60)
    assert leader.returncode == 4, err
    assert "error[journal.snapshot_mismatch]" in err.decode(), err
    assert "slot failed" not in err.decode(), err
    archive.write_bytes(body)
    archive.chmod(0o600)
    task = ferry.task(old_id)
    assert (task["state"], task["attempt"]) == ("QUEUED", 2)


def same_seq_merge_due(ferry: Ferry) -> set[str]:
    """Two compactions, each archiving a task: the next compaction (nothing in between)
    merges at the seq of the current snapshot. The archives it names, returned."""
    for _ in range(2):
        ferry.ok("run", "--", "false", codes=(1,))
        compact_small(ferry)
    named = archive_names(ferry)
    assert len(named) == 2
    return named


def assert_history_readable(ferry: Ferry, tasks: int) -> None:
    listed = ferry.tasks()
    assert [t["state"] for t in listed] == ["FAILED"] * tasks
    ferry.task(listed[0]["id"])
    ferry.verify_clean()
    compact_small(ferry)
    assert len(ferry.tasks()) == tasks
    ferry.ok("retry", listed[0]["id"])
    ferry.verify_clean()


@pytest.mark.parametrize("point", ["before:snapshot_write", "after:snapshot_write"])
def test_a_crash_in_a_same_seq_merge_leaves_every_snapshots_archives_intact(
    ferry: Ferry, point: str
) -> None:
    """Archives were named settled-<snapshot seq>: a merge at the seq of the current
    snapshot replaced the very archive that snapshot names (its SHA-256 no longer
    matched). Killed before the new snapshot, every command exited 4 for ever."""
    named = same_seq_merge_due(ferry)
    killed = ferry(
        "journal", "compact", failpoints=point,
        command=(sys.executable, SMALL_ARCHIVES, "2"),
    )  # fmt: skip
    assert killed.code == -9, killed
    if point == "before:snapshot_write":
        assert named <= archive_names(ferry)  # the current snapshot's, all there
    assert_history_readable(ferry, 2)


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_a_same_seq_merge_killed_at_its_snapshot_rename_by_strace(ferry: Ferry) -> None:
    """The issue's reproduction: the 2nd rename of the merging compaction (its archive
    is the 1st) is the snapshot's; SIGKILL there."""
    same_seq_merge_due(ferry)
    strace = (
        "strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=rename",
        "-e", "inject=rename:signal=SIGKILL:when=2",
    )  # fmt: skip
    killed = ferry("journal", "compact", command=(*strace, sys.executable, SMALL_ARCHIVES, "2"))
    assert killed.code == -9, killed
    assert_history_readable(ferry, 2)


def roll_a_segment(ferry: Ferry, tmp_path: Path) -> None:
    """About 9 MiB of records (3 queued tasks with a 3 MiB env each, never run): the
    8 MiB segment they start in is sealed, a new one active."""

    big = tmp_path / "big.jsonl"
    env = [f"V{i}=" + "x" * (100 << 10) for i in range(30)]
    big.write_text(json.dumps({"argv": ["true"], "env": env}) + "\n")
    for _ in range(3):
        ferry.ok("submit", "--from", str(big))


def test_a_reader_that_opens_during_a_compaction_is_not_told_the_journal_is_corrupt(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Opening reads the newest snapshot, then the records after it. A compaction in
    between removed the sealed segment holding them: the read raised CompactedError,
    reported as journal.corrupt (exit 4 for `ls`; 1 in 17 tries with a concurrent
    `journal compact` loop). Made certain: `ls` stopped right between the two."""

    from ferry.proc.process import read_stat

    ferry.ok("run", "--", "true")
    ferry.ok("journal", "compact")
    roll_a_segment(ferry, tmp_path)  # the records after that snapshot: a sealed segment
    reader = ferry.start("--json", "ls", "--limit", "0", failpoints="before:replay=stop")
    wait_until(
        lambda: (st := read_stat(reader.pid)) is not None and st.state == "T",
        what="the reader to stop between the snapshot and the records after it",
    )
    removed = ferry.json("journal", "compact")["removed"]
    assert any(name.endswith(".jsonl") for name in removed), removed
    os.kill(reader.pid, signal.SIGCONT)
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    assert len(orjson.loads(out)) == 4


def stopped(pid: int) -> bool:
    from ferry.proc.process import read_stat

    st = read_stat(pid)
    return st is not None and st.state == "T"


def test_a_stopped_compaction_is_skipped_by_run_not_awaited(ferry: Ferry) -> None:
    """`maybe_compact` (after run, claim, work, recover) took compact.lock with a
    blocking flock: a ferry process stopped inside a compaction (Ctrl-Z, a frozen
    container) made each later `ferry run` finish its task, journal SUCCEEDED, and never
    return. Now such a compaction is skipped; the stopped one, continued, ends well."""

    ferry.ok("submit", "--from", "-", stdin=b'{"argv": ["true"]}\n' * 1000)  # a tail due
    compactor = ferry.start("journal", "compact", failpoints="before:snapshot_write=stop")
    wait_until(lambda: stopped(compactor.pid), what="the compaction to stop in its lock")
    try:
        runner = ferry.start("--json", "run", "--", "true")
        out, err = runner.communicate(timeout=60)  # (it hung here for ever)
        assert runner.returncode == 0, err
        assert orjson.loads(out)["state"] == "SUCCEEDED"
    finally:
        os.kill(compactor.pid, signal.SIGCONT)
    _, err = compactor.communicate(timeout=60)
    assert compactor.returncode == 0, err
    ferry.verify_clean()
    assert len(ferry.tasks()) == 1001


def test_an_explicit_compaction_waits_for_a_stopped_one_and_says_so(ferry: Ferry) -> None:
    """`ferry journal compact` (explicit) waits for compact.lock, and says so after a
    few seconds (it waited in silence, for ever if the holder stays stopped)."""

    ferry.ok("run", "--", "true")
    first = ferry.start("journal", "compact", failpoints="before:snapshot_write=stop")
    wait_until(lambda: stopped(first.pid), what="the compaction to stop in its lock")
    second = ferry.start("journal", "compact")
    try:
        assert second.stderr is not None
        os.set_blocking(second.stderr.fileno(), False)
        said = bytearray()

        def notice() -> bool:
            said.extend(second.stderr.read() or b"")  # type: ignore[union-attr]
            return b"compact.lock" in said

        wait_until(notice, what="a notice that the compaction waits")
        assert second.poll() is None  # still waiting
        assert said.startswith(b"ferry: "), said
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=60) == 0
    assert second.wait(timeout=60) == 0
    ferry.verify_clean()


def test_a_home_fed_only_by_submit_compacts_its_tail(ferry: Ferry) -> None:
    """Every command folds the records after the last snapshot. A home that only
    receives submits (a cron filling a queue that no worker drains yet) compacts too,
    when due by the same rule as ``run``, before the submit's write: else each submit
    folds every one before it (a loop of 600 submits took a fifth longer at its end
    than at its start)."""
    lines = b'{"argv": ["true"]}\n' * SNAPSHOT_TAIL_RECORDS
    ferry.ok("submit", "--from", "-", stdin=lines)
    journal_dir = ferry.home / "journal"
    assert not list(journal_dir.glob("snapshot-*")), "not due until a command finds it so"
    ferry.ok("submit", "--", "true")
    assert list(journal_dir.glob("snapshot-*")), "compacted by the submit that found it due"
    store = Store.open(ferry.home)
    try:
        assert store.tail_records() == 1  # (its own task's record, after the snapshot)
    finally:
        store.close()
    tasks = ferry.json("ls", "--limit", "0")
    assert len(tasks) == SNAPSHOT_TAIL_RECORDS + 1
    assert {t["state"] for t in tasks} == {"QUEUED"}


def test_a_submit_interrupted_in_its_compaction_has_queued_nothing(ferry: Ferry) -> None:
    """A submit interrupted in its compaction (Ctrl-C, a cron's ``timeout``; with a long
    queue a compaction takes a second) exits 130 having queued nothing, so that trying
    again queues the task once. (A review: when it compacted after its write, it exited
    130 with no id printed, its task queued: a retry queued it twice.)"""
    lines = b'{"argv": ["true"]}\n' * SNAPSHOT_TAIL_RECORDS
    ferry.ok("submit", "--from", "-", stdin=lines)
    submit = ferry.start("submit", "--", "true", failpoints="before:snapshot_write=stop",
                         stdout=subprocess.PIPE)  # fmt: skip
    wait_until(lambda: submit.poll() is not None or stopped(submit.pid),
               what="the submit to stop in its compaction")  # fmt: skip
    assert submit.poll() is None, "it stopped in its compaction"
    os.kill(submit.pid, signal.SIGINT)  # the user gives up on a submit that hangs
    os.kill(submit.pid, signal.SIGCONT)
    out, err = submit.communicate(timeout=60)
    assert (submit.returncode, out) == (130, b""), err
    assert len(ferry.tasks()) == SNAPSHOT_TAIL_RECORDS, "nothing queued"
    ferry.ok("submit", "--", "true")  # tried again
    assert len(ferry.tasks()) == SNAPSHOT_TAIL_RECORDS + 1


def test_a_submit_leaves_the_compaction_to_a_leader(ferry: Ferry) -> None:
    """While the journal shows a leader holding the lease, a submit does not compact
    (``unless_led``): the leader does between its turns, and learns there that a merge
    its loop must not do is due (a submit's compaction hid it: the merge beside work
    was then never started, in one run of test_a_merge_too_big... in four)."""
    ferry.ok("run", "--", "true")
    store = Store.open(ferry.home)
    try:
        add_cancelled(store, SNAPSHOT_TAIL_RECORDS)
        holder = {"pid": 1, "start_time": 1, "boot_id": "b", "host": "h"}
        store.commit(ev.LeaseAcquired(1, holder), epoch=1)
        assert store.compaction_due()
        assert store.maybe_compact(merge=False, unless_led=True) is None
        store.commit(ev.LeaseReleased(1, holder), epoch=1)
        assert store.maybe_compact(merge=False, unless_led=True) is not None
    finally:
        store.close()
