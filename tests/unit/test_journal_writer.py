"""The writer: durable appends, batches, rotation, fencing, hooks, group commit,
subscribers, several handles on one directory, and failure (unit tier: real files; the
OS calls are counted or failed by swapping ``journal._fsutil.os``)."""

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
from writerkit import Gate, wait_for

import journal as journal_module
import journal._fsutil as fsutil
import journal._reader as reader_module
from journal import (
    FencedError,
    InvalidRecordError,
    Journal,
    JournalClosedError,
    JournalError,
    Record,
    RecordTooLargeError,
    WriterFailedError,
    read_records,
    verify,
)
from journal._codec import encode_record, prepare
from journal._segment import list_segments, segment_name


class CountingOS:
    """Delegates to the real os module, counting calls (and failing them on demand)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, OSError] = {}
        self.dir_fsyncs = 0
        self._dir_fds: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if not callable(real):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name in self.fail:
                raise self.fail[name]
            result = real(*args, **kwargs)
            if name == "open" and args[1] & getattr(os, "O_DIRECTORY", 0):
                self._dir_fds.add(result)
            elif name == "fsync" and args[0] in self._dir_fds:
                self.dir_fsyncs += 1
            elif name == "close":
                self._dir_fds.discard(args[0])
            return result

        return call


@pytest.fixture
def fake_os(monkeypatch: pytest.MonkeyPatch) -> CountingOS:
    counting = CountingOS()
    monkeypatch.setattr(fsutil, "os", counting)
    return counting


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal"


@pytest.fixture
def journal(jdir: Path) -> Iterator[Journal]:
    with Journal.open(jdir) as j:
        yield j


# -- appending ----------------------------------------------------------------------------


def test_open_creates_the_directory_private(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        assert j.last_seq == 0 and j.first_seq == 1 and j.max_epoch == 0
    assert jdir.is_dir() and (jdir.stat().st_mode & 0o777) == 0o700
    assert list_segments(jdir) == []  # the first segment is created by the first append


def test_append_returns_the_committed_record(journal: Journal, jdir: Path) -> None:
    before = time.time()
    rec = journal.append("SUBMITTED", {"task": "t1", "argv": ("echo", "hi")}, epoch=0)
    assert rec == Record(1, 0, rec.ts, "SUBMITTED", {"task": "t1", "argv": ["echo", "hi"]})
    assert before <= rec.ts <= time.time()
    assert list(read_records(jdir)) == [rec]
    path = jdir / segment_name(1)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert path.read_bytes().count(b"\n") == 1


def test_seqs_are_gap_free_across_batches(journal: Journal) -> None:
    first = journal.append("A", {})
    batch = journal.append_batch([("B", {"i": i}) for i in range(5)])
    last = journal.append("C", {})
    assert [first.seq, *[r.seq for r in batch], last.seq] == list(range(1, 8))
    assert journal.last_seq == 7


def test_one_write_and_one_fsync_per_batch(journal: Journal, fake_os: CountingOS) -> None:
    journal.append("warm", {})  # creates the first segment
    fake_os.calls.clear()
    records = journal.append_batch([("T", {"i": i}) for i in range(100)])
    assert len(records) == 100
    assert fake_os.calls["pwrite"] == 1 and fake_os.calls["write"] == 0
    assert fake_os.calls["fdatasync"] + fake_os.calls["fsync"] == 1


def test_most_appends_write_over_the_preallocated_zero_tail(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.append("first", {})
        segment = next(jdir.glob("*.jsonl"))
        size = segment.stat().st_size
        assert size >= 64 << 10, "the first append preallocates"
        assert segment.read_bytes().rstrip(b"\0").count(b"\n") == 1
        for i in range(100):
            j.append("more", {"i": i})
        assert segment.stat().st_size == size, "no append grew the file"


def test_a_refresh_with_nothing_new_reads_one_byte(jdir: Path, fake_os: CountingOS) -> None:
    with Journal.open(jdir) as writer, Journal.open(jdir) as reader:
        writer.append("a", {})
        reader.refresh()  # reads the new record, and the zero tail to its end once
        writer.append("b", {})
        reader.refresh()
        fake_os.calls.clear()
        reader.refresh()
        # The byte after the last record (a NUL): nothing new, and the zero tail is not
        # read again.  (Without the lock, a handle also looks for the next segment by
        # name: a creator counts a segment in the lock file before it exists.)
        assert fake_os.calls["pread"] == 1
        assert reader.last_seq == 2


def test_catching_up_under_the_lock_looks_at_the_byte_after_the_end_once(
    jdir: Path, fake_os: CountingOS
) -> None:
    with Journal.open(jdir) as mine, Journal.open(jdir) as theirs:
        mine.append("a", {})
        theirs.append("b", {})
        mine.append("c", {})  # (catches up on b; the segment count is now remembered)
        theirs.append("d", {"note": "x" * 100})
        fake_os.calls.clear()
        assert mine.append("e", {}).seq == 5  # catches up on d first
        # One pread of the byte after our last record (not a NUL: something new), one
        # of the chunk from there (d's line, then zeros).
        assert fake_os.calls["pread"] == 2


def test_empty_batch_writes_nothing(journal: Journal, fake_os: CountingOS) -> None:
    assert journal.append_batch([]) == []
    assert fake_os.calls["write"] + fake_os.calls["pwrite"] == 0


@pytest.mark.parametrize(
    ("bad", "error"),
    [({"x": float("nan")}, InvalidRecordError), ({"x": "y" * 2_000_000}, RecordTooLargeError)],
)
def test_a_bad_record_refuses_the_whole_batch(
    journal: Journal, jdir: Path, bad: dict[str, Any], error: type[Exception]
) -> None:
    journal.append("A", {})
    with pytest.raises(error):
        journal.append_batch([("B", {}), ("C", bad), ("D", {})])
    assert [r.type for r in read_records(jdir)] == ["A"]
    assert journal.append("E", {}).seq == 2


def test_short_writes_are_completed(
    journal: Journal, jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Trickle(CountingOS):
        def __getattr__(self, name: str) -> Any:
            if name == "pwrite":
                return lambda fd, data, offset: os.pwrite(fd, bytes(data[:7]), offset)
            return super().__getattr__(name)

    monkeypatch.setattr(fsutil, "os", Trickle())
    records = journal.append_batch([("T", {"payload": "x" * 100}) for _ in range(3)])
    assert list(read_records(jdir)) == records


def test_reopen_continues_the_sequence(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.append_batch([("T", {})] * 3)
    with Journal.open(jdir) as j:
        assert j.last_seq == 3
        assert j.append("T", {}).seq == 4


# -- segments -----------------------------------------------------------------------------


def test_rotation_names_segments_by_first_seq_and_fsyncs_the_dir(
    jdir: Path, fake_os: CountingOS
) -> None:
    with Journal.open(jdir, segment_bytes_max=300) as j:
        for i in range(12):
            j.append("T", {"i": i})
    segments = list_segments(jdir)
    assert len(segments) > 3
    seq = 1
    for segment in segments:
        assert segment.first_seq == seq
        size = os.stat(segment.path).st_size
        assert size <= 300
        seq += Path(segment.path).read_bytes().count(b"\n")
    assert seq == 13
    # One directory fsync per segment created (plus the ones for mkdir at open).
    assert fake_os.dir_fsyncs >= len(segments)
    assert verify(jdir).status == "clean"


def test_a_batch_larger_than_a_segment_goes_into_one_segment(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=100) as j:
        j.append("first", {})
        j.append_batch([("T", {"i": i}) for i in range(10)])
        j.append("after", {})
    assert [s.first_seq for s in list_segments(jdir)] == [1, 2, 12]


# -- fencing ------------------------------------------------------------------------------


def test_older_epoch_is_fenced_and_epoch_zero_never(journal: Journal, jdir: Path) -> None:
    journal.append("lead", {}, epoch=3)
    with pytest.raises(FencedError) as caught:
        journal.append("stale", {}, epoch=2)
    assert (caught.value.epoch, caught.value.current_epoch) == (2, 3)
    assert caught.value.code == "journal.fenced"
    assert journal.append("same", {}, epoch=3).seq == 2
    assert journal.append("unfenced", {}, epoch=0).seq == 3
    assert journal.append("newer", {}, epoch=7).epoch == 7
    with pytest.raises(FencedError):
        journal.append("stale", {}, epoch=3)
    assert [r.type for r in read_records(jdir)] == ["lead", "same", "unfenced", "newer"]
    assert journal.max_epoch == 7


def test_fencing_survives_reopen(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.append("lead", {}, epoch=5)
    with Journal.open(jdir) as j:
        assert j.max_epoch == 5
        with pytest.raises(FencedError):
            j.append("stale", {}, epoch=4)


def test_fencing_sees_other_handles(jdir: Path) -> None:
    with Journal.open(jdir) as old, Journal.open(jdir) as new:
        old.append("old leader", {}, epoch=1)
        new.append("new leader", {}, epoch=2)
        with pytest.raises(FencedError):
            old.append("late write", {}, epoch=1)


def test_fence_hook_is_called_with_the_epoch_and_can_refuse(jdir: Path) -> None:
    lease_epoch = 4
    seen: list[int] = []

    class LeaseLost(Exception):
        pass

    def fence(epoch: int) -> None:
        seen.append(epoch)
        if 0 < epoch < lease_epoch:
            raise LeaseLost(epoch)

    with Journal.open(jdir, fence=fence) as j:
        j.append("unfenced", {})
        with pytest.raises(LeaseLost):
            j.append("refused", {}, epoch=3)
        j.append("ok", {}, epoch=4)
        assert seen == [0, 3, 4]
        assert [r.type for r in j.read()] == ["unfenced", "ok"]


def test_check_hook_refuses_without_writing(journal: Journal, jdir: Path) -> None:
    def refuse() -> None:
        raise ValueError("task already claimed")

    journal.append("A", {})
    with pytest.raises(ValueError, match="already claimed"):
        journal.append_batch([("B", {}), ("C", {})], check=refuse)
    assert [r.type for r in read_records(jdir)] == ["A"]
    assert journal.append("D", {}).seq == 2


def test_check_runs_after_catching_up_on_other_handles(jdir: Path) -> None:
    with Journal.open(jdir) as mine, Journal.open(jdir) as theirs:
        table: dict[str, str] = {}
        mine.subscribe(lambda r: table.__setitem__(r.data["task"], r.type))

        def not_claimed() -> None:
            if table.get("t1") == "CLAIMED":
                raise ValueError("t1 already claimed")

        theirs.append("CLAIMED", {"task": "t1"})
        with pytest.raises(ValueError):
            mine.append("CLAIMED", {"task": "t1"}, check=not_claimed)
        assert table == {"t1": "CLAIMED"}
        assert mine.last_seq == 1


# -- group commit -------------------------------------------------------------------------


def _queued(j: Journal) -> int:
    return len(j._writer._queue)


def test_concurrent_appends_share_one_write_and_fsync(jdir: Path, fake_os: CountingOS) -> None:
    gate = Gate()
    with Journal.open(jdir, fence=gate.fence) as j:
        j.append("warm", {})
        gate.armed = True
        first = threading.Thread(target=j.append, args=("leader", {}))
        first.start()
        assert gate.entered.wait(10)
        results: list[list[Record]] = []
        threads = [
            threading.Thread(
                target=lambda i=i: results.append(j.append_batch([("T", {"i": i})] * 2))
            )
            for i in range(6)
        ]
        for t in threads:
            t.start()
        wait_for(lambda: _queued(j) == 6, "six queued batches")
        fake_os.calls.clear()
        gate.release.set()
        for t in [first, *threads]:
            t.join(10)
        assert fake_os.calls["pwrite"] == 2  # the first leader's, then all six together
        assert fake_os.calls["fdatasync"] + fake_os.calls["fsync"] == 2
        seqs = sorted(r.seq for batch in results for r in batch)
        assert seqs == list(range(3, 15))
        for batch in results:
            assert batch[1].seq == batch[0].seq + 1  # a batch stays contiguous
    assert [r.seq for r in read_records(jdir)] == list(range(1, 15))


def test_a_refused_batch_fails_only_its_own_caller(jdir: Path) -> None:
    gate = Gate()
    with Journal.open(jdir, fence=gate.fence) as j:
        j.append("warm", {}, epoch=2)
        outcomes: dict[str, Any] = {}

        def run(name: str, epoch: int, check: Callable[[], None] | None = None) -> None:
            try:
                outcomes[name] = j.append(name, {}, epoch=epoch, check=check)
            except Exception as exc:
                outcomes[name] = exc

        def refuse() -> None:
            raise ValueError("no")

        gate.armed = True
        leader = threading.Thread(target=run, args=("leader", 2))
        leader.start()
        assert gate.entered.wait(10)
        others = [
            threading.Thread(target=run, args=("stale", 1)),
            threading.Thread(target=run, args=("ok1", 2)),
            threading.Thread(target=run, args=("checked-out", 0, refuse)),
            threading.Thread(target=run, args=("ok2", 0)),
        ]
        for t in others:
            t.start()
        wait_for(lambda: _queued(j) == 4, "four queued batches")
        gate.release.set()
        for t in [leader, *others]:
            t.join(10)
        assert isinstance(outcomes["stale"], FencedError)  # epoch 1 < 2
        assert isinstance(outcomes["checked-out"], ValueError)
        for name in ("leader", "ok1", "ok2"):
            assert isinstance(outcomes[name], Record), name
        assert sorted(r.type for r in j.read()) == ["leader", "ok1", "ok2", "warm"]


def test_a_check_sees_records_of_earlier_batches_in_its_group(jdir: Path) -> None:
    gate = Gate()
    with Journal.open(jdir, fence=gate.fence) as j:
        claimed: set[str] = set()
        j.subscribe(lambda r: claimed.add(r.data["task"]) if r.type == "CLAIMED" else None)
        gate.armed = True
        leader = threading.Thread(target=j.append, args=("noise", {"task": "-"}))
        leader.start()
        assert gate.entered.wait(10)
        outcomes: list[Any] = []

        def claim() -> None:
            def check() -> None:
                if "t1" in claimed:
                    raise ValueError("t1 already claimed")

            try:
                outcomes.append(j.append("CLAIMED", {"task": "t1"}, check=check))
            except ValueError as exc:
                outcomes.append(exc)

        claimers = [threading.Thread(target=claim) for _ in range(2)]
        for t in claimers:
            t.start()
        wait_for(lambda: _queued(j) == 2, "two queued claims")
        gate.release.set()
        for t in [leader, *claimers]:
            t.join(10)
        assert sorted(type(o).__name__ for o in outcomes) == ["Record", "ValueError"]
        assert [r.type for r in j.read()].count("CLAIMED") == 1


def _queue_behind_a_held_leader(
    j: Journal, gate: Gate, count: int
) -> tuple[list[threading.Thread], dict[str, Any]]:
    """A leader held inside its commit by ``gate`` and ``count`` batches queued behind
    it, each in its own thread; outcomes[name] gets each caller's result or error."""
    outcomes: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            outcomes[name] = j.append_batch([(name, {}), (name, {})])
        except Exception as exc:
            outcomes[name] = exc

    gate.armed = True
    threads = [threading.Thread(target=run, args=("leader",))]
    threads[0].start()
    assert gate.entered.wait(10)
    for i in range(count):
        threads.append(threading.Thread(target=run, args=(f"queued{i}",)))
        threads[-1].start()
    wait_for(lambda: _queued(j) == count, f"{count} queued batches")
    return threads, outcomes


def _join_all(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a caller was never woken"


def test_a_failed_commit_fails_every_caller_queued_behind_it(
    jdir: Path, fake_os: CountingOS
) -> None:
    gate = Gate()
    with Journal.open(jdir, fence=gate.fence) as j:
        threads, outcomes = _queue_behind_a_held_leader(j, gate, 4)
        fake_os.fail["pwrite"] = OSError(errno.EIO, os.strerror(errno.EIO))
        gate.release.set()
        _join_all(threads)
        assert len(outcomes) == 5
        assert all(isinstance(o, WriterFailedError) for o in outcomes.values()), outcomes
        assert fake_os.calls["pwrite"] == 1  # nobody wrote after the failure


def test_closing_with_callers_queued_wakes_every_one(jdir: Path) -> None:
    gate = Gate()
    j = Journal.open(jdir, fence=gate.fence)
    threads, outcomes = _queue_behind_a_held_leader(j, gate, 4)
    closer = threading.Thread(target=j.close)
    closer.start()
    gate.release.set()
    _join_all([*threads, closer])
    assert isinstance(outcomes["leader"], list)
    # Each queued batch was committed before the close, or refused by it: never lost,
    # never left waiting, and exactly what its caller was told is on disk.
    committed = [o for o in outcomes.values() if isinstance(o, list)]
    assert all(isinstance(o, list | JournalClosedError) for o in outcomes.values()), outcomes
    on_disk = [(r.seq, r.type) for r in read_records(jdir)]
    assert sorted(on_disk) == sorted((r.seq, r.type) for batch in committed for r in batch)


def test_many_threads_leave_every_record_exactly_once(jdir: Path) -> None:
    with Journal.open(jdir, segment_bytes_max=2000) as j:
        seen: list[int] = []
        j.subscribe(lambda r: seen.append(r.seq))

        def work(worker: int) -> None:
            for i in range(25):
                j.append("T", {"w": worker, "i": i})

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert seen == list(range(1, 201))
    got = list(read_records(jdir))
    assert sorted((r.data["w"], r.data["i"]) for r in got) == [
        (w, i) for w in range(8) for i in range(25)
    ]


# -- subscribers and several handles -----------------------------------------------------


def test_subscribe_replays_then_follows(journal: Journal) -> None:
    journal.append_batch([("T", {"i": i}) for i in range(5)])
    seen: list[int] = []
    journal.subscribe(lambda r: seen.append(r.seq), after_seq=2)
    assert seen == [3, 4, 5]
    journal.append("T", {})
    assert seen == [3, 4, 5, 6]
    late: list[int] = []
    journal.subscribe(lambda r: late.append(r.seq), after_seq=journal.last_seq)
    journal.append("T", {})
    assert late == [7] and seen[-1] == 7


def test_the_first_subscriber_gets_the_records_the_open_read_without_reading_again(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening reads and checks every record (the survey); the first subscriber (a
    # store folding them into its table) gets those, not a second read and parse of
    # the same lines. A later one, or one that the handle's own appends overtook,
    # reads from disk.
    with Journal.open(jdir, segment_bytes_max=300) as j:
        for i in range(12):
            j.append("T", {"i": i})
    assert len(list_segments(jdir)) > 1
    reads: list[int] = []
    real = journal_module.iter_records

    def counted(directory: Path, from_seq: int = 1, **kw: Any) -> Iterator[Record]:
        reads.append(from_seq)
        return real(directory, from_seq, **kw)

    monkeypatch.setattr(journal_module, "iter_records", counted)
    with Journal.open(jdir, segment_bytes_max=300) as j:
        first: list[int] = []
        j.subscribe(lambda r: first.append(r.data["i"]), after_seq=3)
        assert first == list(range(3, 12)) and reads == []
        again: list[int] = []
        j.subscribe(lambda r: again.append(r.seq), after_seq=10)
        assert again == [11, 12] and reads == [11]
    with Journal.open(jdir, segment_bytes_max=300) as j:
        j.append("T", {"i": 12})
        later: list[int] = []
        j.subscribe(lambda r: later.append(r.seq))
        assert later == list(range(1, 14)) and reads == [11, 1]


def test_the_records_the_open_read_are_let_go_by_a_first_subscriber_that_needs_none(
    jdir: Path,
) -> None:
    # A store whose snapshot is at the journal's end subscribes after its last record:
    # the survey's records (a whole segment when the snapshot's line is not found) were
    # kept for as long as the handle lived (found by a review).
    with Journal.open(jdir) as j:
        for i in range(5):
            j.append("T", {"i": i})
    for after_seq in (5, 9):
        with Journal.open(jdir) as j:
            assert len(j._writer.surveyed) == 5
            j.subscribe(lambda r: None, after_seq=after_seq)
            assert len(j._writer.surveyed) == 0


def test_subscribers_see_other_handles_exactly_once_in_order(jdir: Path) -> None:
    with (
        Journal.open(jdir, segment_bytes_max=250) as a,
        Journal.open(jdir, segment_bytes_max=250) as b,
    ):
        seen_a: list[int] = []
        a.subscribe(lambda r: seen_a.append(r.seq))
        for i in range(10):
            (a if i % 3 else b).append("T", {"i": i})
        a.refresh()
        assert seen_a == list(range(1, 11))
        b.append("T", {})
        a.append("T", {})  # catches up on b's record first
        assert seen_a == list(range(1, 13))
        a.refresh()
        assert seen_a == list(range(1, 13))
    assert verify(jdir).status == "clean"


def test_handles_follow_each_others_rotations(jdir: Path) -> None:
    with (
        Journal.open(jdir, segment_bytes_max=200) as a,
        Journal.open(jdir, segment_bytes_max=200) as b,
    ):
        for i in range(30):
            (a if i % 2 else b).append("T", {"i": i})
        b.refresh()
        assert a.last_seq == b.last_seq == 30
        assert len(list_segments(jdir)) > 5
    assert [r.data["i"] for r in read_records(jdir)] == list(range(30))


def test_a_raising_subscriber_breaks_the_handle(journal: Journal) -> None:
    def boom(record: Record) -> None:
        raise RuntimeError("bad fold")

    journal.subscribe(boom)
    rec = journal.append("T", {})  # committed: the append itself succeeds
    assert rec.seq == 1
    with pytest.raises(WriterFailedError) as caught:
        journal.append("T", {})
    assert isinstance(caught.value.__cause__, Exception)


# -- failure ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "err"),
    [("fdatasync", errno.EIO), ("pwrite", errno.ENOSPC)],
)
def test_failed_write_or_fsync_makes_the_writer_unusable(
    jdir: Path, fake_os: CountingOS, call: str, err: int
) -> None:
    with Journal.open(jdir) as j:
        j.append("before", {})
        fake_os.fail[call] = OSError(err, os.strerror(err))
        with pytest.raises(WriterFailedError) as caught:
            j.append("lost?", {})
        assert caught.value.code == "journal.writer_failed"
        assert isinstance(caught.value.__cause__, OSError)
        attempts = fake_os.calls[call]
        del fake_os.fail[call]  # even once the disk "recovers": no retry, no more writes
        for _ in range(2):
            with pytest.raises(WriterFailedError):
                j.append("after", {})
            with pytest.raises(WriterFailedError):
                j.refresh()
        assert fake_os.calls[call] == attempts
    with Journal.open(jdir) as j:  # a new handle works; the failed record may or may not be there
        assert j.last_seq in (1, 2)
        assert j.append("new handle", {}).seq == j.last_seq


def test_closed_handle_refuses(jdir: Path) -> None:
    j = Journal.open(jdir)
    j.append("T", {})
    j.close()
    j.close()  # idempotent
    with pytest.raises(JournalClosedError):
        j.append("T", {})
    with pytest.raises(JournalClosedError):
        j.subscribe(lambda r: None)


def test_bad_open_arguments(jdir: Path) -> None:
    with pytest.raises(ValueError):
        Journal.open(jdir, segment_bytes_max=0)


def test_open_refuses_a_record_bytes_max_its_own_reader_would_call_damage(jdir: Path) -> None:
    """The reader takes a line longer than LINE_BYTES_MAX_READ (64 MiB) for damage: a
    handle allowed longer records committed a 65 MiB record that the next handle's
    append then cut as a torn tail."""
    with pytest.raises(ValueError, match="record_bytes_max"):
        Journal.open(jdir, record_bytes_max=(64 << 20) + 1)
    Journal.open(jdir, record_bytes_max=64 << 20).close()


def test_the_largest_record_a_handle_accepts_is_read_back_never_cut(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scaled down (the reader's bound at 600 bytes, reads of 100): a record as large as
    the handle takes is committed, read back, and survives another handle's append
    (with record_bytes_max=1000 an 800-byte record was cut by it, its seq reused)."""
    monkeypatch.setattr(reader_module, "LINE_BYTES_MAX_READ", 600)
    monkeypatch.setattr(reader_module, "CHUNK_BYTES", 100)
    with pytest.raises(ValueError, match="record_bytes_max"):
        Journal.open(jdir, record_bytes_max=601)
    with (
        Journal.open(jdir, record_bytes_max=600) as writer,
        Journal.open(jdir, record_bytes_max=600) as other,
    ):
        pad = 400
        # A timestamp whose text is as long as one can be (17 significant digits): the
        # record's size depends on it, and the append takes its own.
        longest_ts = 1796158690.0416532
        while True:  # the largest record this handle takes, whatever its timestamp
            try:
                prepare("T", {"pad": "p" * (pad + 1)}, 0, 600, ts=longest_ts)
            except RecordTooLargeError:
                break
            pad += 1
        big = writer.append("T", {"pad": "p" * pad})
        other.append("next", {})
    assert verify(jdir).clean
    assert [r.data for r in read_records(jdir)] == [big.data, {}]


def test_snapshot_seq_must_be_known(journal: Journal) -> None:
    journal.append("T", {})
    with pytest.raises(JournalError):
        journal.write_snapshot(2, b"")


# -- crashes of another appender in the middle of a rotation -----------------------------


def _bump_rotation_counter(jdir: Path) -> None:
    with (jdir / ".lock").open("ab") as f:
        f.write(b"+")


def test_a_rotator_that_died_before_creating_its_segment_is_harmless(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.append_batch([("T", {})] * 3)
        _bump_rotation_counter(jdir)  # counted a segment, died before creating it
        assert j.append("T", {}).seq == 4
        j.refresh()
    assert [s.first_seq for s in list_segments(jdir)] == [1]
    assert verify(jdir).status == "clean"


def test_a_segment_left_empty_by_a_dead_rotator_is_used_by_everyone(jdir: Path) -> None:
    with Journal.open(jdir) as old:
        old.append_batch([("T", {})] * 3)
        _bump_rotation_counter(jdir)
        (jdir / segment_name(4)).write_bytes(b"")  # created, died before writing
        with Journal.open(jdir) as new:
            assert new.append("new", {}).seq == 4
        assert old.append("old", {}).seq == 5  # follows into the new segment, no overlap
    assert [s.first_seq for s in list_segments(jdir)] == [1, 4]
    assert [r.type for r in read_records(jdir)] == ["T", "T", "T", "new", "old"]
    assert verify(jdir).status == "clean"


def test_a_lock_free_refresh_racing_a_rotation_does_not_miss_the_segment(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.append_batch([("T", {})] * 3)
        seen: list[int] = []
        j.subscribe(lambda r: seen.append(r.seq), after_seq=3)
        _bump_rotation_counter(jdir)  # another appender counted its segment ...
        j.refresh()  # ... we look before it exists ...
        path = jdir / segment_name(4)
        path.write_bytes(encode_record(4, 0, 1.0, "T", {}))  # ... then it appears
        j.refresh()
        assert seen == [4]


def test_a_writer_fsyncs_the_directory_of_a_segment_it_did_not_create_only_if_empty(
    jdir: Path, fake_os: CountingOS
) -> None:
    with Journal.open(jdir) as j:
        j.append("T", {})
    with Journal.open(jdir) as j:
        fake_os.dir_fsyncs = 0
        j.append("T", {})
        assert fake_os.dir_fsyncs == 0  # its writer made it durable before its record
    # The next segment, created by a writer that died before it fsynced the directory:
    (jdir / segment_name(3)).write_bytes(b"")
    with Journal.open(jdir) as j:
        fake_os.dir_fsyncs = 0
        j.append("T", {})
        assert fake_os.dir_fsyncs == 2  # the journal directory and its parent
        j.append("T", {})
        assert fake_os.dir_fsyncs == 2  # once per handle
    assert [r.seq for r in journal_module.read_records(jdir)] == [1, 2, 3, 4]


def test_calling_back_into_the_journal_from_a_subscriber_is_refused_not_a_deadlock(
    journal: Journal,
) -> None:
    errors: list[Exception] = []

    def nested(record: Record) -> None:
        if record.type == "outer":
            try:
                journal.append("inner", {})
            except JournalError as exc:
                errors.append(exc)
                raise

    journal.subscribe(nested)
    journal.append("outer", {})  # committed; the subscriber's failure breaks the handle
    assert errors and "deadlock" in str(errors[0])
    with pytest.raises(WriterFailedError):
        journal.append("after", {})


def test_calling_back_from_a_check_hook_refuses_that_batch_only(journal: Journal) -> None:
    def check() -> None:
        journal.append("inner", {})

    with pytest.raises(JournalError, match="deadlock"):
        journal.append("outer", {}, check=check)
    assert journal.append("fine", {}).seq == 1


def test_open_on_a_file_is_a_journal_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(JournalError):
        Journal.open(tmp_path / "file")


def test_subscribing_ahead_of_this_handle_skips_what_it_asked_not_to_see(jdir: Path) -> None:
    with Journal.open(jdir) as mine, Journal.open(jdir) as theirs:
        theirs.append_batch([("T", {})] * 5)
        seen: list[int] = []
        mine.subscribe(lambda r: seen.append(r.seq), after_seq=3)  # mine has seen nothing
        mine.refresh()
        theirs.append("T", {})
        mine.append("T", {})
        assert seen == [4, 5, 6, 7]


def test_read_from_zero_or_below_reads_everything(journal: Journal) -> None:
    journal.append_batch([("T", {})] * 3)
    assert [r.seq for r in journal.read(0)] == [1, 2, 3]
    assert [r.seq for r in journal.read(-5)] == [1, 2, 3]


def test_a_handle_inherited_across_fork_fails_in_the_child(jdir: Path) -> None:
    """Parent and child of fork() share the lock's open file description, so flock no
    longer excludes them: a review had both append through one handle, every append
    said "committed", and the journal ended corrupt with most of them gone. The child's
    handle fails at once (documented: open a new handle in the child); the parent's
    goes on."""
    with Journal.open(jdir) as handle:
        handle.append("before", {})
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what its append did, never return into pytest
            try:
                handle.append("child", {})
                said = b"appended"
            except WriterFailedError as error:
                said = b"refused: " + str(error).encode()
            except BaseException as error:  # (said to the parent)
                said = repr(error).encode()
            os.write(write_end, said)
            os._exit(0)
        os.close(write_end)
        try:
            for i in range(20):
                handle.append("parent", {"i": i})
        finally:
            _, status = os.waitpid(pid, 0)
        said = os.read(read_end, 4096).decode()
        os.close(read_end)
    assert status == 0 and said.startswith("refused: ") and "fork" in said, said
    assert verify(jdir).clean
    assert [r.type for r in read_records(jdir)] == ["before"] + ["parent"] * 20


@pytest.mark.parametrize(
    "items",
    [[("a", {}, 1), ("b", {}, 2)], [("a",), ("b",)], "abcd", [{"type": "a", "data": {}}] * 2],
    ids=["triples", "singles", "a str", "dicts"],
)
def test_a_batch_of_items_that_are_not_pairs_is_an_invalid_record(
    journal: Journal, jdir: Path, items: Any
) -> None:
    """Raised a bare ValueError ("too many values to unpack"), where the docstring
    promises InvalidRecordError, before anything is written."""
    with pytest.raises(InvalidRecordError, match="pair"):
        journal.append_batch(items)
    assert journal.last_seq == 0 and verify(jdir).clean


def test_a_file_where_a_journal_directory_is_expected_is_a_journal_error(
    tmp_path: Path,
) -> None:
    """``read_records``, ``verify``, ``repair`` and ``salvage`` of a file raised a bare
    NotADirectoryError (a missing directory: a JournalError that says so); as
    ``Journal.open`` does."""
    path = tmp_path / "a-file"
    path.write_text("not a journal\n")
    for call in (
        lambda: list(read_records(path)),
        lambda: verify(path),
        lambda: journal_module.repair(path),
        lambda: journal_module.salvage(path, dry_run=True),
        lambda: list(read_records(tmp_path / "missing")),
    ):
        with pytest.raises(JournalError, match="journal directory"):
            call()
    assert path.read_text() == "not a journal\n"
