"""Group commit with check hooks and early subscribers (``before_durable=True``), and
the hand-over from one commit to the next.

A leader is held inside its commit (by a fence hook) while other threads queue behind
it, so that the batches they queue form one group, deterministically. The OS calls are
counted by swapping ``journal._fsutil.os``; threads woken by a commit are held (or
interrupted) where they wake by swapping the ``threading`` that ``journal._writer``
makes its wake-up locks with."""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from writerkit import Gate, wait_for

import journal._fsutil as fsutil
import journal._writer as writer_module
from journal import Journal, Record, WriterFailedError, read_records


class CountingOS:
    """Delegates to the real os module, counting calls (and failing them on demand)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.fail_from: dict[str, int] = {}  # name -> the first call (1, 2, ...) to fail

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if not callable(real):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if self.calls[name] >= self.fail_from.get(name, 1 << 62):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(*args, **kwargs)

        return call


@pytest.fixture
def fake_os(monkeypatch: pytest.MonkeyPatch) -> CountingOS:
    counting = CountingOS()
    monkeypatch.setattr(fsutil, "os", counting)
    return counting


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "journal"


class Claims:
    """A table of claimed tasks kept by a subscriber, and appends whose check refuses a
    second claim of the same task (as ferry's store validates transitions)."""

    def __init__(self, j: Journal, *, before_durable: bool) -> None:
        self.j = j
        self.claimed: list[str] = []
        self.seen_by_checks: dict[str, list[str]] = {}
        self.outcomes: dict[str, Any] = {}
        j.subscribe(self._apply, before_durable=before_durable)

    def _apply(self, record: Record) -> None:
        if record.type == "CLAIMED":
            self.claimed.append(record.data["task"])

    def claim(self, name: str, task: str, *, refuse: bool = False) -> threading.Thread:
        def check() -> None:
            self.seen_by_checks[name] = list(self.claimed)
            if refuse:
                raise ValueError(f"{name} refused by its own check")
            if task in self.claimed:
                raise ValueError(f"{task} already claimed")

        def run() -> None:
            try:
                self.outcomes[name] = self.j.append("CLAIMED", {"task": task}, check=check)
            except Exception as exc:
                self.outcomes[name] = exc

        thread = threading.Thread(target=run)
        thread.start()
        return thread


def group_behind_a_held_leader(j: Journal, gate: Gate, start: Callable[[], list[Any]]) -> None:
    """Hold a leader in its commit, start the threads (each queues one batch), let the
    leader go: the queued batches are committed as one group."""
    gate.armed = True
    leader = threading.Thread(target=j.append, args=("noise", {"task": "-"}))
    leader.start()
    assert gate.entered.wait(10)
    threads: list[threading.Thread] = []
    for queued, make in enumerate(start(), 1):
        threads.append(make())
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{queued} queued batches")
    gate.release.set()
    for thread in [leader, *threads]:
        thread.join(10)
        assert not thread.is_alive()


@pytest.fixture
def held(jdir: Path) -> Iterator[tuple[Journal, Gate]]:
    gate = Gate()
    with Journal.open(jdir, fence=gate.fence) as j:
        j.append("warm", {"task": "+"})  # (its segment exists: no directory fsync later)
        yield j, gate


def test_checks_see_earlier_batches_of_their_group_and_share_one_fsync(
    held: tuple[Journal, Gate], jdir: Path, fake_os: CountingOS
) -> None:
    j, gate = held
    claims = Claims(j, before_durable=True)
    fake_os.calls.clear()
    group_behind_a_held_leader(
        j,
        gate,
        lambda: [
            lambda: claims.claim("first", "t1"),
            lambda: claims.claim("second", "t1"),  # must see the first's claim
            lambda: claims.claim("third", "t2"),
        ],
    )
    assert isinstance(claims.outcomes["first"], Record)
    assert isinstance(claims.outcomes["second"], ValueError)
    assert isinstance(claims.outcomes["third"], Record)
    assert claims.seen_by_checks == {"first": [], "second": ["t1"], "third": ["t1"]}
    # The leader's commit, then the group of three: two writes, two fsyncs in all.
    assert fake_os.calls["pwrite"] == 2
    assert fake_os.calls["fdatasync"] + fake_os.calls["fsync"] == 2
    on_disk = [(r.type, r.data["task"]) for r in read_records(jdir)]
    assert on_disk == [("warm", "+"), ("noise", "-"), ("CLAIMED", "t1"), ("CLAIMED", "t2")]
    assert claims.claimed == ["t1", "t2"]


def test_without_an_early_subscriber_each_checked_batch_waits_for_the_ones_before(
    held: tuple[Journal, Gate], jdir: Path, fake_os: CountingOS
) -> None:
    j, gate = held
    claims = Claims(j, before_durable=False)
    fake_os.calls.clear()
    group_behind_a_held_leader(
        j,
        gate,
        lambda: [
            lambda: claims.claim("first", "t1"),
            lambda: claims.claim("second", "t1"),
            lambda: claims.claim("third", "t2"),
        ],
    )
    assert isinstance(claims.outcomes["second"], ValueError)
    assert claims.seen_by_checks == {"first": [], "second": ["t1"], "third": ["t1"]}
    # Durable (and fed) before the next check: the first claim alone, then the third.
    assert fake_os.calls["fdatasync"] + fake_os.calls["fsync"] == 3
    assert [r.data["task"] for r in read_records(jdir)] == ["+", "-", "t1", "t2"]


def test_a_refused_middle_batch_is_neither_written_nor_seen(
    held: tuple[Journal, Gate], jdir: Path
) -> None:
    j, gate = held
    claims = Claims(j, before_durable=True)
    group_behind_a_held_leader(
        j,
        gate,
        lambda: [
            lambda: claims.claim("first", "t1"),
            lambda: claims.claim("middle", "t2", refuse=True),
            lambda: claims.claim("last", "t3"),
        ],
    )
    assert isinstance(claims.outcomes["middle"], ValueError)
    assert claims.seen_by_checks["last"] == ["t1"]  # not t2: refused, never fed
    first, last = claims.outcomes["first"], claims.outcomes["last"]
    assert isinstance(first, Record) and isinstance(last, Record)
    assert last.seq == first.seq + 1  # no hole where the refused batch would have been
    assert [r.data["task"] for r in read_records(jdir)] == ["+", "-", "t1", "t3"]
    assert claims.claimed == ["t1", "t3"]


def test_a_failed_fsync_after_feeding_fails_every_caller_of_the_group(
    held: tuple[Journal, Gate], jdir: Path, fake_os: CountingOS
) -> None:
    """The documented price of before_durable: the group's records were fed, then its
    fsync failed. Every caller of the group gets WriterFailedError, ordinary subscribers
    never hear of the records, the early one has seen them (outcome unknown), and the
    handle refuses everything after, without retrying the fsync."""
    j, gate = held
    claims = Claims(j, before_durable=True)
    durable: list[str] = []
    j.subscribe(lambda r: durable.append(r.data["task"]))
    fake_os.calls.clear()
    fake_os.fail_from["fdatasync"] = 2  # the held leader's commit syncs; the group's fails
    group_behind_a_held_leader(
        j,
        gate,
        lambda: [
            lambda: claims.claim("first", "t1"),
            lambda: claims.claim("second", "t2"),
        ],
    )
    assert isinstance(claims.outcomes["first"], WriterFailedError)
    assert isinstance(claims.outcomes["second"], WriterFailedError)
    assert claims.seen_by_checks == {"first": [], "second": ["t1"]}
    assert claims.claimed == ["t1", "t2"]  # fed before the write: seen, never committed
    assert durable == ["+", "-"]  # (replayed from disk, then the held leader's)
    del fake_os.fail_from["fdatasync"]
    with pytest.raises(WriterFailedError):
        j.append("after", {})
    assert fake_os.calls["fdatasync"] == 2  # never retried
    with Journal.open(jdir) as again:  # the outcome was unknown: here the write landed
        tasks = [r.data.get("task") for r in again.read()]
        assert tasks in (["+", "-"], ["+", "-", "t1", "t2"])


def test_a_failed_fsync_of_a_single_append_leaves_the_early_subscriber_with_it(
    jdir: Path, fake_os: CountingOS
) -> None:
    with Journal.open(jdir) as j:
        early: list[str] = []
        durable: list[str] = []
        j.subscribe(lambda r: early.append(r.type), before_durable=True)
        j.subscribe(lambda r: durable.append(r.type))
        j.append("committed", {})
        fake_os.fail_from["fdatasync"] = fake_os.calls["fdatasync"] + 1
        with pytest.raises(WriterFailedError):
            j.append_batch([("lost?", {}), ("lost too?", {})], check=lambda: None)
        assert early == ["committed", "lost?", "lost too?"]
        assert durable == ["committed"]


def test_records_caught_up_from_another_handle_reach_every_subscriber_once(
    jdir: Path,
) -> None:
    with Journal.open(jdir) as mine, Journal.open(jdir) as theirs:
        theirs.append("before", {})
        early: list[int] = []
        durable: list[int] = []
        mine.subscribe(lambda r: early.append(r.seq), before_durable=True)  # replays seq 1
        mine.subscribe(lambda r: durable.append(r.seq))
        theirs.append("theirs", {})
        mine.append("mine", {})  # catches up on seq 2 first
        theirs.append("theirs again", {})
        mine.refresh()
        assert early == [1, 2, 3, 4]
        assert durable == [1, 2, 3, 4]


@pytest.mark.parametrize("single", [True, False], ids=["append", "append_batch"])
def test_a_subscriber_raising_after_the_fsync_fails_the_handle_not_the_commit(
    jdir: Path, single: bool
) -> None:
    with Journal.open(jdir) as j:

        def boom(record: Record) -> None:
            raise RuntimeError("bad fold")

        j.subscribe(boom)
        if single:
            assert j.append("T", {}).seq == 1  # durable before the subscriber ran
        else:
            assert [r.seq for r in j.append_batch([("T", {})] * 9)] == list(range(1, 10))
        with pytest.raises(WriterFailedError) as caught:
            j.append("after", {})
        assert isinstance(caught.value.__cause__.__cause__, RuntimeError)  # (wrapped)
    assert [r.type for r in read_records(jdir)] == ["T"] * (1 if single else 9)


@pytest.mark.parametrize("single", [True, False], ids=["append", "append_batch"])
def test_an_early_subscriber_raising_fails_the_append_before_anything_is_written(
    jdir: Path, single: bool
) -> None:
    with Journal.open(jdir) as j:
        j.append("before", {})

        def boom(record: Record) -> None:
            raise RuntimeError("bad fold")

        j.subscribe(boom, after_seq=1, before_durable=True)
        with pytest.raises(WriterFailedError) as caught:
            if single:
                j.append("T", {})
            else:
                j.append_batch([("T", {})] * 9)
        assert isinstance(caught.value.__cause__.__cause__, RuntimeError)  # (wrapped)
        with pytest.raises(WriterFailedError):
            j.append("after", {})
    assert [r.type for r in read_records(jdir)] == ["before"]


# -- the hand-over from one commit to the next ---------------------------------------------


class WakeLocks:
    """Stands in for the ``threading`` module of ``journal._writer`` once a handle is
    open (only the per-batch wake-up locks are made after that). A thread named in
    ``hold`` that wakes from its wait stops there, as if not yet scheduled, until its
    event is set; one named in ``interrupt`` raises KeyboardInterrupt from its wait
    (as a signal would)."""

    def __init__(self) -> None:
        self.hold: dict[str, threading.Event] = {}
        self.interrupt: set[str] = set()

    def Lock(self) -> _WakeLock:  # (named as threading names it)
        return _WakeLock(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


class _WakeLock:
    def __init__(self, locks: WakeLocks) -> None:
        self.locks = locks
        self.lock = threading.Lock()
        self.acquired = 0

    def acquire(self) -> bool:
        self.acquired += 1
        if self.acquired == 1:  # (made held by the queuing thread: not a wait)
            return self.lock.acquire()
        name = threading.current_thread().name
        self.lock.acquire()
        if name in self.locks.interrupt:
            raise KeyboardInterrupt
        if name in self.locks.hold:
            assert self.locks.hold[name].wait(10)
        return True

    def release(self) -> None:
        self.lock.release()


@pytest.fixture
def wake_locks(monkeypatch: pytest.MonkeyPatch, held: tuple[Journal, Gate]) -> WakeLocks:
    locks = WakeLocks()
    monkeypatch.setattr(writer_module, "threading", locks)
    return locks


def start_appender(
    j: Journal, name: str, rounds: int, outcomes: dict[str, list[Any]]
) -> threading.Thread:
    """A thread named ``name`` appending ``rounds`` records one at a time, each waiting
    for its commit (as ``ferry work -j N``'s threads do)."""

    def run() -> None:
        outcomes[name] = []
        try:
            for round_no in range(rounds):
                outcomes[name].append(j.append(name, {"round": round_no}))
        except BaseException as exc:  # (KeyboardInterrupt too: the outcome is the test's)
            outcomes[name].append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def test_the_next_commit_waits_for_every_thread_the_last_one_woke(
    held: tuple[Journal, Gate], wake_locks: WakeLocks
) -> None:
    """Threads that each append a record and wait for it append their next one as soon
    as they wake: the commit after theirs waits until each has run, so their next
    records share it. (It started as soon as one thread was back: each fsync carried
    about half of 8 waiting appenders, whatever the disk.)"""
    j, gate = held
    outcomes: dict[str, list[Any]] = {}
    for name in "BCD":
        wake_locks.hold[name] = threading.Event()
    gate.armed = True
    threads = [start_appender(j, "L", 1, outcomes)]
    assert gate.entered.wait(10)
    for queued, (name, rounds) in enumerate([("A", 2), ("B", 2), ("C", 2), ("D", 1)], 1):
        threads.append(start_appender(j, name, rounds, outcomes))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name} queued")
    commits, records = j.commits, j.committed_records
    # L commits alone and hands over to A, which commits A, B, C and D together and
    # wakes B, C and D (held where they wake); A appends again at once.
    gate.release.set()
    wait_for(lambda: len(j._writer._queue) == 1 or j.commits > commits + 2, "A's second append")
    assert j.commits == commits + 2, "A's second record was committed alone"
    for queued, name in enumerate("BC", 2):  # each runs, and queues its next record
        wake_locks.hold[name].set()
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name}'s second append")
        assert j.commits == commits + 2
    wake_locks.hold["D"].set()  # the last one to run: the next commit starts
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), f"{thread.name} never returned"
    assert j.commits == commits + 3
    assert j.committed_records == records + 1 + 4 + 3
    assert all(isinstance(o, Record) for done in outcomes.values() for o in done), outcomes
    assert sorted(done[1].seq for name, done in outcomes.items() if name in "ABC") == [7, 8, 9]


def test_a_thread_interrupted_when_woken_to_lead_passes_the_lead_on(
    held: tuple[Journal, Gate], wake_locks: WakeLocks, jdir: Path
) -> None:
    """The thread of the first queued batch is woken to lead the next commit, and a
    KeyboardInterrupt ends its wait: its batch is dropped (never written) and the next
    queued batch leads. (Before, nobody led: B waited until some other append came.)"""
    j, gate = held
    outcomes: dict[str, list[Any]] = {}
    wake_locks.interrupt.add("A")
    gate.armed = True
    threads = [start_appender(j, "L", 1, outcomes)]
    assert gate.entered.wait(10)
    for queued, name in enumerate("AB", 1):  # queued behind L: the next group
        threads.append(start_appender(j, name, 1, outcomes))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name} queued")
    gate.release.set()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), f"{thread.name} never returned"
    assert isinstance(outcomes["A"][0], KeyboardInterrupt)
    assert isinstance(outcomes["B"][0], Record)
    assert [r.type for r in read_records(jdir)] == ["warm", "L", "B"]


def test_a_thread_interrupted_after_its_commit_does_not_hold_up_the_next(
    held: tuple[Journal, Gate], wake_locks: WakeLocks, jdir: Path
) -> None:
    """B's batch is committed in A's group, and B's wait ends with a KeyboardInterrupt
    instead of a wake-up: the next commit does not wait for B to run (it never will)."""
    j, gate = held
    outcomes: dict[str, list[Any]] = {}
    wake_locks.interrupt.add("B")
    gate.armed = True
    threads = [start_appender(j, "L", 1, outcomes)]
    assert gate.entered.wait(10)
    for queued, (name, rounds) in enumerate([("A", 2), ("B", 1)], 1):
        threads.append(start_appender(j, name, rounds, outcomes))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name} queued")
    gate.release.set()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), f"{thread.name} never returned"
    assert isinstance(outcomes["B"][0], KeyboardInterrupt)  # (committed: not told so)
    assert [type(o) for o in outcomes["A"]] == [Record, Record]
    assert [r.type for r in read_records(jdir)] == ["warm", "L", "A", "B", "A"]
