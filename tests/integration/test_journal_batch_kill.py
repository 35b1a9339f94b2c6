"""A real process SIGKILLed while the one ``pwrite`` of a large batch is in the kernel.

Linux stops a large write to a regular file between pages on a fatal signal: the file
keeps a prefix of the batch, whole records then a cut line.  Before batch marks the
next writer cut the cut line only, and the whole records of the batch stayed, read as
committed (a ``ferry submit --from`` of 40,000 tasks left 1,420 of them queued).  Now
none of the batch is read, and the next append cuts it whole (docs/journal-format.md,
"Batches")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from crashkit import kill_when

import journal
from journal._segment import list_segments

RECORDS = 40_000
PAD = "x" * 1000  # about 1.1 KB a line: a 44 MB write
# argv: directory, records
CHILD = r"""
import sys
import journal
directory, records = sys.argv[1], int(sys.argv[2])
j = journal.Journal.open(directory)
items = [("SUBMITTED", {"i": i, "pad": "x" * 1000}) for i in range(records)]
sys.stdout.write("ready\n")
sys.stdout.flush()
j.append_batch(items)
sys.stdout.write("committed\n")
"""
GROWN_BYTES = 2 << 20  # kill once the segment grew by this much: the write is under way
ATTEMPTS = 4
DEADLINE_S = 60.0


def _segment_size(directory: Path) -> int:
    return sum(os.stat(s.path).st_size for s in list_segments(str(directory)))


def _kill_in_the_write(directory: Path) -> bool:
    """Run the child and SIGKILL it once the segment has grown by GROWN_BYTES; True if
    the kill landed in the write (the last record of the batch is not on disk)."""
    before = _segment_size(directory)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(RECORDS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    if child.stdout.readline() != b"ready\n":
        kill_when(child, lambda: True, DEADLINE_S)  # (reaped)
        raise AssertionError("the child did not start")
    kill_when(child, lambda: _segment_size(directory) >= before + GROWN_BYTES, DEADLINE_S)
    last = b'{"v":1,"seq":%d,"epoch"' % (2 + RECORDS)  # the batch's last line
    data = Path(list_segments(str(directory))[-1].path).read_bytes()
    return last not in data[-(4 << 20) :]


@pytest.mark.timeout(300)
def test_a_batch_killed_in_its_write_leaves_none_of_its_records(tmp_path: Path) -> None:
    for attempt in range(ATTEMPTS):
        directory = tmp_path / f"j{attempt}"
        with journal.Journal.open(directory) as j:
            j.append("before", {"n": 1})
            j.append_batch([("before", {"n": 2}), ("before", {"n": 3})])
        if _kill_in_the_write(directory):
            break
    else:
        pytest.fail(f"the kill never landed in the write in {ATTEMPTS} tries")
    # A prefix of the batch is on disk: whole records of it (the bug read them)...
    data = Path(list_segments(str(directory))[-1].path).read_bytes()
    assert b'{"v":1,"seq":1000,"more":' in data
    # ... and none of them is read.
    report = journal.verify(directory)
    assert report.status == "torn_tail", report
    assert report.torn_tail is not None and report.torn_tail.seq == 4
    assert f"of {RECORDS} records landed" in report.torn_tail.reason
    assert [r.seq for r in journal.read_records(directory)] == [1, 2, 3]
    with journal.Journal.open(directory) as j:
        assert j.last_seq == 3
        seen: list[int] = []
        j.subscribe(lambda r: seen.append(r.seq))
        assert seen == [1, 2, 3]
        assert j.append("after", {}).seq == 4  # the batch cut whole first
    assert journal.verify(directory).clean
    assert [r.type for r in journal.read_records(directory)] == ["before"] * 3 + ["after"]
    assert list(directory.glob("*.broken"))  # (the evidence kept)
