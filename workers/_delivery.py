"""A delivery's claim on its part of a job (a sub-agent, the join, the plan): the token
its message carries, taking and handing back the claim, and the retries that keep it
(``workers/jobs/claims.py`` holds the claims)."""

from __future__ import annotations

import math
from typing import Any

from celery import Task

from drover.workers.agent import RetryLater, get_runtime
from drover.workers.jobs import TOKEN_HEADER, local_worker

__all__ = ["claim_part", "drop_claim", "release", "retry", "token_of", "with_token"]


def retry(task: Task, later: RetryLater, claim: tuple[str, int | str, int] | None = None
          ) -> Exception:
    """A Celery retry that says why, in Flower and in the task's retry exception.

    Every countdown drover schedules goes through here and is capped at
    ``DROVER_COUNTDOWN_CAP_S``, the one the settings check holds below the broker's
    visibility timeout. The argsrepr is handed on (Celery's retry would recompute it).
    With ``claim`` (job id, part, token), the new message carries the part's claim token and
    the claim then says it is on the broker (workers/jobs/claims.py)."""
    settings = get_runtime().settings
    countdown = min(later.countdown, settings.countdown_cap_s)
    if countdown > 0 and settings.broker_is_rabbitmq:
        countdown = float(math.ceil(countdown))  # whole seconds there (see config/celery.py)
    options: dict[str, Any] = {}
    if claim is not None:
        options["headers"] = with_token(task, claim[2])
    again = task.retry(exc=later, countdown=countdown, max_retries=None, throw=False,
                       argsrepr=getattr(task.request, "argsrepr", None) or None, **options)
    if claim is not None:
        release(*claim)
    return again


def token_of(task: Task) -> int:
    """The claim token the message of this delivery carries (0: not re-sent or retried yet)."""
    headers = task.request.headers or {}
    return int(headers.get(TOKEN_HEADER) or getattr(task.request, TOKEN_HEADER, 0) or 0)


def with_token(task: Task, token: int) -> dict[str, Any]:
    return {**(task.request.headers or {}), TOKEN_HEADER: token}


def release(job_id: str, part: int | str, token: int) -> None:
    if token:
        rt = get_runtime()
        rt.store.claims.release(job_id, part, token, local_worker(rt.settings).id)


def claim_part(task: Task, job_id: str, part: str) -> int | None:
    """Take the claim of a job-level part (join, plan); None when another delivery holds it."""
    rt = get_runtime()
    token = int(rt.store.claims.start(job_id, part, token_of(task),
                                      local_worker(rt.settings).id))
    return token if token > 0 else None


def drop_claim(job_id: str, part: str) -> None:
    rt = get_runtime()
    rt.store.claims.drop(job_id, part, local_worker(rt.settings).id)
