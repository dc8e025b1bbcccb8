"""Publishing a job's sub-agent tasks: pipelined batches, each message a member of the job's chord.

What to publish when is the fair-share scheduler's call (``workers/fairshare/scheduler.py``: the
first window at submit, one more each time a sub-agent finishes, the rest never for a
cancelled job); this module only makes each publish cheap and keeps the chord Celery's own.

Why not ``chord(header)(body)`` or ``sig.apply_async()`` per message: Celery publishes one
message at a time, plus one ``task-sent`` event per task, each on a Redis client of its own
(and a chord subscribes the sender to every header task's result). Measured on this 2-core
box: about 860 messages/s as a chord, 1,500/s with one producer, about 4,700/s with kombu's
``Producer.batch``: one non-transactional Redis pipeline per batch, the ``task-sent`` events
in it too, so Flower still sees every task sent. The messages carry the fields Celery's
canvas would put there (``chord`` = the join's signature, ``group`` = the job id,
``group_index``) and the size is registered with the result backend (``open_fanout``), so
the last member to finish sends the join as usual.

Kombu refuses to batch on a connection that may replay a command (``retry_on_timeout``, which
drover's broker options set for everything else), since a replayed pipeline may deliver
twice. Publishing here uses connections of its own without that option and, when a batch
fails half way, publishes the whole batch again: a sub-agent delivered twice is recorded
once (the job store's first write wins), and if the duplicates make the chord count to its
size early, the join finds records missing and retries until they are in.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from celery.canvas import Signature
from kombu import Producer
from kombu.exceptions import BatchPublishError, OperationalError
from redis.exceptions import RedisError

from drover.workers.tasklayer.app import app

__all__ = ["DISPATCH_BATCH", "dispatch", "join_argsrepr", "join_signature", "open_fanout",
           "retry_group", "send_join", "subagent_argsrepr"]

log = logging.getLogger(__name__)

SUBAGENT_TASK = "drover.run_subagent"
JOIN_TASK = "drover.join_results"
DISPATCH_BATCH = 500  # messages per pipeline; between batches the fan-out looks for a cancel
PUBLISH_ATTEMPTS = 40  # like task_publish_retry_policy: rides out a broker restart (~1 min)


def _chord_id(job_id: str) -> str:
    # One chord per job, named after it: a launch task delivered twice joins the same chord.
    return job_id


def subagent_argsrepr(job_id: str, index: int, n: int | str | None, note: str = "") -> str:
    """What Flower shows as a sub-agent task's args: ``sub=<i>/<n> job=<id>`` (i from 0).

    The real args stay ``(job_id, index)``; this is only their display (Celery's
    ``argsrepr``), searchable in Flower as ``args:job=<id>``. The index comes first: Flower's
    table cuts long args, and the 32-character job id would push it out of sight."""
    return f"sub={index}/{'?' if n is None else n} job={job_id}" + (f" {note}" if note else "")


def join_argsrepr(job_id: str, n: int | str | None = None) -> str:
    return f"job={job_id} join" + (f" of {n}" if n is not None else "")


def join_signature(job_id: str, queue: str, n: int | str | None = None,
                   group: str | None = None) -> Signature:
    """The chord body: ``join_results(job_id)`` on the job's queue, immutable, so its args
    are the job id and not the members' results (the join reads the records). ``group``:
    the chord's id (the job's; a retry's chord has its own, ``retry_group``)."""
    return app.signature(JOIN_TASK, args=(job_id,), immutable=True,
                         options={"queue": queue, "ignore_result": True,
                                  "task_id": f"{job_id}-join",
                                  "group_id": group or _chord_id(job_id),
                                  "argsrepr": join_argsrepr(job_id, n)})


def retry_group(job_id: str, round_: int) -> str:
    """The chord of a job's ``round_``-th retry (``drover retry``): a chord of its own, since
    the job's first one has counted to its size and ended."""
    return f"{job_id}.retry{round_}"


def open_fanout(job_id: str, n: int, group: str | None = None) -> None:
    """Register the job's chord of ``n`` sub-agents with the result backend (before dispatch)."""
    app.backend.set_chord_size(group or _chord_id(job_id), n)


def send_join(job_id: str, queue: str) -> None:
    """Send the join outside the chord (a cancelled fan-out never counts to its size)."""
    app.signature(JOIN_TASK, args=(job_id,), immutable=True,
                  options={"queue": queue, "ignore_result": True,
                           "argsrepr": join_argsrepr(job_id)}).apply_async()


_local = threading.local()
# Publishes that failed in this process so far. A failure is most often the broker's
# connections going silent or away, all of them at once: every thread's producer made before
# it is dropped on its next publish instead of waiting out a timeout of its own (on RabbitMQ
# each waited 10 s for a confirm, one thread after another, while the job's next sub-agents
# went unpublished: tests/system/test_silent_connections.py).
_failures = [0]


def _producer() -> Producer:
    """This thread's producer on a broker connection of its own (made again after a fork, and
    after any thread's publish failed since it was made)."""
    producer = getattr(_local, "producer", None)
    if producer is not None and getattr(_local, "made_after", -1) < _failures[0]:
        _drop_producer()
        producer = None
    if producer is None or getattr(_local, "pid", None) != os.getpid():
        made_after = _failures[0]
        conn = app.connection_for_write(transport_options={"retry_on_timeout": False})
        producer = app.amqp.Producer(conn)
        _local.producer, _local.pid, _local.made_after = producer, os.getpid(), made_after
    return producer


def _drop_producer() -> None:
    """Forget this thread's producer; its connection is closed without a word to the broker
    (a polite close waits for replies a silent connection never sends: 2 x 10 s)."""
    producer = getattr(_local, "producer", None)
    _local.producer = None
    if producer is not None:
        try:
            producer.connection.collect()
        except Exception:  # already broken: nothing to release
            pass


def dispatch(job_id: str, indexes: Iterable[int], queue: str, n: int | str | None = None,
             group: str | None = None) -> int:
    """Publish ``run_subagent(job_id, i)`` for each index, as members of the job's chord.

    ``n``, the job's size, is only for Flower's display of the args (``sub=<i>/<n>``).

    One Redis pipeline per ``DISPATCH_BATCH`` messages; returns how many were published. At
    least once: a batch that fails is published again whole (see the module's docstring).
    """
    body = dict(join_signature(job_id, queue, n, group))
    options = {"queue": queue, "ignore_result": True, "chord": body,
               "group_id": group or _chord_id(job_id)}
    sent = 0
    batch: list[int] = []
    for index in indexes:
        batch.append(index)
        if len(batch) >= DISPATCH_BATCH:
            sent += _publish(job_id, batch, options, n)
            batch = []
    if batch:
        sent += _publish(job_id, batch, options, n)
    return sent


def _publish(job_id: str, indexes: Sequence[int], options: dict[str, Any],
             n: int | str | None = None) -> int:
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            producer = _producer()
            with producer.batch(max_size=2 * len(indexes) + 2):  # messages + task-sent events
                for index in indexes:
                    app.send_task(SUBAGENT_TASK, args=(job_id, index), producer=producer,
                                  group_index=index, retry=False, add_to_parent=False,
                                  argsrepr=subagent_argsrepr(job_id, index, n), **options)
            return len(indexes)
        except (BatchPublishError, OperationalError, RedisError, OSError) as error:
            # BatchPublishError: the pipeline failed and delivery is uncertain; the others:
            # the broker went away. Either way, a fresh connection and the whole batch again
            # (for every thread: see _failures).
            _failures[0] += 1
            _drop_producer()
            if attempt + 1 == PUBLISH_ATTEMPTS:
                raise
            log.warning("job %s: publishing %d sub-agents failed (%s: %s); again in a moment",
                        job_id, len(indexes), type(error).__name__, error)
            time.sleep(min(2.0, 0.5 * attempt))
    return 0  # unreachable: the last attempt raises
