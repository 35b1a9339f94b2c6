"""``ferry logs``: the captured output, complete and byte-exact, optionally followed.

Without ``--stream`` the task's stdout goes to ferry's stdout and its stderr to ferry's
stderr; with it, that one stream goes to stdout. ``--tail N`` keeps the last N lines of
each stream. ``-f`` keeps copying new bytes until the task settles, then copies what is
left. With ``--json`` each chunk is one JSON line ``{"stream", "offset", "text"}``
(text decoded as UTF-8 with backslash escapes: use the plain mode for exact bytes).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import orjson

FOLLOW_POLL_S = 0.1
_CHUNK_BYTES = 1 << 20


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


class _Copier:
    def __init__(self, path: Path, name: str, out: BinaryIO, offset: int, as_json: bool) -> None:
        self.path, self.name, self.out = path, name, out
        self.offset, self.as_json = offset, as_json

    def pump(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        copied = 0
        try:
            while True:
                chunk = os.pread(fd, _CHUNK_BYTES, self.offset)
                if not chunk:
                    break
                self._write(chunk)
                self.offset += len(chunk)
                copied += len(chunk)
        finally:
            os.close(fd)
        if copied:
            self.out.flush()
        return copied

    def _write(self, chunk: bytes) -> None:
        if self.as_json:
            text = chunk.decode("utf-8", "backslashreplace")
            line = {"stream": self.name, "offset": self.offset, "text": text}
            sys.stdout.buffer.write(orjson.dumps(line) + b"\n")
        else:
            self.out.write(chunk)


def print_logs(
    paths: tuple[Path, Path],
    *,
    stream: str | None,
    tail: int | None,
    follow: bool,
    settled: Callable[[], bool],
    as_json: bool,
) -> None:
    stdout_path, stderr_path = paths
    targets = []
    if stream in (None, "stdout"):
        targets.append((stdout_path, "stdout", sys.stdout.buffer))
    if stream in (None, "stderr"):
        out = sys.stdout.buffer if stream == "stderr" or as_json else sys.stderr.buffer
        targets.append((stderr_path, "stderr", out))
    copiers = [
        _Copier(path, name, out, 0 if tail is None else _tail_offset(path, tail), as_json)
        for path, name, out in targets
    ]
    for copier in copiers:
        copier.pump()
    while follow:
        done = settled()  # read before the last pump: nothing written after is missed
        moved = sum(copier.pump() for copier in copiers)
        if done:
            break
        if not moved:
            time.sleep(FOLLOW_POLL_S)
