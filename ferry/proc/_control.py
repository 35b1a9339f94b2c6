"""The control channel between a launcher (``run``, ``claim``, ``work``) and one task's
supervisor: messages over a pair of pipes, one each way (no I/O policy here).

Why pipes: the end of the peer (its death included: the kernel closes its descriptors)
reads as end-of-file, at once, in either direction, once every copy of the peer's
write end is closed (each side closes the other's ends right after the fork); they
cost nothing to import (a socket pair needs ``socket``, 3-5 ms of every ``ferry
run``'s start-up). Messages are JSON objects (``{"t": <kind>, ...}``), one per line (a
JSON text holds no raw newline); the journal records a supervisor hands its launcher
travel inside them as ``[type, data]`` pairs, and a task goes to its supervisor as its
snapshot record, which may be megabytes (its argv): a pipe holds 64 KiB.

Sends never block: a launcher that is stopped (SIGSTOP) or slow must not pause the
supervisor, which has a task to watch. What the pipe cannot take now waits in an
outbox (the head of it maybe partly written), flushed whenever the channel is next used
or becomes writable (``write_fd``).
"""

from __future__ import annotations

import errno
import os
from collections import deque
from typing import Any

import orjson

READ_BYTES = 64 << 10  # per read (a pipe's capacity)
_END = b"\n"

# One side's ends of a channel: (the descriptor it reads, the descriptor it writes).
Ends = tuple[int, int]


class ChannelClosed(Exception):
    """The peer is gone (its end of the channel closed: exit, crash, kill -9)."""


def channel_pair() -> tuple[Ends, Ends]:
    """(launcher's ends, supervisor's ends): two pipes, every end close-on-exec and
    non-blocking. After the fork each side closes the other's (``close_ends``)."""
    down_read, down_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # launcher -> supervisor
    up_read, up_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # supervisor -> launcher
    return (up_read, down_write), (down_read, up_write)


def close_ends(ends: Ends) -> None:
    for fd in ends:
        os.close(fd)


class Channel:
    """One side of a control channel."""

    def __init__(self, ends: Ends) -> None:
        self.read_fd, self.write_fd = ends
        self.closed = False  # the peer's end is gone
        self._outbox: deque[memoryview] = deque()  # bytes the pipe has not taken yet
        self._partial: list[bytes] = []  # the start of a message not yet whole
        self._inbox: list[dict[str, Any]] = []  # received, handed back unread (unread)

    def fileno(self) -> int:
        """The descriptor to wait on for messages (readable)."""
        return self.read_fd

    @property
    def pending(self) -> bool:
        """Bytes wait in the outbox (wait for ``write_fd`` to become writable)."""
        return bool(self._outbox)

    def send(self, kind: str, **fields: Any) -> None:
        """Queue one message and send what the pipe takes now. Never blocks; a closed
        peer is remembered (``closed``), not raised: the caller learns it on receive."""
        self._outbox.append(memoryview(orjson.dumps({"t": kind, **fields}) + _END))
        self.flush()

    def flush(self) -> None:
        while self._outbox and not self.closed:
            head = self._outbox[0]
            try:
                written = os.write(self.write_fd, head)
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno == errno.EPIPE:  # (SIGPIPE is ignored: Python's default)
                    self.closed = True
                    return
                raise
            if written < len(head):
                self._outbox[0] = head[written:]  # (the pipe took part of it: full now)
                return
            self._outbox.popleft()

    def unread(self, messages: list[dict[str, Any]]) -> None:
        """Hand back messages received but not for the caller: the next receive returns
        them first (a waiter for one kind must not lose the next one behind it)."""
        self._inbox[:0] = messages

    def receive(self) -> list[dict[str, Any]]:
        """Every message that has arrived (maybe none). ChannelClosed once the peer is
        gone and nothing is left to read."""
        messages, self._inbox = self._inbox, []
        while True:
            try:
                raw = os.read(self.read_fd, READ_BYTES)
            except BlockingIOError:
                return messages
            if not raw:
                self.closed = True
                if messages:
                    return messages
                raise ChannelClosed("the other end of the control channel is gone")
            if _END not in raw:
                self._partial.append(raw)  # (a large message: joined once it is whole)
                continue
            lines = raw.split(_END)
            self._partial.append(lines[0])
            lines[0] = b"".join(self._partial)
            self._partial = [lines.pop()]  # (b"": the read ended with a message)
            messages.extend(orjson.loads(line) for line in lines)

    def wait(self, timeout_s: float | None) -> list[dict[str, Any]]:
        """Block up to ``timeout_s`` (None: for ever) for messages, sending what waits in
        the outbox meanwhile (a peer that reads only once it hears from us must hear);
        ChannelClosed as ``receive``. Returns [] on timeout."""
        import select
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._inbox:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            writable = [self.write_fd] if self.pending and not self.closed else []
            ready, out, _ = select.select([self.read_fd], writable, [], left)
            if out:
                self.flush()
            if ready:
                break
            if deadline is not None and time.monotonic() >= deadline:
                return []
        return self.receive()

    def wait_for(self, kinds: tuple[str, ...], timeout_s: float | None) -> dict[str, Any] | None:
        """The first message of one of ``kinds`` (the others before it are dropped, the
        ones after it kept), or None after ``timeout_s``; ChannelClosed as ``receive``."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            messages = self.wait(left)
            for index, message in enumerate(messages):
                if message["t"] in kinds:
                    self.unread(messages[index + 1 :])
                    return message
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        if self.read_fd < 0:
            return
        self.closed = True
        close_ends((self.read_fd, self.write_fd))
        self.read_fd = self.write_fd = -1


def close_inherited_descriptors(keep: set[int]) -> None:
    """In a freshly forked supervisor: close every descriptor but ``keep``. The
    launcher's journal, lease and lock descriptors must not stay open here (a lock held
    through an inherited descriptor would be shared, not exclusive), nor its ends of
    the other supervisors' channels (a sibling holding them would hide a launcher's
    death from them)."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536
