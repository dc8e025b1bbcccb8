"""The simulator's money, over real HTTP through the real SDKs: its bill in dollars at its
prices, and the spend limit in each provider's words, reached after N paid calls and lifted
through /_sim/config."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import anthropic
import openai
import pytest

from drover.simulator import SimulatorServer

PRICES = {"claude-sim-1": {"input": 3.0, "output": 15.0}, "gpt-sim-1": {"input": 2.0,
                                                                        "output": 8.0}}


def _configure(sim: SimulatorServer, **changes: object) -> None:
    request = urllib.request.Request(sim.url + "/_sim/config", json.dumps(changes).encode(),
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _ask(client: anthropic.Anthropic, text: str) -> anthropic.types.Message:
    return client.messages.create(model="claude-sim-1", max_tokens=300,
                                  messages=[{"role": "user", "content": text}])


def test_the_bill_is_every_admitted_call_at_the_prices(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(prices=PRICES)
    client = anthropic.Anthropic(base_url=sim.url, api_key="sk-a", max_retries=0)
    used = [_ask(client, f"Summarise topic {i}").usage for i in range(4)]
    stats = sim.stats()
    answered = sum(u.input_tokens * 3.0 + u.output_tokens * 15.0 for u in used) / 1e6
    assert stats["billing"]["usd"] == pytest.approx(answered)
    assert stats["billing"]["by_model"]["claude-sim-1"] == pytest.approx(answered)
    assert stats["billing"]["unpriced_requests"] == 0
    client.messages.create(model="claude-unpriced", max_tokens=50,
                           messages=[{"role": "user", "content": "hi"}])
    assert sim.stats()["billing"]["unpriced_requests"] == 1  # counted, never charged $0


def test_the_spend_limit_refuses_after_n_paid_calls_until_it_is_raised(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(prices=PRICES, spend_limit_calls=3)
    client = anthropic.Anthropic(base_url=sim.url, api_key="sk-a", max_retries=0)
    for i in range(3):
        _ask(client, f"question {i}")
    with pytest.raises(anthropic.RateLimitError) as refused:
        _ask(client, "one more")
    assert refused.value.body["error"]["details"]["error_code"] == "enforced_spend_limit_reached"
    assert "retry-after" not in refused.value.response.headers
    billed = sim.stats()["billing"]["usd"]
    assert sim.stats()["spend_limited"] == {"organization": 1}
    _configure(sim, spend_limit_calls=None)  # raised: the next call goes through
    _ask(client, "one more")
    assert sim.stats()["billing"]["usd"] > billed


def test_a_pool_keys_workspace_limit_refuses_that_key_only(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    pool = [{"alias": "a", "api_key": "sk-a"}, {"alias": "b", "api_key": "sk-b"}]
    sim = sim_factory(pool=pool, key_spend_limit_calls={"a": 1})
    a = anthropic.Anthropic(base_url=sim.url, api_key="sk-a", max_retries=0)
    b = anthropic.Anthropic(base_url=sim.url, api_key="sk-b", max_retries=0)
    _ask(a, "first")
    with pytest.raises(anthropic.RateLimitError) as refused:
        _ask(a, "second")
    assert "workspace" in refused.value.message
    for i in range(3):
        _ask(b, f"on b {i}")
    assert sim.stats()["spend_limited"] == {"workspace": 1}


def test_openais_spend_limit_is_insufficient_quota(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(provider="openai", prices=PRICES, spend_limit_calls=1)
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sk-a", max_retries=0)

    def chat() -> None:
        client.chat.completions.create(model="gpt-sim-1", max_completion_tokens=100,
                                       messages=[{"role": "user", "content": "hi"}])

    chat()
    with pytest.raises(openai.RateLimitError) as refused:
        chat()
    assert refused.value.body["code"] == "insufficient_quota"
    assert sim.stats()["billing"]["usd"] > 0
    _configure(sim, spend_limit_calls=5)
    chat()


def test_bad_prices_are_refused_by_the_config_route(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory()
    with pytest.raises(urllib.error.HTTPError) as refused:
        _configure(sim, prices={"m": {"input": 1}})
    assert refused.value.code == 400
