"""Cancel and a worker killed mid-job, on OpenAI (DROVER_PROVIDER=openai): the shapes of
test_cancel.py and test_worker_loss.py, smaller (a few dozen sub-agents, short latencies),
with real worker processes and the openai SDK over HTTP to the simulator's OpenAI mode."""

from __future__ import annotations

import time

import redis

from drover import JobSpec, submit
from drover.workers.limiter import Limiter, llm_scope
from tests.helpers import configure, stop_process_group, wait_for_workers, wait_until
from tests.helpers.fleet import Fleet, assert_complete, kill_group, submit_elsewhere
from tests.helpers.openai import MODEL, on_openai

SLOW = {"latency_mean_s": 0.5, "latency_p95_s": 0.8, "tool_turns": 1, "tools_per_turn": 1}


def _leases(redis_url: str, env: dict[str, str]) -> int:
    limiter = Limiter(redis.Redis.from_url(redis_url), prefix=env["DROVER_KEY_PREFIX"])
    return limiter.state(llm_scope(env["DROVER_KEY_ALIAS"], MODEL))["leases"]


def test_cancel_in_the_middle_on_openai_stops_every_worker(sim_factory, spawn_worker,
                                                             drover_env, redis_url,
                                                             monkeypatch):
    sim = on_openai(monkeypatch, drover_env, sim_factory, **SLOW)
    workers = [spawn_worker(concurrency=6), spawn_worker(concurrency=6)]
    wait_for_workers(2)
    handle = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(60)],
                            tools=["lookup_fact"]))
    early = []
    for record in handle.as_completed(timeout=120):
        early.append(record)
        if len(early) == 6:
            break
    assert handle.cancel()
    cancelled_at = time.time()
    result = handle.wait(timeout=120)
    for proc in workers:
        stop_process_group(proc)

    # Every request reached the provider before the last record was written (one host's
    # clock), and at most one per slot was on its way at the cancel.
    arrivals = sim.arrivals()
    assert arrivals and max(arrivals) < max(r.finished_at for r in result.results)
    assert len([t for t in arrivals if t > cancelled_at]) <= 12
    assert result.status == "cancelled" and result.reason == "cancelled"
    assert [r.index for r in result.results] == list(range(60))
    assert result.counts["ok"] + result.counts["cancelled"] == 60
    assert result.counts["ok"] >= 6 and result.counts["cancelled"] >= 20
    for record in early:  # finished before the cancel: kept as they were
        assert record.status == "ok" and result.results[record.index] == record
    assert sim.stats()["errors_4xx"] == 0  # no half-answered tool call was sent
    assert _leases(redis_url, drover_env) == 0


def test_a_worker_killed_mid_job_on_openai_loses_nothing(sim_factory, drover_env,
                                                          spawn_worker, monkeypatch):
    # As test_worker_loss: default recovery settings, a few 503s on the way (OpenAI's
    # overloaded answer), attempts enough that no sub-agent runs out of them.
    configure(monkeypatch, drover_env, max_attempts=15, countdown_cap_s=5)
    sim = on_openai(monkeypatch, drover_env, sim_factory, overload_rate=0.2,
                    latency_mean_s=0.5, latency_p95_s=1.0, output_tokens_mean=20,
                    tool_turns=2, tools_per_turn=1)
    fleet = Fleet(drover_env)
    try:
        handle = submit_elsewhere(drover_env, JobSpec(
            subtasks=[f"Inspect pier {i}" for i in range(30)], tools=["lookup_fact"],
            max_tokens=60))
        victim = spawn_worker(concurrency=8)
        survivor = spawn_worker(concurrency=8)
        victim_id, _ = fleet.wait_for(victim, survivor)
        wait_until("the job under way and the victim busy",
                   lambda: handle.progress()["ok"] >= 2 and len(fleet.held(victim_id)) >= 4,
                   120)
        in_flight = sim.stats()["in_flight"]
        held = fleet.held(victim_id)
        kill_group(victim)  # SIGKILL: no shutdown, no acks
        killed = time.monotonic()
        victim.wait()
        wait_until("the killed worker's sub-agents resumed elsewhere",
                   lambda: all(fleet.moved_on(job, part, victim_id) for job, part in held), 60)
        result = fleet.wait(handle, 30, timeout=90)
        print(f"\n[openai] kill -9 of a worker holding {len(held)} sub-agents: job done "
              f"{time.monotonic() - killed:.1f} s after it (duplicates "
              f"{sim.stats()['duplicate_accepted']}, in flight before the kill {in_flight})")

        assert_complete(result, fleet, 30)
        stats = sim.stats()
        assert stats["errors_4xx"] == 0
        # Resumed from checkpoints: only calls in flight at the kill can have been sent twice,
        # that is the killed worker's sends whose outcome no checkpoint saved, each counted
        # once as unanswered by the delivery that resumed its sub-agent (at most one for each
        # of its 8 threads: the loop calls one at a time). The simulator's in_flight read
        # before the kill is no bound: the victim sent more between that read and the kill (a
        # full run: 8 sent twice, 8 counted unanswered, 6 read in flight).
        assert stats["duplicate_accepted"] <= result.usage.unanswered_calls <= 8, result.usage
        assert stats["accepted"] - stats["duplicate_accepted"] == result.usage.calls == 30 * 3
    finally:
        fleet.close()


