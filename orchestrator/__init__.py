"""drover's Python API: ``from orchestrator import submit, JobSpec``."""

from orchestrator.jobs import JobHandle, JobNotFound, submit
from orchestrator.planning import plan
from workers.records import JobResult, SubagentResult
from workers.spec import JobSpec

__all__ = ["JobHandle", "JobNotFound", "JobResult", "JobSpec", "SubagentResult", "plan", "submit"]
