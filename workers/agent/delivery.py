"""Which way a job's turns go: realtime calls or the Message Batches API (``batch.py``).

Apart from ``batch.py`` because the submitting process asks it too (launching a job's first
window): this module imports nothing of the call path, so a ``submit`` loads no provider SDK.
"""

from __future__ import annotations

from drover.config import Settings
from drover.workers.jobs.spec import JobSpec

__all__ = ["uses_batch"]


def uses_batch(spec: JobSpec, settings: Settings) -> bool:
    """Whether this job's turns go through the Message Batches API (Anthropic's only: on
    another provider "auto" is realtime, and "batch" was refused at submit)."""
    model = getattr(spec, "model", None) or settings.model
    if settings.provider != "anthropic" or settings.provider_of(model) != "anthropic":
        return False
    delivery = getattr(spec, "delivery", "realtime")
    if delivery == "auto":
        return spec.deadline_s is None or spec.deadline_s >= settings.batch_auto_min_deadline_s
    return delivery == "batch"
