"""The Celery tasks. They carry ids only: prompts and state live in Redis (see store.py)."""

from __future__ import annotations

import importlib
from typing import Any

from celery import Task, chord
from celery.signals import worker_process_init, worker_ready

from workers.agent import SubagentRun
from workers.app import app
from workers.join import Incomplete, join
from workers.llm import CallFailed, Cancelled, RetryLater
from workers.planning import plan_goal
from workers.runtime import get_runtime


def import_tool_modules() -> None:
    """Import the modules named in DROVER_TOOL_MODULES so their @tool functions register."""
    for name in get_runtime().settings.tool_modules:
        importlib.import_module(name)


@worker_ready.connect
@worker_process_init.connect
def _on_worker_start(**_: Any) -> None:
    import_tool_modules()


@app.task(name="drover.run_subagent", bind=True, max_retries=None)
def run_subagent(self: Task, job_id: str, index: int) -> dict[str, Any]:
    rt = get_runtime()
    outcome = rt.run(SubagentRun(rt, job_id, index).run())
    if isinstance(outcome, RetryLater):
        raise self.retry(countdown=outcome.countdown, max_retries=None)
    return outcome.model_dump(mode="json")


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

    Results go to the job's records in Redis, not to Celery's result backend: with
    ``ignore_result`` the sender does not subscribe to thousands of result channels, and the
    chord still counts its header tasks (the backend does that whether results are kept).
    """
    options = {"queue": queue, "ignore_result": True}
    header = [run_subagent.s(job_id, i).set(**options) for i in range(n)]
    chord(header)(join_results.s(job_id).set(**options))


@app.task(name="drover.plan_job", bind=True, max_retries=None)
def plan_job(self: Task, job_id: str) -> dict[str, Any]:
    """Plan a job that was submitted with a goal, then fan it out."""
    rt = get_runtime()
    spec = rt.store.spec(job_id)
    if rt.store.meta(job_id).get("status") != "planning":  # delivered twice: launched once
        return {"job_id": job_id, "status": "launched"}
    assert spec.goal is not None
    try:
        subtasks = rt.run(plan_goal(rt, spec.goal, spec.max_subtasks, model=spec.model,
                                    system=spec.system, job_id=job_id))
    except RetryLater as later:
        raise self.retry(countdown=later.countdown, max_retries=rt.settings.max_attempts
                         ) from None
    except (CallFailed, Cancelled, ValueError) as error:
        rt.store.fail_job(job_id, f"planning failed: {error}")
        return {"job_id": job_id, "status": "failed"}
    rt.store.set_subtasks(job_id, subtasks)
    if rt.store.claim_launch(job_id):
        launch(job_id, len(subtasks), rt.settings.queue)
    return {"job_id": job_id, "status": "launched", "subtasks": len(subtasks)}
