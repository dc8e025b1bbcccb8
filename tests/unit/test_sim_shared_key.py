"""The simulator's shared-key model ``other_model="draws"``: another consumer sends requests
of its own that draw from the same full buckets (virtual time, no server)."""

from __future__ import annotations

from drover.simulator import SimConfig
from drover.simulator.buckets import KeyBuckets


def test_the_other_consumer_takes_its_share_from_full_buckets_and_the_level_drops():
    config = SimConfig(rpm=600, itpm=60_000, otpm=12_000, burst_s=1, other_share=0.4,
                       other_model="draws", seed=3)
    buckets = KeyBuckets(config, 0.0)
    assert buckets.input.capacity == 1_000  # the key's whole burst, not 60% of it
    levels = []
    for tenth in range(1, 6001):  # ten minutes of nobody else on the key
        buckets.refill(tenth / 10)
        levels.append(buckets.input.level)
    # 40% of 10 requests/s for 600 s, at the limits' mean size per request.
    assert abs(buckets.other_admitted - 2_400) <= 150, buckets.other_admitted
    assert buckets.other_refused == 0 and buckets.other_backlog == 0  # alone, always room
    # The bucket refills at the full rate, and the other's draws take it below full.
    assert max(levels) <= 1_000 and min(levels) < 1_000 - 100


def test_with_drover_taking_the_rest_the_other_keeps_about_its_share():
    config = SimConfig(rpm=600, itpm=60_000, burst_s=1, other_share=0.4, other_model="draws")
    buckets = KeyBuckets(config, 0.0)
    ours = 0
    for step in range(1, 60_001):  # a caller that asks every 10 ms, for 600 s
        if buckets.try_admit(100, 0, step / 100) is None:
            ours += 1
    total = ours + buckets.other_admitted
    assert 5_800 <= total <= 6_050  # the key's limit: 600/min for 10 min (+ one burst)
    assert 0.37 * total <= buckets.other_admitted <= 0.43 * total  # it keeps its share


def test_refill_mode_is_unchanged():
    buckets = KeyBuckets(SimConfig(rpm=600, burst_s=1, other_share=0.5), 0.0)
    buckets.requests.level = 0
    buckets.refill(1.0)
    assert buckets.requests.level == 5.0 and buckets.other_admitted == 0
