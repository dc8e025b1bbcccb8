"""``plan(goal, max_subtasks=N)``: split a goal into at most N subtasks, from any process."""

from __future__ import annotations

import time

from drover.config import get_settings
from drover.errors import PlanningFailed
from drover.orchestrator.client.jobs import submitter_services
from drover.workers.agent import RetryLater
from drover.workers.agent.planning import plan_goal
from drover.workers.agent.runtime import get_runtime


def plan(goal: str, max_subtasks: int = 8, *, model: str | None = None,
         system: str | None = None) -> list[str]:
    """Ask the model (through the global limiter) for at most ``max_subtasks`` subtasks."""
    if not goal.strip():
        raise ValueError("plan() needs a non-empty goal")
    if max_subtasks < 1:
        raise ValueError("max_subtasks must be at least 1")
    rt = get_runtime(submitter_services(get_settings()))  # the submitter's root (jobs.py)
    for _ in range(rt.settings.max_attempts):
        try:
            return rt.run(plan_goal(rt, goal, max_subtasks, model=model, system=system))
        except RetryLater as later:  # no Celery here to retry for us: wait in this thread
            time.sleep(later.countdown)
    raise PlanningFailed(f"planning gave up after {rt.settings.max_attempts} attempts")
