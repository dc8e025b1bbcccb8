"""``drover retry JOB`` / ``JobHandle.retry()``: a finished job's sub-agents that did not end ok
run again as a continuation of the same job, and those that succeeded are never sent again.
Worker subprocesses, real Redis, the real SDK over HTTP to the simulator, whose spend limit
stops the job part way and is then raised."""

from __future__ import annotations

import uuid

import pytest

from drover import JobSpec, submit
from drover.errors import JobNotFound, JobRefused
from drover.orchestrator.client.jobs import JobHandle
from tests.helpers import wait_for_workers
from tests.helpers.cli import clean_env
from tests.helpers.cli import drover as run_drover

PRICES = {"claude-sonnet-4-6": {"input": 3.0, "output": 15.0}}


def test_a_retry_after_the_spend_limit_is_raised_finishes_the_job_paying_nothing_twice(
        sim, spawn_worker, drover_env, tmp_path):
    sim.configure(tool_turns=0, prices=PRICES, spend_limit_calls=50)
    spawn_worker(concurrency=8)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(120)],
                            max_tokens=200))
    first = handle.wait(timeout=300)
    paid = {r.index: r for r in first.results if r.status == "ok"}
    assert len(paid) == 50 and sim.stats()["accepted"] == 50, (first.counts, sim.stats())
    assert all("spend limit" in (r.error or "") for r in first.results if r.status != "ok")
    cost_before = first.cost_usd

    sim.configure(spend_limit_calls=None)  # the owner raised the limit
    alias = drover_env["DROVER_KEY_ALIAS"]
    with pytest.raises(JobRefused, match=f"drover keys enable {alias}"):
        handle.retry()  # drover still holds the key stopped: it says how to go on
    enabled = run_drover(["keys", "enable", alias], clean_env(**drover_env), tmp_path)
    assert enabled.returncode == 0, enabled.stderr
    again = handle.retry()
    assert again == sorted(set(range(120)) - set(paid))
    result = handle.wait(timeout=300)
    stats = sim.stats()
    print(f"\nspend limit at 50 paid calls, 120 sub-agents: {first.counts}; after the limit "
          f"was raised and the job retried: {result.counts}, the simulator took "
          f"{stats['accepted']} paid calls in all")
    assert result.job_id == handle.id and result.counts["ok"] == 120, result.counts
    # Not one of the 50 paid-for sub-agents was sent again: 50 + 70 calls in all.
    assert stats["accepted"] == 120, stats["accepted"]
    for index, record in paid.items():  # their records are the ones they had
        assert handle.record(index).finished_at == record.finished_at
    # The job's dollars: the first run's and the retry's, each call once, as billed.
    assert result.cost_usd == pytest.approx(stats["billing"]["usd"], rel=1e-6)
    assert result.cost_usd >= cost_before
    assert handle.retry() == []  # all ok now: nothing to send


def test_retry_refuses_an_unknown_job_and_one_still_running(sim, drover_env, tmp_path):
    with pytest.raises(JobNotFound):
        JobHandle(uuid.uuid4().hex).retry()
    handle = submit(JobSpec(subtasks=["a", "b"]))  # no worker: it stays queued
    with pytest.raises(JobRefused, match="still running"):
        handle.retry()
    env = clean_env(**drover_env)
    done = run_drover(["retry", handle.id], env, tmp_path)
    assert done.returncode == 2 and "still running" in done.stderr, done.stderr
    unknown = run_drover(["retry", "nope"], env, tmp_path)
    assert unknown.returncode == 2 and "no job 'nope'" in unknown.stderr, unknown.stderr
