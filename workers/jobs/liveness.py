"""Liveness that drover owns: one heartbeat per worker process, kept in Redis.

Each process that receives or runs drover tasks has an id (``host:pid:random``) and keeps the
key ``{prefix}:worker:{id}`` alive: a background thread sets it every ``DROVER_HEARTBEAT_S``
with a time to live of ``DROVER_HEARTBEAT_TTL_S``. Redis expires the key on its own clock, so
no worker's clock decides who is dead: a worker is dead when its key is gone. Workers also
register in the ``{prefix}:workers`` sorted set, which the recovery sweep walks (its cost
grows with the number of workers, not with queues or jobs).

A warm shutdown deletes the key at its end, so the sweep takes over at once whatever the
worker still held (prefetched messages, retries waiting out their countdown).

Liveness means progress, not a running thread: the parts of a worker that must move for its
sub-agents to move (the Celery consumer's event loop, drover's asyncio loop) each ``pulse()``
every ``DROVER_HEARTBEAT_S`` while they run. A part that has not pulsed for
``DROVER_PROGRESS_STALE_S`` is stuck (on a connection that went silent, say), and the
heartbeat thread then stops beating, however well it reaches Redis itself: the key expires and
the sweep sends the worker's sub-agents again elsewhere, as for a killed worker. A part that
is not running on purpose (the consumer while it reconnects to a broker that is down) is
``unwatch``-ed until it runs again, so an outage the worker waits out is not a death. Should
the stuck part move again, the worker beats again; its old deliveries then find newer claims
and stop before any call.

A part may be the worker's broker connection (``pulse(part, broker=True)``: the Celery
consumer). A worker that stops beating only because such a part is stuck says so in Redis
(``{prefix}:worker:{id}:stuck``) until it moves again: its sub-agents did not kill it, so the
sweep sends them again without counting a death against their budget (a silent broker
connection is the broker's fault, not the task's).
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
from drover.workers.connections import redis_outage
from drover.workers.jobs.keys import JobKeys

__all__ = ["Heartbeat", "alive", "mark_message_gap", "stuck_on_its_broker", "workers_key"]

log = logging.getLogger(__name__)


def workers_key(prefix: str) -> str:
    return JobKeys(prefix).workers


def heartbeat_key(prefix: str, worker: str) -> str:
    return JobKeys(prefix).heartbeat(worker)


class Heartbeat:
    """This process's worker id and the thread that keeps its heartbeat key alive."""

    def __init__(self, settings: Settings, client: redis.Redis,
                 beats: redis.Redis | None = None):
        """``client``: the process's Redis client (the registry, ``stop``'s delete);
        ``beats``: the client the beating thread uses (default ``client``). Its root hands
        it one that gives up within a beat (``Services.heartbeat``): a beat blocked for the
        usual retry minute would say nothing while Redis is away (a pause, a network gone),
        and the next beat tries again anyway. It is also what notices Redis going and coming
        back."""
        self.settings = settings
        self.prefix = settings.key_prefix
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.pid = os.getpid()
        self.r = client
        self._beats = beats if beats is not None else client
        self._stop = threading.Event()
        self._pulses: dict[str, float] = {}  # a part that must move -> when it last did
        self._broker_parts: set[str] = set()  # parts that are the broker's connection
        self._stuck: list[str] = []
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

    def pulse(self, part: str, broker: bool = False) -> None:
        """``part`` of this worker moved (and is watched from now on). ``broker``: the part
        is the worker's broker connection (stuck, it is the broker's fault, not a task's)."""
        self._pulses[part] = time.monotonic()
        if broker:
            self._broker_parts.add(part)

    def unwatch(self, part: str) -> None:
        """``part`` stops on purpose (its broker connection is down): not a lack of progress."""
        self._pulses.pop(part, None)

    def stuck(self) -> list[str]:
        """The watched parts that have not moved for DROVER_PROGRESS_STALE_S."""
        before = time.monotonic() - self.settings.progress_stale_s
        return sorted(part for part, at in list(self._pulses.items()) if at < before)

    def _progressing(self) -> bool:
        stuck = self.stuck()
        if stuck and not self._stuck:
            log.warning("this worker makes no progress: %s has not moved for %g s (stuck on a "
                        "connection?); its heartbeat stops so that its sub-agents are sent "
                        "again elsewhere", ", ".join(stuck), self.settings.progress_stale_s)
            self._say_stuck(stuck)
        elif self._stuck and not stuck:
            log.warning("this worker moves again (%s); its heartbeat resumes",
                        ", ".join(self._stuck))
            self._say_stuck([])
        self._stuck = stuck
        return not stuck

    def _say_stuck(self, stuck: list[str]) -> None:
        """Tell the sweep the worker stopped beating only because its broker connection is
        stuck (or, with ``[]``, that it moves again)."""
        key = JobKeys(self.prefix).stuck(self.id)
        try:
            if stuck and set(stuck) <= self._broker_parts:
                self._beats.set(key, json.dumps(stuck), ex=max(
                    3600, int(self.settings.progress_stale_s * 10)))
            else:
                self._beats.delete(key)
        except redis.RedisError as error:  # the sweep then counts a death: the old way
            redis_outage.noticed("the heartbeat", error)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            if not self._progressing():
                continue
            try:
                self.beat(self._beats)
                if redis_outage.answered():
                    # Connections to Redis were lost (a restart, a failover, a connection that
                    # went silent): a BRPOP's reply may have been lost with one, its message
                    # taken off the queue and never seen. The sweep looks for such messages
                    # after a heartbeat TTL instead of DROVER_RESEND_AFTER_S.
                    mark_message_gap(self._beats, self.prefix, self.settings)
            except redis.RedisError as error:  # Redis away: the next beat tries again
                redis_outage.noticed("the heartbeat", error)

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


def mark_message_gap(r: redis.Redis, prefix: str, settings: Settings) -> None:
    """Say that a worker died or lost its connections to Redis: for a while the sweep treats
    a job that gains no record for a heartbeat TTL as stalled (its messages may be lost in
    the Redis broker's BRPOP gap, workers/recovery/sweep.py step 3)."""
    r.set(JobKeys(prefix).recovery("death"), "1",
          px=int(max(60.0, 4 * settings.heartbeat_ttl_s) * 1000))


def stuck_on_its_broker(r: redis.Redis, prefix: str, worker: str) -> bool:
    """Whether ``worker`` stopped beating only because its broker connection was stuck
    (its process runs on: nothing it ran killed it)."""
    return bool(r.exists(JobKeys(prefix).stuck(worker)))


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
