"""Budgets stop sub-agents where they should: the turn cap, a sub-agent's token budget and the
job's token budget shared in Redis. The simulator's request count is the referee."""

from __future__ import annotations

from drover import JobSpec, submit
from drover.workers.jobs.records import SubagentResult


def _tokens(record: SubagentResult) -> int:
    """Tokens as budgets count them: input, output and cache writes."""
    u = record.usage
    return u.input_tokens + u.output_tokens + u.cache_creation_input_tokens


def test_the_turn_cap_stops_each_subagent_after_that_many_calls_with_its_partial_summary(
        sim, worker):
    sim.configure(tool_turns=5, tools_per_turn=1)
    worker(concurrency=3)
    handle = submit(JobSpec(subtasks=["Trace port congestion", "Trace fuel prices",
                                      "Trace driver wages"],
                            tools=["lookup_fact"], max_turns=2))
    result = handle.wait(timeout=60)

    assert result.counts["budget_exceeded"] == 3
    for record in result.results:
        assert record.usage.calls == 2 and record.turns == 2
        assert record.error_type == "budget_exceeded" and "turn cap of 2" in record.error
        assert record.summary.startswith("I will use lookup_fact")  # what it had so far
        assert len(handle.report(record.index).tried) == 2  # both turns' tools ran
    assert sim.stats()["accepted"] == 6


def test_a_subagent_token_budget_stops_it_at_the_first_call_that_spends_it(sim, worker):
    sim.configure(tool_turns=6, tools_per_turn=1)
    worker(concurrency=1)
    task = ["Estimate warehouse costs in three regions"]

    def run(**limits: int) -> SubagentResult:
        spec = JobSpec(subtasks=task, tools=["lookup_fact"], **{"max_turns": 20, **limits})
        return submit(spec).wait(timeout=60).results[0]

    # The simulator answers the same conversation the same way: learn what the first two
    # calls cost, then set budgets around them.
    one, two = run(max_turns=1), run(max_turns=2)
    assert _tokens(one) < _tokens(two)
    before = sim.stats()["accepted"]

    stopped_after_one = run(subagent_token_budget=_tokens(one))
    stopped_after_two = run(subagent_token_budget=_tokens(one) + 1)
    unlimited = run()

    assert stopped_after_one.usage.calls == 1 and _tokens(stopped_after_one) == _tokens(one)
    assert stopped_after_two.usage.calls == 2 and _tokens(stopped_after_two) == _tokens(two)
    for record in (stopped_after_one, stopped_after_two):
        assert record.status == "budget_exceeded"
        assert "sub-agent token budget" in record.error
        assert record.summary  # partial findings kept
    assert unlimited.status == "ok" and unlimited.usage.calls == 7
    assert sim.stats()["accepted"] - before == 1 + 2 + 7


def test_the_job_budget_stops_subagents_that_have_not_started(sim, worker):
    sim.configure(tool_turns=1, tools_per_turn=1)
    worker(concurrency=1)  # one at a time: the budget is crossed at a known point
    probe = submit(JobSpec(subtasks=["Compare freight rates 0"], tools=["lookup_fact"]))
    per_subagent = _tokens(probe.wait(timeout=60).results[0])
    budget = int(per_subagent * 3.5)
    sim.reset()

    handle = submit(JobSpec(subtasks=[f"Compare freight rates {i}" for i in range(10)],
                            tools=["lookup_fact"], token_budget=budget))
    result = handle.wait(timeout=90)

    by_finish = sorted(result.results, key=lambda r: r.finished_at)
    worked = [r for r in by_finish if r.usage.calls]
    idle = [r for r in by_finish if not r.usage.calls]
    assert 3 <= len(worked) <= 5 and len(idle) >= 5
    assert all(r.status == "budget_exceeded" and "job token budget" in r.error for r in idle)
    spent = sum(_tokens(r) for r in result.results)
    assert spent >= budget
    assert spent - _tokens(worked[-1]) < budget  # the last one to call started under budget
    # Every call counted once, by the provider and by the job's shared counter.
    assert sim.stats()["accepted"] == result.usage.calls
    assert handle.store.spending.spent(handle.id) == spent
    stopped_midway = [r for r in worked if r.status == "budget_exceeded"]
    assert all(r.summary for r in stopped_midway)


def test_the_shared_job_budget_counts_every_call_of_parallel_subagents_once(sim, worker):
    sim.configure(tool_turns=1, tools_per_turn=2, latency_mean_s=0.05, latency_p95_s=0.1)
    worker(concurrency=8)
    handle = submit(JobSpec(subtasks=[f"Audit depot {i}" for i in range(24)],
                            tools=["lookup_fact"], token_budget=6_000))
    result = handle.wait(timeout=90)

    spent = sum(_tokens(r) for r in result.results)
    assert handle.store.spending.spent(handle.id) == spent  # atomic: no update lost between workers
    assert sim.stats()["accepted"] == result.usage.calls
    assert result.counts["budget_exceeded"] > 0 and result.counts["ok"] > 0
    assert result.counts["ok"] + result.counts["budget_exceeded"] == 24
