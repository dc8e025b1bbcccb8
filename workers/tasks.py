"""The Celery tasks. They carry ids only: prompts and state live in Redis (see store.py)."""

from __future__ import annotations

import importlib
import logging
from typing import Any

from celery import Task, chord
from celery.signals import worker_process_init, worker_ready

from workers.agent import (
    CallFailed,
    Cancelled,
    Incomplete,
    RetryLater,
    SubagentRun,
    get_runtime,
    join,
    plan_job_goal,
)
from workers.app import app
from workers.jobs import start_sweeper
from workers.telemetry import worker_started

__all__ = ["import_tool_modules", "join_results", "launch", "plan_job", "run_subagent",
           "send_again"]

log = logging.getLogger("drover.recovery")


def import_tool_modules() -> None:
    """Import the modules named in DROVER_TOOL_MODULES so their @tool functions register."""
    for name in get_runtime().settings.tool_modules:
        importlib.import_module(name)


@worker_ready.connect
@worker_process_init.connect
def _on_worker_start(sender: Any = None, **_: Any) -> None:
    import_tool_modules()
    worker_started(sender)  # traces when asked for; the heartbeat that counts it alive
    start_sweeper(send_again)  # re-sends tasks the broker lost (see workers/jobs/recovery.py)


@app.task(name="drover.run_subagent", bind=True, max_retries=None)
def run_subagent(self: Task, job_id: str, index: int) -> dict[str, Any]:
    rt = get_runtime()
    try:
        outcome = rt.run(SubagentRun(rt, job_id, index).run())
    except RetryLater as later:
        raise self.retry(countdown=later.countdown, max_retries=None) from None
    # The chord hands these to join_results as its argument, which Flower shows: ids, status
    # and counts only, no model text (the join reads the full records from the job store).
    return {"job_id": job_id, "index": index, "status": outcome.status,
            "calls": outcome.usage.calls}


@app.task(name="drover.join_results", bind=True, max_retries=None)
def join_results(self: Task, results: list[dict[str, Any]], job_id: str) -> dict[str, Any]:
    rt = get_runtime()
    try:
        result = rt.run(join(rt, job_id))
    except Incomplete:
        raise self.retry(countdown=1.0, max_retries=None) from None
    return result.model_dump(mode="json", include={"job_id", "status", "counts"})


def launch(job_id: str, n: int, queue: str) -> None:
    """Send the chord: one sub-agent task per subtask, joined by ``join_results``.

    Results go to the job's records in Redis, not to Celery's result backend
    (``ignore_result``); the chord still counts its header tasks, which the backend does
    whether results are kept or not.
    """
    options = {"queue": queue, "ignore_result": True}
    header = [run_subagent.s(job_id, i).set(**options) for i in range(n)]
    sent = chord(header)(join_results.s(job_id).set(**options))
    _forget_header_results(sent.backend, [r.id for r in getattr(sent.parent, "results", ())])


def _forget_header_results(backend: Any, task_ids: list[str]) -> None:
    """Drop the result subscriptions Celery made for a chord's header in this process.

    The Redis result backend's ``apply_chord`` builds a GroupResult whose ready barrier
    subscribes the sending process to every header task's result channel and keeps each
    AsyncResult until its result arrives. Nothing here waits on them (records come from the
    job store), so a long-lived submitter would pile up subscriptions, and they would try to
    unsubscribe when collected, perhaps after Redis has gone away.
    """
    pending = getattr(backend, "_pending_results", None)
    consumer = getattr(backend, "result_consumer", None)
    if pending is None or consumer is None:
        return
    for mapping in pending:
        for task_id in task_ids:
            mapping.pop(task_id, None)
    for task_id in task_ids:
        consumer.cancel_for(task_id)


@app.task(name="drover.plan_job", bind=True, max_retries=None)
def plan_job(self: Task, job_id: str) -> dict[str, Any]:
    """Plan a job that was submitted with a goal, then fan it out."""
    rt = get_runtime()
    spec = rt.store.spec(job_id)
    if rt.store.meta(job_id).get("status") != "planning":  # delivered twice: launched once
        return {"job_id": job_id, "status": "launched"}
    try:
        subtasks = rt.run(plan_job_goal(rt, job_id, spec))
    except RetryLater as later:
        raise self.retry(countdown=later.countdown, max_retries=rt.settings.max_attempts
                         ) from None
    except Cancelled:  # cancelled (or out of time) before it fanned out: nothing to join
        rt.store.fail_job(job_id, rt.store.cancelled(job_id) or "cancelled", status="cancelled")
        return {"job_id": job_id, "status": "cancelled"}
    except (CallFailed, ValueError) as error:
        rt.store.fail_job(job_id, f"planning failed: {error}")
        return {"job_id": job_id, "status": "failed"}
    if reason := rt.store.cancelled(job_id):  # the cancel came just as the plan did
        rt.store.fail_job(job_id, reason, status="cancelled")
        return {"job_id": job_id, "status": "cancelled"}
    rt.store.set_subtasks(job_id, subtasks)
    if rt.store.claim_launch(job_id):
        launch(job_id, len(subtasks), rt.settings.queue)
    return {"job_id": job_id, "status": "launched", "subtasks": len(subtasks)}


def send_again(queue: str, job_id: str, index: int | None) -> None:
    """Put a lost sub-agent (or, with ``index`` None, the join) on the broker again."""
    if index is None:
        log.warning("job %s: every record is in but the join never ran; sending it again",
                    job_id)
        join_results.s([], job_id).set(queue=queue, ignore_result=True).apply_async()
    else:
        log.warning("sub-agent %s/%d: its task is gone from the broker; sending it again",
                    job_id, index)
        run_subagent.s(job_id, index).set(queue=queue, ignore_result=True).apply_async()
