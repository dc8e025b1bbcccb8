"""A job's first seconds against a provider whose buckets are the limiter's own: the first
burst goes out before any answer has calibrated the estimates, into a bucket in which the
target utilisation leaves 5%; and the calls granted before a 429 must not go out into its
cooldown (bench/RESULTS.md and bench/RESULTS-pool.md: the early 429s).

The real call path in this process: the Redis limiter, the SDK over HTTP to the simulator,
whose tokenizer is not characters / 4."""

from __future__ import annotations

import asyncio

from drover.workers.agent.errors import LimiterSaysLater
from drover.workers.agent.limits import llm_limits
from drover.workers.agent.llm import CallContext, create_message
from drover.workers.limiter import llm_scope
from tests.helpers import configure

# Nine-letter words: characters / 4 counts 2.5 tokens a word, the simulator 3, so a fresh
# worker's estimate is a sixth low (bench.workload's first turns: 1.10-1.41 x, median 1.14).
WORDS = " ".join(["abcdefghi"] * 100)


def _runtime(monkeypatch, drover_env, **settings):  # noqa: ANN001, ANN202
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    configure(monkeypatch, drover_env, **settings)
    rt = get_runtime(services())
    return rt, llm_scope(rt.settings.key_alias, rt.settings.model)


def _params(rt, i: int) -> dict:  # noqa: ANN001
    return {"model": rt.settings.model, "max_tokens": 20,
            "messages": [{"role": "user", "content": f"{WORDS} request {i}"}]}


def test_a_fresh_workers_first_burst_fits_a_provider_bucket_equal_to_the_limiters(
        monkeypatch, drover_env, sim):
    # Both buckets hold 2 s of 120,000 input tokens a minute (4,000); the limiter plans to
    # 95% of it. 24 calls at once, each about 300 tokens by the provider's count and 255 by
    # characters / 4: the first burst is granted at once, before any answer (each takes a
    # second), so a burst reserved at the bare estimate sends 1.14 x the provider's bucket.
    sim.configure(rpm=6000, itpm=120_000, otpm=1_000_000, burst_s=2, tool_turns=0,
                  output_tokens_mean=10, latency_mean_s=1.0, latency_p95_s=1.0)
    rt, scope = _runtime(monkeypatch, drover_env, rpm=6000, itpm=120_000, otpm=1_000_000,
                         burst_seconds=2)
    estimates = [rt.calibration.input_tokens(scope, _params(rt, i), False) for i in range(24)]

    async def burst() -> list[object]:
        return await asyncio.gather(*(create_message(rt, _params(rt, i), CallContext(
            "burst", i, asyncio.Event())) for i in range(24)), return_exceptions=True)

    results = rt.run(burst())
    failed = [r for r in results if isinstance(r, BaseException)]
    stats = sim.stats()
    assert stats["rejected_429"] == 0, (stats["timeline"], failed[:2])
    assert not failed, failed[:2]
    counted = [r.usage.input_tokens for r in results]
    # The case is the one described: the provider counts 10-30% more than the first estimate.
    assert 1.1 < sum(counted) / sum(estimates) < 1.3, (counted[:3], estimates[:3])


def test_a_call_granted_before_a_429_is_not_sent_into_its_cooldown(monkeypatch, drover_env,
                                                                   sim):
    # One request a second, a bucket of one: a grant taken here makes the call's own grant
    # wait a second for its send. While it waits, another worker's call gets a 429 (the
    # cooldown below, longer than the horizon): the provider's bucket is empty, so the call
    # planned before it must not go out at its planned time but plan again behind the
    # cooldown, which frees the worker's slot (LimiterSaysLater: a Celery retry).
    rt, scope = _runtime(monkeypatch, drover_env, rpm=60, target_utilization=1,
                         burst_seconds=1)
    limits = llm_limits(rt.settings, rt.settings.model)
    held = rt.run(rt.limiter.acquire(scope, limits, input_tokens=10, output_tokens=10,
                                     lease_ttl_s=60))
    # (It waits DROVER_LATE_SEND_S itself: at 60 RPM the limiter's bucket of 0.8 s holds
    # less than one request.)
    assert held.granted and held.wait_s <= rt.settings.late_send_s + 0.01

    async def call_then_429() -> BaseException | None:
        call = asyncio.ensure_future(create_message(rt, _params(rt, 0), CallContext(
            "cooled", 0, asyncio.Event())))
        for _ in range(500):  # until its grant is made (a second lease): it waits its turn
            if (await rt.limiter.state(scope))["leases"] >= 2 or call.done():
                break
            await asyncio.sleep(0.01)
        assert not call.done(), "the call did not wait for its turn"
        await rt.limiter.cooldown(scope, limits, 600.0)
        try:
            await asyncio.wait_for(call, 30)
        except LimiterSaysLater as later:
            return later
        return None

    later = rt.run(call_then_429())
    stats = sim.stats()
    assert isinstance(later, LimiterSaysLater) and "limiter cooldown" in str(later), (
        later, stats["by_status"])
    assert stats["by_status"] == {} and stats["accepted"] == 0  # nothing reached the provider
    assert rt.run(rt.limiter.state(scope))["leases"] == 1  # its lease went (the held one's left)
    rt.run(rt.limiter.release(scope, held))
