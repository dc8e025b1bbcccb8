"""Whether the Redis that holds the fleet's limits answers, known within seconds.

The process's Redis client rides out a failover (it retries for about a minute): right for a
worker, whose call can wait, wrong for a gateway's caller, who would wait that long to learn
that nothing was sent. So the gateway asks Redis itself, every ``EVERY_S``, with a client
that asks once and gives up within a second (``Services.redis_probe``), and refuses new
requests (503) once its pings have failed for ``DOWN_AFTER_S``. Only a failed ping counts,
never a late one: under a burst of requests the loop may run the watch late, and that says
nothing about Redis. The pings run on a thread of their own, not the loop's shared pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

import redis

from drover.orchestrator.gateway._every import Every

__all__ = ["RedisWatch"]

EVERY_S = 0.5
DOWN_AFTER_S = 2.0


class RedisWatch:
    """Pings ``probe`` (a sync client) from the loop's thread pool while running."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.failing_since: float | None = None  # the first failed ping since the last answer
        self._pings = Every(EVERY_S, self._ping)
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="drover-redis-watch")

    @property
    def up(self) -> bool:
        since = self.failing_since
        return since is None or time.monotonic() - since < DOWN_AFTER_S

    async def _ping(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, self.probe.ping)
            self.failing_since = None
        except (redis.RedisError, OSError):
            if self.failing_since is None:
                self.failing_since = time.monotonic()

    def start(self) -> None:
        self._pings.start()

    async def stop(self) -> None:
        await self._pings.stop()
        self._thread.shutdown(wait=False)
