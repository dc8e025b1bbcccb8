"""A delivery's claim on its part of a job (a sub-agent, the join, the plan): the token
its message carries, taking and handing back the claim, and the retries that keep it
(``workers/jobs/claims.py`` holds the claims)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from celery import Task
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from drover.workers.agent import RetryLater, get_runtime
from drover.workers.jobs import TOKEN_HEADER
from drover.workers.tasklayer.app import app

__all__ = ["claim_part", "drop_claim", "release", "retry", "token_of", "with_token"]

log = logging.getLogger(__name__)

PUBLISH_PAUSE_MAX_S = 10.0  # between tries of a retry's message while the broker is away


def retry(task: Task, later: RetryLater, claim: tuple[str, int | str, int] | None = None
          ) -> Exception:
    """A Celery retry that says why, in Flower and in the task's retry exception.

    Every countdown drover schedules goes through here and is capped at
    ``DROVER_COUNTDOWN_CAP_S``, the one the settings check holds below the broker's
    visibility timeout. The argsrepr is handed on (Celery's retry would recompute it).
    With ``claim`` (job id, part, token), the new message carries the part's claim token and
    the claim then says it is on the broker (workers/jobs/claims.py)."""
    settings = get_runtime(app.drover).settings
    countdown = min(later.countdown, settings.countdown_cap_s)
    if countdown > 0 and settings.broker_is_rabbitmq:
        countdown = float(math.ceil(countdown))  # whole seconds there (see config/celery.py)
    options: dict[str, Any] = {}
    if claim is not None:
        options["headers"] = with_token(task, claim[2])
    again = _published(task, exc=later, countdown=countdown, max_retries=None, throw=False,
                       argsrepr=getattr(task.request, "argsrepr", None) or None, **options)
    if claim is not None:
        release(*claim)
    return again


def _published(task: Task, **options: Any) -> Exception:
    """``task.retry`` again, with a pause, until its message is on the broker.

    When the broker is away for longer than kombu's connect timeout (``default_channel``
    gives up after ``broker_connection_timeout``, whatever the publish retry policy says),
    Celery's retry rejects the message this delivery came on. That must not end the part: its
    claim still says "running" on this live worker, so no sweep would send it again, the
    broker's own copy of the message is stale, and a rejected task fails the job's chord. So
    this delivery keeps the part and tries again for as long as the worker runs; a worker
    that is shutting down gives up (its heartbeat then goes, and the sweep takes the part
    over)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return task.retry(**options)
        except Reject as rejected:
            if not isinstance(rejected.reason, OperationalError) or _shutting_down():
                raise
            pause = min(PUBLISH_PAUSE_MAX_S, float(attempt))
            log.warning("%s: the broker is away, its retry could not be sent (%s); trying "
                        "again in %.0f s", getattr(task.request, "argsrepr", None) or task.name,
                        rejected.reason, pause)
            time.sleep(pause)


def _shutting_down() -> bool:
    return get_runtime(app.drover).shared.heartbeat().draining


def token_of(task: Task) -> int:
    """The claim token the message of this delivery carries (0: not re-sent or retried yet)."""
    headers = task.request.headers or {}
    return int(headers.get(TOKEN_HEADER) or getattr(task.request, TOKEN_HEADER, 0) or 0)


def with_token(task: Task, token: int) -> dict[str, Any]:
    return {**(task.request.headers or {}), TOKEN_HEADER: token}


def release(job_id: str, part: int | str, token: int) -> None:
    if token:
        rt = get_runtime(app.drover)
        rt.store.claims.release(job_id, part, token, rt.shared.heartbeat().id)


def claim_part(task: Task, job_id: str, part: str) -> int | None:
    """Take the claim of a job-level part (join, plan); None when another delivery holds it."""
    rt = get_runtime(app.drover)
    token = int(rt.store.claims.start(job_id, part, token_of(task),
                                      rt.shared.heartbeat().id))
    return token if token > 0 else None


def drop_claim(job_id: str, part: str) -> None:
    rt = get_runtime(app.drover)
    rt.store.claims.drop(job_id, part, rt.shared.heartbeat().id)
