"""When a request reached this host: the kernel's receive time of its last bytes, not the
moment the event loop got round to it.

A provider judges a request against its buckets when it arrives. The simulator's event loop
shares the host's CPUs with everything else (on a loaded test box, with the very workers it
judges); starved for a few hundred milliseconds, it finds several requests waiting in their
sockets and would judge them as one burst that no sender made. So the listening socket hands
out connections with SO_TIMESTAMP set, each read goes through recvmsg, and the kernel's
timestamp of the data read is kept per connection (file descriptor). A handler asks
``received_at`` after reading the body. Where the option or recvmsg is missing (not Linux),
the time of the read is used, which is what the loop's time was before.

(SIOCGSTAMP, the ioctl that reads a socket's last timestamp, answers ENOENT for TCP on Linux:
only recvmsg's ancillary data carries TCP receive times.)
"""

from __future__ import annotations

import socket
import struct
import time

SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29 if hasattr(socket.socket, "recvmsg") else None)
SCM_TIMESTAMP = SO_TIMESTAMP
_TIMEVAL = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMEVAL.size) if hasattr(socket, "CMSG_SPACE") else 0

# fd -> wall-clock time (time.time()) of the latest data read on that connection. A reused fd
# is overwritten by its new connection's first read, before any request on it is handled, so
# the map needs no clean-up and holds at most one entry per descriptor number.
_received: dict[int, float] = {}


def _kernel_time(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMP and len(data) >= _TIMEVAL.size:
            sec, usec = _TIMEVAL.unpack_from(data)
            return sec + usec / 1e6
    return None


class _StampedConnection(socket.socket):
    """An accepted connection whose reads note the kernel's receive time."""

    __slots__ = ()

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self.recvmsg(bufsize, _ANCILLARY, flags)
        if data:
            _received[self.fileno()] = _kernel_time(ancillary) or time.time()
        return data

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:  # type: ignore[override]
        view = memoryview(buffer)
        n, ancillary, _, _ = self.recvmsg_into([view[:nbytes] if nbytes else view],
                                               _ANCILLARY, flags)
        if n:
            _received[self.fileno()] = _kernel_time(ancillary) or time.time()
        return n


class StampingListener(socket.socket):
    """A listening socket whose accepted connections are _StampedConnection."""

    __slots__ = ()

    def accept(self) -> tuple[socket.socket, object]:
        fd, addr = self._accept()  # type: ignore[attr-defined]
        conn = _StampedConnection(self.family, self.type, self.proto, fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            conn.setblocking(True)  # as socket.socket.accept does
        assert SO_TIMESTAMP is not None  # made only where supported() (below)
        conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        return conn, addr


def supported() -> bool:
    return SO_TIMESTAMP is not None and _ANCILLARY > 0


def listener(host: str, port: int, backlog: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket for aiohttp's SockSite; its connections'
    receive times are kernel timestamps where the platform has them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    cls = StampingListener if supported() else socket.socket
    sock = cls(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host or "0.0.0.0", port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def received_at(transport: object) -> float:
    """Wall-clock time the request read last on ``transport``'s connection reached the host
    (the time now when unknown)."""
    now = time.time()
    get = getattr(transport, "get_extra_info", None)
    sock = get("socket") if get is not None else None
    if sock is None:
        return now
    try:
        at = _received.get(sock.fileno())
    except OSError:
        return now
    return now if at is None else min(at, now)

