"""The client API a user's program calls: ``submit(spec) -> JobHandle`` (``jobs.py``) and
``plan(goal)`` (``planning.py``). Users import it from ``drover`` itself."""

from drover.orchestrator.client.jobs import (
    JobHandle,
    JobNotFound,
    Unreachable,
    check_spec,
    spec_bytes,
    submit,
)
from drover.orchestrator.client.planning import plan

__all__ = ["JobHandle", "JobNotFound", "Unreachable", "check_spec", "plan", "spec_bytes",
           "submit"]
