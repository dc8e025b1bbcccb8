"""The global limiter end to end: real worker processes, real Redis, the real SDK over HTTP to
a simulator whose limits are drover's own (DROVER_RPM/ITPM/OTPM == SimConfig rpm/itpm/otpm).

The first test is the heavy one (about 70 s): the benchmark's 200-sub-agent workload
(`bench/workload.py`: 3 to 8 calls each, prompts of 20 to 700 words, answers of 60 to 500
tokens), 4 worker processes. The provider must see no 429 and no 60 s window over any
limit, and the busy period must run at >= 90% of the tightest limit.
"""

from __future__ import annotations

from bench.workload import FULL, MAX_TOKENS, MODEL, SYSTEM, TOOL_NAMES
from orchestrator import JobSpec, submit
from tests.conftest import configure

DIMS = {"rpm": ("accepted", "requests"), "itpm": ("input_tokens", "input_tokens"),
        "otpm": ("output_tokens", "output_tokens")}


def _spec(subtasks: list[str]) -> JobSpec:
    return JobSpec(subtasks=subtasks, system=SYSTEM, tools=TOOL_NAMES, max_tokens=MAX_TOKENS,
                   model=MODEL, max_turns=10)


def _limit_env(limits: dict[str, float]) -> dict[str, str]:
    return {"model": MODEL, **{dim: f"{value:g}" for dim, value in limits.items()}}


def test_four_workers_run_200_subagents_at_the_limits_without_a_single_429(
        sim, drover_env, monkeypatch, spawn_worker):
    workload = FULL  # the benchmark's workload, without its 2% 529s: this is about limits
    sim.configure(**workload.sim_config(overload_rate=0.0).to_dict())
    configure(monkeypatch, drover_env, **_limit_env(workload.limits))
    for _ in range(4):
        spawn_worker(concurrency=8, pool="threads")

    result = submit(_spec(workload.tasks)).wait(timeout=400)

    stats = sim.stats()
    assert result.counts["ok"] == workload.subagents, (
        [r for r in result.results if r.status != "ok"][:3],
        {k: v for k, v in stats.items() if k != "timeline"})
    assert stats["accepted"] == workload.demand.requests  # every call once, none repeated
    assert stats["input_tokens"] == workload.demand.input_tokens
    assert stats["rejected_429"] == 0
    limits = stats["limits"]
    for dim, (_, window) in DIMS.items():
        assert stats["max_60s"][window] <= limits[dim], (dim, stats["max_60s"], limits)
    # Utilisation of each limit over the provider's busy period; the tightest must be >= 90%.
    busy_s = stats["last_done_ts"] - stats["first_accept_ts"]
    utilisation = {dim: stats[total] / busy_s / (limits[dim] / 60)
                   for dim, (total, _) in DIMS.items()}
    assert max(utilisation.values()) >= 0.90, (utilisation, busy_s)


def test_a_429_on_one_worker_pauses_every_worker_for_its_retry_after(
        sim, drover_env, monkeypatch, spawn_worker):
    retry_after = 4  # whole seconds: the simulator's timeline has one row per second
    sim.configure(tool_turns=6, tools_per_turn=2, latency_mean_s=0.2, latency_p95_s=0.4,
                  inject_429_retry_after=retry_after)
    # Limits far above the traffic: no limiter wait but the 429's cooldown.
    configure(monkeypatch, drover_env, model=MODEL, rpm=100_000)
    for _ in range(4):
        spawn_worker(concurrency=8, pool="threads")
    subtasks = [f"Sub-agent {i}: research market {i}" for i in range(48)]
    # Sub-agent 40 starts once the first ones finish, in the middle of steady traffic from
    # all four workers; its first call is answered 429 (then it goes through).
    subtasks[40] += " [[sim:429:1]]"

    result = submit(_spec(subtasks)).wait(timeout=180)

    assert result.counts["ok"] == len(subtasks)
    stats = sim.stats()
    assert stats["rejected_429"] == 1
    rows = {row["t"]: row for row in stats["timeline"]}
    [hit] = [t for t, row in rows.items() if row["n429"]]

    def accepted(second: int) -> int:
        return rows.get(second, {"requests": 0})["requests"]

    # The 429 came at some instant of second `hit`, so [hit + 1, hit + retry_after) lies
    # inside the cooldown; the first of those seconds may still see requests that were on
    # their way when the 429 was answered, the others must see none from any worker.
    assert accepted(hit - 1) > 0  # traffic was flowing before the 429 ...
    paused = [accepted(s) for s in range(hit + 2, hit + retry_after)]
    assert paused == [0] * (retry_after - 2), (hit, [rows.get(s) for s in range(hit - 1, hit + 6)])
    after = sum(accepted(s) for s in range(hit + retry_after, hit + retry_after + 3))
    assert after > 0  # ... and resumed after the cooldown
