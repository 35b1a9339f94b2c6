"""``ferry logs`` racing what changes its files under it: the supervisor dropping the
middle of a ``--log-max`` log while a reader is slow, and ``ferry gc`` forgetting the
task (and removing its logs) while they are read. Found by a review: a slow reader of
``logs -f`` was shown NUL bytes the task never wrote; a follower whose task gc forgot
printed nothing more, said nothing and exited 1 for a task that SUCCEEDED.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from clikit import Ferry, wait_stopped, wait_until

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


def go_on(proc: subprocess.Popen[bytes]) -> tuple[int, bytes, str]:
    """Continue the stopped ``proc``: its exit status, stdout and stderr."""
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err.decode()


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


# argv: "o:TEXT" to stdout, "e:TEXT" to stderr (each with "\n"), "gate:PATH" waits for
# PATH, "exit:N" exits N.
SCRIPT = r"""
import os, sys, time
for word in sys.argv[1:]:
    kind, _, arg = word.partition(":")
    if kind == "gate":
        while not os.path.exists(arg):
            time.sleep(0.01)
    elif kind == "exit":
        sys.exit(int(arg))
    else:
        os.write(1 if kind == "o" else 2, arg.encode() + b"\n")
"""


def test_logs_follow_of_a_task_gc_forgets_shows_what_it_holds_and_says_so(
    ferry: Ferry, tmp_path: Path
) -> None:
    """``logs -f`` paused while its task runs; the task writes more (stdout, then its
    first stderr), SUCCEEDS and is forgotten by gc, which removes its logs; the follower
    goes on. Before: nothing more printed, nothing said, exit 1. Now: the rest of the
    log it held open, a warning that the task was forgotten before its end was seen
    (its stderr, never opened, removed unread), and exit 1: the outcome is not known."""
    gate = tmp_path / "gate"
    words = ("o:first", f"gate:{gate}", "o:second", "e:last-err")
    runner = ferry.start("run", "--", sys.executable, "-c", SCRIPT, *words,
                         stdout=subprocess.DEVNULL)  # fmt: skip
    task_id = wait_until(ferry.tasks, what="the task")[0]["id"]
    follower = ferry.start("logs", "-f", task_id)
    assert follower.stdout is not None
    assert os.read(follower.stdout.fileno(), 100) == b"first\n"  # following now
    os.kill(follower.pid, signal.SIGSTOP)
    wait_stopped(follower, what="the follower")
    gate.touch()
    assert runner.wait(timeout=60) == 0
    assert [t["id"] for t in ferry.json("gc", "--older-than", "0s")["forgotten"]] == [task_id]
    assert not (ferry.home / "logs" / task_id).exists()
    code, out, err = go_on(follower)
    assert (code, out) == (1, b"second\n"), err
    assert err == (
        f"ferry: warning: task {task_id} was forgotten (ferry gc) before its end was seen: its"
        " outcome is not known; its stderr, if it wrote any, was removed unread\n"
    )


@pytest.mark.parametrize(("follow", "status", "code"), [(False, 0, 0), (True, 0, 0), (True, 3, 1)])
def test_logs_of_a_settled_task_gc_forgets_while_it_reads_says_so(
    ferry: Ferry, follow: bool, status: int, code: int
) -> None:
    """``logs`` stopped once it has read the table (the task settled), gc forgets the
    task and removes its logs, ``logs`` goes on. Before: no output, exit 0 and "log
    file(s) missing". Now: a warning that the task was forgotten and its logs removed
    unread; ``-f`` exits by the end it saw (0: SUCCEEDED, 1: FAILED)."""
    ran = ferry("run", "--", sys.executable, "-c", SCRIPT, "o:out", "e:err", f"exit:{status}")
    assert ran.code == status
    task_id = ferry.only_task()["id"]
    reader = ferry.start_stopped("logs", *(["-f"] if follow else []), task_id, at="after:replay")
    assert [t["id"] for t in ferry.json("gc", "--older-than", "0s")["forgotten"]] == [task_id]
    got, out, err = go_on(reader)
    assert (got, out) == (code, b""), err
    state = "FAILED" if status else "SUCCEEDED"
    assert err == (
        f"ferry: warning: task {task_id} ({state}) was forgotten (ferry gc) as its logs were"
        " read; its stdout and stderr were removed unread\n"
    )
