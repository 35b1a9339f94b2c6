"""Group commit with check hooks and early subscribers (``before_durable=True``).

A leader is held inside its commit (by a fence hook) while other threads queue behind
it, so that the batches they queue form one group, deterministically. The OS calls are
counted by swapping ``journal._fsutil.os``."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import journal._fsutil as fsutil
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


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


class Gate:
    """A fence hook that holds the next leader inside its commit (under the lock) until
    released, so that other threads queue behind it."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def fence(self, epoch: int) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(10)


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
