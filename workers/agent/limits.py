"""The limits drover's settings give a limiter scope (the limiter itself knows no settings)."""

from __future__ import annotations

from drover.config import Settings
from drover.workers.limiter import ScopeLimits

__all__ = ["llm_limits"]


def llm_limits(settings: Settings, model: str) -> ScopeLimits:
    """A model's configured limits scaled by the target utilisation; dimensions the settings
    leave out are learned from ``-limit`` headers, scaled the same way. The key may be shared
    with other software, so the limiter also learns the share of it that is left for us."""
    u = settings.target_utilization
    ml = settings.limits_for(model)

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * u

    return ScopeLimits(rpm=scaled(ml.rpm if ml else None), itpm=scaled(ml.itpm if ml else None),
                       otpm=scaled(ml.otpm if ml else None), burst_s=settings.burst_seconds,
                       max_in_flight=settings.max_in_flight, learned_utilization=u,
                       learn_share=True)
