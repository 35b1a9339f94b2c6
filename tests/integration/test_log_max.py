"""``--log-max BYTES`` end to end: a task that writes far more than BYTES leaves about
BYTES on disk per stream, the head and the tail of each, in the order written; the
passthrough to ``run``'s stdout stays whole; the evidence says how much was dropped;
``ferry logs`` marks where; a supervisor killed mid-task leaves the head and the last
bytes written, still within the bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clikit import Ferry, wait_until

pytestmark = pytest.mark.timeout(180)

CAP = 64 << 10
MIB = 1 << 20
# A fast writer: stderr BEGIN, 24 MiB of numbered stdout lines with MIDDLE on stderr
# halfway, END on stderr. Before each stderr line it waits until ferry has logged all of
# stdout so far (the capped log keeps the stream's offsets): a write returns once the
# pipe holds it, not once ferry has read it, and ferry reads what both pipes hold in the
# order they became readable; while its passthrough to a slow reader (this test, on a
# loaded machine) is backlogged, it even reads stderr alone. Then the order is the one
# the order index keeps.
WRITER = r"""
import os, time
task, attempt = os.environ["FERRY_TASK"].split(":")[:2]
log = os.path.join(os.environ["FERRY_HOME"], "logs", task, attempt + ".stdout")
written = 0
def out(data):
    global written
    view = memoryview(data)
    while view:
        n = os.write(1, view)
        view, written = view[n:], written + n
def err(text):
    while not (os.path.exists(log) and os.path.getsize(log) >= written):
        time.sleep(0.005)
    os.write(2, text)
os.write(2, b"BEGIN\n")
line = lambda n: b"%08d " % n + b"x" * 91 + b"\n"
block = lambda first: b"".join(line(n) for n in range(first, first + 1000))
for k in range(120):
    out(block(k * 1000))
err(b"MIDDLE\n")
for k in range(120, 240):
    out(block(k * 1000))
err(b"END\n")
"""
STREAM = b"".join(b"%08d " % n + b"x" * 91 + b"\n" for n in range(240_000))  # 24.24 MB


def log_path(ferry: Ferry, task_id: str, stream: str = "stdout") -> Path:
    return ferry.home / "logs" / task_id / f"1.{stream}"


def disk_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_a_big_output_keeps_head_and_tail_in_order_and_passes_through_whole(
    ferry: Ferry,
) -> None:
    run = ferry.ok("run", "--log-max", "64K", "--", sys.executable, "-c", WRITER)
    assert run.out == STREAM, "the passthrough is not capped"
    assert run.err == "BEGIN\nMIDDLE\nEND\n"
    task = ferry.only_task()
    assert task["state"] == "SUCCEEDED" and task["log_max_bytes"] == CAP
    dropped = task["evidence"]["log_dropped_bytes"]
    # (The kept parts end and start on file system blocks: a little more than the cap.)
    assert dropped["stderr"] == 0
    assert len(STREAM) - CAP - 8192 <= dropped["stdout"] <= len(STREAM) - CAP

    stdout_log = log_path(ferry, task["id"])
    assert disk_bytes(stdout_log) <= CAP + 8192
    assert os.stat(stdout_log).st_size == len(STREAM), "offsets stay the stream's"

    shown = ferry.ok("logs", "--merged", task["id"])
    assert shown.out.startswith(b"BEGIN\n") and shown.out.endswith(b"END\n")
    head, tail = shown.out[len(b"BEGIN\n") : -len(b"END\n")].split(b"MIDDLE\n")
    assert len(head) >= CAP // 2 and len(tail) >= CAP // 2
    assert head == STREAM[: len(head)] and tail == STREAM[len(STREAM) - len(tail) :]
    assert len(head) + len(tail) == len(STREAM) - dropped["stdout"]
    # Where bytes were dropped, a line on stderr says how many: two here, before MIDDLE
    # and after it (MIDDLE was written while the dropped part of stdout was).
    markers = [line for line in shown.err.splitlines() if "not kept here (--log-max)" in line]
    assert len(markers) == 2, shown.err
    total = sum(int(m.split("[", 1)[1].split(" ")[0].replace(",", "")) for m in markers)
    assert total == dropped["stdout"]
    lines = ferry.ok("--json", "logs", task["id"]).out.splitlines()
    assert sum(1 for line in lines if b'"dropped"' in line) == 2
    assert ferry.ok("logs", task["id"], "--tail", "1", "--stream", "stdout").out == STREAM[-101:]


def test_a_queued_task_keeps_its_cap_and_the_limits_are_checked(ferry: Ferry) -> None:
    line = (
        b'{"argv": ["sh", "-c", "head -c 3000000 /dev/zero | tr \\"\\\\0\\" a"], "log_max": "1M"}\n'
    )
    [task_id] = ferry.ok("submit", "--from", "-", stdin=line).text.split()
    ferry.ok("work", "--drain", "--poll", "0.05")
    task = ferry.task(task_id)
    assert task["log_max_bytes"] == MIB
    assert task["evidence"]["log_dropped_bytes"]["stdout"] >= 3_000_000 - MIB - 8192
    assert disk_bytes(log_path(ferry, task_id)) <= MIB + 8192
    ferry.refused(2, "usage.bad_size", "run", "--log-max", "10", "--", "true")
    ferry.refused(2, "usage.bad_size", "submit", "--log-max", "1X", "--", "true")
    ferry.refused(2, "usage.bad_size", "run", "--log-max=-5", "--", "true")


def test_a_supervisor_killed_mid_task_leaves_the_head_and_the_last_bytes(
    ferry: Ferry, tmp_path: Path
) -> None:
    """kill -9 of the task's supervisor while the task writes: the log holds the head and
    what was logged last, never much more than the cap on disk."""
    marker = tmp_path / "written"
    writer = (
        "import os, time\n"
        f"for n in range(200): os.write(1, (b'%06d ' % n) + b'y' * 99993)\n"
        "os.write(1, b'LAST\\n')\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "time.sleep(300)\n"
    )
    proc = ferry.start("run", "--log-max", "64K", "--", sys.executable, "-c", writer,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    wait_until(marker.exists, what="the task to write its 20 MB")
    task = ferry.only_task()
    stdout_log = log_path(ferry, task["id"])
    wait_until(lambda: stdout_log.read_bytes().endswith(b"LAST\n"), what="LAST to be logged")
    os.kill(int(task["runner"]["pid"]), signal.SIGKILL)  # the supervisor
    ferry.end_at_close(int(task["pid"]))
    os.kill(int(task["pid"]), signal.SIGKILL)
    proc.wait(timeout=30)
    data = stdout_log.read_bytes()
    assert data[: CAP // 2] == (b"000000 " + b"y" * 99993)[: CAP // 2]
    assert data.endswith(b"y" * 1000 + b"LAST\n")
    assert disk_bytes(stdout_log) <= 2 * CAP + 8192
    assert ferry.recover()[0] in (0, 3)
    shown = ferry.ok("logs", task["id"], "--stream", "stdout")
    assert shown.out.startswith(b"000000 ") and shown.out.endswith(b"LAST\n")
    assert "not kept here (--log-max)" in shown.err
