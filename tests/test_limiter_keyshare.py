"""Sharing the key with software drover does not run (issue 14, item 4).

The real scripts on the real Redis with an injected clock, against the simulator's own
buckets (``simulator.buckets.KeyBuckets``, with ``other_share`` = another consumer taking that
fraction of every limit) and its headers: a discrete-event run of callers that acquire,
wait, send, and settle with the response's headers, or cool down on a 429. Virtual time, so
the run takes seconds, not minutes.
"""

from __future__ import annotations

import heapq
import itertools

from limiter_model import T0, Clock

from simulator import SimConfig
from simulator.buckets import KeyBuckets
from simulator.responses import ratelimit_headers
from workers.limiter import Limiter, ScopeLimits

ITPM = 600_000  # 10,000 tokens/s, 1,000 tokens a call: 10 calls/s when the key is ours
COST, LATENCY_S, CALLERS = 1_000, 1.0, 40
LIMITS = ScopeLimits(rpm=6_000 * 0.95, itpm=ITPM * 0.95, burst_s=1.0, learned_utilization=0.95,
                     learn_share=True)


def run(lim: Limiter, clock: Clock, sim: KeyBuckets, scope: str, until_s: float,
        events: list, stats: dict) -> None:
    """Advance the callers to virtual time ``until_s``; ``stats`` counts per whole second."""
    seq = itertools.count()
    while events and events[0][0] <= until_s:
        t, _, kind, grant = heapq.heappop(events)
        clock.us = T0 + int(t * 1e6)
        if kind == "acquire":
            g = lim.acquire(scope, LIMITS, input_tokens=COST)
            if g.granted:
                heapq.heappush(events, (t + g.wait_s, next(seq), "send", g))
            else:
                heapq.heappush(events, (t + g.retry_after_s, next(seq), "acquire", None))
        elif kind == "send":
            rejected = sim.try_admit(COST, 0, t)
            if rejected is None:
                stats.setdefault(int(t), 0)
                stats[int(t)] += COST
                heapq.heappush(events, (t + LATENCY_S, next(seq), "done", grant))
            else:
                stats["429"] = stats.get("429", 0) + 1
                lim.settle(scope, LIMITS, grant, input_tokens=0, output_tokens=0)
                lim.cooldown(scope, LIMITS, rejected.retry_after_s)
                heapq.heappush(events, (t + rejected.retry_after_s, next(seq), "acquire", None))
        else:
            headers = ratelimit_headers(sim, t, t, round_tokens=True)
            lim.settle(scope, LIMITS, grant, input_tokens=COST, output_tokens=0,
                       headers=headers)
            heapq.heappush(events, (t, next(seq), "acquire", None))
        stats["sent"] = stats.get("sent", 0) + (kind == "send")


def rate(stats: dict, start: int, end: int) -> float:
    """Mean tokens/s the provider admitted in seconds [start, end)."""
    return sum(stats.get(s, 0) for s in range(start, end)) / (end - start)


def test_the_limiter_learns_its_share_of_a_shared_key_and_climbs_back(redis_client, key_prefix):
    clock = Clock()
    lim = Limiter(redis_client, prefix=key_prefix, horizon_s=15, clock=clock)
    sim = KeyBuckets(SimConfig(rpm=6_000, itpm=ITPM, burst_s=60, other_share=0.4), 0.0)
    scope, stats = "llm:k:shared", {}
    events = [(0.01 * i, i, "acquire", None) for i in range(CALLERS)]
    heapq.heapify(events)

    run(lim, clock, sim, scope, 240, events, stats)  # someone else takes 40% of the key
    left = 0.6 * ITPM / 60
    assert stats.get("429", 0) <= 0.02 * stats["sent"], stats.get("429")
    assert rate(stats, 120, 240) >= 0.90 * left, rate(stats, 120, 240) / left
    share = lim.state(scope, LIMITS)["input_tokens"]["share"]
    assert 0.5 <= share <= 0.7, share

    sim.other_share = 0.0  # ... and stops: within a minute drover plans to all of it again
    n429 = stats.get("429", 0)
    run(lim, clock, sim, scope, 300, events, stats)
    assert lim.state(scope, LIMITS)["input_tokens"]["share"] >= 0.95
    assert rate(stats, 290, 300) >= 0.90 * ITPM / 60, rate(stats, 290, 300) / (ITPM / 60)
    assert stats.get("429", 0) == n429


def test_the_simulators_other_user_takes_its_share_of_every_limit_and_can_stop():
    from simulator.engine import Engine

    engine = Engine(SimConfig(rpm=600, itpm=60_000, burst_s=1, other_share=0.5))
    buckets = engine._buckets_for("k", 0.0)
    assert buckets.try_admit(1_000, 0, 0.0) is None  # the whole input bucket
    buckets.refill(1.0)
    assert buckets.input.level == 500  # half of a second's refill was the other user's
    with_other = buckets.try_admit(1_000, 0, 1.0)
    assert with_other is not None and with_other.limit_name == "input tokens"
    engine.configure(other_share=0.0)  # the other user stops: the buckets stay
    assert engine._buckets_for("k", 1.0) is buckets and buckets.other_share == 0.0
    buckets.refill(1.5)
    assert buckets.input.level == 1_000
    for bad in (-0.1, 1.0):
        try:
            SimConfig(other_share=bad)
        except ValueError as error:
            assert "other_share" in str(error)
        else:
            raise AssertionError(f"other_share={bad} accepted")
