"""Caps in dollars: ``JobSpec(max_cost_usd=...)`` and a tenant's ``usd_per_month``, checked
before each call (a realtime call, or a turn put into a Message Batch) with its worst case
reserved, so a job stops within one call's worth of its cap. Worker subprocesses, real Redis,
the real SDK over HTTP to the simulator, which bills at the same prices
(``stats()["billing"]``).

``python -m pytest tests/system/test_caps.py -n 0 -q -s -p no:cacheprovider``"""

from __future__ import annotations

import json
import uuid

import redis

from drover import JobSpec, submit
from drover.config.prices import derive_price
from tests.helpers import configure, wait_for_workers

PRICES = {"claude-sonnet-4-6": {"input": 3.0, "output": 15.0}}
PRICE = derive_price(PRICES["claude-sonnet-4-6"], "anthropic")
MAX_TOKENS = 200


def _within_one_call(sim, cap: float, result, words: str) -> list:  # noqa: ANN001
    """The goal: what the simulator billed is at most the cap plus the worst case of the
    largest call it took (its input at the cache-write price, the dearer, and max_tokens of
    output). Prints the figures; returns the job's budget_exceeded records."""
    stats = sim.stats()
    bill = stats["billing"]["usd"]
    worst = (stats["max_request_input_tokens"] * PRICE.cache_write
             + MAX_TOKENS * PRICE.output) / 1e6
    print(f"\n{words} ${cap:.2f}: the provider billed ${bill:.4f}, the job counts "
          f"${result.cost_usd:.4f}; one call's worst case ${worst:.4f}; {result.counts}")
    assert bill <= cap + worst, (bill, cap, worst)
    return result.by_status("budget_exceeded")


def _spec(n: int, **more: object) -> JobSpec:
    return JobSpec(subtasks=[f"Assess supplier {i}" for i in range(n)], tools=["lookup_fact"],
                   max_tokens=MAX_TOKENS, **more)


def test_a_job_capped_in_dollars_stops_within_one_calls_worth(
        sim, spawn_worker, drover_env, monkeypatch):
    sim.configure(prices=PRICES, tool_turns=1, output_tokens_mean=80,
                  latency_mean_s=0.2, latency_p95_s=0.4)
    configure(monkeypatch, drover_env, prices=json.dumps(PRICES))
    for _ in range(2):
        spawn_worker(concurrency=8)
    wait_for_workers(2)
    cap = 0.20
    result = submit(_spec(120, max_cost_usd=cap)).wait(timeout=300)
    over = _within_one_call(sim, cap, result, "a job capped at")
    assert result.cost_usd is not None and result.cost_usd <= cap * 1.05
    assert result.counts["ok"] >= 1 and over, result.counts
    assert all("cost cap of $0.2000 (JobSpec.max_cost_usd)" in (r.error or "") for r in over)
    never = [r for r in over if r.usage.sent_calls == 0]
    assert never, "the sub-agents that had not started ended without a call"


def test_a_tenants_monthly_cap_holds_across_its_jobs(
        sim, spawn_worker, drover_env, monkeypatch):
    tenant = f"team-{uuid.uuid4().hex[:6]}"  # this month's tally is this test's alone
    cap = 0.15
    sim.configure(prices=PRICES, tool_turns=0, output_tokens_mean=80)
    configure(monkeypatch, drover_env, prices=json.dumps(PRICES),
              tenant_budgets=json.dumps({tenant: {"usd_per_month": cap}}))
    spawn_worker(concurrency=8)
    wait_for_workers(1)
    first = submit(_spec(30, tenant=tenant)).wait(timeout=300)
    assert first.counts["ok"] == 30, first.counts
    second = submit(_spec(200, tenant=tenant)).wait(timeout=300)
    over = _within_one_call(sim, cap, second, "two jobs of a tenant capped a month at")
    assert over and all(f"monthly cost cap of tenant {tenant}" in (r.error or "")
                        for r in over)
    # A job's own calls are the tenant's too: with its month spent, a goal is not planned.
    accepted = sim.stats()["accepted"]
    planned = submit(JobSpec(goal="Survey the depots", max_tokens=MAX_TOKENS,
                             tenant=tenant)).wait(timeout=120)
    assert planned.status == "failed" and f"monthly cost cap of tenant {tenant}" in (
        planned.reason or ""), (planned.status, planned.reason)
    assert sim.stats()["accepted"] == accepted



def _batch_job(sim, spawn_worker, env, monkeypatch, more_env: dict,  # noqa: ANN001
               **spec: object) -> tuple:
    """120 one-call sub-agents by Message Batch (the first a request the provider refuses:
    its reservation settles to nothing): the job's result, the simulator's bill and one
    call's worst case at the batch price (as ``_within_one_call``'s, halved)."""
    sim.configure(prices=PRICES, tool_turns=0, output_tokens_mean=80, batch_processing_s=0.5)
    configure(monkeypatch, env, prices=json.dumps(PRICES), DROVER_BATCH_LINGER_S=0.3,
              DROVER_BATCH_POLL_S=0.2, DROVER_BATCH_TICK_S=0.1, DROVER_BATCH_RPM=6000,
              **more_env)
    spawn_worker(concurrency=8)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=["Assess supplier 0 [[sim:400]]",
                                      *(f"Assess supplier {i}" for i in range(1, 120))],
                            tools=["lookup_fact"], max_tokens=MAX_TOKENS, delivery="batch",
                            **spec))
    result = handle.wait(timeout=300)
    stats = sim.stats()
    assert stats["accepted"] == 0, "every call went by batch"
    bill = stats["billing"]["usd"]
    worst = (stats["batches"]["max_request_input_tokens"] * PRICE.cache_write
             + MAX_TOKENS * PRICE.output) / 1e6 * PRICE.batch
    print(f"\na batch job ({spec}): the provider billed ${bill:.4f} (batch "
          f"${stats['billing']['batch_usd']:.4f}), the job counts ${result.cost_usd:.4f}; one "
          f"call's worst case ${worst:.4f}; {result.counts}")
    assert result.cost_usd is not None and abs(result.cost_usd - bill) < 1e-6
    over = result.by_status("budget_exceeded")
    assert result.counts["ok"] >= 1 and over, result.counts
    assert all(r.usage.sent_calls == 0 and r.usage.batch_calls == 0 for r in over)
    return result, bill, worst


def _tally(redis_url: str, key: str) -> float:
    """The dollars a cap's key holds spent or reserved."""
    return int(redis.Redis.from_url(redis_url).hget(key, "usd") or 0) / 1e9


def test_a_batch_job_capped_in_dollars_stops_within_one_calls_worth(
        sim, spawn_worker, drover_env, monkeypatch, redis_url):  # noqa: ANN001
    """delivery="batch": each turn's worst case at the batch price is reserved before it is
    queued, and settled with its result's cost (an errored one's with nothing)."""
    cap = 0.05  # about half of the 120 calls' bill at the batch price (~$0.09 uncapped)
    result, bill, worst = _batch_job(sim, spawn_worker, drover_env, monkeypatch, {},
                                     max_cost_usd=cap)
    assert bill <= cap + worst, (bill, cap, worst)
    assert all("cost cap of $0.0500 (JobSpec.max_cost_usd)" in (r.error or "")
               for r in result.by_status("budget_exceeded"))
    # Every reservation was settled: the job's tally is what its results cost.
    tally = _tally(redis_url, f"{drover_env['DROVER_KEY_PREFIX']}:job:{result.job_id}:usd")
    assert abs(tally - bill) < 1e-6, (tally, bill)


def test_a_tenants_monthly_cap_holds_for_its_batch_jobs(
        sim, spawn_worker, drover_env, monkeypatch, redis_url):  # noqa: ANN001
    from drover.workers.agent.caps import month

    tenant = f"team-{uuid.uuid4().hex[:6]}"  # this month's tally is this test's alone
    cap = 0.04
    result, bill, worst = _batch_job(
        sim, spawn_worker, drover_env, monkeypatch,
        {"tenant_budgets": json.dumps({tenant: {"usd_per_month": cap}})}, tenant=tenant)
    assert bill <= cap + worst, (bill, cap, worst)
    assert all(f"monthly cost cap of tenant {tenant}" in (r.error or "")
               for r in result.by_status("budget_exceeded"))
    tally = _tally(redis_url, f"{drover_env['DROVER_KEY_PREFIX']}:tenant:{tenant}:usd:{month()}")
    assert abs(tally - bill) < 1e-6, (tally, bill)


def test_the_jobs_own_calls_spend_from_its_cap_too(sim, spawn_worker, drover_env, monkeypatch):
    # The planning call of a goal and the join's synthesis are the job's calls: a cap that
    # has no room for the planning call's worst case (about $0.003) ends the job before any
    # call is sent; a synthesis the sub-agents left no room for is not made. Every answer is
    # 80 tokens (0.4 x max_tokens), and one thread runs the sub-agents one after another: all
    # four are answered (about $0.0014 each, each reserved at its worst case, $0.0033), and
    # the cap below leaves the synthesis (up to about $0.0049) about $0.001 short. (With
    # four threads, whether the fourth sub-agent's reservation found the first ones settled
    # was up to the host: a refused one ends the job's spending, so its synthesis too, but
    # in a full run at a load of 14 all four fitted one by one under a cap of $0.012, and
    # the synthesis was made.)
    sim.configure(prices=PRICES, tool_turns=0, output_tokens_mean=80,
                  output_share_min=0.4, output_share_max=0.4)
    configure(monkeypatch, drover_env, prices=json.dumps(PRICES))
    spawn_worker(concurrency=1)
    wait_for_workers(1)
    planned = submit(JobSpec(goal="Survey the harbour's cranes", max_tokens=MAX_TOKENS,
                             max_cost_usd=0.001)).wait(timeout=120)
    assert planned.status == "failed" and "cost cap of $0.0010" in (planned.reason or ""), (
        planned.status, planned.reason)
    assert sim.stats()["accepted"] == 0
    cap = 0.0095  # room for the four sub-agents' calls, none for a synthesis after them
    joined = submit(_spec(4, max_cost_usd=cap, synthesize=True)).wait(timeout=120)
    assert joined.counts["ok"] == 4, joined.counts
    assert joined.synthesis is not None and joined.synthesis.startswith(
        "(synthesis not made: the job's cost cap"), joined.synthesis
    _within_one_call(sim, cap, joined, "a job and its synthesis capped at")
