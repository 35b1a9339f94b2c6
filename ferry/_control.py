"""The control channel between a launcher (``run``, ``claim``, ``work``) and one task's
supervisor: messages over a ``SOCK_SEQPACKET`` socket pair (no I/O policy here).

Why a seqpacket socket: each message arrives whole or not at all (no framing to get
wrong), in order, and the end of the peer (its death included: the kernel closes its
descriptors) reads as an empty message, at once. Messages are small JSON objects
(``{"t": <kind>, ...}``); the journal records a supervisor hands its launcher travel
inside them as ``[type, data]`` pairs.

Sends never block: a launcher that is stopped (SIGSTOP) or slow must not pause the
supervisor, which has a task to watch. What the socket cannot take now waits in an
outbox, flushed whenever the channel is next used or becomes writable.
"""

from __future__ import annotations

import errno
import os
import socket
from collections import deque
from typing import Any

import orjson

MESSAGE_BYTES_MAX = 1 << 20  # a SETTLED record with its evidence fits many times over


class ChannelClosed(Exception):
    """The peer is gone (its end of the socket closed: exit, crash, kill -9)."""


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """(launcher's end, supervisor's end), both close-on-exec and non-blocking."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        end.setblocking(False)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MESSAGE_BYTES_MAX)
    return ours, theirs


class Channel:
    """One end of a control channel."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False  # the peer's end is gone
        self._outbox: deque[bytes] = deque()

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def pending(self) -> bool:
        """Messages wait in the outbox (wait for the socket to become writable)."""
        return bool(self._outbox)

    def send(self, kind: str, **fields: Any) -> None:
        """Queue one message and send what the socket takes now. Never blocks; a closed
        peer is remembered (``closed``), not raised: the caller learns it on receive."""
        self._outbox.append(orjson.dumps({"t": kind, **fields}))
        self.flush()

    def flush(self) -> None:
        while self._outbox and not self.closed:
            try:
                self.sock.send(self._outbox[0])
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                    self.closed = True
                    return
                raise
            self._outbox.popleft()

    def receive(self) -> list[dict[str, Any]]:
        """Every message that has arrived (maybe none). ChannelClosed once the peer is
        gone and nothing is left to read."""
        messages: list[dict[str, Any]] = []
        while True:
            try:
                raw = self.sock.recv(MESSAGE_BYTES_MAX)
            except BlockingIOError:
                return messages
            except ConnectionResetError:
                raw = b""
            if not raw:
                self.closed = True
                if messages:
                    return messages
                raise ChannelClosed("the other end of the control channel is gone")
            messages.append(orjson.loads(raw))

    def wait(self, timeout_s: float | None) -> list[dict[str, Any]]:
        """Block up to ``timeout_s`` (None: for ever) for messages; ChannelClosed as
        ``receive``. Returns [] on timeout."""
        import select

        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        return self.receive() if ready else []

    def close(self) -> None:
        self.closed = True
        self.sock.close()


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
