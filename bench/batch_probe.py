"""Imported by the workers of ``bench/batch.py`` (through DROVER_TOOL_MODULES): adds up how
long each worker thread spent inside a task, in Redis, so the benchmark can tell worker-thread
occupancy (busy thread-seconds / (threads x makespan)) for each delivery."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun

from drover.config import get_settings

_started: dict[str, float] = {}
_lock = threading.Lock()


def busy_key() -> str:
    settings = get_settings()
    return f"{settings.key_prefix}:bench:busy:{settings.queue}"


@task_prerun.connect
def _before(task_id: str | None = None, **_: Any) -> None:
    with _lock:
        _started[str(task_id)] = time.monotonic()


@task_postrun.connect
def _after(task_id: str | None = None, **_: Any) -> None:
    with _lock:
        began = _started.pop(str(task_id), None)
    if began is not None:
        client = redis.Redis.from_url(get_settings().redis_url)
        client.incrbyfloat(busy_key(), time.monotonic() - began)
        client.close()
