"""The limits drover's settings give a limiter scope (the limiter itself knows no settings)."""

from __future__ import annotations

from drover.config import ModelLimits, Settings
from drover.workers.limiter import ScopeLimits

__all__ = ["MIN_BUCKET_S", "bucket_seconds", "llm_limits", "scaled_limits"]

# The smallest bucket the late-send allowance leaves (seconds of refill): below it a quiet
# scope could hardly send two calls at once, and the allowance is taken only in part.
MIN_BUCKET_S = 0.1


def bucket_seconds(settings: Settings) -> float:
    """The limiter's bucket, in seconds of refill, for a provider bucket of
    DROVER_BURST_SECONDS: smaller by DROVER_LATE_SEND_S.

    A call is planned for instant s and reaches the provider at s + d, d >= 0 (the wait's
    wake-up, the hold-back check, the SDK, the thread and the GIL under load). Calls planned
    over [a, b] may then all arrive in [b, b + d]: a window of length w at the provider can
    hold the sends planned over w + d, at most bucket + u * rate * (w + d) when the limiter's
    bucket is ``bucket`` seconds of u * rate. The provider admits rate * (B + w) in it. So with
    bucket = B - d (and u <= 1) every send up to d late fits: u * rate * (B - d + w + d) <=
    rate * (B + w). Without it, at u = 1 no send may be late at all, and at 0.95 only 0.05 s.
    """
    burst = settings.burst_seconds
    return max(burst - settings.late_send_s, min(burst, MIN_BUCKET_S))


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
                       otpm=scaled(ml.otpm if ml else None), tpm=scaled(ml.tpm if ml else None),
                       burst_s=bucket_seconds(settings),
                       max_in_flight=max_in_flight, learned_utilization=u, learn_share=True)
