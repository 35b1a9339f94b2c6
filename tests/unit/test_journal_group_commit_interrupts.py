"""Group commit under attack: a KeyboardInterrupt delivered at each point of an append
that waits, many threads appending with interrupts, close() and a failing write while
woken threads have not yet run, and a thread that hogs the GIL.

A signal is handled by the main thread where it blocks (a lock's acquire) or at the next
check of the interpreter after it: so the writer's ``_mutex`` is swapped for one that
raises KeyboardInterrupt in a named thread at its nth taking, instead of taking it
("enter", as a signal that arrives while the thread blocks there) or right after leaving
it ("exit", as one handled at the next check). Every outcome is checked against the
journal's guarantees: the records on disk are in seq order without gaps, each once;
every record returned is on disk as returned; every thread returns; the handle still
closes."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from writerkit import JOIN_S, Gate, wait_for

import journal._fsutil as fsutil
from journal import (
    Journal,
    JournalClosedError,
    Record,
    WriterFailedError,
    read_records,
)


class InterruptingMutex:
    """Stands in for a writer's ``_mutex``: KeyboardInterrupt in the thread named in
    ``interrupt`` at its nth ``with`` on the mutex, on "enter" (not taken) or "exit"
    (after leaving it). ``chance``: also at random, with that probability per use."""

    def __init__(self, seed: int = 0) -> None:
        self.real = threading.Lock()
        self.uses: Counter[str] = Counter()
        self.interrupt: dict[str, tuple[int, str]] = {}
        self.chance = 0.0
        self.random = random.Random(seed)
        self.fired = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self.real.acquire(blocking, timeout)

    def release(self) -> None:
        self.real.release()

    def _fire(self, where: str) -> None:
        name = threading.current_thread().name
        if self.interrupt.get(name) == (self.uses[name], where):
            del self.interrupt[name]
        elif not (self.chance and name != "MainThread" and self.random.random() < self.chance):
            return
        self.fired += 1
        raise KeyboardInterrupt

    def __enter__(self) -> bool:
        self.uses[threading.current_thread().name] += 1
        self._fire("enter")
        return self.real.acquire()

    def __exit__(self, *exc: object) -> None:
        self.real.release()
        self._fire("exit")


def install(j: Journal, mutex: InterruptingMutex) -> None:
    writer = j._writer
    writer._mutex = mutex  # type: ignore[assignment]
    writer._cond = threading.Condition(mutex)  # type: ignore[arg-type]


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "journal"


@pytest.fixture
def held(jdir: Path) -> Iterator[tuple[Journal, Gate, InterruptingMutex]]:
    gate = Gate()
    j = Journal.open(jdir, fence=gate.fence)
    try:
        j.append("warm", {"name": "warm", "round": 0})
        mutex = InterruptingMutex()
        install(j, mutex)
        yield j, gate, mutex
    finally:
        closing = threading.Thread(target=j.close, daemon=True)
        closing.start()
        closing.join(JOIN_S)
        assert not closing.is_alive(), "close() hung"


Outcomes = dict[str, list[Any]]


def start_appender(
    j: Journal, name: str, rounds: int, outcomes: Outcomes, *, batch: int = 1
) -> threading.Thread:
    """A thread appending ``rounds`` times (one record, or a batch of ``batch``), each
    waiting for its commit; it stops at the first error (kept in ``outcomes``)."""

    def run() -> None:
        outcomes[name] = []
        try:
            for round_no in range(rounds):
                if batch == 1:
                    outcomes[name].append(j.append(name, {"name": name, "round": round_no}))
                else:
                    items = [
                        (name, {"name": name, "round": round_no, "i": i}) for i in range(batch)
                    ]
                    outcomes[name].extend(j.append_batch(items))
        except BaseException as exc:  # (KeyboardInterrupt too: the outcome is the test's)
            outcomes[name].append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def join_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(JOIN_S)
    stuck = [thread.name for thread in threads if thread.is_alive()]
    assert not stuck, f"never returned: {stuck}"


def check_guarantees(jdir: Path, outcomes: Outcomes) -> list[Record]:
    """Seq order without gaps, each record once, every returned record on disk as
    returned, and a thread's records in the order it appended them."""
    on_disk = list(read_records(jdir))
    assert [r.seq for r in on_disk] == list(range(1, len(on_disk) + 1))
    keys = [(r.type, r.data.get("round"), r.data.get("i")) for r in on_disk]
    assert len(keys) == len(set(keys)), "a record was committed twice"
    by_seq = {r.seq: r for r in on_disk}
    for name, done in outcomes.items():
        returned = [o for o in done if isinstance(o, Record)]
        for record in returned:
            assert by_seq.get(record.seq) == record, f"{name}: {record} not on disk as returned"
            assert record.type == name
        mine = [r for r in on_disk if r.type == name]
        rounds = [(r.data["round"], r.data.get("i")) for r in mine]
        assert rounds == sorted(rounds), f"{name}'s records out of order"
        errors = [o for o in done if not isinstance(o, Record)]
        assert len(errors) <= 1 and (not errors or done[-1] is errors[0])
    return on_disk


# -- a KeyboardInterrupt at each point of a waiting append ---------------------------------


def test_a_thread_interrupted_taking_the_mutex_after_its_commit_does_not_hold_up_the_next(
    held: tuple[Journal, Gate, InterruptingMutex], jdir: Path
) -> None:
    """B's batch is committed in A's group; woken, B is interrupted as it takes the
    mutex to check in (a SIGINT handled while it blocks there). The handle must not stay
    reserved for B: A's next record is committed."""
    j, gate, mutex = held
    outcomes: Outcomes = {}
    gate.armed = True
    threads = [start_appender(j, "L", 1, outcomes)]
    assert gate.entered.wait(JOIN_S)
    for queued, (name, rounds) in enumerate([("A", 2), ("B", 1)], 1):
        threads.append(start_appender(j, name, rounds, outcomes))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name} queued")
    mutex.interrupt["B"] = (mutex.uses["B"] + 1, "enter")  # the first after its wake-up
    gate.release.set()
    join_all(threads)
    assert isinstance(outcomes["B"][0], KeyboardInterrupt)  # (committed: not told so)
    assert [type(o) for o in outcomes["A"]] == [Record, Record]
    assert [r.type for r in check_guarantees(jdir, outcomes)] == ["warm", "L", "A", "B", "A"]


def test_a_thread_interrupted_taking_the_mutex_to_lead_passes_the_lead_on(
    held: tuple[Journal, Gate, InterruptingMutex], jdir: Path
) -> None:
    """A is woken to lead the next commit and interrupted as it takes the mutex: its
    batch is dropped and B leads."""
    j, gate, mutex = held
    outcomes: Outcomes = {}
    gate.armed = True
    threads = [start_appender(j, "L", 1, outcomes)]
    assert gate.entered.wait(JOIN_S)
    for queued, name in enumerate("AB", 1):
        threads.append(start_appender(j, name, 1, outcomes))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name} queued")
    mutex.interrupt["A"] = (mutex.uses["A"] + 1, "enter")
    gate.release.set()
    join_all(threads)
    assert isinstance(outcomes["A"][0], KeyboardInterrupt)
    assert isinstance(outcomes["B"][0], Record)
    assert [r.type for r in check_guarantees(jdir, outcomes)] == ["warm", "L", "B"]


POINTS = [
    (name, use, where) for name in "LABC" for use in range(1, 9) for where in ("enter", "exit")
]


@pytest.mark.parametrize(("name", "use", "where"), POINTS, ids=[f"{n}{u}{w}" for n, u, w in POINTS])
def test_an_interrupt_at_any_taking_of_the_mutex_hangs_nobody_and_loses_nothing(
    held: tuple[Journal, Gate, InterruptingMutex], jdir: Path, name: str, use: int, where: str
) -> None:
    """L commits alone while A, B and C (two rounds each, C a batch of 3) queue behind
    it; one thread is interrupted at its nth taking of the mutex. Every other thread
    returns with its records committed, and the handle still appends (or, if the
    interrupt hit a commit, refuses with WriterFailedError)."""
    j, gate, mutex = held
    outcomes: Outcomes = {}
    gate.armed = True
    threads = [start_appender(j, "L", 2, outcomes)]
    assert gate.entered.wait(JOIN_S)
    for queued, (thread_name, batch) in enumerate([("A", 1), ("B", 1), ("C", 3)], 1):
        threads.append(start_appender(j, thread_name, 2, outcomes, batch=batch))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{thread_name} queued")
    mutex.interrupt[name] = (mutex.uses[name] + use, where)
    gate.release.set()
    join_all(threads)
    failed = j._writer._failed is not None
    for other, done in outcomes.items():
        if other != name:
            assert all(isinstance(o, Record) for o in done) or (
                failed and isinstance(done[-1], WriterFailedError)
            ), (other, done)
    check_guarantees(jdir, outcomes)
    after = threading.Thread(target=lambda: start_appender(j, "Z", 1, outcomes).join(JOIN_S))
    after.start()
    join_all([after])
    assert isinstance(outcomes["Z"][0], WriterFailedError if failed else Record), outcomes


# -- many threads, with interrupts ---------------------------------------------------------


def hammer(jdir: Path, *, threads_n: int, rounds: int, chance: float, seed: int) -> None:
    """``threads_n`` threads each append ``rounds`` times (single records, batches, some
    with a check hook that refuses now and then, an early subscriber), each interrupted
    at random takings of the mutex and restarting after each interrupt."""
    with Journal.open(jdir) as j:
        mutex = InterruptingMutex(seed)
        install(j, mutex)
        seen: list[int] = []
        j.subscribe(lambda r: seen.append(r.seq), before_durable=True)
        outcomes: Outcomes = {}
        rng = random.Random(seed)

        def run(name: str, plan: list[int]) -> None:
            done = outcomes[name] = []
            for round_no, size in enumerate(plan):
                try:
                    if size == 0:  # a checked single record, refused one time in 5

                        def check(r: int = round_no) -> None:
                            if r % 5 == 4:
                                raise ValueError("refused")

                        done.append(j.append(name, {"round": round_no}, check=check))
                    elif size == 1:
                        done.append(j.append(name, {"round": round_no}))
                    else:
                        items = [(name, {"round": round_no, "i": i}) for i in range(size)]
                        done.extend(j.append_batch(items))
                except (KeyboardInterrupt, ValueError):
                    continue
                except WriterFailedError as exc:
                    done.append(exc)  # (a commit was interrupted: the handle is failed)
                    return

        workers = [
            threading.Thread(
                target=run,
                args=(f"T{n}", [rng.choice([0, 1, 1, 1, 2, 5]) for _ in range(rounds)]),
                name=f"T{n}",
                daemon=True,
            )
            for n in range(threads_n)
        ]
        mutex.chance = chance
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 120
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        mutex.chance = 0.0
        stuck = [w.name for w in workers if w.is_alive()]
        assert not stuck, f"never returned: {stuck} (interrupts: {mutex.fired})"
        assert mutex.fired > 0
    on_disk = list(read_records(jdir))
    assert [r.seq for r in on_disk] == list(range(1, len(on_disk) + 1))
    keys = [(r.type, r.data["round"], r.data.get("i")) for r in on_disk]
    assert len(keys) == len(set(keys)), "a record was committed twice"
    by_seq = {r.seq: r for r in on_disk}
    for done in outcomes.values():
        for record in (o for o in done if isinstance(o, Record)):
            assert by_seq.get(record.seq) == record


def test_eight_threads_appending_with_interrupts_hang_nobody(jdir: Path) -> None:
    hammer(jdir, threads_n=8, rounds=40, chance=0.02, seed=1)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(5))
def test_thirty_two_threads_appending_with_interrupts_hang_nobody(jdir: Path, seed: int) -> None:
    hammer(jdir, threads_n=32, rounds=150, chance=0.01, seed=seed)


# -- close() and a failing write while woken threads have not yet run ----------------------


def test_close_ends_while_threads_keep_appending_and_each_learns_it(
    held: tuple[Journal, Gate, InterruptingMutex], jdir: Path
) -> None:
    """Four threads append without pause; close() must not wait for a moment when none
    is appending (there is none): it waited for the handle to be free, and each commit's
    last woken thread took it again at once (before and after the hand-over change)."""
    j, gate, _ = held
    outcomes: Outcomes = {}
    gate.armed = True
    threads = [start_appender(j, "L", 1, outcomes)]
    assert gate.entered.wait(JOIN_S)
    for queued, name in enumerate("ABCD", 1):
        threads.append(start_appender(j, name, 100_000, outcomes))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name} queued")
    closing = threading.Thread(target=j.close, daemon=True)
    gate.release.set()
    wait_for(lambda: sum(map(len, outcomes.values())) >= 20, "a few commits")
    closing.start()
    join_all([closing, *threads])
    for name in "ABCD":
        assert isinstance(outcomes[name][-1], JournalClosedError), outcomes[name][-1]
    check_guarantees(jdir, outcomes)


class FailingOS:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.fail = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if name in ("fdatasync", "fsync") and self.fail:

            def failing(*args: Any) -> Any:
                raise OSError(5, "EIO")

            return failing
        return attr


def test_a_failed_fsync_while_threads_queue_and_wake_settles_every_one(
    held: tuple[Journal, Gate, InterruptingMutex], jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j, gate, _ = held
    failing = FailingOS(fsutil.os)
    monkeypatch.setattr(fsutil, "os", failing)
    outcomes: Outcomes = {}
    gate.armed = True
    threads = [start_appender(j, "L", 1, outcomes)]
    assert gate.entered.wait(JOIN_S)
    for queued, name in enumerate("ABCDEFGH", 1):
        threads.append(start_appender(j, name, 1000, outcomes, batch=1 + queued % 3))
        wait_for(lambda n=queued: len(j._writer._queue) == n, f"{name} queued")
    gate.release.set()
    wait_for(lambda: j.commits >= 5, "a few commits")
    failing.fail = True
    join_all(threads)
    for name in "ABCDEFGH":
        assert isinstance(outcomes[name][-1], WriterFailedError), outcomes[name][-1]
    monkeypatch.setattr(fsutil, "os", failing.real)
    check_guarantees(jdir, outcomes)


# -- a thread hogging the GIL --------------------------------------------------------------


def test_appenders_keep_committing_while_a_thread_hogs_the_gil(jdir: Path) -> None:
    """A CPU-bound thread holds the GIL whenever it can: each woken thread must wait
    for its turn, but every commit still ends and every appender returns."""
    stop = threading.Event()

    def hog() -> None:
        while not stop.is_set():
            sum(range(10_000))

    with Journal.open(jdir) as j:
        outcomes: Outcomes = {}
        hogger = threading.Thread(target=hog, daemon=True)
        hogger.start()
        try:
            threads = [start_appender(j, f"T{n}", 20, outcomes) for n in range(8)]
            join_all(threads)
        finally:
            stop.set()
            hogger.join(JOIN_S)
        assert all(isinstance(o, Record) for done in outcomes.values() for o in done)
    assert len(check_guarantees(jdir, outcomes)) == 8 * 20


# -- real SIGINTs to a main thread that appends among others ---------------------------

SIGNALLED = """
import faulthandler, os, signal, sys, threading, time
from journal import Journal, WriterFailedError, read_records
end = time.monotonic() + float(sys.argv[2])
faulthandler.dump_traceback_later(float(sys.argv[2]) + 30, exit=True)  # (a hang)
done, interrupts, handles, armed = {}, 0, 0, False
def on_sigint(signum, frame):
    if armed:
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_sigint)
def run(j, name, stop):
    n = 0
    try:
        while time.monotonic() < stop:
            items = [(name, {"n": (handles, n), "i": i}) for i in range(n % 3 + 1)]
            done.setdefault(name, []).extend(
                [j.append(name, items[0][1])] if n % 2 else j.append_batch(items))
            n += 1
    except WriterFailedError:  # (the main thread was interrupted while leading)
        pass
def pester(go, stop):
    go.wait()
    while time.monotonic() < stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.0005)
while time.monotonic() < end:  # a handle per round: one interrupted commit fails it
    j = Journal.open(sys.argv[1])
    handles += 1
    stop, go = time.monotonic() + 1, threading.Event()
    workers = [threading.Thread(target=run, args=(j, f"T{k}", stop), daemon=True)
               for k in range(15)]
    for w in workers: w.start()
    threading.Thread(target=pester, args=(go, stop), daemon=True).start()
    go.set()
    n, mine = 0, done.setdefault("main", [])
    while time.monotonic() < stop + 0.1:
        try:
            armed = True  # (the interrupt lands in the append, not in this loop)
            n += 1  # (an interrupted append may be committed: each try is another record)
            record = j.append("main", {"n": (handles, n), "i": 0})
            armed = False
            mine.append(record)
        except KeyboardInterrupt:
            armed = False
            interrupts += 1
        except WriterFailedError:
            armed = False
            time.sleep(0.001)
    for w in workers:
        w.join(10)
        assert not w.is_alive(), "a worker never returned"
    j.close()
on_disk = list(read_records(sys.argv[1]))
assert [r.seq for r in on_disk] == list(range(1, len(on_disk) + 1))
keys = [(r.type, tuple(r.data["n"]), r.data["i"]) for r in on_disk]
assert len(keys) == len(set(keys)), "a record twice"
by_seq = {r.seq: r for r in on_disk}
assert all(by_seq[r.seq] == r for rs in done.values() for r in rs)
print("ok", len(on_disk), interrupts, handles)
"""


@pytest.mark.soak
@pytest.mark.xfail(
    reason="not made safe: a KeyboardInterrupt that Python handles at a function entry"
    " inside the writer's bookkeeping (e.g. _release after a commit, before it takes the"
    " mutex) cuts it short, and all appenders wait for ever (not diagnosed further). Seen"
    " in about 1 run in 5, before the group-commit change too (95ed45b)",
    strict=False,
)
def test_real_sigints_to_an_appending_main_thread_hang_nobody(jdir: Path) -> None:
    """The main thread appends among 15 others while SIGINTs keep coming (2 a ms): each
    lands wherever the main thread is (waiting for its commit, for the mutex, leading).
    Every thread ends, and the journal holds each record once, in order, as returned."""
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED, str(jdir), "8"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok"), proc.stdout
