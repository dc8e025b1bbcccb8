"""Sends that leave late (DROVER_LATE_SEND_S, workers/agent/limits.py bucket_seconds): the
limiter's bucket is smaller than the provider's by the allowance, so calls the limiter planned,
each reaching the provider up to that much late, never overflow the provider's bucket."""

from __future__ import annotations

import pytest

from drover.config import load_settings
from drover.simulator import SimConfig
from drover.simulator.buckets import KeyBuckets
from drover.workers.agent.limits import MIN_BUCKET_S, bucket_seconds, llm_limits
from drover.workers.limiter import Limiter
from tests.helpers.limiter_model import T0, Clock

ITPM, CALL = 60_000, 200  # 1,000 input tokens a second; calls of 200 tokens (5 a second)


def test_the_allowance_comes_off_the_burst_down_to_a_floor():
    def bucket(**kw: float) -> float:
        return bucket_seconds(load_settings(**kw))

    assert bucket() == pytest.approx(0.8)  # the defaults: 1 s less 0.2 s
    assert bucket(burst_seconds=3, late_send_s=0.5) == pytest.approx(2.5)
    assert bucket(late_send_s=0) == 1.0
    assert bucket(burst_seconds=0.25, late_send_s=0.2) == MIN_BUCKET_S  # the floor
    assert bucket(burst_seconds=0.05) == 0.05  # a burst below the floor stays as it is
    s = load_settings(itpm=ITPM, burst_seconds=2, late_send_s=0.3, model="m")
    assert llm_limits(s, "m").burst_s == pytest.approx(1.7)


def planned_sends(redis_client, key_prefix, utilization: float, late_send_s: float,
                  callers: int = 40) -> list[float]:
    """Send instants (s after the start) the real limiter plans for ``callers`` calls that
    all ask at once into a quiet scope: a burst, then the queue at the refill rate."""
    s = load_settings(itpm=ITPM, rpm=100_000, otpm=10_000_000, burst_seconds=1,
                      target_utilization=utilization, late_send_s=late_send_s, model="m",
                      max_in_flight=100)
    limiter = Limiter(redis_client, prefix=key_prefix, clock=Clock(), horizon_s=600)
    scope = f"llm:late:{utilization}:{late_send_s}"
    limits = llm_limits(s, "m")
    grants = [limiter.acquire(scope, limits, input_tokens=CALL) for _ in range(callers)]
    assert all(g.granted for g in grants)
    return [(g.now_us - T0) / 1e6 + g.wait_s for g in grants]


def first_refusal(sends: list[float], late_s: float) -> tuple[float, float] | None:
    """Against the provider's own buckets (the simulator's: 1 s of the whole limit, full at
    the start), the worst a lateness of up to ``late_s`` does: for each instant t, the sends
    planned in [t - late_s, t) all leave late, at t, the others on time. The first (t, send)
    refused, or None."""
    for t in sorted({s + late_s for s in sends} | {0.0}):
        arrivals = sorted(t if t - late_s <= s < t else s for s in sends)
        # (1e-9 over the limit: at 1.0 sends land exactly on the provider's refill, and float
        # rounding of an exact fit must not count as a refusal)
        provider = KeyBuckets(SimConfig(rpm=100_000, itpm=ITPM * (1 + 1e-9), otpm=10_000_000,
                                        burst_s=1.0), now=0.0)
        for at in arrivals:
            if provider.try_admit(CALL, 1, at) is not None:
                return t, at
    return None


@pytest.mark.parametrize("utilization", [0.95, 1.0])
def test_sends_late_by_up_to_the_allowance_fit_the_providers_bucket(
        redis_client, key_prefix, utilization):
    sends = planned_sends(redis_client, key_prefix, utilization, late_send_s=0.2)
    assert first_refusal(sends, late_s=0.2) is None
    assert first_refusal(sends, late_s=0.0) is None  # on time, of course


@pytest.mark.parametrize("utilization", [0.95, 1.0])
def test_without_the_allowance_such_late_sends_overflow_it(redis_client, key_prefix,
                                                            utilization):
    # What the allowance is for: the limiter's bucket as large as the provider's (times the
    # utilisation), and the same lateness, draws a refusal.
    sends = planned_sends(redis_client, key_prefix, utilization, late_send_s=0.0)
    assert first_refusal(sends, late_s=0.0) is None
    assert first_refusal(sends, late_s=0.2) is not None
