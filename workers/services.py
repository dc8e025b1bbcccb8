"""The composition root: what one process shares, built once from its settings.

Only a process's roots call ``services()``: the CLI's commands, the submitter's
(``submitter_services``, for ``submit``, ``JobHandle`` and ``plan``) and the worker's Celery
app (``app.drover``); they hand what it makes to the parts that need it (the views, the job's
handle, the runtime as ``rt.shared``, the window, the tasks, the recovery sweep its job store
and ``fairshare``), so each part is configured in one place (prefix, TTL, window sizes, the
Redis client's retries) and a process holds one client per Redis, not one per caller. Nothing
else builds a client, limiter, scheduler or store (tests/unit/test_architecture.py; first
contact and the demo's clean-up open clients that give up at once; docs/architecture.md, "The
roots"). The object is made again after a fork (a prefork child must not share its
parent's sockets) and when the settings change (tests run several configurations in one
process).

What lives on the worker's event loop (the async Redis client, the ``AsyncLimiter``, the SDK
clients of the provider and of a key pool) binds to that loop: the agent runtime
(``Runtime(shared)``) asks its ``Services`` for them on the loop, once (``loop_parts()``),
and closes them with it.

Two parts are the process's rather than one configuration's: the worker heartbeat (one worker
id per process, which the claims it takes are held by) and the telemetry recorder (one live
process in ``drover metrics``). Every ``Services`` of one Redis and key prefix shares them;
asked for another Redis or prefix (tests switch settings under an in-process worker), the old
one stops first.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio as aioredis

from drover.config import Settings, get_settings
from drover.workers.connections.redis_clients import async_redis, client_settings, sync_redis
from drover.workers.fairshare import FairShare
from drover.workers.jobs.batches import BatchStore
from drover.workers.jobs.cancels import Cancels
from drover.workers.jobs.checkpoints import Checkpoints
from drover.workers.jobs.counters import Counters
from drover.workers.jobs.liveness import Heartbeat
from drover.workers.jobs.meta import JobMeta
from drover.workers.jobs.outcomes import Outcomes
from drover.workers.jobs.record_store import Records
from drover.workers.jobs.results_db import ResultsStore
from drover.workers.jobs.specs import Specs
from drover.workers.jobs.spending import Spending
from drover.workers.jobs.store import JobStore
from drover.workers.jobs.stream import Stream
from drover.workers.limiter import AsyncLimiter, Limiter
from drover.workers.telemetry import Recorder, use_recorder

if TYPE_CHECKING:
    from drover.workers.providers import Pool

__all__ = ["LoopParts", "Services", "reset_services", "services", "stop_process", "stop_worker"]

T = TypeVar("T")


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
        return sync_redis(self.settings.redis_url, **client_settings(self.settings))

    @cached_property
    def store(self) -> JobStore:
        return JobStore(self.redis, prefix=self.settings.key_prefix,
                        ttl_s=self.settings.result_ttl_s, results=self.results)

    # The job store's parts, for callers that need one of them (built once, with ``store``).
    @property
    def counters(self) -> Counters:
        return self.store.counters

    @property
    def spending(self) -> Spending:
        return self.store.spending

    @property
    def stream(self) -> Stream:
        return self.store.stream

    @property
    def specs(self) -> Specs:
        return self.store.specs

    @property
    def meta(self) -> JobMeta:
        return self.store.meta

    @property
    def records(self) -> Records:
        return self.store.records

    @property
    def outcomes(self) -> Outcomes:
        return self.store.outcomes

    @property
    def cancels(self) -> Cancels:
        return self.store.cancels

    @property
    def checkpoints(self) -> Checkpoints:
        return self.store.checkpoints

    @cached_property
    def results(self) -> ResultsStore | None:
        """The durable results store (DROVER_RESULTS_URL), or None when it is not set. It
        connects on first use."""
        url = self.settings.results_url
        return (ResultsStore(url.get_secret_value(), timeout_s=self.settings.results_timeout_s)
                if url is not None else None)

    @cached_property
    def batches(self) -> BatchStore:
        return BatchStore(self.redis, self.store.keys, self.settings.result_ttl_s, self.meta)

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
        holder = self.worker_id
        with self._lock:
            fs = self._fairshare.get((queue, holder))
            if fs is None:
                fs = self._fairshare[(queue, holder)] = FairShare.from_settings(
                    self.redis, self.settings, queue, holder=holder)
            return fs

    @property
    def recorder(self) -> Recorder:
        """The process's telemetry recorder for this Redis and prefix (its counts, flushed to
        Redis every DROVER_METRICS_FLUSH_S)."""
        s = self.settings
        return _process_part("recorder", s, lambda: Recorder(
            sync_redis(s.redis_url, **client_settings(s)), s.key_prefix, s.metrics_flush_s,
            keep_s=s.result_ttl_s))

    @property
    def redis_probe(self) -> Any:  # a redis.Redis (the name ``redis`` is the property above)
        """A client that asks once and gives up within a second (no retries): for a process
        that must know at once whether Redis answers (``drover gateway`` refuses to forward
        while it does not), where the process's client would ride out a failover first."""
        s = self.settings
        return _process_part("redis_probe", s, lambda: sync_redis(s.redis_url, **client_settings(
            s, retries=False, socket_timeout=1.0, socket_connect_timeout=1.0)))

    def heartbeat(self) -> Heartbeat:
        """The process's worker heartbeat, started on first use: a process that receives or
        runs drover tasks is a worker, and the sweep takes over what it held once it stops."""
        s = self.settings
        # The beats' own client gives up within one beat (no retries, short timeouts); the
        # rest (the registry, the delete at stop) goes through the process's client.
        quick = max(0.5, min(s.heartbeat_s, 5.0))
        return _process_part("heartbeat", s, lambda: Heartbeat(
            s, client=self.redis, beats=sync_redis(s.redis_url, **client_settings(
                s, retries=False, socket_timeout=quick, socket_connect_timeout=quick))))

    @property
    def worker_heartbeat(self) -> Heartbeat | None:
        """This process's heartbeat if it is a worker (its heartbeat runs), else None."""
        held = _parts.get("heartbeat")
        return held[1] if held is not None and held[0] == _identity(self.settings) else None

    @property
    def worker_id(self) -> str:
        """This process's worker id if it is a worker (its heartbeat runs), else ""."""
        heartbeat = self.worker_heartbeat
        return heartbeat.id if heartbeat is not None else ""

    async def loop_parts(self) -> LoopParts:
        """What lives on the running event loop, built on it (the agent runtime asks on its
        loop, once per runtime): the async Redis client, the ``AsyncLimiter`` on it, the
        provider's client (realtime and batch) and a pool's per-key clients."""
        s = self.settings
        aredis = async_redis(s.redis_url, **client_settings(s))
        limiter = AsyncLimiter(aredis, prefix=s.key_prefix, horizon_s=s.horizon_s,
                               stats_window_s=s.stats_window_s)
        # Imported here: the SDKs cost seconds of CPU, and the CLI's readers (`drover stats`,
        # `drover metrics`) build a Services but never call a provider.
        from drover.workers.clients.limited import turn_client
        from drover.workers.providers.clients import key_pool, provider_client

        client = provider_client(s)
        pool = key_pool(s)
        # The Message Batches API's calls are short requests: a total timeout, as before.
        return LoopParts(redis=aredis, limiter=limiter, client=client,
                         batch_client=client.with_options(timeout=s.call_timeout_s), pool=pool,
                         turn_client=turn_client)

    def close(self) -> None:
        if "redis" in self.__dict__:
            self.redis.close()
        results = self.__dict__.get("results")  # only when made (a cached_property)
        if results is not None:
            results.close()


@dataclass
class LoopParts:
    """The parts bound to one event loop (``Services.loop_parts``), closed together."""

    redis: aioredis.Redis
    limiter: AsyncLimiter
    client: Any  # the provider's realtime client
    batch_client: Any  # the same connections, with a total timeout
    pool: Pool | None
    # drover's own loop's client for one turn (``clients.turn_client(rt, ctx, model)``): the
    # agent sends through the clients' limited transport without importing that room.
    turn_client: Callable[..., Any]

    async def close(self) -> None:
        await self.client.close()
        if self.pool is not None:
            await self.pool.close()
        await self.redis.aclose()


def _identity(settings: Settings) -> tuple[int, str, str]:
    return (os.getpid(), settings.redis_url, settings.key_prefix)


_parts: dict[str, tuple[tuple[int, str, str], Any]] = {}  # name -> (identity, part)
_parts_lock = threading.Lock()


def _process_part(name: str, settings: Settings, make: Callable[[], T]) -> T:
    want = _identity(settings)
    held = _parts.get(name)
    if held is not None and held[0] == want:
        return held[1]
    with _parts_lock:
        held = _parts.get(name)
        if held is None or held[0] != want:
            if held is not None and held[0][0] == want[0]:  # not a forked parent's
                _stop(held[1])
            held = _parts[name] = (want, make())
        return held[1]


def _stop(part: Any) -> None:
    (part.stop if isinstance(part, Heartbeat) else part.close)()


def stop_worker() -> None:
    """Stop this process's heartbeat (a warm shutdown's end): the sweep then takes over at
    once whatever this worker still held."""
    with _parts_lock:
        held = _parts.pop("heartbeat", None)
        if held is not None and held[0][0] == os.getpid():
            held[1].stop()


def stop_process() -> None:
    """Stop what this process shares across settings: its heartbeat, then its telemetry
    recorder (flushed). For a process that outlives the Redis they write to (``drover demo``
    stops its own Redis before it exits: a recorder left for ``atexit`` would retry its last
    flush against that Redis for a minute, and the heartbeat would warn meanwhile)."""
    with _parts_lock:
        held = [_parts.pop(name, None) for name in ("heartbeat", "recorder")]
    for part in held:
        if part is not None and part[0][0] == os.getpid():
            _stop(part[1])


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


# Telemetry's hooks count into the recorder of the process's current settings.
use_recorder(lambda: services().recorder)
