"""The control channel between a launcher (``run``, ``claim``, ``work``) and one task's
supervisor: messages over a ``SOCK_SEQPACKET`` socket pair (no I/O policy here).

Why a seqpacket socket: each packet arrives whole or not at all, in order, and the end
of the peer (its death included: the kernel closes its descriptors) reads as an empty
packet, at once. Messages are JSON objects (``{"t": <kind>, ...}``); the journal
records a supervisor hands its launcher travel inside them as ``[type, data]`` pairs,
and a task goes to its supervisor as its snapshot record. A packet is one byte of
framing (``.``: the last of its message; ``+``: more follow) and at most FRAME_BYTES of
the message: a task may be megabytes (its argv), and a packet may not be larger than
the socket's send buffer, which is 208 KiB on many systems.

The pair is made with ``_socket``, the C module the standard library's ``socket`` wraps:
importing ``socket`` costs every ``ferry run`` 3-5 ms (it turns the module's hundreds of
constants into enums), and this needs none of what it adds. (A pipe each way costs
nothing to import either, but doubles the descriptors a launcher holds: ``work -j 256``
keeps up to 512 supervisors, whose pipes alone would reach the usual limit of 1024.)

Sends never block: a launcher that is stopped (SIGSTOP) or slow must not pause the
supervisor, which has a task to watch. What the socket cannot take now waits in an
outbox, flushed whenever the channel is next used or becomes writable.
"""

from __future__ import annotations

import _socket
import errno
import os
from collections import deque

from journal import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FRAME_BYTES = 64 << 10  # per packet (a SETTLED record with its evidence fits whole)
_LAST, _MORE = b".", b"+"


class ChannelClosed(Exception):
    """The peer is gone (its end of the socket closed: exit, crash, kill -9)."""


Socket = _socket.socket


def channel_pair() -> tuple[Socket, Socket]:
    """(launcher's end, supervisor's end), both close-on-exec and non-blocking."""
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        end.setblocking(False)
    return ours, theirs


def encode(kind: str, **fields: Any) -> bytes:
    """A message, as ``Channel.send`` sends it (over FRAME_BYTES: in several packets)."""
    return _json.dumps({"t": kind, **fields})


class Channel:
    """One end of a control channel."""

    def __init__(self, sock: Socket) -> None:
        self.sock = sock
        self.closed = False  # the peer's end is gone
        self._outbox: deque[bytes] = deque()  # packets not yet taken by the socket
        self._partial: list[bytes] = []  # the frames of a message not yet whole
        self._inbox: list[dict[str, Any]] = []  # received, handed back unread (unread)

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def pending(self) -> bool:
        """Messages wait in the outbox (wait for the socket to become writable)."""
        return bool(self._outbox)

    def send(self, kind: str, **fields: Any) -> None:
        """Queue one message and send what the socket takes now. Never blocks; a closed
        peer is remembered (``closed``), not raised: the caller learns it on receive."""
        self.send_encoded(encode(kind, **fields))

    def send_encoded(self, body: bytes) -> None:
        """``send`` of a message ``encode`` made."""
        for start in range(0, len(body), FRAME_BYTES):
            end = start + FRAME_BYTES
            self._outbox.append((_LAST if end >= len(body) else _MORE) + body[start:end])
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

    def drain(self) -> None:
        """Block until every queued packet is in the socket or the peer is gone: for a
        message that must be out before what follows it happens (a supervisor's plan
        before its spawn)."""
        import select

        self.flush()
        while self._outbox and not self.closed:
            select.select([], [self.sock], [])
            self.flush()

    def unread(self, messages: list[dict[str, Any]]) -> None:
        """Hand back messages received but not for the caller: the next receive returns
        them first (a waiter for one kind must not lose the next one behind it)."""
        self._inbox[:0] = messages

    def receive(self) -> list[dict[str, Any]]:
        """Every message that has arrived (maybe none). ChannelClosed once the peer is
        gone and nothing is left to read."""
        messages, self._inbox = self._inbox, []
        resets = 0
        while True:
            try:
                raw = self.sock.recv(FRAME_BYTES + 1)
            except BlockingIOError:
                return messages
            except ConnectionResetError:
                # The peer died with packets of ours unread: the kernel says so once,
                # before the packets it sent first, which are still to be read (its
                # plan, its end): read on.
                resets += 1
                if resets == 1:
                    continue
                raw = b""
            if not raw:
                self.closed = True
                if messages:
                    return messages
                raise ChannelClosed("the other end of the control channel is gone")
            self._partial.append(raw[1:])
            if raw[:1] == _LAST:
                messages.append(_json.loads(b"".join(self._partial)))
                self._partial = []

    def wait(self, timeout_s: float | None) -> list[dict[str, Any]]:
        """Block up to ``timeout_s`` (None: for ever) for messages, sending what waits in
        the outbox meanwhile (a peer that reads only once it hears from us must hear);
        ChannelClosed as ``receive``. Returns [] on timeout."""
        import select
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._inbox:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            writable = [self.sock] if self.pending and not self.closed else []
            ready, out, _ = select.select([self.sock], writable, [], left)
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
