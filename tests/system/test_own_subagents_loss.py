"""A worker killed (-9) in the middle of a job of a team's own ``@subagent`` functions: the
sub-agents it ran resume on the other worker and every one ends ok, its record written once.
Real worker processes with the default recovery settings; the functions are in
``tests/helpers/own_subagents.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from drover import JobSpec
from drover.simulator import SimConfig, SimulatorServer
from tests.helpers import configure, wait_for_workers, wait_until
from tests.helpers.fleet import Fleet, assert_complete, kill_group, submit_elsewhere

MODULES = json.dumps(["drover.workers.tools.demo", "tests.helpers.own_subagents"])
THREADS = 8
N = 24


@pytest.fixture
def fleet(drover_env: dict[str, str]) -> Iterator[Fleet]:
    f = Fleet(drover_env)
    yield f
    f.close()


def test_a_worker_killed_mid_job_of_own_functions_loses_none(sim, drover_env, spawn_worker,
                                                            monkeypatch, fleet):
    configure(monkeypatch, drover_env, tool_modules=MODULES)
    sim.configure(latency_mean_s=0.3, latency_p95_s=0.6)
    inputs = [{"topic": f"berth {i}", "checks": 4, "pause_s": 0.3} for i in range(N)]
    handle = submit_elsewhere(drover_env, JobSpec(subagent="research", inputs=inputs))
    victim = spawn_worker(concurrency=THREADS)
    survivor = spawn_worker(concurrency=THREADS)
    victim_id, _ = fleet.wait_for(victim, survivor)
    wait_until("the victim running sub-agents mid-function",
               lambda: len(fleet.running(victim_id)) >= 4 and sim.stats()["accepted"] >= 60, 120)

    in_flight = sim.stats()["in_flight"]  # both workers' calls: a bound on the victim's
    held = fleet.held(victim_id)
    kill_group(victim)  # SIGKILL: no shutdown, no acks
    killed = time.monotonic()
    victim.wait()
    result = fleet.wait(handle, N, timeout=120)
    stats = sim.stats()
    print(f"\nkill -9 of a worker holding {len(held)} own sub-agents: job done "
          f"{time.monotonic() - killed:.1f} s after it; calls {stats['accepted']}, sent twice "
          f"{stats['duplicate_accepted']} (in flight just before the kill: {in_flight})")

    assert_complete(result, fleet, N)
    for record, item in zip(result.results, inputs, strict=True):
        assert record.output["topic"] == item["topic"] and len(record.output["checks"]) == 4
    # The resumed sub-agents replayed the calls answered before the kill from their journals:
    # only the calls in flight at the kill can have gone out twice, at most one for each of
    # the killed worker's threads (these functions call one at a time). The simulator's
    # in_flight read before the kill is printed, not a bound: the victim can send more
    # between that read and the kill (test_openai_cancel_and_loss: 8 sent twice, 6 read).
    assert stats["duplicate_accepted"] <= THREADS
    assert stats["accepted"] - stats["duplicate_accepted"] == N * 6
    # Each call the simulator took counted once: answered (its real usage) or, sent by the
    # killed worker with its answer lost, unanswered (its estimate); a send marked by the
    # killed worker that had not reached the simulator yet counts too (at most one per
    # sub-agent it ran: these functions call one at a time).
    usage = result.usage
    assert stats["accepted"] <= usage.sent_calls <= stats["accepted"] + len(held), usage
    assert usage.calls >= N * 6


def test_sigterm_hands_a_workers_own_sub_agents_back_between_calls(sim, drover_env,
                                                                  spawn_worker, monkeypatch,
                                                                  fleet):
    configure(monkeypatch, drover_env, tool_modules=MODULES)
    config = {"latency_mean_s": 0.3, "latency_p95_s": 0.6}
    sim.configure(**config)
    # The victim calls a simulator of its own (both answer alike: same seed), so what it sends
    # after the signal is counted apart; its grace is long, so only the hand-back between
    # calls (not the grace running out) can move its sub-agents before they finish.
    with SimulatorServer(SimConfig(seed=1, tool_turns=1, output_tokens_mean=60,
                                   **config)) as own:
        inputs = [{"topic": f"quay {i}", "checks": 4, "pause_s": 1.0} for i in range(N)]
        handle = submit_elsewhere(drover_env, JobSpec(subagent="research", inputs=inputs))
        victim = spawn_worker(concurrency=THREADS, DROVER_ANTHROPIC_BASE_URL=own.url,
                              DROVER_SHUTDOWN_GRACE_S="60")
        survivor = spawn_worker(concurrency=THREADS)
        victim_id, _ = fleet.wait_for(victim, survivor)
        wait_until("the victim running sub-agents mid-function",
                   lambda: len(fleet.running(victim_id)) >= 4 and own.stats()["accepted"] >= 8,
                   120)
        held = fleet.held(victim_id)
        before = own.stats()
        os.kill(victim.pid, signal.SIGTERM)  # what docker stop and Kubernetes send
        wait_until("its sub-agents continuing on the other worker",
                   lambda: all(fleet.moved_on(job, part, victim_id) for job, part in held), 60)
        victim.wait(timeout=90)
        result = fleet.wait(handle, N, timeout=120)
        after = own.stats()
    print(f"\nSIGTERM: {len(held)} own sub-agents handed back; the victim sent "
          f"{after['accepted'] - before['accepted']} calls after it ({before['in_flight']} in "
          f"flight at the signal)")

    assert victim.returncode == 0  # a warm shutdown, not a crash
    assert_complete(result, fleet, N)
    # Its calls in flight finished and were journaled; none started after the signal.
    assert after["accepted"] - before["accepted"] <= before["in_flight"]
    # The resumed functions replayed what they had been answered: no call went out twice.
    assert after["accepted"] + sim.stats()["accepted"] == result.usage.calls == N * 6


def test_a_function_killed_with_calls_in_flight_counts_each_and_its_usage_brackets_the_bill(
        sim, drover_env, spawn_worker, monkeypatch):
    """A function that gathers three calls at once, its worker killed while they stream: the
    resume counts each of the three as unanswered (not only the last one marked), and counts
    each one's output at its max_tokens, so that the job's usage brackets what the provider
    billed (answered <= billed <= answered + unanswered). Its worker had learned a short mean
    answer first: counted at that mean, the three long answers cut mid-way were billed more
    than the job counted."""
    configure(monkeypatch, drover_env, tool_modules=MODULES)
    sim.configure(tool_turns=0, output_tokens_mean=10)
    victim = spawn_worker(concurrency=2)
    wait_for_workers(1)
    warm = submit_elsewhere(drover_env, JobSpec(subagent="side_by_side",
                                                inputs=[{"topic": "tides", "n": 3}]))
    assert warm.wait(timeout=60).counts["ok"] == 1  # the victim's mean answer: ~10 tokens
    # Answers of max_tokens (120), 20 tokens a second: each call streams for 6 s.
    sim.configure(output_share_min=1.0, output_share_max=1.0, output_tokens_per_s=20)
    before = sim.stats()
    # Watched from before it is submitted: the job runs once `drover submit` has published
    # it, which on a loaded host was seconds before that process had exited (seen: the three
    # calls admitted 4.5 s before submit_elsewhere returned, and all four calls done before
    # the first look at a load of 10-20: never three in flight, or the kill after the three).
    with ThreadPoolExecutor(1) as submitter:
        submitted = submitter.submit(submit_elsewhere, drover_env, JobSpec(
            subagent="side_by_side", inputs=[{"topic": "currents", "n": 3}]))
        wait_until("the three calls streaming", lambda: sim.stats()["in_flight"] == 3, 60)
        time.sleep(2.5)  # ~50 tokens of each generated (and billed)
        kill_group(victim)
        handle = submitted.result()
    victim.wait()
    sim.configure(output_tokens_per_s=0, output_share_min=0, output_share_max=0)
    spawn_worker(concurrency=2)
    result = handle.wait(timeout=120)
    after = sim.stats()

    record = result.results[0]
    assert record.status == "ok", record
    usage = record.usage
    billed_requests = after["billed"]["requests"] - before["billed"]["requests"]
    billed_out = after["billed"]["output_tokens"] - before["billed"]["output_tokens"]
    print(f"\nthree calls lost mid-stream: {usage.calls} answered + {usage.unanswered_calls} "
          f"unanswered ({billed_requests} billed); output {usage.output_tokens} + "
          f"{usage.unanswered_output_tokens} counted, {billed_out} billed")
    assert usage.unanswered_calls == 3, usage
    assert usage.calls == 4 and usage.sent_calls == billed_requests == 7, usage
    assert usage.output_tokens <= billed_out <= (
        usage.output_tokens + usage.unanswered_output_tokens), (usage, billed_out)
