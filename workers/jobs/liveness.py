"""Liveness that drover owns: one heartbeat per worker process, kept in Redis.

Each process that receives or runs drover tasks has an id (``host:pid:random``) and keeps the
key ``{prefix}:worker:{id}`` alive: a background thread sets it every ``DROVER_HEARTBEAT_S``
with a time to live of ``DROVER_HEARTBEAT_TTL_S``. Redis expires the key on its own clock, so
no worker's clock decides who is dead: a worker is dead when its key is gone. Workers also
register in the ``{prefix}:workers`` sorted set, which the recovery sweep walks (its cost
grows with the number of workers, not with queues or jobs).

A warm shutdown deletes the key at its end, so the sweep takes over at once whatever the
worker still held (prefetched messages, retries waiting out their countdown).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import redis

from drover.config import Settings
from drover.workers import redis_outage
from drover.workers.jobs.keys import JobKeys
from drover.workers.redis_clients import client_settings, sync_redis

__all__ = ["Heartbeat", "alive", "workers_key"]

log = logging.getLogger(__name__)


def workers_key(prefix: str) -> str:
    return JobKeys(prefix).workers


def heartbeat_key(prefix: str, worker: str) -> str:
    return JobKeys(prefix).heartbeat(worker)


class Heartbeat:
    """This process's worker id and the thread that keeps its heartbeat key alive."""

    def __init__(self, settings: Settings, client: redis.Redis | None = None):
        self.settings = settings
        self.prefix = settings.key_prefix
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.pid = os.getpid()
        self.r = client or sync_redis(settings.redis_url, **client_settings(settings))
        # The beats' own client gives up within one beat: a beat blocked for the usual retry
        # minute would say nothing while Redis is away (a pause, a network gone), and the
        # next beat tries again anyway. It is also what notices Redis going and coming back.
        quick = max(0.5, min(settings.heartbeat_s, 5.0))
        self._beats = client or sync_redis(settings.redis_url, **client_settings(
            settings, retries=False, socket_timeout=quick, socket_connect_timeout=quick))
        self._stop = threading.Event()
        # Warm shutdown (SIGTERM): draining = start no new LLM call, hand sub-agents back;
        # handing_back = the grace for calls in flight is over, abort them and hand back too.
        self.draining = False
        self.handing_back = False
        self._info = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "started": time.time()})
        self.beat()  # alive before the first message is taken
        self._thread = threading.Thread(target=self._run, name="drover-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, client: redis.Redis | None = None) -> None:
        pipe = (client or self.r).pipeline(transaction=False)
        pipe.set(heartbeat_key(self.prefix, self.id), self._info,
                 px=int(self.settings.heartbeat_ttl_s * 1000))
        pipe.zadd(workers_key(self.prefix), {self.id: time.time()}, nx=True)
        # The registry outlives dead workers (the sweep takes over what they held) but not
        # the jobs they could have held: a prefix no worker uses any more leaves nothing.
        pipe.expire(workers_key(self.prefix), self.settings.result_ttl_s)
        pipe.execute()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            try:
                self.beat(self._beats)
            except redis.RedisError as error:  # Redis away: the next beat tries again
                redis_outage.noticed("the heartbeat", error)
            else:
                redis_outage.answered()

    def drain(self, grace_s: float, interrupt: Callable[[], None]) -> None:
        """Stop starting calls now; after ``grace_s``, ``interrupt`` the ones still in flight."""
        self.draining = True

        def over() -> None:
            self.handing_back = True
            interrupt()

        timer = threading.Timer(grace_s, over)
        timer.daemon = True
        timer.start()

    def stop(self) -> None:
        """Stop beating and say so: the sweep then takes over what this worker still holds."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)  # a beat under way would write the keys again
        try:
            self.r.delete(heartbeat_key(self.prefix, self.id))
        except redis.RedisError:
            pass  # the key expires by itself


def alive(r: redis.Redis, prefix: str, workers: list[str]) -> dict[str, bool]:
    """Whether each worker's heartbeat key still exists (one round trip)."""
    pipe = r.pipeline(transaction=False)
    for worker in workers:
        pipe.exists(heartbeat_key(prefix, worker))
    return {w: bool(found) for w, found in zip(workers, pipe.execute(), strict=True)}


def registered_workers(r: redis.Redis, prefix: str) -> dict[str, bool]:
    """Every worker in the registry, and whether its heartbeat is alive."""
    workers = [w.decode() if isinstance(w, bytes) else str(w)
               for w in r.zrange(workers_key(prefix), 0, -1)]
    return alive(r, prefix, workers) if workers else {}


def forget_worker(r: redis.Redis, prefix: str, worker: str) -> None:
    """Take a dead worker whose parts are all handed on out of the registry."""
    r.zrem(workers_key(prefix), worker)
