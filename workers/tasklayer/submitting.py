"""What a submitting process sends: a job's first window of sub-agents, or its plan task.

The tasks go by name (``drover.plan_job``; the sub-agents through ``dispatch``), so the
process that submits never imports ``tasks.py`` and, through it, the agent loop and the
provider SDKs: a first ``submit`` costs its Redis and broker round trips, not seconds of
imports (bench/first_submit.py; tests/unit/test_architecture.py checks what it loads).
"""

from __future__ import annotations

from drover.workers.tasklayer._window import job_size, launch, publish_granted
from drover.workers.tasklayer.app import app
from drover.workers.tasklayer.dispatch import dispatch, open_fanout, retry_group

__all__ = ["PLAN_TASK", "launch", "publish_granted", "relaunch", "send_plan"]

PLAN_TASK = "drover.plan_job"  # tasks.plan_job's name


def send_plan(job_id: str, queue: str) -> None:
    """Send the planning task of a job submitted with a goal."""
    app.signature(PLAN_TASK, args=(job_id,), options={"queue": queue, "ignore_result": True}
                  ).apply_async()


def relaunch(job_id: str, indexes: list[int], queue: str, round_: int) -> None:
    """Send a reopened job's sub-agents again (``drover retry``), as a chord of their own
    joined by the job's join. They go out at once, outside the fair-share window: the job
    was given its places when it ran, and a retry is the few that did not end ok."""
    group = retry_group(job_id, round_)
    open_fanout(job_id, len(indexes), group)
    dispatch(job_id, indexes, queue, n=job_size(job_id), group=group)
