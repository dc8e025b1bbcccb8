"""A TCP proxy whose open connections can go silent, as a managed failover or a NAT that drops
a connection's state looks to its clients: no FIN, no RST, no byte either way, while new
connections pass.

``TcpProxy(port)`` listens on a free 127.0.0.1 port and forwards each connection to
``127.0.0.1:port`` (one thread, a selector). ``silence()`` turns every connection open at that
moment into a black hole: what either side sends is read and dropped, and neither side is
closed (a side that closes its own end is not told to the other). Connections made afterwards
are forwarded as before. ``go_down()`` is a server that stopped: every connection is closed
and new ones are closed at once, until ``come_back()``. ``lose_reply(marker)``: the next request
carrying ``marker`` reaches the server, and its connection is closed before the reply comes
back (a server killed right after it ran the command). ``close()`` closes everything.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

__all__ = ["TcpProxy"]


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.silent = False
        self.lose_reply = False  # its next reply is dropped with the connection

    def other(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client


class TcpProxy:
    """Forwards 127.0.0.1:``self.port`` to ``host``:``port`` until ``close()``."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._closing = False
        self.silenced = 0  # connections silenced so far
        self._down = False  # go_down(): every connection closed, new ones too
        self._lose: bytes | None = None  # lose_reply(): the marker of the request to cut
        self.replies_lost = 0
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def url(self, scheme: str = "redis", tail: str = "") -> str:
        """A URL through the proxy: ``redis://127.0.0.1:PORT/0``, ``amqp://...``."""
        return f"{scheme}://127.0.0.1:{self.port}{tail}"

    def silence(self) -> int:
        """Every connection open now stops carrying bytes, in both directions, for good
        (neither side is closed). Returns how many were open."""
        with self._lock:
            live = [pair for pair in self._pairs if not pair.silent]
            for pair in live:
                pair.silent = True
            self.silenced += len(live)
            return len(live)

    def go_down(self) -> None:
        """As a server that stopped: open connections are closed (within the loop's 0.2 s),
        and each new one is closed as soon as it is accepted, until ``come_back()``."""
        self._down = True

    def come_back(self) -> None:
        self._down = False

    def lose_reply(self, marker: bytes) -> None:
        """The next request that carries ``marker`` is forwarded, and its connection closed
        (both sides) as soon as the server answers, the answer dropped."""
        self._lose = marker

    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for pair in self._pairs if not pair.silent)

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=5)
        with self._lock:
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            for sock in (pair.client, pair.upstream):
                with contextlib.suppress(OSError):
                    sock.close()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._selector.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closing:
            if self._down:
                with self._lock:
                    pairs = list(self._pairs)
                for pair in pairs:
                    self._drop(pair)
            for key, _events in self._selector.select(timeout=0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._forward(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        if self._down:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()  # the target is down: a refused connection, as without a proxy
            return
        for sock in (client, upstream):
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(client, upstream)
        with self._lock:
            self._pairs.add(pair)
        self._selector.register(client, selectors.EVENT_READ, pair)
        self._selector.register(upstream, selectors.EVENT_READ, pair)

    def _forward(self, sock: socket.socket, pair: _Pair) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if pair.silent:
            if not data:  # this side closed its end: the other side is not told
                self._selector.unregister(sock)
            return  # a black hole: what was sent is dropped
        if data and sock is pair.upstream and pair.lose_reply:
            self.replies_lost += 1
            self._drop(pair)  # the server ran it; its client never hears
            return
        if data and sock is pair.client and self._lose is not None and self._lose in data:
            self._lose, pair.lose_reply = None, True
        if data:
            try:
                pair.other(sock).sendall(data)
                return
            except OSError:
                pass
        self._drop(pair)  # a side closed while forwarding: close both, as a proxy does

    def _drop(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
        for sock in (pair.client, pair.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            with contextlib.suppress(OSError):
                sock.close()
