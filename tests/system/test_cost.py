"""Money: what a job costs at its prices against the provider's bill, with worker
subprocesses, real Redis and the real SDK over HTTP to the simulator, which bills every
request it admitted at its own prices (``stats()["billing"]``).

The figures of docs/cost.md come from here:
``python -m pytest tests/system/test_cost.py -n 0 -q -s -p no:cacheprovider``.
"""

from __future__ import annotations

import json
import uuid

from drover import JobSpec, estimate, submit
from drover.orchestrator.ops.stats import fleet_cost
from drover.workers.services import services
from tests.helpers import configure, stop_process_group, wait_for_workers, wait_until

# Round prices unlike any table's, the same on both sides.
PRICES = {"claude-sonnet-4-6": {"input": 2.0, "output": 10.0, "cache_write": 2.5,
                                "cache_read": 0.2}}


def test_a_jobs_cost_matches_the_providers_bill_at_the_same_prices(
        sim, spawn_worker, drover_env, monkeypatch):
    sim.configure(prices=PRICES, tool_turns=1, output_tokens_mean=80)
    configure(monkeypatch, drover_env, prices=json.dumps(PRICES))
    workers = [spawn_worker(concurrency=8), spawn_worker(concurrency=8)]
    wait_for_workers(2)
    tenant = f"cost-{uuid.uuid4().hex[:6]}"  # its own series in the fleet's counters
    spec = JobSpec(subtasks=[f"Assess supplier {i}" for i in range(120)],
                   tools=["lookup_fact"], max_tokens=300, tenant=tenant)
    worst = estimate(spec).worst
    handle = submit(spec)
    result = handle.wait(timeout=300)
    # drover_cost_usd{model, tenant}, as `drover metrics` and `drover stats` read it.
    fleet = wait_until("the workers' cost counters flushed", lambda: (
        fleet_cost(services())[0].get(("claude-sonnet-4-6", tenant), 0)
        >= result.cost_usd - 1e-9))
    for proc in workers:
        stop_process_group(proc)
    bill = sim.stats()["billing"]
    assert result.counts["ok"] == 120, result.counts
    assert result.cost_usd is not None and bill["usd"] > 0
    ratio = result.cost_usd / bill["usd"]
    print(f"\n120 sub-agents, {result.usage.sent_calls} calls: the job's cost_usd "
          f"${result.cost_usd:.6f}, the simulator's bill ${bill['usd']:.6f}, ratio {ratio:.4f}")
    assert 0.95 <= ratio <= 1.20, (result.cost_usd, bill)
    # What drover estimate said before: the worst case bounds what it cost.
    assert worst.cost_usd is not None and result.cost_usd <= worst.cost_usd
    assert result.usage.sent_calls <= worst.calls
    assert fleet and fleet_cost(services())[0][("claude-sonnet-4-6", tenant)] < (
        result.cost_usd * 1.0001)
    # Each record's dollars add up to the job's (no planning or synthesis call here).
    assert abs(sum(r.cost_usd or 0 for r in handle.records()) - result.cost_usd) < 1e-9
    from drover.orchestrator.cli.watch import usage_lines

    assert any(line.startswith(f"cost: ${result.cost_usd:,.4f}")
               for line in usage_lines(result.usage))
