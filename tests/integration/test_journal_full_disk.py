"""The journal near a full disk, on a real (small) tmpfs: preallocation must never be
what fills it. A write that fails fails the handle for good, so the zeros that
preallocate a segment go in only while the file system has room for twice them."""

from __future__ import annotations

import os
from pathlib import Path

from hardkit import mounted_tmpfs

import journal


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_near_a_full_disk_records_go_in_without_preallocating(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "disk", "size=1m,mode=0700") as disk:
        directory = disk / "j"
        with journal.Journal.open(directory) as j:
            j.append("first", {})
            segment = next(directory.glob("*.jsonl"))
            assert segment.stat().st_size >= 64 << 10, "room enough: the first append preallocates"
            (disk / "filler").write_bytes(bytes(free_bytes(disk) - (150 << 10)))
            # Past the zero tail, and with zeros after it, it would not fit in 150 KiB.
            big = {"blob": "x" * (100 << 10)}
            record = j.append("big", big)
            content = segment.read_bytes()
            assert len(content) == len(content.rstrip(b"\0")), "no zeros were added"
            assert j.append("small", {}).seq == record.seq + 1
        assert [r.type for r in journal.read_records(directory)] == ["first", "big", "small"]
        assert journal.verify(directory).clean


def test_a_batch_that_fills_the_disk_leaves_none_of_its_records(tmp_path: Path) -> None:
    """The write of a batch stops short (ENOSPC) after some whole lines: the caller is
    told it failed, so none of them may be found later (a batch is all or none). The
    writer takes its bytes back (truncate + sync) before it gives up; only what was
    committed before stays."""
    with mounted_tmpfs(tmp_path / "disk", "size=1m,mode=0700") as disk:
        directory = disk / "j"
        with journal.Journal.open(directory) as j:
            j.append("before", {})
            (disk / "filler").write_bytes(bytes(free_bytes(disk) - (100 << 10)))
            batch = [("batch", {"i": i, "pad": "x" * 300}) for i in range(1000)]  # ~350 KiB
            try:
                j.append_batch(batch)
            except journal.WriterFailedError:
                pass
            else:
                raise AssertionError("the batch cannot fit")
        assert [r.type for r in journal.read_records(directory)] == ["before"]
        assert journal.verify(directory).clean
