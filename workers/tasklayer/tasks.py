"""The Celery tasks: a sub-agent, the join (the chord's body), the plan of a job with a goal,
and re-sending a part of a job. They carry ids only: prompts and state live in Redis
(``workers/jobs/store.py``). What the worker process does around them is in
``workers/tasklayer/lifecycle.py``."""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Task, signature
from celery.exceptions import Ignore

from drover.config import get_settings
from drover.workers.agent import (
    CallFailed,
    Cancelled,
    Incomplete,
    LimiterSaysLater,
    Parked,
    RetryableFailure,
    RetryLater,
    SubagentRun,
    get_runtime,
    join,
    plan_job_goal,
)
from drover.workers.agent.batch import PLAN_PART, SYNTHESIS_PART
from drover.workers.agent.errors import CostCapReached
from drover.workers.clients import subagent_client
from drover.workers.jobs import TOKEN_HEADER, ClaimLost, SubagentResult
from drover.workers.tasklayer._delivery import (
    claim_part,
    drop_claim,
    release,
    retry,
    token_of,
    with_token,
)
from drover.workers.tasklayer._logs import configure_logging
from drover.workers.tasklayer._window import job_size, launch, refill, window_op
from drover.workers.tasklayer.app import app
from drover.workers.tasklayer.dispatch import join_argsrepr, subagent_argsrepr
from drover.workers.tasklayer.submitting import PLAN_TASK

__all__ = ["join_results", "launch", "plan_job", "resume_parked", "run_subagent", "send_again",
           "subagent_task_result"]

log = logging.getLogger(__name__)
# The provider SDKs, imported above through the agent loop, set their loggers' levels from
# their own environment variables on import: ours win, as when the app was built.
configure_logging(get_settings())


ERROR_CHARS = 160  # of a failed sub-agent's error in its task result (Flower's Result column)
FAILED_SHOWN = 20  # failed indexes a join's task result names


def subagent_task_result(outcome: SubagentResult) -> dict[str, Any]:
    """The task's return value: status first, so Flower's Result column starts with it.

    Celery allows no task state but SUCCESS for a chord member whose chord must still run
    its body (FAILURE makes the Redis backend fail the chord; a custom state needs
    ``Ignore``, which never counts the chord part), so a ``failed`` sub-agent is a SUCCESS
    task whose result reads ``{'status': 'failed', 'error': ...}``. Ids, status and the
    error in words only: no model text (the records in the job store have the rest)."""
    out: dict[str, Any] = {"status": outcome.status}
    if outcome.status != "ok":
        what = " ".join(str(p) for p in (outcome.status_code, outcome.error_type) if p)
        error = f"{what}: {outcome.error or outcome.status}" if what else (outcome.error or "")
        out["error"] = error[:ERROR_CHARS]
    out.update(job_id=outcome.job_id, index=outcome.index, attempts=outcome.attempts,
               calls=outcome.usage.calls)
    return out


@app.task(name="drover.run_subagent", bind=True, max_retries=None)
def run_subagent(self: Task, job_id: str, index: int) -> dict[str, Any]:
    rt = get_runtime(app.drover)
    if self.request.retries:  # back from a countdown (or re-sent, maybe from one): on a slot
        window_op(rt.shared, job_id, "resume", index)
    run = SubagentRun(rt, job_id, index, token=token_of(self), own_client=subagent_client)
    try:
        outcome = rt.run(run.run())
    except ClaimLost:  # a late copy: another delivery runs (or ran) this sub-agent
        log.warning("sub-agent %s/%d: a late copy of its task (another delivery holds its "
                    "claim or it has finished); this one stops without a call", job_id, index)
        return {"status": "superseded", "job_id": job_id, "index": index}
    except Parked:
        # Its request waits in a Message Batch: keep what resumes this very task (same id,
        # same chord, its claim token) and end without counting towards the chord; the
        # batcher sends it again when the result is in (workers/agent/batch.py).
        rt.shared.batches.park(job_id, index, json.dumps(self.signature_from_request(
            argsrepr=getattr(self.request, "argsrepr", None) or None,  # Flower's args
            headers=with_token(self, run.token))))
        release(job_id, index, run.token)
        raise Ignore() from None
    except RetryLater as later:
        window_op(rt.shared, job_id, "defer", index)  # its slot is free while it waits
        raise retry(self, later, (job_id, index, run.token)) from None
    # A failed sub-agent may have ended its job (its only key refused, all_or_nothing): the
    # job is then cancelled too, and its sub-agents never published need the join sent. So
    # may an ok one: a call in flight when its key's spend limit ended the job finishes.
    ended = outcome.status == "cancelled" or bool(rt.store.meta.get(job_id).get("cancelled"))
    refill(rt.shared, job_id, cancelled=ended, done=run.records_in)
    return subagent_task_result(outcome)


@app.task(name="drover.join_results", bind=True, max_retries=None)
def join_results(self: Task, *args: Any) -> dict[str, Any]:
    """The chord body, an immutable signature: ``(job_id,)``.

    (A message sent before the join was immutable has the header results first: the job id
    is the last argument either way. The join reads the records from the job store.)"""
    job_id = args[-1]
    rt = get_runtime(app.drover)
    token = claim_part(self, job_id, "join")
    if token is None:  # a late copy: another join of this job holds the claim
        return {"status": "superseded", "job_id": job_id}
    try:
        result = rt.run(join(rt, job_id))
    except Parked:  # a batch job's synthesis waits in a Message Batch: resumed when it is in
        _park(self, rt, job_id, SYNTHESIS_PART, "join", token)
    except Incomplete as early:
        raise retry(self, LimiterSaysLater(1.0, f"join: {early}"), (job_id, "join", token)
                     ) from None
    drop_claim(job_id, "join")
    failed = [r.index for r in result.results if r.status == "failed"]
    out: dict[str, Any] = {"status": result.status, "failed_indexes": failed[:FAILED_SHOWN]}
    if len(failed) > FAILED_SHOWN:
        out["failed_more"] = len(failed) - FAILED_SHOWN
    out.update(counts=result.counts, job_id=job_id)
    return out


@app.task(name=PLAN_TASK, bind=True, max_retries=None)
def plan_job(self: Task, job_id: str) -> dict[str, Any]:
    """Plan a job that was submitted with a goal, then fan it out."""
    rt = get_runtime(app.drover)
    spec = rt.store.specs.get(job_id)
    if rt.store.meta.get(job_id).get("status") != "planning":  # delivered twice: launched once
        return {"status": "launched", "job_id": job_id}
    failures = self.request.retries or 0  # earlier deliveries of this plan were retries
    token = claim_part(self, job_id, "plan")
    if token is None:  # a late copy: another delivery plans this job
        return {"status": "superseded", "job_id": job_id}
    try:
        subtasks = rt.run(plan_job_goal(rt, job_id, spec, failures=failures))
    except Parked:  # a batch job's planning waits in a Message Batch: resumed when it is in
        _park(self, rt, job_id, PLAN_PART, "plan", token)
    except RetryableFailure as failure:
        if failures + 1 >= rt.settings.max_attempts:
            rt.store.outcomes.fail(job_id, f"planning failed: gave up after {failures + 1} "
                                           f"attempts; last error: {failure.decision.message}")
            return {"status": "failed", "job_id": job_id}
        raise retry(self, failure, (job_id, "plan", token)) from None
    except RetryLater as later:
        raise retry(self, later, (job_id, "plan", token)) from None
    except Cancelled:  # cancelled (or out of time) before it fanned out: nothing to join
        rt.store.outcomes.fail(job_id, rt.store.cancels.cancelled(job_id) or "cancelled",
                               status="cancelled")
        return {"status": "cancelled", "job_id": job_id}
    except (CallFailed, CostCapReached, ValueError) as error:
        rt.store.outcomes.fail(job_id, f"planning failed: {error}")
        return {"status": "failed", "job_id": job_id}
    if reason := rt.store.cancels.cancelled(job_id):  # the cancel came just as the plan did
        rt.store.outcomes.fail(job_id, reason, status="cancelled")
        return {"status": "cancelled", "job_id": job_id}
    rt.store.specs.set_subtasks(job_id, subtasks)
    if rt.store.meta.claim_launch(job_id):
        launch(job_id, len(subtasks), rt.settings.queue, tenant=spec.tenant or "default",
               priority=spec.priority or "normal", shared=rt.shared)
    drop_claim(job_id, "plan")
    return {"status": "launched", "job_id": job_id, "subtasks": len(subtasks)}


def _park(task: Task, rt: Any, job_id: str, part: int, claim: str, token: int) -> None:
    """Keep what resumes this very task (its id, its claim token) for the batcher, let go of
    the claim, and end the task without a result (``Ignore``)."""
    rt.shared.batches.park(job_id, part, json.dumps(task.signature_from_request(
        argsrepr=getattr(task.request, "argsrepr", None) or None,
        headers=with_token(task, token))))
    release(job_id, claim, token)
    raise Ignore() from None


def send_again(queue: str, job_id: str, part: int | str, token: int) -> None:
    """Put a part of a job (a sub-agent's index, "join" or "plan") on the broker again, its
    message carrying the claim ``token`` the recovery sweep took for it (its worker died, or
    the broker lost its message)."""
    options = {"queue": queue, "ignore_result": True, "headers": {TOKEN_HEADER: token}}
    if part == "join":
        join_results.si(job_id).set(argsrepr=join_argsrepr(job_id, job_size(job_id))
                                    + " resent", **options).apply_async()
    elif part == "plan":
        plan_job.s(job_id).set(**options).apply_async()
    else:
        # A new task (the lost one cannot be retried): its args say why it exists. It counts
        # as a retry, so it "resumes" in the fair-share window: the lost copy may have been
        # waiting out a countdown there (a resume of one that was not changes nothing).
        run_subagent.s(job_id, int(part)).set(argsrepr=subagent_argsrepr(
            job_id, int(part), job_size(job_id), "resent: its worker or message was lost"),
            retries=1, **options).apply_async()


def resume_parked(raw: str) -> None:
    """Send a parked sub-agent's saved signature again (its batch result is in)."""
    signature(json.loads(raw), app=app).apply_async()
