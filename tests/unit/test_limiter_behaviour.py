"""The limiter's promises, one test each, against the real Redis."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from drover.workers.agent.limits import llm_limits
from drover.workers.limiter import (
    STAT_FIELDS,
    AsyncLimiter,
    Limiter,
    ScopeLimits,
    llm_scope,
    tool_scope,
)
from drover.workers.limiter._scripts import INJECTED_TTL_MARGIN_MS
from drover.workers.providers import ANTHROPIC
from tests.helpers.limiter_model import T0, Clock


def read(headers):
    """What the Anthropic provider reads from these headers (the limiter folds readings)."""
    return ANTHROPIC.read_limits(headers)


def clocked(cls, client, key_prefix, **kw):
    """A limiter whose scripts see an injected clock (``at`` sets it) instead of Redis TIME."""
    return cls(client, prefix=key_prefix, clock=Clock(), **kw)


@pytest.fixture
def lim(redis_client, key_prefix):
    return clocked(Limiter, redis_client, key_prefix, horizon_s=5.0)


def at(limiter, seconds: float):
    """Put the limiter's injected clock at T0 + seconds."""
    limiter._clock.us = T0 + int(round(seconds * 1e6))
    return limiter


def test_scope_names():
    assert llm_scope("team-a", "claude-sonnet-4-5") == "llm:team-a:claude-sonnet-4-5"
    assert tool_scope("search") == "tool:search"


def test_settings_give_limits_scaled_by_target_utilisation():
    from drover.config import load_settings
    s = load_settings(rpm=100, itpm=10_000, otpm=2_000, target_utilization=0.5,
                      burst_seconds=2, max_in_flight=7, model="m1")
    limits = llm_limits(s, "m1")
    assert (limits.rpm, limits.itpm, limits.otpm) == (50, 5_000, 1_000)
    # The bucket is the burst less the late-send allowance (DROVER_LATE_SEND_S, 0.2 s)
    assert (limits.burst_s, limits.max_in_flight, limits.learned_utilization) == (
        pytest.approx(1.8), 7, 0.5)
    unknown = llm_limits(s, "other-model")
    assert (unknown.rpm, unknown.itpm, unknown.otpm) == (None, None, None)


def test_decisions_ignore_the_workers_clocks(redis_url, key_prefix, monkeypatch):
    """Two "hosts" with clocks an hour apart in opposite directions share one bucket."""
    scope, limits = "llm:k:skew", ScopeLimits(rpm=60, burst_s=1)  # 1 request/s, capacity 1
    real_time, real_mono = time.time, time.monotonic
    a_client = redis.Redis.from_url(redis_url)
    b_client = redis.Redis.from_url(redis_url)
    server_before = (lambda t: t[0] + t[1] / 1e6)(a_client.time())
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    monkeypatch.setattr(time, "monotonic", lambda: real_mono() + 3600)
    a = Limiter(a_client, prefix=key_prefix).acquire(scope, limits)
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)
    monkeypatch.setattr(time, "monotonic", lambda: real_mono() - 3600)
    b = Limiter(b_client, prefix=key_prefix).acquire(scope, limits)
    monkeypatch.undo()
    server_after = (lambda t: t[0] + t[1] / 1e6)(a_client.time())
    assert a.granted and a.wait_s == 0
    # queued one refill behind a (not 0 nor 3600 s); its wait is that less the time between
    # the two calls, which a loaded box may stretch, so the send times are what is compared
    assert b.granted and 0 < b.wait_s <= 1.0
    assert server_before - 0.01 <= a.send_at <= server_after + 0.01
    assert b.send_at - a.send_at == pytest.approx(1.0, abs=1e-6)
    a_client.close()
    b_client.close()


def test_a_crashed_worker_frees_its_in_flight_slot_when_the_lease_expires(lim):
    scope, limits = "llm:k:lease", ScopeLimits(max_in_flight=2)
    at(lim, 0)
    crashed = lim.acquire(scope, limits, lease_ttl_s=2.0)
    held = lim.acquire(scope, limits, lease_ttl_s=60.0)
    assert crashed.granted and held.granted
    blocked = lim.acquire(scope, limits)
    assert (blocked.granted, blocked.reason) == (False, "in_flight")
    assert 0 < blocked.retry_after_s <= 0.2
    assert lim.state(scope)["leases"] == 2
    at(lim, 2.5)  # the crashed worker never settles; its lease runs out
    assert lim.state(scope)["leases"] == 1
    assert lim.acquire(scope, limits).granted
    lim.settle(scope, limits, held, input_tokens=0, output_tokens=0)
    assert lim.state(scope)["leases"] == 1


def test_with_an_injected_clock_keys_outlive_the_real_time_a_test_takes(lim, redis_client):
    """Redis expires keys on its own clock, not the injected one: a lease of 0.2 s got a
    leases key of 1.2 s, which a test slow in real time (a loaded box) outlived while its
    clock still held the lease. A TTL still to run gets the margin; the lease itself still
    ends at the injected time."""
    scope, limits = "llm:k:ttl-margin", ScopeLimits(max_in_flight=2)
    at(lim, 0)
    g = lim.acquire(scope, limits, lease_ttl_s=0.2)
    leases = lim.keys(scope)[1]
    assert redis_client.pttl(leases) > INJECTED_TTL_MARGIN_MS
    assert lim.state(scope)["leases"] == 1
    at(lim, 0.1)
    assert lim.state(scope)["leases"] == 1
    at(lim, 0.3)
    assert lim.state(scope)["leases"] == 0
    lim.release(scope, g)


def test_the_in_flight_limit_counts_the_lease_set_itself(lim, redis_client):
    scope, limits = "llm:k:count", ScopeLimits(rpm=600, max_in_flight=2)
    at(lim, 0)
    first = lim.acquire(scope, limits)
    assert first.granted and lim.acquire(scope, limits).granted
    assert lim.acquire(scope, limits).reason == "in_flight"
    lim.settle(scope, limits, first, input_tokens=0, output_tokens=0)
    assert lim.acquire(scope, limits).granted
    assert lim.acquire(scope, limits).reason == "in_flight"
    redis_client.delete(lim.keys(scope)[1])  # e.g. evicted: the slots are free again
    at(lim, 0.2)
    assert lim.acquire(scope, limits).granted and lim.acquire(scope, limits).granted
    assert lim.acquire(scope, limits).reason == "in_flight"
    assert lim.state(scope)["leases"] == 2


def test_settle_refunds_overestimates_and_debits_underestimates(lim):
    scope, limits = "llm:k:settle", ScopeLimits(rpm=600, itpm=60_000, otpm=6_000)
    at(lim, 0)
    g = lim.acquire(scope, limits, input_tokens=400, output_tokens=80)
    s = lim.state(scope, limits)
    assert s["input_tokens"]["level"] == 1000 - 400 and s["output_tokens"]["level"] == 100 - 80
    lim.settle(scope, limits, g, input_tokens=100, output_tokens=250)  # -300 in, +170 out
    s = lim.state(scope, limits)
    assert s["input_tokens"]["level"] == 1000 - 100
    assert s["output_tokens"]["level"] == 100 - 250  # negative: later callers wait
    assert s["requests"]["level"] == 10 - 1  # the request stays counted
    nxt = lim.acquire(scope, limits, input_tokens=10, output_tokens=10)
    assert nxt.wait_s == pytest.approx((10 + 150) / 100)
    # queued 1.6 s behind the output debt, it holds every bucket to what that bucket will
    # have at its send (1,000 - 1.6 s x 1,000/s), less its own 10; the settle gives them back
    assert lim.state(scope, limits)["input_tokens"]["level"] == 1000 - 1600 - 10
    lim.settle(scope, limits, nxt, input_tokens=0, output_tokens=0)
    assert lim.state(scope, limits)["input_tokens"]["level"] == 1000 - 1600


def test_a_scope_of_one_tokens_bucket_counts_input_and_output_there_and_nowhere_else(lim):
    """OpenAI's limits: requests and one tokens bucket. A scope has the dimensions its
    limits give: the call's input and output both go to ``tokens``, and there is no input or
    output bucket faked beside it; the headers' "tokens" readings are that bucket's."""
    from drover.workers.providers import provider

    scope, limits = "llm:k:one-bucket", ScopeLimits(rpm=600, tpm=60_000)  # 1,000/s, cap 1,000
    at(lim, 0)
    g = lim.acquire(scope, limits, input_tokens=300, output_tokens=200)
    s = lim.state(scope, limits)
    assert s["tokens"]["level"] == 1000 - 500
    assert s["input_tokens"] is None and s["output_tokens"] is None
    lim.settle(scope, limits, g, input_tokens=350, output_tokens=200)  # 50 more than reserved
    assert lim.state(scope, limits)["tokens"]["level"] == 1000 - 550
    assert lim.acquire(scope, limits, input_tokens=400, output_tokens=100).wait_s == 0.05
    usage = lim.usage(scope, 5)
    assert sum(r["input_tokens"] for r in usage) == 350  # counted apart, as the answer said
    assert sum(r["output_tokens"] for r in usage) == 200
    learn = ScopeLimits(rpm=600, learned_utilization=0.5)
    lim.sync_headers("llm:k:one-learned", learn, provider("openai").read_limits({
        "x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-tokens": "30000"}))
    state = lim.state("llm:k:one-learned", learn)
    assert state["learned"]["tpm"] == 30_000 and state["learned"]["itpm"] is None
    assert state["tokens"]["limit_per_min"] == 15_000


def test_a_refund_never_lifts_a_level_above_capacity(lim):
    # state() never reports more than capacity, so the proof is in what the next caller gets:
    # a refund on a full bucket must not let it take more than capacity at once
    scope, limits = "llm:k:refundcap", ScopeLimits(rpm=600, itpm=60_000)  # 1,000/s, cap 1,000
    at(lim, 0)
    g = lim.acquire(scope, limits, input_tokens=300)
    at(lim, 10)  # full again long since
    lim.settle(scope, limits, g, input_tokens=0, output_tokens=0)  # 300 back on a full bucket
    assert lim.acquire(scope, limits, input_tokens=1000).wait_s == 0
    assert lim.acquire(scope, limits, input_tokens=100).wait_s == pytest.approx(0.1)


def test_release_refunds_everything(lim):
    scope, limits = "llm:k:release", ScopeLimits(rpm=600, itpm=60_000)
    at(lim, 0)
    lim.acquire(scope, limits, input_tokens=100)
    before = lim.state(scope, limits)
    g = lim.acquire(scope, limits, input_tokens=300)
    lim.release(scope, g)
    after = lim.state(scope, limits)
    assert after["input_tokens"]["level"] == before["input_tokens"]["level"]
    assert after["requests"]["level"] == before["requests"]["level"]
    assert after["leases"] == 1


def test_cooldown_holds_back_every_host_then_resumes_at_the_refill_rate(
        redis_url, key_prefix):
    scope, limits = "llm:k:cool", ScopeLimits(rpm=120, burst_s=1)  # 2/s, capacity 2
    host_a = clocked(Limiter, redis.Redis.from_url(redis_url), key_prefix, horizon_s=30)
    host_b = clocked(Limiter, redis.Redis.from_url(redis_url), key_prefix, horizon_s=30)
    at(host_a, 0), at(host_b, 0)
    assert host_a.acquire(scope, limits).wait_s == 0
    assert host_a.cooldown(scope, limits, 10) == 10
    at(host_a, 3), at(host_b, 3)
    assert host_a.cooldown(scope, limits, 2) == 7  # max(current, now + R)
    waits = [host_b.acquire(scope, limits).wait_s for _ in range(3)]
    # the cooldown ends at 10 s; the bucket refills from empty: one request per 0.5 s
    assert waits == pytest.approx([7.5, 8.0, 8.5])
    assert host_b.state(scope)["cooldown_s"] == 7


def test_cooldown_longer_than_the_horizon_is_not_granted(lim):
    scope, limits = "llm:k:coolh", ScopeLimits(rpm=60)
    at(lim, 0)
    lim.cooldown(scope, limits, 30)
    g = lim.acquire(scope, limits)
    assert (g.granted, g.reason) == (False, "cooldown")
    assert g.retry_after_s == pytest.approx(30 - 5)


def test_a_refund_after_a_cooldown_does_not_bring_back_a_burst(lim):
    scope, limits = "llm:k:cool429", ScopeLimits(rpm=600, itpm=60_000)
    at(lim, 0)
    g = lim.acquire(scope, limits, input_tokens=500)
    lim.cooldown(scope, limits, 2)  # the call got a 429 ...
    lim.settle(scope, limits, g, input_tokens=0, output_tokens=0)  # ... and counted nothing
    # the cooldown emptied the bucket as of its end (2 s x 1,000 tokens/s below zero now);
    # the 500 given back stay given up (a refund would leave -1,500)
    assert lim.state(scope, limits)["input_tokens"]["level"] == -2000
    at(lim, 2.0)  # the cooldown is over: the bucket refills from empty, 1,000 tokens/s
    assert lim.acquire(scope, limits, input_tokens=500).wait_s == pytest.approx(0.5)


def test_horizon_refuses_and_debits_nothing(lim):
    # 10 input tokens/s, capacity 50; horizon 5 s
    scope, limits = "llm:k:horizon", ScopeLimits(rpm=60, itpm=600, burst_s=5)
    at(lim, 0)
    assert lim.acquire(scope, limits, input_tokens=50).wait_s == 0
    assert lim.acquire(scope, limits, input_tokens=50).wait_s == pytest.approx(5.0)
    before = lim.state(scope, limits)
    g = lim.acquire(scope, limits, input_tokens=20)  # would wait 7 s > 5 s
    assert (g.granted, g.reason, g.lease_id) == (False, "horizon", None)
    assert g.retry_after_s == pytest.approx(2.0)
    after = lim.state(scope, limits)
    assert after["input_tokens"] == before["input_tokens"]
    assert after["requests"] == before["requests"]
    assert after["leases"] == before["leases"] == 2
    at(lim, 2.0)
    g = lim.acquire(scope, limits, input_tokens=20)
    assert g.granted and g.wait_s == pytest.approx(5.0)


def test_sync_headers_lowers_but_never_raises(lim):
    scope, limits = "llm:k:sync", ScopeLimits(rpm=600, itpm=60_000, otpm=6_000)
    at(lim, 0)
    lim.acquire(scope, limits, input_tokens=100)
    lim.sync_headers(scope, limits, read({
        "anthropic-ratelimit-requests-remaining": "1000",     # above: ignored
        "anthropic-ratelimit-input-tokens-remaining": "0",    # below: lowers
        "anthropic-ratelimit-output-tokens-remaining": "42",  # below capacity 100: lowers
        "anthropic-ratelimit-requests-limit": "5",            # configured: not learned
    }))
    s = lim.state(scope, limits)
    assert s["requests"]["level"] == 9
    assert s["input_tokens"]["level"] == 0
    assert s["output_tokens"]["level"] == 42
    assert s["learned"] == {"rpm": None, "itpm": None, "otpm": None, "tpm": None}


def test_sync_headers_fills_limits_that_were_not_configured(lim):
    scope = "llm:k:learn"
    limits = ScopeLimits(rpm=600, learned_utilization=0.5)  # token limits unknown
    at(lim, 0)
    assert lim.acquire(scope, limits, input_tokens=10**6).wait_s == 0  # nothing to limit yet
    lim.sync_headers(scope, limits, read({"Anthropic-RateLimit-Input-Tokens-Limit": "120000",
                                          "anthropic-ratelimit-input-tokens-remaining": "garbage"}))
    s = lim.state(scope, limits)
    assert s["learned"]["itpm"] == 120_000
    assert s["input_tokens"]["limit_per_min"] == 60_000  # raw x learned_utilization
    g = lim.acquire(scope, limits, input_tokens=2000)  # 1000 tok/s, capacity 1000
    assert g.granted and g.wait_s == pytest.approx(1.0)
    assert read({"anthropic-ratelimit-requests-remaining": "-1"}) is None


def test_settle_with_headers_is_settle_then_sync_in_one_call(redis_url, key_prefix):
    limits = ScopeLimits(rpm=600, itpm=60_000)  # output tokens not configured: learned
    headers = {"anthropic-ratelimit-input-tokens-remaining": "300",
               "anthropic-ratelimit-output-tokens-limit": "12000"}
    client = redis.Redis.from_url(redis_url)
    two_calls, one_call = (at(clocked(Limiter, client, key_prefix), 0) for _ in range(2))
    states = []
    for lim, scope in ((two_calls, "llm:k:two"), (one_call, "llm:k:one")):
        g = lim.acquire(scope, limits, input_tokens=400, output_tokens=100)
        at(lim, 0.5)
        if lim is two_calls:
            lim.settle(scope, limits, g, input_tokens=250, output_tokens=80)
            lim.sync_headers(scope, limits, read(headers))
        else:
            lim.settle(scope, limits, g, input_tokens=250, output_tokens=80, readings=read(headers))
        states.append(lim.state(scope, limits))
    client.close()
    assert states[0] == states[1]
    assert states[1]["input_tokens"]["level"] == 300  # lowered by -remaining
    assert states[1]["learned"]["otpm"] == 12_000 and states[1]["leases"] == 0


def test_tool_scope_limits_requests_per_second(lim):
    scope, limits = tool_scope("search"), ScopeLimits.for_tool(rps=4, burst_s=0.5)
    assert limits.rpm == 240 and limits.itpm is None
    at(lim, 0)
    waits = [lim.acquire(scope, limits).wait_s for _ in range(6)]
    # capacity 2 at 4/s: two at once, then one every 0.25 s
    assert waits == pytest.approx([0, 0, 0.25, 0.5, 0.75, 1.0])


def test_keys_share_one_hash_tag_and_expire(lim, redis_client, key_prefix):
    scope, limits = llm_scope("alias", "model"), ScopeLimits(rpm=60, itpm=600, otpm=60)
    lim.acquire(scope, limits, input_tokens=5, output_tokens=5)
    lim.sync_headers(scope, ScopeLimits(), read({"anthropic-ratelimit-requests-limit": "50"}))
    lim.record(scope, uncached=1)
    keys = sorted(redis_client.scan_iter(match=f"{key_prefix}:*"))
    scoped = [k for k in keys if k != f"{key_prefix}:scopes"]
    assert len(scoped) == 5 and all(k.startswith(f"{key_prefix}:{{{scope}}}:") for k in scoped)
    slots = {key_slot(k.encode()) for k in scoped}
    assert len(slots) == 1
    for k in keys:
        assert redis_client.pttl(k) > 0, k
    assert lim.scopes() == [scope]
    with pytest.raises(ValueError):
        lim.keys("llm:{bad}")


def test_the_learned_share_keeps_its_own_named_state_under_the_scopes_tag(
        lim, redis_client, key_prefix):
    scope = llm_scope("alias", "shared")
    limits = ScopeLimits(rpm=600, itpm=60_000, learn_share=True)
    headers = {"anthropic-ratelimit-input-tokens-remaining": "59000",
               "anthropic-ratelimit-input-tokens-limit": "60000"}
    at(lim, 0)
    g = lim.acquire(scope, limits, input_tokens=100)
    lim.settle(scope, limits, g, input_tokens=100, output_tokens=0, readings=read(headers))
    for second, remaining in ((3, "20000"), (6, "10000"), (9, "5000")):  # someone else too
        at(lim, second)
        lim.sync_headers(scope, limits, read({
            **headers, "anthropic-ratelimit-input-tokens-remaining": remaining}))
    bucket, *_, share = lim.keys(scope)
    assert set(redis_client.hkeys(bucket)) <= {
        "r", "i", "o", "Lr", "Li", "Lo", "burst", "cd", "lx", "ls", "so"}
    learned = {k: float(v) for k, v in redis_client.hgetall(share).items()}
    assert {"lt", "i.share", "i.r1", "i.t1", "i.u1", "i.x1", "i.top"} <= set(learned)
    assert learned["i.share"] == lim.state(scope)["input_tokens"]["share"] < 1
    assert key_slot(share.encode()) == key_slot(bucket.encode())
    assert 0 < redis_client.pttl(share) - INJECTED_TTL_MARGIN_MS <= 65_000


def test_no_key_is_left_without_a_ttl_when_the_last_lease_goes(lim, redis_client, key_prefix):
    scope, limits = "llm:k:ttl", ScopeLimits(rpm=600, max_in_flight=4)
    def ttls() -> dict[str, int]:
        return {k: redis_client.pttl(k) for k in redis_client.scan_iter(match=f"{key_prefix}:*")}

    for _ in range(3):  # the lease set empties after each settle, then fills again
        g = lim.acquire(scope, limits)
        assert lim.state(scope)["leases"] == 1
        assert all(ttl > 0 for ttl in ttls().values()), ttls()
        lim.settle(scope, limits, g, input_tokens=0, output_tokens=0)
        assert lim.state(scope)["leases"] == 0
        assert all(ttl > 0 for ttl in ttls().values()), ttls()


def test_usage_counts_per_second(lim):
    scope, limits = "llm:k:usage", ScopeLimits(rpm=60, itpm=6000, otpm=600)
    at(lim, 0)
    g1 = lim.acquire(scope, limits, input_tokens=10, output_tokens=5)
    g2 = lim.acquire(scope, limits, input_tokens=10, output_tokens=5)  # waits 1 s
    at(lim, 1.2)
    lim.settle(scope, limits, g1, input_tokens=12, output_tokens=7)
    lim.settle(scope, limits, g2, input_tokens=3, output_tokens=1,
               counts={"cache_read": 40, "uncached": 0})  # added at the settle second
    lim.record(scope, requests=2, uncached=1, short_prefix=1)
    rows = lim.usage(scope, 3)
    assert [r["t"] for r in rows] == [T0 // 10**6 - 1, T0 // 10**6, T0 // 10**6 + 1]
    none = {"cache_read": 0, "cache_write": 0, "uncached": 0, "short_prefix": 0,
            "streamed": 0, "ttft_ms": 0, "gen_ms": 0, "gen_tokens": 0}
    assert rows[1] == {"t": T0 // 10**6, "requests": 1, "input_tokens": 0, "output_tokens": 0,
                       "waits": 1, "wait_ms": 1000, **none}
    assert rows[2] == {"t": T0 // 10**6 + 1, "requests": 3, "input_tokens": 15,
                       "output_tokens": 8, "waits": 0, "wait_ms": 0, **none, "cache_read": 40,
                       "uncached": 1, "short_prefix": 1}
    with pytest.raises(ValueError):
        lim.record(scope, bogus=1)
    with pytest.raises(ValueError):  # calls by outcome are telemetry's (drover_llm_calls)
        lim.record(scope, n429=1)
    with pytest.raises(ValueError):
        lim.settle(scope, limits, g1, input_tokens=1, output_tokens=1, counts={"bogus": 1})


def test_async_limiter_agrees_with_limiter(redis_url, key_prefix):
    limits = ScopeLimits(rpm=120, itpm=6000, otpm=600, max_in_flight=3)
    steps = [("acquire", 100, 10), ("acquire", 700, 50), ("settle", 50, 80),
             ("acquire", 50, 5), ("cooldown", 1.5), ("acquire", 10, 1), ("release",),
             ("acquire", 0, 0), ("acquire", 0, 0)]

    def run_sync(scope):
        lim = at(clocked(Limiter, redis.Redis.from_url(redis_url), key_prefix), 0)
        out, grants = [], []
        for i, step in enumerate(steps):
            at(lim, i * 0.3)
            if step[0] == "acquire":
                g = lim.acquire(scope, limits, input_tokens=step[1], output_tokens=step[2])
                grants.append(g)
                out.append((g.granted, g.reason, g.wait_s, g.retry_after_s))
            elif step[0] == "settle":
                lim.settle(scope, limits, grants[0], input_tokens=step[1], output_tokens=step[2])
            elif step[0] == "release":
                lim.release(scope, grants[-1])
            else:
                out.append(lim.cooldown(scope, limits, step[1]))
            out.append(lim.state(scope, limits))
        return out + [lim.usage(scope, 5)]

    async def run_async(scope):
        client = redis.asyncio.Redis.from_url(redis_url)
        lim = at(clocked(AsyncLimiter, client, key_prefix), 0)
        out, grants = [], []
        for i, step in enumerate(steps):
            at(lim, i * 0.3)
            if step[0] == "acquire":
                g = await lim.acquire(scope, limits, input_tokens=step[1], output_tokens=step[2])
                grants.append(g)
                out.append((g.granted, g.reason, g.wait_s, g.retry_after_s))
            elif step[0] == "settle":
                await lim.settle(scope, limits, grants[0], input_tokens=step[1],
                                 output_tokens=step[2])
            elif step[0] == "release":
                await lim.release(scope, grants[-1])
            else:
                out.append(await lim.cooldown(scope, limits, step[1]))
            out.append(await lim.state(scope, limits))
        res = out + [await lim.usage(scope, 5)]
        assert await lim.scopes() == ["llm:k:async", "llm:k:sync"]
        await client.aclose()
        return res

    sync_out = run_sync("llm:k:sync")
    async_out = asyncio.run(run_async("llm:k:async"))
    assert sync_out == async_out
    reasons = {o[1] for o in sync_out if isinstance(o, tuple)}
    assert {"ok", "in_flight"} <= reasons  # the sequence exercised more than one path


def test_fakeredis_runs_the_scripts_exactly_like_redis(redis_url, key_prefix):
    """The demo falls back to fakeredis: the same scripts must give the very same decisions
    and state as Redis."""
    import fakeredis

    limits = ScopeLimits(rpm=120, otpm=600, max_in_flight=2)  # input tokens: learned
    headers = {"anthropic-ratelimit-input-tokens-limit": "6000",
               "anthropic-ratelimit-output-tokens-remaining": "4"}

    def run(client) -> list:
        lim = at(clocked(Limiter, client, key_prefix, horizon_s=5), 0)
        scope, out, grants = "llm:k:fake", [], []
        for i, (op, *a) in enumerate([
                ("acquire", 100, 10), ("acquire", 700, 50), ("settle", 50, 80, headers),
                ("acquire", 50, 5), ("cooldown", 1.5), ("acquire", 10, 1), ("release",),
                ("sync", {"anthropic-ratelimit-requests-remaining": "0"}), ("acquire", 9, 9),
                ("record",), ("acquire", 0, 0), ("acquire", 10**5, 0)]):
            at(lim, i * 0.7)
            if op == "acquire":
                g = lim.acquire(scope, limits, input_tokens=a[0], output_tokens=a[1])
                grants.append(g)
                out.append((g.granted, g.reason, g.wait_s, g.retry_after_s, g.send_us))
            elif op == "settle":
                lim.settle(scope, limits, grants[0], input_tokens=a[0], output_tokens=a[1],
                           readings=read(a[2]))
            elif op == "release":
                lim.release(scope, grants[-1])
            elif op == "cooldown":
                out.append(lim.cooldown(scope, limits, a[0]))
            elif op == "sync":
                lim.sync_headers(scope, limits, read(a[0]))
            else:
                lim.record(scope, requests=2)
            out.append(lim.state(scope, limits))
        return out + [lim.usage(scope, 10), lim.scopes()]

    real = run(redis.Redis.from_url(redis_url))
    fake = run(fakeredis.FakeRedis())
    assert fake == real
    assert {o[1] for o in real if isinstance(o, tuple)} >= {"ok", "in_flight", "horizon"}


def test_fakeredis_runs_the_production_scripts_on_its_own_clock():
    """Without an injected clock the scripts read Redis TIME, which fakeredis has too."""
    import fakeredis

    lim = Limiter(fakeredis.FakeRedis(), prefix="demo")
    limits = ScopeLimits(rpm=60, itpm=6000, max_in_flight=4)
    first = lim.acquire("llm:k:demo", limits, input_tokens=50)
    second = lim.acquire("llm:k:demo", limits, input_tokens=50)
    assert first.granted and first.wait_s == 0 and 0 < second.wait_s <= 1.0
    assert second.send_at - first.send_at == pytest.approx(1.0, abs=1e-6)
    lim.settle("llm:k:demo", limits, first, input_tokens=40, output_tokens=3,
               readings=read({"anthropic-ratelimit-output-tokens-limit": "600"}))
    state = lim.state("llm:k:demo")
    assert state["leases"] == 1 and state["learned"]["otpm"] == 600
    assert sum(r["requests"] for r in lim.usage("llm:k:demo", 5)) == 1


def test_every_counter_comes_back_in_its_own_place(lim):
    """The scripts count the fields Python lists (_scripts.py hands STAT_FIELDS to them):
    each reads back under its own name, and a second pruned drops all of them."""
    scope, lim.stats_window_s = "llm:k:fields", 2
    at(lim, 0).record(scope, **{name: i + 1 for i, name in enumerate(STAT_FIELDS)})
    row = lim.usage(scope, 1)[-1]
    assert [row[name] for name in STAT_FIELDS] == list(range(1, len(STAT_FIELDS) + 1))
    at(lim, 5).record(scope, requests=1)  # a new second prunes those older than the window
    stats = lim._client.hgetall(lim.keys(scope)[3])
    assert {k.split(":")[1] for k in stats} == {"requests"} and len(stats) == 1


def test_a_call_held_back_by_a_later_cooldown_keeps_its_reservation_spent(lim):
    """hold_back.lua: a grant that waited, held back by a cooldown that began after it was
    made, loses its lease but its reservation stays debited, so planned again it goes behind
    the calls granted before the 429 for after the cooldown. At 60 RPM (one send a second,
    capacity one) with a 1 s cooldown the cooldown alone does not push the queue back, so a
    refund of the held-back reservation shows: its new send would come 0.8 s early, right
    behind the call granted for t=2 (the other tests' cooldowns are long enough to hide it)."""
    scope, limits = "llm:k:heldback", ScopeLimits(rpm=60, burst_s=1)
    at(lim, 0)
    first = lim.acquire(scope, limits)
    held = lim.acquire(scope, limits)
    last = lim.acquire(scope, limits)
    assert [g.wait_s for g in (first, held, last)] == pytest.approx([0.0, 1.0, 2.0])
    at(lim, 0.2)
    lim.cooldown(scope, limits, 1.0)  # a 429 while `held` and `last` wait: until t=1.2
    at(lim, 1.0)  # `held`'s planned send
    assert lim.hold_back(held, scope) == pytest.approx(0.2)
    assert lim.state(scope)["leases"] == 2  # its lease is gone; first's and last's stay
    # Planned again: behind `last` (sent at t=2), at t=3, not at t=2.2.
    again = lim.acquire(scope, limits)
    assert again.granted and again.wait_s == pytest.approx(2.0)


def test_a_bucket_of_less_than_one_request_paces_each_send_on_when_the_last_one_left(lim):
    """hold_back.lua: where the limiter's request bucket holds less than one request (57
    RPM in 0.8 s: the defaults' view of a 60 RPM key in 1 s bursts, whose provider bucket
    holds one), the provider admits a send one interval after the last one *left*. A call
    that leaves 0.35 s late moves the next one back by as much; on planned times alone the
    next would go 0.35 s early, a 429 at the provider (bench/RESULTS-small.md). A bucket of
    a whole request is paced the same way by the sends as they left (`sr`): at 60 RPM in
    1 s bursts, with no allowance for late sends, the provider's one request that the late
    first took has refilled 0.65 of the next at its planned send."""
    per = 60 / 57
    scope, limits = "llm:k:paced", ScopeLimits(rpm=57, burst_s=0.8)
    at(lim, 0)
    first, second = lim.acquire(scope, limits), lim.acquire(scope, limits)
    assert second.wait_s - first.wait_s == pytest.approx(per)
    at(lim, first.wait_s + 0.35)  # the first leaves late
    assert lim.hold_back(first, scope) == 0.0
    at(lim, second.wait_s)  # the second's planned send: one interval after the first's plan
    assert lim.hold_back(second, scope) == pytest.approx(-0.35, abs=1e-5)
    assert lim.state(scope)["leases"] == 2  # paced, not held back: its grant stands
    at(lim, first.wait_s + 0.35 + per + 1e-5)
    assert lim.hold_back(second, scope) == 0.0
    whole = "llm:k:whole"  # 60 RPM in 1 s bursts: one request's room
    at(lim, 10)
    a, b = lim.acquire(whole, ScopeLimits(rpm=60, burst_s=1)), lim.acquire(
        whole, ScopeLimits(rpm=60, burst_s=1))
    at(lim, 10.35)
    assert lim.hold_back(a, whole) == 0.0
    at(lim, 10 + b.wait_s)
    assert lim.hold_back(b, whole) == pytest.approx(-0.35, abs=1e-5)
    at(lim, 10.35 + 1.0)
    assert lim.hold_back(b, whole) == 0.0


def test_a_paced_send_waits_one_provider_interval_after_the_last_ones_headers(lim):
    """hold_back.lua and admitted.lua: the pacing on when the last send left its check does
    not see the way from the check to the provider. At 60 RPM in 1 s bursts (57 RPM in 0.8 s
    at the 0.95 target), a first send whose headers (a stream's: they come at its admission)
    come back 0.2 s after it left reached the provider up to then: the next send waits one
    interval of the provider's full rate (1 s) and a 10 ms margin after them, not only the
    limiter's 1.053 s after the first left (on that alone it went 0.15 s early: a 429 on
    requests, bench.small_keys --mix at loads over 8). Headers back at once hold nothing more;
    headers that never come block nothing; a scope that is not paced is not asked for them."""
    per = 60 / 57
    scope, limits = "llm:k:admitted", ScopeLimits(rpm=57, burst_s=0.8, learned_utilization=0.95)
    at(lim, 0)
    first, second, third, fourth = (lim.acquire(scope, limits) for _ in range(4))
    t = first.wait_s  # the first's planned send
    assert second.wait_s == pytest.approx(t + 1.0)  # planned at the provider's full rate
    at(lim, t)
    held = lim.hold_back(first, scope, report=True)
    assert held == 0.0 and held.report  # paced: its caller reports its headers
    at(lim, t + 0.2)  # the first's headers: it reached the provider by then
    lim.admitted(first, scope)
    at(lim, t + 1.0)  # the second's planned send, one provider interval after the first left
    assert lim.hold_back(second, scope, report=True) == pytest.approx(
        -(0.2 + 1.0 + 0.01 - 1.0), abs=1e-5)
    assert lim.state(scope)["leases"] == 4  # paced, not held back: its grant stands
    t += 1.21
    at(lim, t)
    assert lim.hold_back(second, scope, report=True).report
    at(lim, t + 0.005)  # its headers at once: the next is paced on when it left, as before
    lim.admitted(second, scope)
    at(lim, t + per + 1e-5)
    assert lim.hold_back(third, scope) == 0.0  # (not a stream: nothing to report)
    at(lim, t + 2 * per + 2e-5)  # the third's headers never came: the fourth is not held for them
    assert lim.hold_back(fourth, scope, report=True) == 0.0
    plain = "llm:k:not-paced"  # 600 RPM in 0.8 s: no headers asked for, nothing written
    at(lim, 10)
    g = lim.acquire(plain, ScopeLimits(rpm=600, burst_s=0.8))
    held = lim.hold_back(g, plain, report=True)
    assert held == 0.0 and not held.report


def test_a_paced_scope_is_planned_at_the_full_rate_and_never_admitted_early(lim):
    """_bucket.lua, hold_back.lua: a bucket of less than one request (57 RPM in 0.8 s, the
    0.95 target's view of 60 RPM in 1 s bursts) plans its requests at the provider's full
    rate (1 s apart, not 1.053 s): the pacing on the last send's headers is its tolerance.
    Streams whose headers come back 3 ms to 0.3 s after their send (the send's way to the
    provider, unseen) are each let go no sooner than 1 s after the last one's headers (the
    latest the provider can have admitted it), and 10 ms later at most when that binds or
    on their plan otherwise. A send whose headers will not be reported keeps the next the
    target's interval after it left (hold_back.lua's `ar`), as before. The other dimensions
    keep the target (input: 38,000 ITPM); a scope whose bucket holds many requests (570 RPM
    in 0.8 s) is planned at the target as before (without the change: 1.053 s apart)."""
    scope = "llm:k:full-rate"
    limits = ScopeLimits(rpm=57, itpm=38_000, burst_s=0.8, learned_utilization=0.95)
    at(lim, 0)
    grants = [lim.acquire(scope, limits, input_tokens=10) for _ in range(5)]  # the horizon: 5 s
    planned = [g.wait_s for g in grants]
    assert [b - a for a, b in zip(planned, planned[1:], strict=False)] == pytest.approx([1.0] * 4)
    ways = [0.003, 0.3, 0.02, 0.25, 0.003]  # check -> headers, each send
    sent, headers = [], []
    for g, plan, way in zip(grants, planned, ways, strict=True):
        t = plan
        at(lim, t)
        while (held := lim.hold_back(g, scope, report=True)) < 0:
            t -= held
            at(lim, t)
        assert held == 0.0 and held.report
        sent.append(t)
        headers.append(t + way)
        at(lim, t + way)
        lim.admitted(g, scope)
    for k in range(1, len(sent)):  # never before one provider interval after the headers
        assert sent[k] >= headers[k - 1] + 1.0
        assert sent[k] == pytest.approx(
            max(planned[k], headers[k - 1] + 1.01, sent[k - 1] + 1.0), abs=1e-5)
    # Fast headers (3 ms): the send goes 13 ms after its plan, before the target's 1.053 s
    assert sent[1] == pytest.approx(sent[0] + 1.013, abs=1e-5) and sent[1] < sent[0] + 60 / 57
    # A send that will not report its headers: the next waits the target's interval
    at(lim, 10)
    quiet, after = lim.acquire(scope, limits), lim.acquire(scope, limits)
    assert after.wait_s - quiet.wait_s == pytest.approx(1.0)
    at(lim, 10 + quiet.wait_s)
    assert lim.hold_back(quiet, scope) == 0.0
    at(lim, 10 + after.wait_s)
    assert lim.hold_back(after, scope, report=True) == pytest.approx(-(60 / 57 - 1.0), abs=1e-5)
    # The request bucket holds the provider's full rate's 0.8 s; input keeps the target's
    state = lim.state(scope)
    assert float(state["requests"]["capacity"]) == pytest.approx(60 / 60 * 0.8)
    assert float(state["input_tokens"]["capacity"]) == pytest.approx(38_000 / 60 * 0.8)
    large = "llm:k:large-key"  # 570 RPM in 0.8 s: not paced, planned at the target
    big = ScopeLimits(rpm=570, burst_s=0.8, learned_utilization=0.95)
    at(lim, 40)
    gs = [lim.acquire(large, big) for _ in range(12)]
    assert gs[-1].wait_s - gs[-2].wait_s == pytest.approx(60 / 570)


def test_a_prompt_larger_than_the_bucket_waits_for_the_refill_after_the_last_ones_headers(lim):
    """admitted.lua: a prompt larger than the input bucket (927 tokens reserved; 38,000 ITPM
    in 0.8 s, the limiter's view of 40,000 in 1 s) is admitted by the provider into a full
    bucket only: the next waits the last one's input refill at the provider's full rate
    (927 / 40,000 a minute: 1.39 s) and 10 ms after the last one's headers came back."""
    scope = "llm:k:long-admitted"
    limits = ScopeLimits(rpm=6000, itpm=38_000, burst_s=0.8, learned_utilization=0.95)
    at(lim, 0)
    first = lim.acquire(scope, limits, input_tokens=927)
    second = lim.acquire(scope, limits, input_tokens=927)
    refill = second.wait_s - first.wait_s  # 1.46 s: the limiter's, at 0.95 of the rate
    at(lim, first.wait_s)
    assert lim.hold_back(first, scope, report=True).report
    at(lim, first.wait_s + 0.3)
    lim.admitted(first, scope)
    at(lim, second.wait_s)
    assert lim.hold_back(second, scope, report=True) == pytest.approx(
        -(0.3 + 927 * 60 / 40_000 + 0.01 - refill), abs=1e-5)
    short = "llm:k:short-admitted"  # a prompt the bucket holds: not paced, nothing asked
    at(lim, 10)
    g = lim.acquire(short, limits, input_tokens=300)
    assert not lim.hold_back(g, short, report=True).report
    # At a bucket of one request too, a short prompt after a long one waits the request's
    # interval after the long one's headers, not its input's refill (the provider needs
    # only the short one's room: bench.small_keys --mix lost 0.4 s a run to it).
    both = "llm:k:both-admitted"
    small = ScopeLimits(rpm=57, itpm=38_000, burst_s=0.8, learned_utilization=0.95)
    at(lim, 20)
    long_one = lim.acquire(both, small, input_tokens=927)
    short_one = lim.acquire(both, small, input_tokens=30)
    at(lim, 20 + long_one.wait_s)
    assert lim.hold_back(long_one, both, report=True).report
    at(lim, 20 + long_one.wait_s + 0.3)
    lim.admitted(long_one, both)
    at(lim, 20 + short_one.wait_s)
    assert lim.hold_back(short_one, both, report=True) == pytest.approx(
        -(long_one.wait_s + 0.3 + 1.0 + 0.01 - short_one.wait_s), abs=1e-5)


def test_sends_a_stall_held_back_leave_paced_on_when_they_left_not_all_at_once(lim):
    """hold_back.lua: grants planned at 10 a second, the first 10 sent at once, then the
    sender stalls for 1.5 s (a loaded host, a busy loop): the 15 grants planned meanwhile are
    all due when it wakes. The provider's bucket (10 requests, 10 a second) was full since
    1 s and banked none of the refill after, so it holds 10: the sends are paced on when the
    last ones left, and none is refused when replayed through the simulator's bucket. (On
    planned times alone all 15 went at 1.5 s: five 429s, as a full run's gateway drew.)"""
    from drover.simulator.buckets import TokenBucket

    scope, limits = "llm:k:stalled", ScopeLimits(rpm=600, burst_s=1)
    at(lim, 0)
    grants = [lim.acquire(scope, limits) for _ in range(25)]
    assert [g.wait_s for g in grants[:11]] == pytest.approx([0.0] * 10 + [0.1])
    left = []
    for grant in grants:
        now = max(grant.wait_s, 1.5 if grant.wait_s > 0 else 0.0)  # the stall, then all due
        now = max(now, left[-1] if left else 0.0)
        at(lim, now)
        while (held := lim.hold_back(grant, scope)) < 0:
            now -= held
            at(lim, now)
        assert held == 0.0
        left.append(now)
    assert left[10:20] == pytest.approx([1.5] * 10)  # the bucket's 10 at once, then paced
    assert left[20:] == pytest.approx([1.6, 1.7, 1.8, 1.9, 2.0])
    provider = TokenBucket(600, 1, 0.0)
    for t in left:
        provider.refill(t)
        assert provider.shortfall_s(1) == 0.0, t
        provider.level -= 1
    assert lim.state(scope)["leases"] == 25


def test_a_prompt_larger_than_the_bucket_is_paced_on_when_the_last_one_left(lim):
    """hold_back.lua: a prompt larger than the limiter's input bucket (927 tokens; 38,000
    ITPM in 0.8 s holds 507) is admitted by the provider only into a full bucket, one refill
    of the last send's input after that send *left*. A call that leaves 0.35 s late moves the
    next one back by as much (on planned times alone it went 0.35 s early: a 429 on input
    tokens, bench.small_keys --mix); a smaller prompt is not held by it."""
    per = 60 / 38_000
    scope, limits = "llm:k:long-prompts", ScopeLimits(rpm=6000, itpm=38_000, burst_s=0.8)
    at(lim, 0)
    first = lim.acquire(scope, limits, input_tokens=927)
    second = lim.acquire(scope, limits, input_tokens=927)
    assert second.wait_s - first.wait_s == pytest.approx(927 * per)
    at(lim, first.wait_s + 0.35)  # the first leaves late
    assert lim.hold_back(first, scope) == 0.0
    at(lim, second.wait_s)  # the second's planned send
    assert lim.hold_back(second, scope) == pytest.approx(-0.35, abs=1e-5)
    assert lim.state(scope)["leases"] == 2  # paced, not held back: its grant stands
    at(lim, first.wait_s + 0.35 + 927 * per + 1e-5)
    assert lim.hold_back(second, scope) == 0.0
    short = "llm:k:short-prompts"  # 300 tokens: the late-send allowance covers them
    at(lim, 10)
    a = lim.acquire(short, limits, input_tokens=300)
    b = lim.acquire(short, limits, input_tokens=300)
    assert a.wait_s == 0.0 and 0.1 < b.wait_s < 0.2
    at(lim, 10.1)  # a leaves 0.1 s late
    assert lim.hold_back(a, short) == 0.0
    at(lim, 10 + b.wait_s)  # b on time: not held for a's input
    assert lim.hold_back(b, short) == 0.0


def test_an_answer_longer_than_its_reservation_holds_back_the_sends_granted_before_it(lim):
    """hold_back.lua: the provider admits a request while its output bucket has room and
    debits each answer as it is generated. An answer of 300 tokens, reserved as 50, put that
    bucket (100 tokens, full when it was sent) 200 tokens in debt; a call granted before that
    answer was settled, planned without it, waits until the debt has refilled (2.2 s at 100
    tokens a second), not only until its own planned send. (On planned times alone it went
    out at once: a 429 on output tokens, bench.small_keys --mix.) Scopes without an output
    limit are not held."""
    scope, limits = "llm:k:long", ScopeLimits(rpm=6000, otpm=6000, burst_s=1)  # 100 tokens
    at(lim, 0)
    a = lim.acquire(scope, limits, input_tokens=10, output_tokens=50)
    b = lim.acquire(scope, limits, input_tokens=10, output_tokens=50)
    assert a.wait_s == b.wait_s == 0.0  # one bucket holds both
    assert lim.hold_back(a, scope) == 0.0  # a goes
    at(lim, 0.2)
    lim.settle(scope, limits, a, input_tokens=10, output_tokens=300)
    at(lim, 0.25)
    assert lim.hold_back(b, scope) == pytest.approx(-1.95, abs=1e-5)
    assert lim.state(scope)["leases"] == 1  # b's: held, not refused, its grant stands
    at(lim, 2.2)
    assert lim.hold_back(b, scope) == 0.0
    # A call granted after the settle was planned behind the debt: it waits no longer.
    c = lim.acquire(scope, limits, input_tokens=10, output_tokens=50)
    at(lim, 2.2 + c.wait_s)
    assert lim.hold_back(c, scope) <= 0.0
    plain = "llm:k:requests-only"
    at(lim, 10)
    g = lim.acquire(plain, ScopeLimits(rpm=6000, burst_s=1), output_tokens=50)
    assert lim.hold_back(g, plain) == 0.0
    lim.settle(plain, ScopeLimits(rpm=6000, burst_s=1), g, input_tokens=0, output_tokens=900)
    g2 = lim.acquire(plain, ScopeLimits(rpm=6000, burst_s=1), output_tokens=50)
    assert lim.hold_back(g2, plain) == 0.0


def test_hold_back_reads_the_one_keys_stop_in_the_same_call(lim):
    """hold_back.lua with ``stop`` (the one key's alias): a key stopped fleet-wide since the
    grant (its spend limit) answers inf and changes nothing (the caller releases the grant
    and sends nothing), in the one trip to Redis the send makes anyway; a key not stopped,
    or enabled again, lets the grant go."""
    scope, limits = "llm:solo:stopped", ScopeLimits(rpm=600, burst_s=1)
    at(lim, 0)
    grant = lim.acquire(scope, limits)
    assert lim.hold_back(grant, scope, stop="solo") == 0.0
    again = lim.acquire(scope, limits)
    lim.disable_key("solo", why="spend limit (429): test")
    assert lim.hold_back(again, scope, stop="solo") == math.inf
    assert lim.state(scope)["leases"] == 2  # nothing changed: its lease stays to release
    assert lim.hold_back(again, scope, stop="other") == 0.0  # another key's stop
    lim.enable_key("solo")
    assert lim.hold_back(lim.acquire(scope, limits), scope, stop="solo") == 0.0
