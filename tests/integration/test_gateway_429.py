"""`drover gateway` waits out a provider's 429 for its caller (orchestrator/gateway/_forward.py):
the call path cools the scope down for the whole fleet, and the request goes again through
the limits behind that cooldown, instead of reaching a caller that has retries off."""

from __future__ import annotations

import anthropic
import pytest

from tests.helpers import configure
from tests.helpers.gateway import GATEWAY_KEYS


def _ask(gw, text: str):  # noqa: ANN001, ANN202
    from drover.config import get_settings

    client = anthropic.Anthropic(base_url=gw.url, api_key=GATEWAY_KEYS["web"], max_retries=0,
                                 timeout=60)
    return client.messages.create(model=get_settings().model, max_tokens=20,
                                  messages=[{"role": "user", "content": text}])


def test_a_provider_429_is_waited_out_behind_the_fleet_cooldown_not_handed_to_the_caller(
        drover_env, sim, gateway):
    """The provider answers the first try 429 with retry-after 1 s: the caller, retries off,
    gets the answer of the second try, which the limiter sent after the cooldown the 429
    began (the provider saw it at least that long after the first)."""
    sim.configure(tool_turns=0, output_tokens_mean=20, inject_429_retry_after=1)
    gw = gateway()
    answer = _ask(gw, "Tides, once refused [[sim:429:1]]")
    assert answer.usage.output_tokens > 0
    stats = sim.stats()
    assert (stats["rejected_429"], stats["accepted"]) == (1, 1)
    first, second = sim.arrivals()[-2:]
    assert second - first >= 1.0  # held by the fleet-wide cooldown, not sent again at once


def test_a_429_that_outlasts_the_attempts_reaches_the_caller_as_it_came(
        monkeypatch, drover_env, sim, gateway):
    """DROVER_MAX_ATTEMPTS bounds the waiting: a key refused every time has its caller see
    the provider's 429 after that many tries, not wait for ever."""
    sim.configure(tool_turns=0, output_tokens_mean=20, inject_429_retry_after=1)
    configure(monkeypatch, drover_env, max_attempts=2)
    gw = gateway()
    with pytest.raises(anthropic.RateLimitError):
        _ask(gw, "Currents, always refused [[sim:429:9]]")
    stats = sim.stats()
    assert (stats["rejected_429"], stats["accepted"]) == (2, 0)


def test_a_gateway_stalled_mid_flood_sends_what_it_held_paced_not_at_once(
        monkeypatch, drover_env, sim, gateway):
    """200 calls into 900 requests a minute in 1 s bursts (the rate binds), and the gateway
    stopped for 1.5 s while they go (SIGSTOP: a host too loaded to run it): the calls planned
    meanwhile are all due when it runs again, into a provider bucket that was full for part
    of the stop and banked none of that refill. They leave a bucket at once, then paced on
    when the ones before them left (hold_back.lua's ``sr``): the provider refuses none. (Sent
    on their planned instants alone: 7 and 8 429s in two runs, as a full run's loaded
    gateway drew two.)"""
    import asyncio
    import os
    import signal
    import time

    from drover.config import get_settings

    sim.configure(rpm=900, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=900, burst_seconds=1, max_in_flight=1000)
    gw = gateway()
    assert gw.proc is not None
    model = get_settings().model

    async def run() -> list[object]:
        client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=GATEWAY_KEYS["batch"],
                                          max_retries=0, timeout=120)
        try:
            calls = [asyncio.create_task(client.messages.create(
                model=model, max_tokens=20,
                messages=[{"role": "user", "content": f"Berth {i}"}])) for i in range(200)]
            while sim.stats()["accepted"] < 40:  # the rate binds by now
                await asyncio.sleep(0.05)
            os.kill(gw.proc.pid, signal.SIGSTOP)
            time.sleep(1.5)  # the whole process stalls: this loop too, on purpose
            os.kill(gw.proc.pid, signal.SIGCONT)
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await client.close()

    results = asyncio.run(run())
    assert not [r for r in results if isinstance(r, BaseException)]
    stats = sim.stats()
    assert (stats["accepted"], stats["rejected_429"]) == (200, 0)
