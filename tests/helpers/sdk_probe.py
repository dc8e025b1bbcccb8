"""Which provider SDKs a worker process has imported, told after each of its tasks.

Workers import this module through ``DROVER_TOOL_MODULES`` (beside their tool modules): on
each task's end it pushes ``{"task", "sdks"}`` to the running test's own Redis list
(``sdk_probe_key()``), so a test reads what a worker subprocess had imported by then.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import redis
from celery.signals import task_postrun

from drover.config import get_settings

__all__ = ["SDKS", "sdk_probe_key", "sdks_loaded"]

SDKS = ("anthropic", "openai")


def sdk_probe_key() -> str:
    settings = get_settings()
    return f"{settings.key_prefix}:sdk-probe:{settings.queue}"


def sdks_loaded() -> list[str]:
    return [name for name in SDKS if name in sys.modules]


@task_postrun.connect(weak=False)
def _told(task: Any = None, **_: Any) -> None:
    client = redis.Redis.from_url(get_settings().redis_url)
    try:
        client.rpush(sdk_probe_key(), json.dumps({"task": getattr(task, "name", ""),
                                                  "sdks": sdks_loaded()}))
    finally:
        client.close()
