"""drover's Python API: ``from orchestrator import submit, JobSpec``.

The names are imported on first use (PEP 562), so ``drover --help`` and the CLI's quick
refusals do not pay for importing the SDK and Celery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.jobs import JobHandle, JobNotFound, submit
    from orchestrator.planning import plan
    from workers.jobs.records import JobResult, SubagentResult
    from workers.jobs.spec import JobSpec

__all__ = ["JobHandle", "JobNotFound", "JobResult", "JobSpec", "SubagentResult", "plan", "submit"]

_WHERE = {"JobHandle": "orchestrator.jobs", "JobNotFound": "orchestrator.jobs",
          "submit": "orchestrator.jobs", "plan": "orchestrator.planning",
          "JobResult": "workers.jobs.records", "SubagentResult": "workers.jobs.records",
          "JobSpec": "workers.jobs.spec"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
