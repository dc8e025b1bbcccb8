"""Is anyone serving the job? What ``submit`` says when no worker serves the job's queue, and
``JobHandle.wait()``, ``as_completed()`` and ``drover submit --wait`` when nothing finishes: no
worker consumes the job's queue, or none is alive."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from drover.config import Settings
from drover.workers.jobs.liveness import registered_workers

__all__ = ["NO_WORKER_HINT_AFTER_S", "WorkerWatch", "no_worker_hint", "warn_if_unserved",
           "workers_line"]

log = logging.getLogger("drover.orchestrator.client")

# How long a wait sees nothing finish before it asks whether a worker serves the queue.
NO_WORKER_HINT_AFTER_S = 5.0


def no_worker_hint(queue: str, timeout: float = 2.0) -> str | None:
    """None when a worker consumes ``queue``; else what to do (asks workers over the broker)."""
    from drover.workers.app import app

    try:
        replies = app.control.inspect(timeout=timeout).active_queues() or {}
    except Exception:  # remote control unavailable (a broker without it): no hint
        return None
    if any(q.get("name") == queue for queues in replies.values() for q in queues or ()):
        return None
    start = (f"start one with `drover worker` (with the same DROVER_REDIS_URL, "
             f"DROVER_KEY_PREFIX and DROVER_QUEUE={queue}); the job waits for it")
    if replies:
        others = sorted({q.get("name") for queues in replies.values() for q in queues or ()})
        return (f"no worker consumes queue {queue!r} (DROVER_QUEUE); the {len(replies)} that "
                f"answered consume {', '.join(map(str, others))}. {start[0].upper()}{start[1:]}")
    return f"no worker answered within {timeout:g} s: {start}"


def workers_line(r: redis.Redis, settings: Settings) -> str:
    """How many workers have a live heartbeat under this key prefix (one Redis read)."""
    try:
        live = sum(registered_workers(r, settings.key_prefix).values())
    except redis.RedisError as error:
        return f"could not read the workers' heartbeats ({error})"
    if live:
        return f"{live} worker process(es) alive under DROVER_KEY_PREFIX={settings.key_prefix}"
    return (f"no worker alive under DROVER_KEY_PREFIX={settings.key_prefix}: start one with "
            f"`drover worker` (DROVER_QUEUE={settings.queue})")


def warn_if_unserved(live_slots: Callable[[], int], r: redis.Redis, settings: Settings,
                     job_id: str) -> bool:
    """At submit: one warning line when no worker serves the job's queue (each reports its
    slots there every 2 s: ``live_slots``) and none is alive under the key prefix at all, so
    a user without workers hears it now, not only from a ``wait()`` later. A live worker
    that has not reported slots for this queue says nothing here (it may be starting, or run
    in-process as ``drover demo``'s does); a wait names a queue no worker consumes. The job
    stays queued and runs once a worker does. True when it warned: that handle's first wait
    then does not say it again (``WorkerWatch(told=True)``)."""
    try:
        if live_slots() or sum(registered_workers(r, settings.key_prefix).values()):
            return False
    except redis.RedisError:  # the submit worked; this is a nicety
        return False
    log.warning("job %s is queued, but no worker serves it yet: %s; it runs once one does",
                job_id, workers_line(r, settings))
    return True


class WorkerWatch:
    """One wait's watch: once nothing has finished for NO_WORKER_HINT_AFTER_S, ask (once)
    whether a worker consumes the queue, and warn when none does; the wait goes on.
    ``told``: the submit already said no worker serves it (``drover submit --wait``): once."""

    def __init__(self, job_id: str, queue: str, finished: int, *, told: bool = False):
        self.job_id, self.queue = job_id, queue
        self.since, self.finished, self.asked = time.monotonic(), finished, told
        self.hint: str | None = None

    def check(self, finished: int) -> None:
        if finished != self.finished:  # progress: someone serves the queue
            self.finished, self.since = finished, time.monotonic()
            return
        if self.asked or time.monotonic() - self.since < NO_WORKER_HINT_AFTER_S:
            return
        self.asked = True
        self.hint = no_worker_hint(self.queue)
        if self.hint:
            log.warning("still waiting for job %s: %s", self.job_id, self.hint)
