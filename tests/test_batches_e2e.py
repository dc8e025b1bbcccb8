"""delivery="batch" end to end: real worker subprocesses, Redis, the real SDK, the simulator.

Every turn of every sub-agent goes through the simulator's Message Batches API (none
through messages.create), worker slots are free while batches run, results resume the
sub-agents from their checkpoints, and the records' usage is what the simulator billed.
"""

from __future__ import annotations

import time

import pytest
import redis

from orchestrator import JobSpec, submit
from tests.conftest import configure, wait_until
from workers.limiter import Limiter

FAST = {"DROVER_BATCH_LINGER_S": "0.3", "DROVER_BATCH_POLL_S": "0.2",
        "DROVER_BATCH_TICK_S": "0.1", "DROVER_BATCH_RPM": "6000",
        "DROVER_RESEND_AFTER_S": "600"}


@pytest.fixture
def batch_env(monkeypatch: pytest.MonkeyPatch, drover_env: dict[str, str], sim) -> dict[str, str]:  # noqa: ANN001
    configure(monkeypatch, drover_env, **FAST)
    sim.configure(batch_processing_s=0.5, tool_turns=1, tools_per_turn=1)
    return drover_env


def _wait_for_workers(count: int, timeout: float = 90) -> None:
    from workers.app import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(app.control.ping(timeout=0.5) or []) >= count:
            return
    raise AssertionError(f"{count} workers did not come up within {timeout} s")


def _batch_counters(redis_url: str, env: dict[str, str], job_id: str) -> dict[str, int]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    key = f"{env['DROVER_KEY_PREFIX']}:job:{job_id}:batch"
    return {k: int(v) for k, v in r.hgetall(key).items()}


def test_a_batch_job_runs_every_turn_by_batch_and_bills_what_the_simulator_saw(
        sim, spawn_worker, batch_env, redis_url):  # noqa: ANN001
    spawn_worker(concurrency=4)
    _wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Summarise document {i}" for i in range(30)],
                            tools=["lookup_fact"], delivery="batch"))
    result = handle.wait(timeout=120)
    assert result.counts["ok"] == 30, [r.error for r in result.results if r.error]
    stats = sim.stats()
    assert stats["accepted"] == 0 and not stats["by_status"], "no realtime messages.create"
    b = stats["batches"]
    # Two turns each (a tool turn, then the answer): at least two batch rounds.
    assert all(r.turns == 2 and r.usage.batch_calls == 2 for r in result.results)
    assert b["requests"] == b["outcomes"]["succeeded"] == 60 and b["batches_created"] >= 2
    usage = result.usage
    assert usage.batch_calls == usage.calls == 60
    assert (usage.batch_input_tokens, usage.batch_output_tokens) == (
        b["input_tokens"], b["output_tokens"])
    assert usage.batch_tokens == usage.total_tokens
    assert b["in_progress"] == 0 and b["queued"] == 0
    assert _batch_counters(redis_url, batch_env, handle.id)["succeeded"] == 60
