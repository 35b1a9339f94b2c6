"""``ferry logs``: the captured output, complete and byte-exact, in the order it was
written, optionally followed.

Without ``--stream`` both streams are replayed in the order the task wrote them (as
the supervisor's order index says: :mod:`ferry.proc.logorder`), the task's stdout to
ferry's stdout and its stderr to ferry's stderr (``merged``: both to stdout); with it,
that one stream goes to stdout. ``--tail N`` keeps the last N lines of each stream.
``-f`` keeps copying new bytes until the task settles, then copies what is left. With
``--json`` each chunk is one JSON line ``{"task", "stream", "offset", "text"}``, in write
order (text decoded as UTF-8 with backslash escapes: use the plain mode for exact
bytes).

How the index is read, and why nothing is ever lost: the logs' sizes are taken first,
the index after. An entry says "this stream's bytes up to here come before what
follows"; each is replayed as it is met, once its bytes are in the log (an entry past
a log's size, while the task runs, waits for the next round). What follows the last
entry is one stream's current run (the supervisor writes an entry before it logs the
other stream's next chunk), shown as it comes. When both streams hold bytes past the
index (a log written before the index existed, an index the disk could not take, the
end of a task whose index lost its tail), they are shown one stream after the other,
stdout first: order is lost there, never bytes.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import orjson

from ferry.proc.logorder import ENTRY_BYTES, STDERR, STDOUT, order_path, unpack

FOLLOW_POLL_S = 0.1
_CHUNK_BYTES = 1 << 20
_NAMES = ("stdout", "stderr")


def _tail_offset(path: Path, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of ``path`` start."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if lines == 0:
        return size
    with path.open("rb") as stream:
        # A final line without "\\n" counts as a line; a trailing "\\n" ends the last one.
        wanted = lines + 1 if size and _last_byte(stream, size) == b"\n" else lines
        pos, found = size, 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            stream.seek(pos)
            block = stream.read(step)
            for index in range(len(block) - 1, -1, -1):
                if block[index] == 0x0A:
                    found += 1
                    if found == wanted:
                        return pos + index + 1
    return 0


def _last_byte(stream: BinaryIO, size: int) -> bytes:
    stream.seek(size - 1)
    return stream.read(1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class _Replay:
    """Both logs (or one), replayed in write order from their start offsets."""

    def __init__(
        self,
        paths: tuple[Path, Path],
        outs: tuple[BinaryIO | None, BinaryIO | None],
        starts: tuple[int, int],
        as_json: bool,
        task_id: str = "",
    ) -> None:
        self.paths, self.outs, self.as_json = paths, outs, as_json
        self.task_id = task_id
        self.pos = list(starts)  # per stream: what was shown (or skipped) ends here
        self.index = order_path(paths[0])
        self.index_read = 0  # bytes of the index taken in (whole entries)
        self.entries: deque[tuple[int, int]] = deque()  # read, not yet replayed
        self.fds: list[int | None] = [None, None]  # the logs, open once there
        self.last_out: BinaryIO | None = None  # flushed before the other one is written
        self.copied = 0

    def pump(self, *, final: bool) -> int:
        """Replay what the logs hold now; the number of bytes copied. ``final``: the
        logs will not grow (the task settled): show everything, in order as far as the
        index knows it."""
        self.copied = 0
        sizes = [_size(path) for path in self.paths]  # before the index: see the docstring
        self._read_index()
        while self.entries:
            stream, end = self.entries[0]
            if end > sizes[stream]:
                if not final:
                    break  # its bytes are being logged now: next round
                end = sizes[stream]  # (bytes a power cut took: the log is all there is)
            self.entries.popleft()
            self._copy(stream, end)
        if not self.entries:
            for stream in (STDOUT, STDERR):
                self._copy(stream, sizes[stream])
        if self.copied and self.last_out is not None:
            self.last_out.flush()
        return self.copied

    def _read_index(self) -> None:
        if self.outs[STDOUT] is None or self.outs[STDERR] is None:
            return  # one stream: no order to keep
        try:
            fd = os.open(self.index, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            # Missing: no switch between the streams yet, or logs from before the index.
            # Unreadable, or a symlink planted there: ignored like a damaged index.
            return
        try:
            data = b""
            while chunk := os.pread(fd, _CHUNK_BYTES, self.index_read + len(data)):
                data += chunk
        finally:
            os.close(fd)
        whole = len(data) - len(data) % ENTRY_BYTES  # (a torn or unfinished entry waits)
        self.entries.extend(unpack(data[:whole]))
        self.index_read += whole

    def _copy(self, stream: int, end: int) -> None:
        """Show the stream's bytes up to ``end`` (what was not shown yet)."""
        start = self.pos[stream]
        if end <= start:
            return
        out = self.outs[stream]
        if out is None:  # (a stream not asked for)
            self.pos[stream] = end
            return
        fd = self.fds[stream]
        if fd is None:
            try:
                fd = self.fds[stream] = os.open(self.paths[stream], os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return
        while start < end:
            chunk = os.pread(fd, min(_CHUNK_BYTES, end - start), start)
            if not chunk:
                break  # (the log shrank: someone cut it)
            self._write(stream, out, start, chunk)
            start += len(chunk)
            self.copied += len(chunk)
        self.pos[stream] = start

    def close(self) -> None:
        for fd in self.fds:
            if fd is not None:
                os.close(fd)
        self.fds = [None, None]

    def _write(self, stream: int, out: BinaryIO, offset: int, chunk: bytes) -> None:
        if self.as_json:
            text = chunk.decode("utf-8", "backslashreplace")
            line = {"task": self.task_id, "stream": _NAMES[stream], "offset": offset, "text": text}
            out.write(orjson.dumps(line) + b"\n")
        else:
            if self.last_out is not None and self.last_out is not out:
                self.last_out.flush()  # (both may be one terminal: keep them in order)
            out.write(chunk)
        self.last_out = out


def print_logs(
    paths: tuple[Path, Path],
    *,
    stream: str | None,
    tail: int | None,
    follow: bool,
    settled: Callable[[], bool],
    as_json: bool,
    merged: bool = False,
    task_id: str = "",
) -> None:
    """Copy the task's logs (``paths``: stdout's, stderr's) to ferry's stdout/stderr;
    ``task_id`` names them in JSON lines."""
    stdout = sys.stdout.buffer
    to_stdout = stream is not None or as_json or merged
    outs: tuple[BinaryIO | None, BinaryIO | None] = (
        stdout if stream in (None, "stdout") else None,
        (stdout if to_stdout else sys.stderr.buffer) if stream in (None, "stderr") else None,
    )
    starts = (
        (0, 0) if tail is None else (_tail_offset(paths[0], tail), _tail_offset(paths[1], tail))
    )
    replay = _Replay(paths, outs, starts, as_json, task_id)
    try:
        # (Not following a task that still runs: what its logs hold now, in order.)
        replay.pump(final=not follow and settled())
        while follow:
            done = settled()  # read before the last pump: nothing written after is missed
            moved = replay.pump(final=done)
            if done:
                break
            if not moved:
                time.sleep(FOLLOW_POLL_S)
    finally:
        replay.close()
