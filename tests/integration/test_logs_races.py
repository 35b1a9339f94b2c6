"""``ferry logs`` racing what changes its files under it: the supervisor dropping the
middle of a ``--log-max`` log while a reader is slow. Found by a review: a slow reader
of ``logs -f`` was shown NUL bytes the task never wrote.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from clikit import Ferry, wait_until

pytestmark = pytest.mark.timeout(120)

LINES = 20_000  # 100-byte numbered lines: 2 MB, the first half before the gate
WRITER = r"""
import os, sys, time
line = lambda n: b"%07d " % n + b"a" * 91 + b"\n"
def out(first, last):
    view = memoryview(b"".join(line(n) for n in range(first, last)))
    while view:
        view = view[os.write(1, view):]
out(0, 10_000)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
out(10_000, 20_000)
"""
STREAM = b"".join(b"%07d " % n + b"a" * 91 + b"\n" for n in range(LINES))
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


def pipe_full(proc: subprocess.Popen[bytes]) -> bool:
    """Its stdout pipe, which nobody reads, is full: it waits in a write."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    held = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, held)
    return int.from_bytes(held, sys.byteorder) >= fcntl.fcntl(fd, F_GETPIPE_SZ)


def markers(err: str) -> list[int]:
    return [
        int(line.split("[", 1)[1].split(" ")[0].replace(",", ""))
        for line in err.splitlines()
        if "not kept here (--log-max)" in line
    ]


def test_a_slow_reader_of_a_capped_log_is_never_shown_bytes_dropped_meanwhile(
    ferry: Ferry, tmp_path: Path
) -> None:
    """Two followers (plain, --json) of a --log-max task block on a full pipe while
    writing its head; the task then writes on, and the supervisor drops the tail they
    had found. Before: each printed that region as 131,072 NUL bytes, and its markers
    said that many bytes fewer were dropped. Now every byte shown is the task's, at its
    offset, and what was dropped meanwhile is said dropped."""
    gate = tmp_path / "gate"
    runner = ferry.start("run", "--log-max", "256K", "--", sys.executable, "-c", WRITER,
                         str(gate), stdout=subprocess.DEVNULL)  # fmt: skip
    task_id = wait_until(ferry.tasks, what="the task")[0]["id"]
    log = ferry.home / "logs" / task_id / "1.stdout"
    wait_until(lambda: log.exists() and log.stat().st_size == LINES * 50, what="1 MB logged")
    plain = ferry.start("logs", "-f", "--stream", "stdout", task_id)
    as_json = ferry.start("--json", "logs", "-f", "--stream", "stdout", task_id)
    for follower in (plain, as_json):  # (each has found the head and the tail kept now)
        wait_until(lambda f=follower: pipe_full(f), what="the follower to block writing")
    gate.touch()
    assert runner.wait(timeout=60) == 0
    dropped = ferry.task(task_id)["evidence"]["log_dropped_bytes"]["stdout"]
    assert dropped > LINES * 50

    out, err = plain.communicate(timeout=60)
    assert plain.returncode == 0, err
    assert b"\0" not in out
    assert sum(markers(err.decode())) == dropped
    assert len(out) == len(STREAM) - dropped
    head = next(i for i, (a, b) in enumerate(zip(out, STREAM, strict=False)) if a != b)
    assert head >= 128 << 10 and out[head:] == STREAM[len(STREAM) - len(out) + head :]

    out, err = as_json.communicate(timeout=60)
    assert as_json.returncode == 0, err
    at, said_dropped = 0, 0
    for line in out.splitlines():  # the chunks and the drops tile the stream, in order
        chunk = json.loads(line)
        assert chunk["offset"] == at, (chunk.get("dropped"), at)
        if "dropped" in chunk:
            at += chunk["dropped"]
            said_dropped += chunk["dropped"]
            continue
        data = chunk["text"].encode()
        assert data == STREAM[at : at + len(data)], f"bytes the task never wrote at {at}"
        at += len(data)
    assert (at, said_dropped) == (len(STREAM), dropped)
