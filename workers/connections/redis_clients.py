"""Every Redis client drover makes: one plain Redis URL or a Sentinel list, sync and asyncio.

``DROVER_REDIS_URL`` is either a Redis URL (``redis://``, ``rediss://``, ``unix://``) or, for
Redis Sentinel, kombu's list ``sentinel://[:PASSWORD@]HOST:PORT[/DB];sentinel://HOST:PORT;...``
with ``DROVER_SENTINEL_MASTER`` naming the master the sentinels monitor (the same form the
Celery broker and result backend take, so one value serves all three). The password in the
list is the master's (and its replicas'); ``DROVER_SENTINEL_PASSWORD`` is the sentinels' own
where they have one.

A Sentinel client asks the sentinels for the master's address at every new connection
(redis-py's ``SentinelConnectionPool``), trying each sentinel in turn, so a dead first one is
skipped (celery#5538 was kombu asking only the first). A connection that drops, or a master
that answers READONLY because it was demoted, is a ``ConnectionError``; the same retry that
rides out a restart of a single Redis then opens a new connection, which asks the sentinels
again and reaches the promoted replica. A managed Redis whose failover moves a DNS name
takes the plain-URL path: the dropped connection is retried and the name resolves anew.

Every client retries a dropped connection for about a minute (exponential backoff capped at
2 s) before an error reaches the caller: longer than Sentinel's detection plus promotion
(``down-after-milliseconds`` + a few seconds) and a restart from the AOF.

A connection can also die without closing: a managed failover or a NAT that drops its state
leaves it open with nothing coming back (no FIN, no RST), while new connections work. Every
client here therefore has a timeout on every command and read (``DROVER_SOCKET_TIMEOUT_S``,
longer than the longest blocking read drover makes: XREAD's 0.5 s, the cancel listener's 1 s
poll), TCP keepalive with short timings (``DROVER_KEEPALIVE_S``) and a PING before a
connection idle for ``DROVER_HEALTH_CHECK_S`` is used. A command that times out drops its
connection (redis-py disconnects it) and is retried on a new one like a command cut by a
restart: it may have run, and what depends on that is already guarded for a restart (claims
with fencing tokens, the records' once-only rule, the limiter's leases that expire). The sync
clients' connections are silence-aware (``silence.py``): once one timed out, the others made
before it reconnect before their next command instead of each waiting out a timeout.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from drover.config.sentinel import SentinelTarget, is_sentinel, parse_sentinel
from drover.config.sockets import redis_socket_options
from drover.workers.connections.silence import SilenceAware, SilenceAwareConnection

__all__ = ["REDIS_RETRIES", "SentinelConnection", "SentinelTarget", "async_redis",
           "client_settings", "is_sentinel", "parse_sentinel",
           "sentinel_for", "sentinel_settings", "sync_redis"]

REDIS_RETRIES = 40
ASYNC_CONNECTIONS = 100  # an asyncio client's connections at most (then a call waits)
CONNECTION_WAIT_S = 30.0  # how long a call waits for one of them
_RETRY_ON = [redis.ConnectionError, redis.TimeoutError]


def sentinel_settings(settings: Any) -> dict[str, str | None]:
    """``master`` and ``sentinel_password`` of drover's settings, as the factories take them."""
    password = settings.sentinel_password
    return {"master": settings.sentinel_master,
            "sentinel_password": password.get_secret_value() if password else None}


def client_settings(settings: Any, **overrides: Any) -> dict[str, Any]:
    """Everything of drover's settings the factories take (the Sentinel master and password,
    the socket options), with ``overrides`` on top."""
    return {**sentinel_settings(settings), **redis_socket_options(settings), **overrides}


def _target(url: str, master: str | None, sentinel_password: str | None) -> SentinelTarget:
    if master is None:
        # Callers that hold only a URL: the process's own settings name the master.
        from drover.config import get_settings

        settings = get_settings()
        master = settings.sentinel_master
        if sentinel_password is None and settings.sentinel_password is not None:
            sentinel_password = settings.sentinel_password.get_secret_value()
    return parse_sentinel(url, master, sentinel_password)


def sentinel_for(target: SentinelTarget, timeout: float = 5.0, **master_options: Any,
                 ) -> redis.sentinel.Sentinel:
    """A Sentinel over ``target``'s sentinels; ``master_options`` go to master connections."""
    return redis.sentinel.Sentinel(
        list(target.sentinels), sentinel_kwargs=target.sentinel_options(timeout),
        **master_options)


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=2.0, base=0.05), REDIS_RETRIES)


def sync_redis(url: str, *, master: str | None = None, sentinel_password: str | None = None,
               retries: bool = True, **options: Any) -> redis.Redis:
    """A client for ``url`` (a Redis URL or a Sentinel list) that rides out a restart or a
    failover. Without ``master`` a Sentinel list takes DROVER_SENTINEL_MASTER; ``retries``
    False makes one attempt (first contact); ``options`` override the socket options."""
    settings: dict[str, Any] = {**redis_socket_options(), **options}
    retry = _retry() if retries else Retry(NoBackoff(), 0)
    if not is_sentinel(url):
        if url.startswith("redis://"):  # TCP: silence-aware (TLS and unix sockets as they are)
            settings.setdefault("connection_class", SilenceAwareConnection)
        return redis.Redis.from_url(url, retry=retry, retry_on_error=_RETRY_ON, **settings)
    target = _target(url, master, sentinel_password)
    sentinel = sentinel_for(target, settings["socket_connect_timeout"])
    return sentinel.master_for(target.master, redis_class=redis.Redis, retry=retry,
                               retry_on_error=_RETRY_ON, connection_class=SentinelConnection,
                               **target.master_options(), **settings)


class SentinelConnection(SilenceAware, redis.sentinel.SentinelManagedConnection):
    """redis-py's Sentinel connection asks the sentinels only in ``connect()``, which the pool
    calls when it hands the connection out; a connection that reconnects itself on its next
    command (``send_packed_command``) goes straight back to the address it had. A client that
    holds one connection for good (kombu's consumer: its BRPOP connection) so reconnects to
    the dead master for ever after a failover: the worker stays up, consuming nothing, and
    logs nothing (celery#6348). Asking on every connect moves it to the promoted replica as
    soon as the sentinels name it. Used by every sync Sentinel client here and by the Celery
    broker (``drover.workers.connections.sentinel_transport``)."""

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> None:
        if self._sock:
            return
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health,
                                     retry_socket_connect=retry_socket_connect)


class _AsyncSentinelConnection(aiosentinel.SentinelManagedConnection):
    """The same for redis.asyncio, where it showed first: through a failover every retry of
    a command knocked at the dead master for the whole retry minute (measured: 73 s), then
    4 s with this."""

    async def connect_check_health(self, check_health: bool = True,
                                   retry_socket_connect: bool = True) -> None:
        if self.is_connected:
            return
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health=check_health,
                                           retry_socket_connect=retry_socket_connect)


def async_redis(url: str, *, master: str | None = None,
                sentinel_password: str | None = None, **options: Any) -> aioredis.Redis:
    """The asyncio twin of ``sync_redis`` (redis.asyncio needs its own Retry class: handed the
    sync one, it gives up at once)."""
    settings: dict[str, Any] = {**redis_socket_options(), **options}
    retry = AsyncRetry(ExponentialBackoff(cap=2.0, base=0.05), REDIS_RETRIES)
    if not is_sentinel(url):
        # A blocking pool: a call beyond its connections waits for one instead of failing
        # (redis.asyncio's plain pool raises MaxConnectionsError past 100 at once, which a
        # gateway or a limited client meets with 100 calls arriving together).
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=ASYNC_CONNECTIONS, timeout=CONNECTION_WAIT_S, retry=retry,
            retry_on_error=_RETRY_ON, **settings)
        return aioredis.Redis.from_pool(pool)  # closed with the client
    target = _target(url, master, sentinel_password)
    sentinel = aiosentinel.Sentinel(
        list(target.sentinels),
        sentinel_kwargs=target.sentinel_options(settings["socket_connect_timeout"]))
    return sentinel.master_for(target.master, redis_class=aioredis.Redis, retry=retry,
                               retry_on_error=_RETRY_ON, connection_class=_AsyncSentinelConnection,
                               **target.master_options(), **settings)
