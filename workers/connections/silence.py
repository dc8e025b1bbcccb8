"""A Redis connection that gives up on its siblings once one of them went silent.

A managed failover or a NAT that drops its state silences every connection open at that
moment (no FIN, no RST) while new connections work. redis-py notices one connection at a time:
each pooled connection costs its own ``DROVER_SOCKET_TIMEOUT_S`` when it is next used (its
health-check PING or its command waits that long), and a thread that uses several in turn
waits that long for each. The Celery consumer on the Redis broker did: kombu's restore scan,
an event's publish and the BRPOP's health check, one after the other on three silent
connections, 30 s in all before it consumed again (measured with tests/helpers/tcp_proxy.py).

``SilenceAware`` counts, per Redis address and process, the reads that timed out on the
connection's own socket timeout; a connection made before the latest such timeout is
dropped before its next command and made anew (a TCP connect) instead of waiting out a
timeout of its own. The cost of a read that timed out for another reason (a Redis busy for
longer than the socket timeout): every connection to it reconnects once.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from redis.connection import SENTINEL  # read_response's "no timeout of its own"

__all__ = ["SilenceAware", "SilenceAwareConnection"]

_timeouts: dict[tuple[str, int], int] = {}  # (host, port) -> reads timed out so far
_lock = threading.Lock()


class SilenceAware:
    """A mixin for a sync redis-py connection class (before it in the bases)."""

    _seen_timeouts = 0  # the address's count when this connection's socket was made

    def _address(self) -> tuple[str, int]:
        return str(getattr(self, "host", "")), int(getattr(self, "port", 0) or 0)

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "_sock", None) is None:
            self._seen_timeouts = _timeouts.get(self._address(), 0)
        super().connect_check_health(*args, **kwargs)  # type: ignore[misc]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if getattr(self, "_sock", None) is not None and (
                self._seen_timeouts < _timeouts.get(self._address(), 0)):
            self.disconnect()  # type: ignore[attr-defined]  # made before the silence
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.TimeoutError:
            if kwargs.get("timeout", SENTINEL) is SENTINEL:  # its own socket timeout
                with _lock:
                    address = self._address()
                    _timeouts[address] = _timeouts.get(address, 0) + 1
            raise


class SilenceAwareConnection(SilenceAware, redis.Connection):
    """redis-py's TCP connection, silence-aware (the Redis broker's, drover's sync clients')."""
