"""Socket options against a connection that goes silent, for every Redis client (drover's and
Celery's) and the RabbitMQ broker.

A managed Redis failover, a NAT or a cloud load balancer that drops a connection's state leaves
it open with nothing coming back: no FIN, no RST, while new connections work. A client without
a timeout waits on it for ever (a worker whose heartbeat beats while its consumer or its tasks
stand still). So every connection has a timeout on each command and read
(``DROVER_SOCKET_TIMEOUT_S``), TCP keepalive with short timings (``DROVER_KEEPALIVE_S``: a peer
gone from the network) and a health check of idle connections (``DROVER_HEALTH_CHECK_S``).
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["CONNECT_TIMEOUT_S", "KEEPALIVE_PROBES", "keepalive_options", "redis_socket_options"]

CONNECT_TIMEOUT_S = 5.0
KEEPALIVE_PROBES = 3


def keepalive_options(idle_s: float) -> dict[int, int]:
    """TCP keepalive timings (Linux names; a platform without them keeps its own): probe a
    connection idle ``idle_s``, every third of that, and give up after 3 probes."""
    wanted = {"TCP_KEEPIDLE": idle_s, "TCP_KEEPINTVL": max(1.0, idle_s / 3),
              "TCP_KEEPCNT": KEEPALIVE_PROBES}
    return {getattr(socket, name): max(1, round(value)) for name, value in wanted.items()
            if hasattr(socket, name)}


def redis_socket_options(settings: Any = None) -> dict[str, Any]:
    """redis-py's (and kombu's Redis transport's) socket options from ``settings`` (default:
    the settings' own defaults, for a caller that holds only a URL)."""
    if settings is None:
        from drover.config.settings import Settings

        fields = Settings.model_fields
        timeout, keepalive, health = (fields[name].default for name in (
            "socket_timeout_s", "keepalive_s", "health_check_s"))
    else:
        timeout, keepalive, health = (settings.socket_timeout_s, settings.keepalive_s,
                                      settings.health_check_s)
    return {"socket_connect_timeout": min(CONNECT_TIMEOUT_S, timeout), "socket_timeout": timeout,
            "socket_keepalive": True, "socket_keepalive_options": keepalive_options(keepalive),
            "health_check_interval": health}
