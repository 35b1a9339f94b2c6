"""Records another handle read before they were durable, then taken back: a commit
whose fdatasync failed cuts its records off again (``_writer._take_back``), but a
lock-free reader may have read them in between (``Journal.refresh`` reads what is
written, synced or not). Such a handle must never write at its stale end, snapshot
past the journal's end, or act on the records as if committed: its next catch-up finds
them gone (the bytes before its end are not the ones it read) and the handle fails,
``TakenBackError``; a new handle reads the journal as it is. (Found by a review: a
``work`` leader claimed and ran a task whose ``submit`` had exited 125, writing its
records at the stale offset behind another process's record, then a zero gap: every
command exited 4.)

Unit tier, real files: the failing fdatasync is the one of ``journal._fsutil.os``,
swapped for one that lets the reader look first."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import journal._fsutil as fsutil
from journal import Journal, TakenBackError, WriterFailedError, read_records, verify

BIG = {"pad": "x" * 600}  # (longer than the record written in its place)


class FailingSync:
    """``os``, but the next fdatasync first calls ``meanwhile`` (another handle reads
    the records written and not yet synced), then fails with EIO."""

    def __init__(self, meanwhile: Callable[[], None]) -> None:
        self.meanwhile: Callable[[], None] | None = meanwhile

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name != "fdatasync" or self.meanwhile is None:
            return real

        def fail(fd: int) -> None:
            meanwhile, self.meanwhile = self.meanwhile, None
            assert meanwhile is not None
            meanwhile()
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        return fail


def taken_back(monkeypatch: pytest.MonkeyPatch, writer: Journal, reader: Journal) -> None:
    """``writer`` appends a record, ``reader`` reads it before its fdatasync, which
    fails: the writer takes it back."""
    monkeypatch.setattr(fsutil, "os", FailingSync(reader.refresh))
    before = reader.last_seq
    with pytest.raises(WriterFailedError):
        writer.append("phantom", BIG)
    monkeypatch.setattr(fsutil, "os", os)
    assert reader.last_seq == before + 1, "the reader saw the record before it was taken back"


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "journal"


@pytest.mark.parametrize("then_another_appends", [True, False])
def test_a_handle_that_read_records_since_taken_back_writes_nothing(
    jdir: Path, monkeypatch: pytest.MonkeyPatch, then_another_appends: bool
) -> None:
    with Journal.open(jdir) as leader, Journal.open(jdir) as submitter:
        leader.append("first", {})
        taken_back(monkeypatch, submitter, leader)
        if then_another_appends:  # (a short record over the phantom's start, then zeros)
            with Journal.open(jdir) as other:
                assert other.append("real", {}).seq == 2
        with pytest.raises(WriterFailedError) as caught:
            leader.append("claim", {"of": "phantom"})
        assert isinstance(caught.value.__cause__, TakenBackError)
        assert caught.value.__cause__.code == "journal.taken_back"
        with pytest.raises(WriterFailedError):  # (the handle stays failed)
            leader.refresh()
    assert verify(jdir).status == "clean"
    expected = ["first", "real"] if then_another_appends else ["first"]
    assert [r.type for r in read_records(jdir)] == expected
    with Journal.open(jdir) as fresh:
        assert fresh.append("next", {}).seq == len(expected) + 1


def test_a_lock_free_refresh_finds_records_taken_back(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Journal.open(jdir) as reader, Journal.open(jdir) as submitter:
        taken_back(monkeypatch, submitter, reader)
        with Journal.open(jdir) as other:
            other.append("real", {})
        with pytest.raises(WriterFailedError) as caught:
            reader.refresh()
        assert isinstance(caught.value.__cause__, TakenBackError)


def test_no_snapshot_covers_records_taken_back(jdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Journal.open(jdir) as leader, Journal.open(jdir) as submitter:
        leader.append("first", {})
        taken_back(monkeypatch, submitter, leader)
        with pytest.raises(WriterFailedError):
            leader.write_snapshot(2, b"a state with the phantom in it")
    assert not list(jdir.glob("snapshot-*"))
    assert verify(jdir).status == "clean"


@pytest.mark.parametrize("call", ["sync", "write_snapshot"])
def test_a_failed_fdatasync_of_what_a_handle_read_fails_it_for_good(
    jdir: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """``sync`` and ``write_snapshot`` fdatasync the records the handle read (another
    process's may be unsynced: it died between its write and its sync). That fdatasync
    failing (EIO) fails the handle: a retry may "succeed" without the data (Linux may
    have dropped the dirty pages that failed), so nothing more is said durable through
    it. (Found by a review: the OSError passed through, the handle stayed usable, a
    second ``sync`` returned True and a second ``write_snapshot`` covered the records.)"""
    with Journal.open(jdir) as writer:
        writer.append("first", {})
    with Journal.open(jdir) as handle:
        act = (
            (lambda: handle.sync()) if call == "sync" else (lambda: handle.write_snapshot(1, b"s"))
        )
        monkeypatch.setattr(fsutil, "os", FailingSync(lambda: None))
        with pytest.raises(WriterFailedError) as caught:
            act()
        assert isinstance(caught.value.__cause__, OSError), caught.value.__cause__
        monkeypatch.setattr(fsutil, "os", os)
        for again in (act, lambda: handle.append("after", {})):
            with pytest.raises(WriterFailedError):
                again()
    assert not list(jdir.glob("snapshot-*"))
    assert [r.type for r in read_records(jdir)] == ["first"]


def test_a_read_only_handle_syncs_under_the_lock(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sync`` on a read-only handle (``wait``, ``logs -f``) takes the append lock for
    its catch-up (it raised ReadOnlyError): what it read and its writer then took back
    is found gone, as for a writer's handle; no append is in progress meanwhile."""
    with Journal.open(jdir) as writer:
        writer.append("first", {})
    with Journal.open(jdir, read_only=True) as reader, Journal.open(jdir) as submitter:
        taken_back(monkeypatch, submitter, reader)
        with pytest.raises(WriterFailedError) as caught:
            reader.sync()
        assert isinstance(caught.value.__cause__, TakenBackError)
    with Journal.open(jdir, read_only=True) as reader:
        reader.sync()
        assert reader.last_seq == 1
    with Journal.open(tmp := jdir.parent / "none", read_only=True) as empty:
        empty.sync()  # (no journal yet, no lock file: a plain catch-up)
        assert empty.last_seq == 0 and not tmp.exists()


def syncs_once_the_lock_is_free(reader: Journal, jdir: Path) -> None:
    """``reader.sync(within_s)``: False, nothing done, while another process holds the
    append lock all along (a ferry stopped in its append); True once it is free."""
    import fcntl

    lock = os.open(jdir / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert reader.sync(0.05) is False
        fcntl.flock(lock, fcntl.LOCK_UN)
        assert reader.sync(0.05) is True and reader.last_seq == 1
    finally:
        os.close(lock)


def test_sync_within_a_time_gives_up_while_another_holds_the_lock(jdir: Path) -> None:
    with Journal.open(jdir) as writer:
        writer.append("first", {})
    with Journal.open(jdir, read_only=True) as reader:
        syncs_once_the_lock_is_free(reader, jdir)


def test_a_reader_opened_before_the_journal_was_made_syncs_under_the_lock(
    tmp_path: Path,
) -> None:
    """A read-only handle opened before its journal existed had no lock file, and kept
    none: its ``sync`` never took the lock once the journal was there, and said True
    while a writer was inside its append (for a record that writer then took back). It
    looks for the lock file again."""
    jdir = tmp_path / "j"
    with Journal.open(jdir, read_only=True) as reader:
        assert reader.sync(0.05) is True and reader.last_seq == 0  # (no journal: nothing)
        with Journal.open(jdir) as writer:
            writer.append("first", {})
        syncs_once_the_lock_is_free(reader, jdir)


def test_sync_within_a_time_gives_up_while_its_own_handle_waits_for_the_lock(
    jdir: Path,
) -> None:
    """Another thread of the same handle waits in its append for the lock (held by a
    writer stopped in its own): ``sync(within_s)`` waited for that thread, with no
    bound, before its own timed wait for the lock."""
    import fcntl
    import threading

    with Journal.open(jdir) as handle:
        lock = os.open(jdir / ".lock", os.O_RDONLY)
        fcntl.flock(lock, fcntl.LOCK_EX)
        appender = threading.Thread(target=handle.append, args=("x", {}))
        appender.start()
        try:
            deadline = time.monotonic() + 30
            while not handle._writer._busy:  # (its commit has begun: it waits for flock)
                assert time.monotonic() < deadline, "the append never began"
                time.sleep(0.001)
            result: list[bool] = []
            syncer = threading.Thread(target=lambda: result.append(handle.sync(0.05)))
            syncer.start()
            syncer.join(30)
            assert not syncer.is_alive(), "sync(0.05) waited for the stopped writer"
            assert result == [False]
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
            appender.join(30)
        assert handle.last_seq == 1 and handle.sync(0.05) is True
