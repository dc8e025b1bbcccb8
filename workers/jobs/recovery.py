"""Sub-agents whose task message the broker lost: found and sent again.

Celery's Redis transport takes a message off the queue (BRPOP) before it records it as
unacked, so a worker killed between the two loses that message for good (celery#4354,
celery#7950, kombu#305); the visibility timeout cannot bring it back, the broker no longer has
it. The same goes for a task that was acked without leaving a record (a retry that could not
be published while the broker was away ends as a rejected message).

So every ``celery worker`` process runs a small sweep in a thread (one worker per queue and
interval does the work, under a Redis lock). A running job of the worker's queue that has not
gained a record for ``DROVER_RESEND_AFTER_S`` is looked at: each unfinished sub-agent whose
task is neither in the queue nor unacked (running, prefetched or waiting out a retry
countdown: the broker itself redelivers those) is sent again. It resumes from its checkpoint
and its record is stored once. A sub-agent sent again ``DROVER_MAX_ATTEMPTS`` times gets a
``failed`` record instead, so a poisoned task cannot keep a job open.

A re-sent task is outside the job's chord, which then never counts to the end: a job whose
records are all in but that has no result after the same wait gets its join sent again (the
join is idempotent).

The broker is read with kombu's Redis layout: ``{prefix}:celery:{queue}`` lists (plus one per
priority step) and the ``{prefix}:celery:unacked`` hash.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from config import Settings, get_settings
from workers.jobs.connections import sync_redis
from workers.jobs.fairshare import FairShare
from workers.jobs.records import SubagentResult
from workers.jobs.store import ACTIVE, JobStore

log = logging.getLogger("drover.recovery")

SUBAGENT_TASK = "drover.run_subagent"
KOMBU_SEP = "\x06\x16"  # kombu's separator between a queue name and its priority step
KOMBU_PRIORITY_STEPS = (3, 6, 9)  # step 0 is the plain queue
RECENT_JOBS = 200  # the sweep looks at this many of the newest jobs

Send = Callable[[str, str, int | None], None]  # (queue, job_id, index or None for the join)


def sweep_interval_s(settings: Settings) -> float:
    return max(1.0, min(30.0, settings.resend_after_s / 4))


def subagent_of(message: dict[str, Any]) -> tuple[str, int] | None:
    """(job id, index) of a ``run_subagent`` message in kombu's JSON envelope, else None."""
    if (message.get("headers") or {}).get("task") != SUBAGENT_TASK:
        return None
    body = message.get("body")
    if (message.get("properties") or {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args = json.loads(body)[0]  # Celery's message protocol 2: [args, kwargs, embed]
    return str(args[0]), int(args[1])


def subagents_in_broker(r: redis.Redis, key_prefix: str, queue: str) -> set[tuple[str, int]]:
    """Every sub-agent task the broker still holds for ``queue``: queued or unacked."""
    base = f"{key_prefix}:celery:"
    raws: list[Any] = []
    for key in [queue, *(f"{queue}{KOMBU_SEP}{step}" for step in KOMBU_PRIORITY_STEPS)]:
        raws.extend(json.loads(raw) for raw in r.lrange(base + key, 0, -1))
    raws.extend(json.loads(raw)[0] for raw in r.hvals(base + "unacked"))
    found = set()
    for message in raws:
        try:
            subagent = subagent_of(message)
        except (ValueError, TypeError, KeyError, IndexError):
            continue  # not a message of ours
        if subagent is not None:
            found.add(subagent)
    return found


def sweep(store: JobStore, settings: Settings, send: Send) -> list[tuple[str, int | None]]:
    """One pass over the recent jobs of ``settings.queue``; returns what was sent again."""
    r = store.r
    lock = f"{store.prefix}:recovery:{settings.queue}"
    if not r.set(lock, "1", nx=True, px=int(sweep_interval_s(settings) * 900)):
        return []  # another worker swept this queue a moment ago
    fairshare = FairShare.from_settings(r, settings)
    now = store.server_time()
    in_broker: set[tuple[str, int]] | None = None
    sent: list[tuple[str, int | None]] = []
    for job_id in store.jobs(limit=RECENT_JOBS):
        meta = _meta(store, job_id)
        if (meta.get("status") not in ACTIVE or meta.get("queue") != settings.queue
                or "launched" not in meta):
            continue
        n, done = int(meta["n"]), store.record_count(job_id)
        if not _stalled(store, job_id, done, now, settings.resend_after_s):
            continue
        if done >= n:
            if store.result(job_id) is None:
                send(settings.queue, job_id, None)
                sent.append((job_id, None))
            continue
        if in_broker is None:
            in_broker = subagents_in_broker(r, store.prefix, settings.queue)
        recorded = {int(i) for i in r.hkeys(store.key(job_id, "records"))}
        # Parked sub-agents wait for a Message Batch, task-less on purpose: the batcher
        # resumes them (workers/agent/batch.py).
        recorded |= {int(i) for i in r.hkeys(store.key(job_id, "bpark"))}
        # Sub-agents the fair-share window has not published yet are not lost, only waiting.
        dispatched = fairshare.dispatched(job_id)
        for index in range(n if dispatched is None else min(n, dispatched)):
            if index in recorded or (job_id, index) in in_broker:
                continue
            if store.add_resend(job_id, index) > settings.max_attempts:
                _give_up(store, job_id, index, settings.max_attempts)
                continue
            send(settings.queue, job_id, index)
            sent.append((job_id, index))
    return sent


def _meta(store: JobStore, job_id: str) -> dict[str, str]:
    try:
        return store.meta(job_id)
    except LookupError:  # expired
        return {}


def _stalled(store: JobStore, job_id: str, done: int, now: float, after_s: float) -> bool:
    """True once the job has kept ``done`` records for ``after_s`` (then the wait restarts)."""
    key = store.key(job_id, "sweep")
    seen = store.r.hgetall(key)
    count = int(seen.get(b"records", -1)) if seen else -1
    since = float(seen.get(b"since", now)) if seen else now
    if count != done or now - since < after_s:
        if count != done:
            store.r.hset(key, mapping={"records": done, "since": now})
            store.r.expire(key, store.ttl_s)
        return False
    store.r.hset(key, "since", now)  # act at most once per wait
    return True


def _give_up(store: JobStore, job_id: str, index: int, attempts: int) -> None:
    message = (f"the task of this sub-agent was lost by the broker {attempts} times "
               "(no record, not queued, not unacked); gave up")
    log.error("sub-agent %s/%d: %s", job_id, index, message)
    store.finish(SubagentResult(job_id=job_id, index=index, status="failed", attempts=attempts,
                                error_type="task_lost", error=message, finished_at=time.time()))


_started = threading.Lock()
_thread: threading.Thread | None = None


def start_sweeper(send: Send, settings: Settings | None = None) -> None:
    """Start this process's sweeper thread (once); called when a worker is ready.

    ``send`` puts a task on the broker again (the tasks module passes Celery's; this package
    knows no Celery)."""
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return
        settings = settings or get_settings()
        _thread = threading.Thread(target=_sweep_forever, args=(settings, send),
                                   name="drover-recovery", daemon=True)
        _thread.start()


def _sweep_forever(settings: Settings, send: Send) -> None:
    store = JobStore(sync_redis(settings.redis_url), prefix=settings.key_prefix,
                     ttl_s=settings.result_ttl_s)
    interval = sweep_interval_s(settings)
    while True:
        time.sleep(interval * random.uniform(0.8, 1.2))
        try:
            sweep(store, settings, send)
        except Exception as error:  # Redis away, a broker hiccup: try again next time
            log.warning("recovery sweep failed (%s: %s)", type(error).__name__, error)

