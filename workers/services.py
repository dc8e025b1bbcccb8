"""The composition root: what one process shares, built once from its settings.

Every part of drover that needs Redis, the job store, the limiter, the fair-share scheduler or
the batch queue asks ``services()`` for it (the tasks, the sweep, the window, the CLI,
``drover stats`` and ``drover metrics``), so each is configured in one place (prefix, TTL,
window sizes, the Redis client's retries) and a process holds one client per Redis, not one
per caller. The object is made again after a fork (a prefork child must not share its
parent's sockets) and when the settings change (tests run several configurations in one
process).

What lives on the worker's event loop (the async Redis client, the ``AsyncLimiter``, the SDK
client) is the agent runtime's (``drover.workers.agent.runtime``): it belongs to that loop.
It takes its job store from here.
"""

from __future__ import annotations

import os
import threading
from functools import cached_property

import redis

from drover.config import Settings, get_settings
from drover.workers.fairshare import FairShare
from drover.workers.jobs.batches import BatchStore
from drover.workers.jobs.liveness import local_worker_id
from drover.workers.jobs.store import JobStore
from drover.workers.limiter import Limiter
from drover.workers.redis_clients import sentinel_settings, sync_redis

__all__ = ["Services", "reset_services", "services"]


class Services:
    """One process's shared objects for one set of settings (made lazily, kept)."""

    def __init__(self, settings: Settings, *, client: redis.Redis | None = None):
        self.settings = settings
        self.pid = os.getpid()
        self._fairshare: dict[tuple[str, str], FairShare] = {}
        self._lock = threading.Lock()
        if client is not None:  # a client of the caller's own (one that gives up at once)
            self.__dict__["redis"] = client

    @classmethod
    def from_settings(cls, settings: Settings, *, client: redis.Redis | None = None
                      ) -> Services:
        return cls(settings, client=client)

    @cached_property
    def redis(self) -> redis.Redis:
        """The process's client for ``DROVER_REDIS_URL`` (a pool: safe across threads)."""
        return sync_redis(self.settings.redis_url, **sentinel_settings(self.settings))

    @cached_property
    def store(self) -> JobStore:
        return JobStore(self.redis, prefix=self.settings.key_prefix,
                        ttl_s=self.settings.result_ttl_s)

    @cached_property
    def batches(self) -> BatchStore:
        return BatchStore(self.store)

    @cached_property
    def limiter(self) -> Limiter:
        """The sync limiter, for readers (stats, metrics, the CLI); the worker's calls go
        through the runtime's ``AsyncLimiter`` on the same keys."""
        return Limiter(self.redis, prefix=self.settings.key_prefix,
                       horizon_s=self.settings.horizon_s,
                       stats_window_s=self.settings.stats_window_s)

    def fairshare(self, queue: str | None = None) -> FairShare:
        """The queue's fair-share scheduler, its grants held by this process's worker id
        (none outside a worker: a submitter's grants are published by itself at once)."""
        queue = queue or self.settings.queue
        holder = local_worker_id()
        with self._lock:
            fs = self._fairshare.get((queue, holder))
            if fs is None:
                fs = self._fairshare[(queue, holder)] = FairShare.from_settings(
                    self.redis, self.settings, queue, holder=holder)
            return fs

    def close(self) -> None:
        if "redis" in self.__dict__:
            self.redis.close()


_known: list[Services] = []  # this process's, newest last (a few: tests switch settings)
_lock = threading.Lock()
_KEEP = 8


def services(settings: Settings | None = None) -> Services:
    """This process's services for ``settings`` (default: the process's settings)."""
    settings = settings or get_settings()
    pid = os.getpid()
    for known in reversed(_known):
        if known.pid == pid and (known.settings is settings or known.settings == settings):
            return known
    with _lock:
        if _known and _known[0].pid != pid:
            _known.clear()  # a forked child: the parent's sockets are not ours
        for known in _known:
            if known.settings == settings:
                return known
        made = Services.from_settings(settings)
        _known.append(made)
        if len(_known) > _KEEP:
            _known.pop(0).close()
        return made


def reset_services() -> None:
    """Forget this process's services (tests that change settings between runs)."""
    with _lock:
        for known in _known:
            if known.pid == os.getpid():
                known.close()
        _known.clear()
