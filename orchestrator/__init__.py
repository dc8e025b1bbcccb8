"""drover's Python API: ``from orchestrator import submit, JobSpec``."""

from orchestrator.jobs import JobHandle, JobNotFound, submit
from orchestrator.planning import plan
from workers.jobs.records import JobResult, SubagentResult
from workers.jobs.spec import JobSpec

__all__ = ["JobHandle", "JobNotFound", "JobResult", "JobSpec", "SubagentResult", "plan", "submit"]
