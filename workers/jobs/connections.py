"""Redis clients that ride out a Redis restart (the job store, the limiter and the CLI use them)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

__all__ = ["async_redis", "sync_redis"]

# Redis may restart under a running job: every client retries a dropped connection for about
# a minute (exponential backoff capped at 2 s) before an error reaches the caller.
REDIS_RETRIES = 40


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=2.0, base=0.05), REDIS_RETRIES)


def sync_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, retry=_retry(), retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        socket_connect_timeout=5, socket_timeout=30, health_check_interval=10)


def async_redis(url: str) -> aioredis.Redis:
    # redis.asyncio needs its own Retry class: handed the sync one, it gives up at once.
    retry = AsyncRetry(ExponentialBackoff(cap=2.0, base=0.05), REDIS_RETRIES)
    return aioredis.Redis.from_url(
        url, retry=retry, retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        socket_connect_timeout=5, socket_timeout=30, health_check_interval=10)
