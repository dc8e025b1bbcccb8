"""Real services for the tests: Redis (the one at DROVER_REDIS_URL / 127.0.0.1:6379, or a
private redis-server on a free port), the simulator on a free port and real Celery workers.

Tests never flush a Redis they did not start: each test gets its own key prefix, and the
Celery broker uses a queue name of this test session's own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from orchestrator.services import RedisService, ensure_redis

DEFAULT_REDIS = os.environ.get("DROVER_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_service() -> Iterator[RedisService]:
    service = ensure_redis(DEFAULT_REDIS)
    if service.kind == "fakeredis":
        service.close()
        pytest.exit("tests need a real Redis: install redis-server (Debian: apt-get install "
                    "redis-server) or set DROVER_REDIS_URL", returncode=3)
    yield service
    service.close()


@pytest.fixture(scope="session")
def redis_url(redis_service: RedisService) -> str:
    return redis_service.url


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards (only its own)."""
    prefix = f"drovertest-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()
