"""``ferry logs``: the captured output, complete and byte-exact, in the order it was
written, optionally followed.

Without ``--stream`` both streams are replayed in the order the task wrote them (as
the supervisor's order index says: :mod:`ferry.proc.logorder`), the task's stdout to
ferry's stdout and its stderr to ferry's stderr (``merged``: both to stdout); with it,
that one stream goes to stdout. ``--tail N`` keeps the last N lines of each stream.
``-f`` keeps copying new bytes until the task settles, then copies what is left. With
``--json`` each chunk is one JSON line ``{"task", "attempt", "stream", "offset", "text"}``, in write
order: ``text`` is the chunk's bytes as UTF-8 (a character split between two chunks is
shown whole, with the second); bytes that are not UTF-8 are backslash escapes there,
and the line then also has ``b64``, the chunk's exact bytes.

A log kept with ``--log-max`` has a hole where the middle of its stream was dropped
(:mod:`ferry.proc._logcap`): its offsets stay the stream's, and the hole is skipped
(``SEEK_DATA``/``SEEK_HOLE``), never shown as zeros. Where it was, a marker says how many
bytes were dropped: a ``ferry:`` line on stderr (``--json``: a line ``{"task", "stream",
"offset", "dropped"}`` in the output's order). The hole grows while the task runs,
under a reader too: what is read is shown only once the file is seen to hold it as
data still (a region punched meanwhile reads as zeros), and is otherwise said dropped.

Each log (and the index) is opened the first time it is found, and read through that
descriptor from then on, its size taken with ``fstat``: ``ferry gc`` may forget the
task and remove its logs under a reader, which still shows all of a log it holds. A
log removed before it was found is lost: :func:`print_logs` names it, and the use case
says so (:meth:`ferry.app.service.Service.logs`).

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

import errno
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO

from ferry.proc.logorder import ENTRY_BYTES, STDERR, STDOUT, order_path, unpack
from journal import _json

FOLLOW_POLL_S = 0.1
_CHUNK_BYTES = 1 << 20
_NAMES = ("stdout", "stderr")


def data_segments(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) of the file open on ``fd`` that hold data, in order: all
    of it unless the file has a hole there (``--log-max``). A file system that cannot
    say (no ``SEEK_DATA``) is taken to hold data everywhere."""
    found: list[tuple[int, int]] = []
    pos = start
    while pos < end and (part := _next_data(fd, pos, end)) is not None:
        found.append(part)
        pos = part[1]
    return found


def _next_data(fd: int, pos: int, end: int) -> tuple[int, int] | None:
    """The first part of [pos, end) that holds data (not empty), or None."""
    while True:
        try:
            low = os.lseek(fd, pos, os.SEEK_DATA)
            high = os.lseek(fd, low, os.SEEK_HOLE)
        except OSError as error:
            if error.errno == errno.ENXIO:  # no data past pos (a hole to the end)
                return None
            return (pos, end)  # (cannot tell: all data)
        if low >= end:
            return None
        if high > low:
            return (low, min(high, end))
        pos = low  # (punched between the two looks: look again)


def still_data(fd: int, offset: int, chunk: bytes) -> list[tuple[int, bytes]]:
    """The parts of ``chunk``, just read at ``offset`` of the file open on ``fd``, that
    the file still holds as data, with their offsets. The supervisor of a ``--log-max``
    task punches holes under its readers at any moment, and a region punched before or
    while it was read reads as zeros the task never wrote; a punch only ever turns data
    into a hole, never back, so what is data after the read was data all through it:
    read as written."""
    end = offset + len(chunk)
    return [
        (low, chunk[low - offset : high - offset]) for low, high in data_segments(fd, offset, end)
    ]


def read_tails(paths: tuple[str, str], bytes_max: int) -> dict[str, tuple[bytes, int]]:
    """Per stream whose log exists: its last ``bytes_max`` bytes, of its last stretch of
    data only (a hole dropped by ``--log-max`` ends it: what is kept lies just before
    the log's end, so its offset is the log's size less its length), and the log's
    size."""
    found: dict[str, tuple[bytes, int]] = {}
    for name, path in zip(_NAMES, paths, strict=True):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            kept = b""
            if stretches := data_segments(fd, 0, size):
                low, high = stretches[-1]
                start = max(low, high - bytes_max)
                kept = b"".join(
                    data for _, data in still_data(fd, start, os.pread(fd, high - start, start))
                )
            found[name] = (kept, size)
        finally:
            os.close(fd)
    return found


def _tail_offset(path: str, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of ``path`` start (a hole dropped by
    ``--log-max`` holds no line)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if lines == 0:
            return size
        segments = data_segments(fd, 0, size)
        # A final line without "\\n" counts as a line; a trailing "\\n" ends the last one.
        ends_line = bool(segments) and os.pread(fd, 1, segments[-1][1] - 1) == b"\n"
        wanted = lines + 1 if ends_line else lines
        found = 0
        for low, high in reversed(segments):
            pos = high
            while pos > low:
                step = min(65536, pos - low)
                pos -= step
                block = os.pread(fd, step, pos)
                for index in range(len(block) - 1, -1, -1):
                    if block[index] == 0x0A:
                        found += 1
                        if found == wanted:
                            return pos + index + 1
        return 0
    finally:
        os.close(fd)


class _Replay:
    """Both logs (or one), replayed in write order from their start offsets."""

    def __init__(
        self,
        paths: tuple[str, str],
        outs: tuple[BinaryIO | None, BinaryIO | None],
        starts: tuple[int, int],
        as_json: bool,
        task_id: str = "",
        attempt: int | None = None,
        kept: str = "--log-max",
        bases: tuple[int, int] = (0, 0),
    ) -> None:
        self.paths, self.outs, self.as_json = paths, outs, as_json
        self.task_id, self.attempt = task_id, attempt
        self.kept = kept  # why bytes are not here, said where they were
        # Per stream: its offset in the stream of the log's first byte (a tail kept
        # elsewhere; what is before it is a "dropped" line, under --json).
        self.bases = bases
        self.heads_said = False
        self.pos = list(starts)  # per stream: what was shown (or skipped) ends here
        self.index = order_path(paths[0])
        self.index_fd: int | None = None  # the index, open once there
        self.index_read = 0  # bytes of the index taken in (whole entries)
        self.entries: deque[tuple[int, int]] = deque()  # read, not yet replayed
        # The logs, open from the first look that finds them (the index too): a log
        # removed later (``ferry gc`` forgot the task) is still read to its end.
        self.fds: list[int | None] = [None, None]
        self.last_out: BinaryIO | None = None  # flushed before the other one is written
        self.copied = 0
        # --json, per stream: the bytes of a character a chunk ended inside (the rest is
        # in the next one), and their offset: shown with that rest.
        self.held = [b"", b""]
        self.held_at = [0, 0]

    def pump(self, *, final: bool) -> int:
        """Replay what the logs hold now; the number of bytes copied. ``final``: the
        logs will not grow (the task settled): show everything, in order as far as the
        index knows it."""
        self.copied = 0
        sizes = [self._size(stream) for stream in (STDOUT, STDERR)]  # before the index
        if not self.heads_said and self.as_json:  # (text: the caller says it, once)
            self.heads_said = True
            for stream, out in enumerate(self.outs):
                if out is not None and self.bases[stream] and self.pos[stream] == 0:
                    self._dropped(stream, out, -self.bases[stream], self.bases[stream])
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
        if final:  # (a character cut short at the end: shown as it is)
            for stream in (STDOUT, STDERR):
                self._let_go_held(stream)
        if self.copied and self.last_out is not None:
            self.last_out.flush()
        return self.copied

    def _size(self, stream: int) -> int:
        """The size of the stream's log (0: none yet, or not asked for), opened if it is
        there now."""
        if self.outs[stream] is None:
            return 0
        fd = self.fds[stream]
        if fd is None:
            try:
                fd = self.fds[stream] = os.open(self.paths[stream], os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return 0
        return os.fstat(fd).st_size

    def _read_index(self) -> None:
        if self.outs[STDOUT] is None or self.outs[STDERR] is None:
            return  # one stream: no order to keep
        fd = self.index_fd
        if fd is None:
            try:
                flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
                fd = self.index_fd = os.open(self.index, flags)
            except OSError:
                # Missing: no switch between the streams yet, or logs from before the
                # index. Unreadable, or a symlink planted there: ignored like a damaged
                # index.
                return
        data = b""
        while chunk := os.pread(fd, _CHUNK_BYTES, self.index_read + len(data)):
            data += chunk
        whole = len(data) - len(data) % ENTRY_BYTES  # (a torn or unfinished entry waits)
        self.entries.extend(unpack(data[:whole]))
        self.index_read += whole

    def _copy(self, stream: int, end: int) -> None:
        """Show the stream's bytes up to ``end`` (what was not shown yet): each chunk of
        data as it is once read (:func:`still_data`: the supervisor may punch a hole
        under this reader, above all while it waits for a slow reader of its own), and
        where a hole is, how many bytes it dropped."""
        start = self.pos[stream]
        if end <= start:
            return
        out = self.outs[stream]
        if out is None:  # (a stream not asked for)
            self.pos[stream] = end
            return
        fd = self.fds[stream]
        if fd is None:  # (no log: its size was 0)
            return
        pos = start  # shown or said dropped up to here
        while start < end and (found := _next_data(fd, start, end)) is not None:
            low, high = found
            chunk = os.pread(fd, min(_CHUNK_BYTES, high - low), low)
            if not chunk:
                break  # (the log shrank: someone cut it; nothing more to say)
            for offset, data in still_data(fd, low, chunk):
                if offset > pos:
                    self._dropped(stream, out, pos, offset - pos)
                self._write(stream, out, offset, data)
                self.copied += len(data)
                pos = offset + len(data)
            start = low + len(chunk)
        else:
            if pos < end:  # dropped up to this entry's end (a hole, not yet data)
                self._dropped(stream, out, pos, end - pos)
                pos = end
        self.pos[stream] = pos

    def _dropped(self, stream: int, out: BinaryIO, offset: int, count: int) -> None:
        """Bytes the log did not keep (``--log-max``; those only the task's host keeps), at
        ``offset`` of the log: say so, in place."""
        if self.as_json:
            self._let_go_held(stream)
            line: dict[str, Any] = {"task": self.task_id, "stream": _NAMES[stream]}
            if self.attempt is not None:
                line["attempt"] = self.attempt
            line.update(offset=self.bases[stream] + offset, dropped=count)
            out.write(_json.dumps(line) + b"\n")
            self.last_out = out
            return
        if self.last_out is not None:
            self.last_out.flush()
        sys.stdout.flush()
        note = f"ferry: [{count:,} bytes of {_NAMES[stream]} not kept here ({self.kept})]\n"
        sys.stderr.buffer.write(note.encode())
        sys.stderr.buffer.flush()

    def unread(self) -> list[str]:
        """The streams asked for whose log was never found here (not there yet, or
        removed before it was opened)."""
        return [
            _NAMES[stream]
            for stream in (STDOUT, STDERR)
            if self.outs[stream] is not None and self.fds[stream] is None
        ]

    def _let_go_held(self, stream: int) -> None:
        """Show what was held of a character, as it is (what followed it is not its rest)."""
        held, out = self.held[stream], self.outs[stream]
        if held and out is not None:
            self.held[stream] = b""
            self._json_chunk(stream, out, self.held_at[stream], held)

    def _json_chunk(self, stream: int, out: BinaryIO, offset: int, chunk: bytes) -> None:
        """One chunk, one JSON line: ``text`` (UTF-8; bytes that are not, as backslash
        escapes) and then also ``b64``, the chunk's exact bytes."""
        line: dict[str, Any] = {
            "task": self.task_id, "stream": _NAMES[stream], "offset": self.bases[stream] + offset,
        }  # fmt: skip
        if self.attempt is not None:
            line["attempt"] = self.attempt
        try:
            line["text"] = chunk.decode("utf-8")
        except UnicodeDecodeError:
            import base64  # (lazy: most logs are text)

            line["text"] = chunk.decode("utf-8", "backslashreplace")
            line["b64"] = base64.b64encode(chunk).decode("ascii")
        out.write(_json.dumps(line) + b"\n")
        self.last_out = out

    def close(self) -> None:
        for fd in (*self.fds, self.index_fd):
            if fd is not None:
                os.close(fd)
        self.fds, self.index_fd = [None, None], None

    def _write(self, stream: int, out: BinaryIO, offset: int, chunk: bytes) -> None:
        if self.as_json:
            held = self.held[stream]
            if held and self.held_at[stream] + len(held) == offset:
                chunk, offset = held + chunk, self.held_at[stream]
            else:
                self._let_go_held(stream)
            whole = _whole_characters(chunk)
            self.held[stream], self.held_at[stream] = chunk[whole:], offset + whole
            if whole:
                self._json_chunk(stream, out, offset, chunk[:whole])
        else:
            if self.last_out is not None and self.last_out is not out:
                self.last_out.flush()  # (both may be one terminal: keep them in order)
            out.write(chunk)
        self.last_out = out


def _whole_characters(data: bytes) -> int:
    """How much of ``data`` ends on a UTF-8 character's boundary: all of it but the
    first bytes of a character it ends inside (up to 3)."""
    for back in range(1, min(3, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a character's first byte (or ASCII), not a continuation
            size = (
                2
                if byte & 0xE0 == 0xC0
                else 3
                if byte & 0xF0 == 0xE0
                else 4
                if byte & 0xF8 == 0xF0
                else 1
            )
            return len(data) - back if size > back else len(data)
    return len(data)


def print_logs(
    paths: tuple[str, str],
    *,
    stream: str | None,
    tail: int | None,
    follow: bool,
    settled: Callable[[], bool],
    as_json: bool,
    merged: bool = False,
    task_id: str = "",
    attempt: int | None = None,
    kept: str = "--log-max",
    bases: tuple[int, int] = (0, 0),
) -> list[str]:
    """Copy the task's logs (``paths``: stdout's, stderr's) to ferry's stdout/stderr;
    ``task_id`` and ``attempt`` name them in JSON lines; a hole in a log is said dropped,
    ``kept`` saying why (in text); ``bases``: each log's first byte's offset in its
    stream (a tail kept elsewhere: what is before it is a ``dropped`` line under
    ``--json``). The streams asked for whose log it never found (not
    there, or removed before it looked: ``ferry gc``)."""
    stdout = sys.stdout.buffer
    to_stdout = stream is not None or as_json or merged
    outs: tuple[BinaryIO | None, BinaryIO | None] = (
        stdout if stream in (None, "stdout") else None,
        (stdout if to_stdout else sys.stderr.buffer) if stream in (None, "stderr") else None,
    )
    starts = (
        (0, 0) if tail is None else (_tail_offset(paths[0], tail), _tail_offset(paths[1], tail))
    )
    replay = _Replay(paths, outs, starts, as_json, task_id, attempt, kept, bases)
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
        return replay.unread()
    finally:
        replay.close()
