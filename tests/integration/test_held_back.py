"""A call held back by a cooldown that began after its grant (workers/agent/llm.py's
``_HeldBack``, limiter/lua/hold_back.lua) keeps its reservation spent, through drover's real
LLM path: the runtime, the limiter in Redis, the SDK and the simulator."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from drover.workers.agent.limits import llm_limits
from drover.workers.agent.llm import CallContext, create_message
from drover.workers.limiter import Limiter, llm_scope
from tests.helpers import configure, wait_until


def test_a_call_held_back_by_a_later_cooldown_plans_again_behind_the_calls_granted_before(
        sim, drover_env, monkeypatch, redis_url):
    """15 requests a minute and a bucket of one request (4 s of refill): the test's own
    grant A goes now, the call through ``create_message`` is granted for 4 s later, the
    test's grant B after it; then a cooldown (a 429 elsewhere) begins while the call waits.
    At its planned send the call is held back and plans again: with its reservation kept it
    goes behind B (the next grant after it comes two requests' refill after B's); handed back
    (``release`` in the held-back path, or a refund in hold_back.lua) the refund reopens a
    place before B's, and the next grant comes about one after B's.

    Nothing here races the real clock. The call's check before its send (``Route.hold_back``)
    waits until the cooldown is set: a test process starved on two cores (a full run at a
    load of 20) once set it after the call had passed that check, unseen by the simulator
    yet, and saw a gap of one request. And the cooldown ends halfway between B's grant and
    B's planned send, whenever B was granted: it holds at the call's check, and it ends
    before B's send, so it empties no level B's reservation had not (a fixed 4 s from A's
    grant did only while the test kept within 3.6 s of it)."""
    configure(monkeypatch, drover_env, rpm=15, burst_seconds=4.4, late_send_s=0.4,
              target_utilization=1.0)
    sim.configure(tool_turns=0)
    from drover.config import get_settings
    from drover.workers.agent.routes import Route
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    cooled = threading.Event()
    checked = Route.hold_back

    async def hold_back_once_cooled(self, *args, **kwargs):
        await asyncio.to_thread(cooled.wait, 60)  # (bounded: a failed test ends the call)
        return await checked(self, *args, **kwargs)

    monkeypatch.setattr(Route, "hold_back", hold_back_once_cooled)
    settings = get_settings()
    rt = get_runtime(services())
    scope, limits = llm_scope(settings.key_alias, settings.model), llm_limits(
        settings, settings.model)
    lim = Limiter(redis.Redis.from_url(redis_url), prefix=settings.key_prefix,
                  horizon_s=settings.horizon_s)
    a = lim.acquire(scope, limits)
    assert a.granted and a.wait_s == 0
    params = {"model": settings.model, "max_tokens": 50,
              "messages": [{"role": "user", "content": "Summarise the contract"}]}
    call = rt.submit(create_message(rt, params, CallContext("held", 0, asyncio.Event())))
    wait_until("the call's grant", lambda: lim.state(scope)["leases"] == 2, timeout=30)
    b = lim.acquire(scope, limits)
    assert b.granted and b.wait_s > 0, "B is not behind the call"
    lim.cooldown(scope, limits, (b.send_us - b.now_us) / 2e6)
    assert sim.stats()["accepted"] == 0, "the call went out before the cooldown began"
    assert lim.state(scope)["cooldown_s"] > 0, "the cooldown ended before the call's check"
    cooled.set()
    call.result(timeout=60)
    assert sim.stats()["accepted"] == 1
    c = lim.acquire(scope, limits)
    assert c.granted
    # One request's refill after B's send: the held-back call's new place; one more: C's
    # (at the rate after the 429, which cut the share the limiter learns by a tenth).
    per = 1 / lim.state(scope)["requests"]["rate_per_s"]
    assert (c.send_us - b.send_us) / 1e6 == pytest.approx(2 * per, abs=0.01)
    for grant in (a, b, c):
        lim.release(scope, grant)
