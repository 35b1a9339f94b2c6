"""The zero-copy passthrough (tee + splice, ferry.proc._splice) with real processes and pipes:
large output reaches a piped stdout and the log byte-exact, after earlier bytes of the
log; the fast path is really taken; a log that refuses splice, or fails, is handled.

The supervisor runs in this process with its passthrough pointed at a pipe that another
process drains (``stdout_echo_fd``), so the spy below can count the fast path's use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ferry.proc import _splice
from ferry.proc.supervise import SuperviseSpec, supervise

PY = sys.executable
pytestmark = pytest.mark.skipif(not _splice.available(), reason="needs Linux splice")


# The reader of ferry's passthrough: another process (not a thread of this one, which
# runs the supervisor and would share its GIL), copying into a file as it reads, so
# that a task can see how far the reader has got.
COPY = "import os\nwhile chunk := os.read(0, 1 << 16):\n    os.write(1, chunk)"


def _run_piped(tmp_path: Path, script: str, *args: str) -> tuple[bytes, bytes]:
    """Run ``script`` under supervise with stdout passed through to a pipe whose reader
    copies it into ``received``; return (what came through the pipe, the stdout log)."""
    received = tmp_path / "received"
    read_fd, write_fd = os.pipe()
    with received.open("wb") as sink:
        reader = subprocess.Popen([PY, "-c", COPY], stdin=read_fd, stdout=sink)
    os.close(read_fd)
    try:
        spec = SuperviseSpec(
            argv=[PY, "-c", script, *args],
            cwd=str(tmp_path),
            env=dict(os.environ),
            timeout_s=None,
            kill_grace_s=5.0,
            heartbeat_s=1.0,
            stdout_log=tmp_path / "task.out",
            stderr_log=tmp_path / "task.err",
            heartbeat_path=tmp_path / "task.hb",
            passthrough=True,
            stdout_echo_fd=write_fd,
            stdin=os.open(os.devnull, os.O_RDONLY),
        )
        outcome = supervise(spec, on_spawned=lambda pid, pgid: None)
    finally:
        os.close(write_fd)
        try:
            reader.wait(timeout=60)
        finally:
            reader.kill()
            reader.wait()
    assert outcome.exit_code == 0 and outcome.log_error is None
    return received.read_bytes(), (tmp_path / "task.out").read_bytes()


WRITE_FILE = "import sys\nsys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"


@pytest.fixture
def spliced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Byte counts the fast path moved (a spy around the real function)."""
    moved: list[int] = []
    real = _splice.move_to_log

    def spy(src: int, log_fd: int, n_bytes: int) -> Any:
        moved.append(n_bytes)
        return real(src, log_fd, n_bytes)

    monkeypatch.setattr(_splice, "move_to_log", spy)
    return moved


def test_sixteen_megabytes_byte_exact_on_a_piped_stdout(tmp_path: Path) -> None:
    # However the chunks go (the fast path while the reader keeps up, the classic one
    # when it lags: scheduling decides), every byte arrives, in order, on both sides.
    payload = os.urandom(16 << 20)
    (tmp_path / "payload").write_bytes(payload)
    passed, log = _run_piped(tmp_path, WRITE_FILE, str(tmp_path / "payload"))
    assert passed == payload
    assert log == payload


# Writes its payload past the fast path's threshold, then chunk by chunk, each once the
# reader (see COPY) has received every byte so far: so each chunk finds ferry's pipe
# empty and nothing in its backlog, the fast path's conditions, whatever the machine's
# load. (Bounded: a reader that stops gets the rest at once, and the test fails.)
PACED_WRITE = """\
import os, sys, time
payload = open(sys.argv[1], "rb").read()
received, first, chunk = sys.argv[2], int(sys.argv[3]), 256 << 10
out = sys.stdout.buffer
out.write(payload[:first]); out.flush()
sent = first
while sent < len(payload):
    deadline = time.monotonic() + 30
    while os.path.getsize(received) < sent and time.monotonic() < deadline:
        time.sleep(0.002)
    out.write(payload[sent:sent + chunk]); out.flush()
    sent += chunk
"""


def test_the_fast_path_carries_the_chunks_that_find_the_reader_caught_up(
    tmp_path: Path, spliced: list[int]
) -> None:
    payload = os.urandom(4 << 20)
    (tmp_path / "payload").write_bytes(payload)
    first = str(_splice.TEE_AFTER_BYTES + (64 << 10))
    received = str(tmp_path / "received")
    passed, log = _run_piped(tmp_path, PACED_WRITE, str(tmp_path / "payload"), received, first)
    assert passed == payload
    assert log == payload
    assert sum(spliced) > 0


def test_the_fast_path_appends_after_an_earlier_attempts_bytes(
    tmp_path: Path, spliced: list[int]
) -> None:
    earlier = b"attempt 1 said this\n"
    payload = os.urandom(4 << 20)
    (tmp_path / "payload").write_bytes(payload)
    (tmp_path / "task.out").write_bytes(earlier)
    first = str(_splice.TEE_AFTER_BYTES + (64 << 10))
    received = str(tmp_path / "received")
    passed, log = _run_piped(tmp_path, PACED_WRITE, str(tmp_path / "payload"), received, first)
    assert passed == payload
    assert log == earlier + payload
    assert sum(spliced) > 0


def test_small_output_never_loads_the_fast_path(tmp_path: Path, spliced: list[int]) -> None:
    passed, log = _run_piped(tmp_path, "print('hello')")
    assert passed == log == b"hello\n"
    assert spliced == []


def test_a_log_that_refuses_splice_gets_the_bytes_the_classic_way(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    log_fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(write_fd, b"abcdef")
        # O_APPEND still set: splice answers EINVAL.
        error, spliced = _splice.move_to_log(read_fd, log_fd, 4)
        assert (error, spliced) == (None, False)
        assert os.read(read_fd, 10) == b"ef"  # the pipe stayed in step
    finally:
        for fd in (read_fd, write_fd, log_fd):
            os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"abcd"


def test_a_failing_log_reports_the_error_and_keeps_the_pipe_in_step() -> None:
    read_fd, write_fd = os.pipe()
    full_fd = os.open("/dev/full", os.O_WRONLY)
    try:
        os.write(write_fd, b"0123456789")
        error, _ = _splice.move_to_log(read_fd, full_fd, 6)
        assert error is not None
        os.close(write_fd)
        write_fd = -1
        assert os.read(read_fd, 10) == b"6789"
    finally:
        for fd in (read_fd, write_fd, full_fd):
            if fd >= 0:
                os.close(fd)


def test_a_big_log_gets_a_writeback_head_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No passthrough at all (the classic path): the head start does not need tee.
    started: list[int] = []
    real = _splice.start_writeback
    monkeypatch.setattr(_splice, "start_writeback", lambda fd: (started.append(fd), real(fd)))
    payload = os.urandom(_splice.WRITEBACK_EVERY_BYTES + (1 << 20))
    (tmp_path / "payload").write_bytes(payload)
    spec = SuperviseSpec(
        argv=[PY, "-c", WRITE_FILE, str(tmp_path / "payload")],
        cwd=str(tmp_path),
        env=dict(os.environ),
        timeout_s=None,
        kill_grace_s=5.0,
        heartbeat_s=1.0,
        stdout_log=tmp_path / "task.out",
        stderr_log=tmp_path / "task.err",
        heartbeat_path=tmp_path / "task.hb",
        passthrough=False,
    )
    outcome = supervise(spec, on_spawned=lambda pid, pgid: None)
    assert outcome.exit_code == 0 and outcome.log_error is None
    assert (tmp_path / "task.out").read_bytes() == payload
    assert len(started) == 1
