"""``--log-max`` at the file level (``ferry.proc._logcap``), on real files: the log keeps
exactly the stream's head and tail at the stream's own offsets, the middle a hole (no
disk), at every moment (a crash between two writes), and ``ferry logs``' reader skips
the hole."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from ferry.app.logs import data_segments, still_data
from ferry.proc import _logcap
from ferry.proc._logcap import LogCap

CAP = 64 << 10
FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


def kept(path: Path) -> list[tuple[int, bytes]]:
    """(offset, bytes) of each part of the file that holds data."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return [(low, os.pread(fd, high - low, low)) for low, high in data_segments(fd, 0, size)]
    finally:
        os.close(fd)


def disk_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def check(path: Path, whole: bytes | bytearray, cap: LogCap, base: int = 0) -> None:
    """The file is ``whole`` (the stream, after what an earlier run logged) up to
    ``keep_to`` and from ``hole_end`` on, at their offsets; nothing else holds data."""
    parts = kept(path)
    if cap.hole_end <= cap.keep_to:
        assert parts == ([(0, bytes(whole))] if whole else [])
        return
    assert parts == [(0, whole[: cap.keep_to]), (cap.hole_end, whole[cap.hole_end :])]
    assert cap.dropped == cap.hole_end - cap.keep_to
    assert cap.keep_to - base >= CAP // 2
    assert len(whole) - cap.hole_end >= CAP // 2


@pytest.mark.parametrize("seed", range(6))
def test_the_log_keeps_the_head_and_the_tail_at_every_moment(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "1.stdout"
    fd = os.open(path, FLAGS, 0o600)
    cap = LogCap(fd, CAP)
    stream = bytearray()
    top = rng.choice([100, 5000, 70_000, 1 << 20])
    for _ in range(200 if top < 1 << 20 else 40):
        chunk = rng.randbytes(rng.randint(1, top))
        cap.write(chunk)
        stream += chunk
        check(path, stream, cap)  # (as a kill -9 right now would leave it)
        # On disk: the head and the tail, a step of tail not cut yet, the chunk.
        assert disk_bytes(path) <= CAP + cap.step + len(chunk) + 4 * cap.block
    cap.finish()
    check(path, stream, cap)
    assert len(stream) - cap.hole_end < CAP // 2 + cap.block
    assert disk_bytes(path) <= CAP + 2 * cap.block
    os.close(fd)


def test_a_run_appending_to_an_earlier_runs_log_caps_its_own_part(tmp_path: Path) -> None:
    path = tmp_path / "1.stdout"
    earlier = os.urandom(10_000)
    path.write_bytes(earlier)
    fd = os.open(path, FLAGS)
    cap = LogCap(fd, CAP)
    stream = os.urandom(3 << 20)
    for start in range(0, len(stream), 65536):
        cap.write(stream[start : start + 65536])
    cap.finish()
    os.close(fd)
    check(path, earlier + stream, cap, base=len(earlier))


def test_the_order_index_sees_stream_offsets(tmp_path: Path) -> None:
    """The file position after each write is the stream's end (the order index reads it
    with lseek, ferry.proc.logorder)."""
    fd = os.open(tmp_path / "1.stdout", FLAGS)
    cap = LogCap(fd, CAP)
    total = 0
    for size in (1000, 200_000, 3, 70_000, 1 << 20, 17):
        cap.write(b"x" * size)
        total += size
        assert os.lseek(fd, 0, os.SEEK_CUR) == total == cap.pos
    os.close(fd)


def test_without_hole_punching_only_the_head_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(_logcap, "_load_punch", lambda: refuse)
    path = tmp_path / "1.stdout"
    fd = os.open(path, FLAGS)
    cap = LogCap(fd, CAP)
    assert cap.error is not None and "only the log's head is kept" in cap.error
    stream = os.urandom(1 << 20)
    for start in range(0, len(stream), 10_000):
        cap.write(stream[start : start + 10_000])
    cap.finish()
    os.close(fd)
    assert path.read_bytes() == stream[: cap.keep_to]
    assert cap.dropped == len(stream) - cap.keep_to


def test_the_reader_finds_no_hole_in_an_ordinary_log(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_bytes(b"a" * 100_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert data_segments(fd, 0, 100_000) == [(0, 100_000)]
        assert data_segments(fd, 5, 7) == [(5, 7)]
        assert data_segments(fd, 100_000, 100_000) == []
    finally:
        os.close(fd)


def test_what_was_punched_while_it_was_read_is_not_taken_for_data(tmp_path: Path) -> None:
    """A reader's chunk read as the supervisor punched it: the punched part reads as
    zeros the task never wrote. ``still_data`` keeps only what the file holds as data
    once read (found by a review: ``logs -f`` of a capped log showed NUL bytes)."""
    path = tmp_path / "1.stdout"
    fd = os.open(path, FLAGS, 0o600)
    block = LogCap(fd, CAP).block
    stream = bytes(range(1, 256)) * (8 * block // 255 + 1)
    os.write(fd, stream[: 8 * block])
    reader = os.open(path, os.O_RDONLY)
    try:
        before = os.pread(reader, 8 * block, 0)
        assert still_data(reader, 0, before) == [(0, stream[: 8 * block])]
        punch = _logcap._load_punch()
        assert punch is not None
        punch(fd, 2 * block, 3 * block)  # (as if between the read and the look)
        assert still_data(reader, 0, before) == [
            (0, stream[: 2 * block]), (5 * block, stream[5 * block : 8 * block])
        ]  # fmt: skip
        after = os.pread(reader, 6 * block, block)
        assert after[block : 4 * block] == bytes(3 * block)  # (what the reader would show)
        assert still_data(reader, block, after) == [
            (block, stream[block : 2 * block]), (5 * block, stream[5 * block : 7 * block])
        ]  # fmt: skip
    finally:
        os.close(reader)
        os.close(fd)
