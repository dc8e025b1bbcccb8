"""Money through the limited SDK clients (``drover.AsyncAnthropic``), the second door of the
one call path: their calls count in ``drover_cost_usd``, respect a tenant's monthly cap, and a
key stopped for its spend limit sends nothing more. The real SDK over HTTP to the simulator,
the limiter and the counters in the real Redis."""

from __future__ import annotations

import asyncio
import json

import anthropic
import pytest

from tests.helpers import configure

PRICES = {"claude-sonnet-4-6": {"input": 3.0, "output": 15.0}}


def _fleet_usd(model: str) -> float:
    from drover.orchestrator.ops.stats import fleet_cost
    from drover.workers.services import services

    services().recorder.flush()
    return sum(usd for (m, _), usd in fleet_cost(services())[0].items() if m == model)


def _ask(llm, model: str, i: int):  # noqa: ANN001, ANN202
    return llm.messages.create(model=model, max_tokens=60, messages=[
        {"role": "user", "content": f"question {i}"}])


def test_a_limited_clients_calls_count_in_the_fleets_dollars(monkeypatch, drover_env, sim):
    sim.configure(tool_turns=0, output_tokens_mean=30, prices=PRICES)
    configure(monkeypatch, drover_env, prices=json.dumps(PRICES))
    import drover
    from drover.config import get_settings

    model = get_settings().model
    before = _fleet_usd(model)

    async def calls() -> None:
        llm = drover.AsyncAnthropic()
        await asyncio.gather(*(_ask(llm, model, i) for i in range(6)))

    asyncio.run(calls())
    bill = sim.stats()["billing"]["usd"]
    assert bill > 0 and _fleet_usd(model) - before == pytest.approx(bill, rel=1e-6)


def test_a_limited_client_sends_nothing_on_a_key_stopped_for_its_spend_limit(
        monkeypatch, drover_env, sim):
    sim.configure(tool_turns=0, output_tokens_mean=30, spend_limit_calls=3)
    import drover
    from drover.config import get_settings

    model = get_settings().model

    async def calls() -> list[object]:
        llm = drover.AsyncAnthropic(max_retries=0)
        out: list[object] = []
        for i in range(6):
            try:
                out.append(await _ask(llm, model, i))
            except Exception as error:  # noqa: BLE001  # what each call met, checked below
                out.append(error)
        return out

    results = asyncio.run(calls())
    stats = sim.stats()
    refused = [r for r in results if isinstance(r, BaseException)]
    # The provider refused once (the SDK's own spend-limit error); drover refused the rest
    # itself without sending, as the SDK's base error naming the limit (not retried).
    assert stats["accepted"] == 3 and stats["spend_cap_429"] == 1, stats
    assert len(refused) == 3
    assert isinstance(refused[0], anthropic.RateLimitError), refused
    for later in refused[1:]:
        assert isinstance(later, anthropic.AnthropicError), later
        assert "spend limit" in str(later) and "drover keys enable" in str(later), later


def test_an_own_subagents_calls_are_priced_at_the_model_they_name(
        monkeypatch, drover_env, sim, worker):
    """The team's function calls claude-sonnet-4-6 while the fleet's DROVER_MODEL is another
    model of another price: its records cost what the simulator bills, at the model called."""
    prices = {"claude-sonnet-4-6": {"input": 2.0, "output": 10.0},
              "claude-haiku-4-5": {"input": 0.5, "output": 1.0}}
    sim.configure(prices=prices, tool_turns=0)
    big = {"rpm": 6000, "itpm": 10_000_000, "otpm": 10_000_000}
    configure(monkeypatch, drover_env, prices=json.dumps(prices), model="claude-haiku-4-5",
              limits=json.dumps({"claude-sonnet-4-6": big}),
              tool_modules=json.dumps(["drover.workers.tools.demo",
                                       "tests.helpers.own_subagents"]))
    from drover import JobSpec, submit

    worker(concurrency=4)
    inputs = [{"topic": f"supplier {i}", "checks": 1} for i in range(4)]
    result = submit(JobSpec(subagent="research", inputs=inputs)).wait(timeout=120)
    bill = sim.stats()["billing"]
    assert result.counts["ok"] == 4, [r.error for r in result.results]
    assert set(bill["by_model"]) == {"claude-sonnet-4-6"}
    assert result.cost_usd == pytest.approx(bill["usd"], rel=1e-6)
