"""A TCP relay whose link can be cut and restored: a network partition between ferry and
its database, for one simulated host, without touching the server.

``cut()`` closes every relayed connection at once (both sides see the link die, as
after a cable pull or a firewall reset) and, until ``restore()``, closes each new one
as soon as it is accepted (a client sees the server hang up before it says anything).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager


class TcpCut:
    def __init__(self, target_host: str, target_port: int, bind: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server((bind, 0))
        self.bind = bind
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[tuple[socket.socket, socket.socket]] = []
        self._cut = False
        self._closed = False
        self.refused = 0  # connections hung up on while cut (a client trying again)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, url: str) -> str:
        """``url`` (a postgresql:// URL to the target) through this relay."""
        parts = urllib.parse.urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        where = f"{self.bind}:{self.port}"
        netloc = f"{credentials}@{where}" if credentials else where
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            links, self._links = self._links, []
        for pair in links:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                client.close()
                self.refused += 1
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._links.append((client, server))
            threading.Thread(target=self._relay, args=(client, server), daemon=True).start()

    @staticmethod
    def _relay(client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            for sock in peer:
                selector.register(sock, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in selector.select():
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        peer[key.fileobj].sendall(data)  # type: ignore[index]
            except OSError:
                return
            finally:
                for sock in peer:
                    with contextlib.suppress(OSError):
                        sock.close()


@contextmanager
def relayed(url: str, bind: str = "127.0.0.1") -> Iterator[tuple[TcpCut, str]]:
    """A relay to the server of ``url`` (TCP), listening on ``bind``, and ``url``
    through it."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or parts.hostname.startswith("/") or "host=" in parts.query:
        raise RuntimeError(f"not a TCP URL, nothing to relay: {url}")
    relay = TcpCut(parts.hostname, parts.port or 5432, bind)
    try:
        yield relay, relay.url(url)
    finally:
        relay.close()
