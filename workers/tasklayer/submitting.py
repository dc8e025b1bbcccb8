"""What a submitting process sends: a job's first window of sub-agents, or its plan task.

The tasks go by name (``drover.plan_job``; the sub-agents through ``dispatch``), so the
process that submits never imports ``tasks.py`` and, through it, the agent loop and the
provider SDKs: a first ``submit`` costs its Redis and broker round trips, not seconds of
imports (bench/first_submit.py; tests/unit/test_architecture.py checks what it loads).
"""

from __future__ import annotations

from drover.workers.tasklayer._window import launch
from drover.workers.tasklayer.app import app

__all__ = ["PLAN_TASK", "launch", "send_plan"]

PLAN_TASK = "drover.plan_job"  # tasks.plan_job's name


def send_plan(job_id: str, queue: str) -> None:
    """Send the planning task of a job submitted with a goal."""
    app.signature(PLAN_TASK, args=(job_id,), options={"queue": queue, "ignore_result": True}
                  ).apply_async()
