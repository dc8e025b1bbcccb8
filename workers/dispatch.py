"""The fan-out: a job's sub-agent tasks go to the broker in pipelined batches, as one chord.

``submit`` does not publish the sub-agents itself: it stores the job and sends one
``drover.launch_job`` task, whose worker calls ``fan_out``. That keeps ``submit`` at a few
Redis round trips for any fan-out, and lets a cancel stop the dispatch half way.

Why not ``chord(header)(body)``: Celery publishes a header one message at a time, plus one
``task-sent`` event per task, each on a Redis client of its own, and it subscribes the sender
to every header task's result. Measured on this 2-core box: about 860 messages/s that way,
about 4,700/s with kombu's ``Producer.batch`` (one non-transactional Redis pipeline per
batch, the ``task-sent`` events included, so Flower still sees every task sent). The chord
stays Celery's own: the header messages carry the same ``chord``/``group`` fields that
Celery's canvas would put there, and the size is registered with the result backend's
``set_chord_size`` before the first message goes out, so the last sub-agent to finish sends
the join as usual.

Kombu refuses to batch on a connection that may replay a command (``retry_on_timeout``, which
drover's broker options set for everything else), since a replayed pipeline may deliver
twice. The fan-out uses a connection of its own without that option and, when a batch fails
half way, publishes the whole batch again: a sub-agent delivered twice is recorded once (the
job store's first write wins), and if the duplicates make the chord count to its size early,
the join finds records missing and retries until they are in.

The pieces are small on purpose (``open_fanout``, ``dispatch``, ``send_join``): a scheduler
that dispatches a job's sub-agents a few at a time (fair share between jobs) calls
``dispatch`` with the indexes it chooses and leaves the chord as it is.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from celery.canvas import Signature
from kombu import Connection
from kombu.exceptions import BatchPublishError, OperationalError
from redis.exceptions import RedisError

from workers.app import app
from workers.jobs.store import JobStore

__all__ = ["DISPATCH_BATCH", "FanOut", "dispatch", "fan_out", "join_signature", "open_fanout",
           "send_join"]

log = logging.getLogger("drover.dispatch")

SUBAGENT_TASK = "drover.run_subagent"
JOIN_TASK = "drover.join_results"
DISPATCH_BATCH = 500  # messages per pipeline; between batches the fan-out looks for a cancel
PUBLISH_ATTEMPTS = 40  # like task_publish_retry_policy: rides out a broker restart (~1 min)


def _chord_id(job_id: str) -> str:
    # One chord per job, named after it: a launch task delivered twice joins the same chord.
    return job_id


def join_signature(job_id: str, queue: str) -> Signature:
    """The chord body: ``join_results(header_results, job_id)`` on the job's queue."""
    return app.signature(JOIN_TASK, args=(job_id,),
                         options={"queue": queue, "ignore_result": True,
                                  "task_id": f"{job_id}-join", "group_id": _chord_id(job_id)})


def open_fanout(job_id: str, n: int) -> None:
    """Register the job's chord of ``n`` sub-agents with the result backend (before dispatch)."""
    app.backend.set_chord_size(_chord_id(job_id), n)


def send_join(job_id: str, queue: str) -> None:
    """Send the join outside the chord (a cancelled fan-out never counts to its size)."""
    app.signature(JOIN_TASK, args=([], job_id),
                  options={"queue": queue, "ignore_result": True}).apply_async()


_local = threading.local()


def _connection() -> Connection:
    """This thread's broker connection for batched publishing (made again after a fork)."""
    conn = getattr(_local, "conn", None)
    if conn is None or getattr(_local, "pid", None) != os.getpid():
        conn = app.connection_for_write(transport_options={"retry_on_timeout": False})
        _local.conn, _local.pid = conn, os.getpid()
    return conn


def _drop_connection() -> None:
    conn = getattr(_local, "conn", None)
    _local.conn = None
    if conn is not None:
        try:
            conn.release()
        except Exception:  # already broken: nothing to release
            pass


def dispatch(job_id: str, indexes: Iterable[int], queue: str) -> int:
    """Publish ``run_subagent(job_id, i)`` for each index, as members of the job's chord.

    One Redis pipeline per ``DISPATCH_BATCH`` messages; returns how many were published. At
    least once: a batch that fails is published again whole (see the module's docstring).
    """
    body = dict(join_signature(job_id, queue))
    options = {"queue": queue, "ignore_result": True, "chord": body,
               "group_id": _chord_id(job_id)}
    sent = 0
    batch: list[int] = []
    for index in indexes:
        batch.append(index)
        if len(batch) >= DISPATCH_BATCH:
            sent += _publish(job_id, batch, options)
            batch = []
    if batch:
        sent += _publish(job_id, batch, options)
    return sent


def _publish(job_id: str, indexes: Sequence[int], options: dict[str, Any]) -> int:
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            conn = _connection()
            producer = app.amqp.Producer(conn)
            with producer.batch(max_size=2 * len(indexes) + 2):  # messages + task-sent events
                for index in indexes:
                    app.send_task(SUBAGENT_TASK, args=(job_id, index), producer=producer,
                                  group_index=index, retry=False, **options)
            return len(indexes)
        except (BatchPublishError, OperationalError, RedisError, OSError) as error:
            # BatchPublishError: the pipeline failed and delivery is uncertain; the others:
            # the broker went away. Either way, a fresh connection and the whole batch again.
            _drop_connection()
            if attempt + 1 == PUBLISH_ATTEMPTS:
                raise
            log.warning("job %s: publishing %d sub-agents failed (%s: %s); again in a moment",
                        job_id, len(indexes), type(error).__name__, error)
            time.sleep(min(2.0, 0.5 * attempt))
    return 0  # unreachable: the last attempt raises


@dataclass
class FanOut:
    """What one ``fan_out`` call did."""

    dispatched: int  # sub-agents published by this call
    total: int  # the job's fan-out
    cancelled: bool  # stopped by a cancel before every sub-agent was out
    seconds: float


def fan_out(store: JobStore, job_id: str, queue: str, *, batch: int = DISPATCH_BATCH
            ) -> FanOut:
    """Dispatch the job's sub-agents from where an earlier delivery stopped, batch by batch.

    Between batches it looks for a cancel (or a passed deadline): then the sub-agents not yet
    out get their ``cancelled`` records in bulk and the join is sent at once, so the job ends
    without its remaining messages ever being published.
    """
    started = time.monotonic()
    meta = store.meta(job_id)
    n = int(meta.get("n", 0))
    done = int(meta.get("dispatched", 0))
    if done == 0 and n:
        open_fanout(job_id, n)
    sent = 0
    while done < n:
        if reason := store.cancelled(job_id):
            store.cancel_unstarted(job_id, reason)
            send_join(job_id, queue)
            return FanOut(sent, n, True, time.monotonic() - started)
        upto = min(n, done + batch)
        sent += dispatch(job_id, range(done, upto), queue)
        done = upto
        store.set_dispatched(job_id, done)
    return FanOut(sent, n, False, time.monotonic() - started)
