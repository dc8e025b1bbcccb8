"""Which way a job's turns go: realtime calls or the Message Batches API (``batch.py``).

Apart from ``batch.py`` because the submitting process asks it too (launching a job's first
window): this module imports nothing of the call path, so a ``submit`` loads no provider SDK.
"""

from __future__ import annotations

from drover.config import Settings
from drover.config.providers import about
from drover.workers.jobs.spec import JobSpec

__all__ = ["uses_batch"]


def uses_batch(spec: JobSpec, settings: Settings) -> bool:
    """Whether this job's turns go through the Message Batches API (on a provider with
    ``has_batches``, Anthropic: on another "auto" is realtime, and "batch" was refused at
    submit)."""
    model = getattr(spec, "model", None) or settings.model
    if not all(about(p).has_batches for p in (settings.provider, settings.provider_of(model))):
        return False
    delivery = getattr(spec, "delivery", "realtime")
    if delivery == "auto":
        return spec.deadline_s is None or spec.deadline_s >= settings.batch_auto_min_deadline_s
    return delivery == "batch"
