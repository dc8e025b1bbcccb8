"""The limits drover's settings give a limiter scope (the limiter itself knows no settings)."""

from __future__ import annotations

from drover.config import ModelLimits, Settings
from drover.workers.limiter import ScopeLimits

__all__ = ["llm_limits", "scaled_limits"]


def llm_limits(settings: Settings, model: str) -> ScopeLimits:
    """A model's (its class's) configured limits scaled by the target utilisation; dimensions
    the settings leave out are learned from ``-limit`` headers, scaled the same way. With a
    pool of keys these are the organisation's. The key may be shared with other software, so
    the limiter also learns the share of it that is left for us."""
    return scaled_limits(settings, settings.limits_for(model),
                         max_in_flight=settings.max_in_flight)


def scaled_limits(settings: Settings, ml: ModelLimits | None, *,
                  max_in_flight: int | None) -> ScopeLimits:
    """``ml`` (per minute, as the console shows them) as the limiter enforces them."""
    u = settings.target_utilization

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * u

    return ScopeLimits(rpm=scaled(ml.rpm if ml else None), itpm=scaled(ml.itpm if ml else None),
                       otpm=scaled(ml.otpm if ml else None), burst_s=settings.burst_seconds,
                       max_in_flight=max_in_flight, learned_utilization=u, learn_share=True)
