"""delivery="batch" end to end: real worker subprocesses, Redis, the real SDK, the simulator.

Every turn of every sub-agent goes through the simulator's Message Batches API (none
through messages.create), worker slots are free while batches run, results resume the
sub-agents from their checkpoints, and the records' usage is what the simulator billed.
"""

from __future__ import annotations

import time

import pytest
import redis

from drover import JobSpec, submit
from drover.workers.limiter import Limiter
from drover.workers.services import services
from tests.helpers import configure, wait_for_workers, wait_until

FAST = {"DROVER_BATCH_LINGER_S": "0.3", "DROVER_BATCH_POLL_S": "0.2",
        "DROVER_BATCH_TICK_S": "0.1", "DROVER_BATCH_RPM": "6000",
        "DROVER_RESEND_AFTER_S": "600"}


@pytest.fixture
def batch_env(monkeypatch: pytest.MonkeyPatch, drover_env: dict[str, str], sim) -> dict[str, str]:  # noqa: ANN001
    configure(monkeypatch, drover_env, **FAST)
    sim.configure(batch_processing_s=0.5, tool_turns=1, tools_per_turn=1)
    return drover_env




def _batch_counters(redis_url: str, env: dict[str, str], job_id: str) -> dict[str, int]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    key = f"{env['DROVER_KEY_PREFIX']}:job:{job_id}:batch"
    return {k: int(v) for k, v in r.hgetall(key).items()}


def test_a_batch_job_runs_every_turn_by_batch_and_bills_what_the_simulator_saw(
        sim, spawn_worker, batch_env, redis_url):  # noqa: ANN001
    spawn_worker(concurrency=4)
    wait_for_workers(1)
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


def test_errored_and_expired_results_are_retried_or_recorded_and_endpoint_429s_back_off(
        sim, spawn_worker, batch_env, redis_url):  # noqa: ANN001
    # The simulator allows 2 calls a second to its batches endpoints; drover is told 6,000
    # a minute, so it meets the provider's 429s and has to back off on them.
    sim.configure(batch_rpm=120, burst_s=1.0, tool_turns=0)
    spawn_worker(concurrency=4)
    wait_for_workers(1)
    tasks = ["Summarise report A [[sim:529:1]]",  # overloaded once: retried in the next batch
             "Summarise report B [[sim:400]]",    # invalid: not retryable, failed
             "Summarise report C [[sim:expire:1]]",  # expired once: sent again
             *(f"Summarise report {i}" for i in range(5))]
    handle = submit(JobSpec(subtasks=tasks, delivery="batch"))
    result = handle.wait(timeout=120)
    by_index = result.results
    assert by_index[0].status == "ok" and by_index[0].attempts == 2
    assert by_index[1].status == "failed" and by_index[1].status_code == 400
    assert by_index[1].error_type == "invalid_request_error" and by_index[1].attempts == 1
    assert by_index[2].status == "ok" and by_index[2].attempts == 2
    assert all(r.status == "ok" and r.attempts == 1 for r in by_index[3:])
    stats = sim.stats()
    assert stats["accepted"] == 0
    b = stats["batches"]
    assert b["outcomes"] == {"succeeded": 7, "errored": 2, "canceled": 0, "expired": 1}
    assert b["rejected_429"] >= 1, "drover was meant to meet the endpoints' 429s"
    counters = _batch_counters(redis_url, batch_env, handle.id)
    assert counters["submitted"] == 10 and counters["expired"] == 1


def test_the_queued_requests_cap_holds_across_the_fleet(
        sim, spawn_worker, batch_env, monkeypatch, redis_url):  # noqa: ANN001
    cap = 4
    configure(monkeypatch, batch_env, DROVER_BATCH_QUEUE_CAP=cap)
    sim.configure(batch_queue_cap=cap, tool_turns=0, batch_processing_s=0.3)
    spawn_worker(concurrency=4)
    spawn_worker(concurrency=4)
    wait_for_workers(2)
    handle = submit(JobSpec(subtasks=[f"Summarise memo {i}" for i in range(14)],
                            delivery="batch"))
    result = handle.wait(timeout=120)
    assert result.counts["ok"] == 14
    b = sim.stats()["batches"]
    assert b["queue_cap_429"] == 0 and 1 <= b["max_queued"] <= cap
    assert b["batches_created"] >= 14 // cap
    limiter = Limiter(redis.Redis.from_url(redis_url), prefix=batch_env["DROVER_KEY_PREFIX"])
    assert limiter.state(f"batchq:{batch_env['DROVER_KEY_ALIAS']}")["leases"] == 0


def test_cancel_mid_batch_cancels_it_at_the_provider_and_every_subagent_gets_a_record(
        sim, spawn_worker, batch_env, redis_url):  # noqa: ANN001
    sim.configure(batch_processing_s=4.0)
    spawn_worker(concurrency=4)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(20)],
                            tools=["lookup_fact"], delivery="batch"))
    wait_until("a batch in progress", lambda: sim.stats()["batches"]["in_progress"], 60)
    wait_until("some of its requests processed",
               lambda: sim.stats()["batches"]["in_progress_done"] >= 3, 60)
    assert handle.cancel()
    result = handle.wait(timeout=60)
    assert result.status == "cancelled"
    assert [r.index for r in result.results] == list(range(20))
    assert result.counts["cancelled"] == 20
    # the cancel reached the provider; its batch ends CANCEL_S later, maybe after the job
    b = wait_until("the provider's batch to end", lambda: (
        s if (s := sim.stats()["batches"])["in_progress"] == 0 and s["canceling"] == 0
        else None), 30)
    assert b["calls"]["cancel"] >= 1
    assert b["accepted"] == 0 or b["outcomes"]["succeeded"] == b["accepted"]
    # What still ended is in the records (and billed at the batch rate), the rest cancelled.
    counters = _batch_counters(redis_url, batch_env, handle.id)
    assert counters["canceled"] == b["outcomes"]["canceled"] >= 1
    assert counters["succeeded"] == b["outcomes"]["succeeded"] == result.usage.batch_calls
    assert sim.stats()["accepted"] == 0


def test_an_expired_result_past_the_deadline_fails_the_subagent_with_that_reason(
        drover_env, redis_url):  # noqa: ANN001
    from drover.workers.agent import SubagentRun, get_runtime
    from drover.workers.jobs.batches import custom_id
    from drover.workers.jobs.records import Checkpoint

    handle = submit(JobSpec(subtasks=["Summarise the archive"], delivery="batch",
                            deadline_s=0.2))  # no workers: the sub-agent is run here
    rt = get_runtime(services())
    cid = custom_id(handle.id, 0, 0, 1)
    state = Checkpoint.first("Summarise the archive")
    state.batch_cid, state.batch_n = cid, 1
    rt.store.checkpoints.save(handle.id, 0, state)
    store = services(rt.settings).batches
    pipe = rt.store.r.pipeline()
    store._deliver(pipe, cid, {"type": "expired"})
    pipe.execute()
    time.sleep(0.3)  # past the job's 0.2 s deadline: the expired result meets it
    record = rt.run(SubagentRun(rt, handle.id, 0).run())
    assert record.status == "failed" and record.error_type == "expired"
    assert "deadline" in record.error


def test_a_delivery_taken_over_before_its_batch_turn_is_queued_queues_nothing(drover_env):  # noqa: ANN001
    """The sweep took the sub-agent over (a new claim token, a new message) while this
    delivery was on its way to queue its turn: it stops at the turn's checkpoint, so only the
    new delivery's request goes into a batch (the provider would bill both)."""
    import asyncio

    from drover.workers.agent import get_runtime
    from drover.workers.agent.batch import batch_message
    from drover.workers.agent.llm import CallContext
    from drover.workers.agent.loop import request_params
    from drover.workers.jobs import ClaimLost
    from drover.workers.jobs.records import Checkpoint
    from drover.workers.limiter import llm_scope

    handle = submit(JobSpec(subtasks=["Summarise the archive"], delivery="batch"))  # no workers
    rt = get_runtime(services())
    start = rt.store.checkpoints.start(handle.id, 0, worker="a-delivery-about-to-be-superseded",
                                       token=0)
    assert start.token > 0 and start.spec is not None
    assert rt.store.claims.takeover(handle.id, 0, -1, "")  # the sweep sends it again
    state = start.checkpoint or Checkpoint.first(start.task or "")
    params = request_params(start.spec, start.spec.model or rt.settings.model, [],
                            state.messages)
    with pytest.raises(ClaimLost):
        rt.run(batch_message(rt, params, CallContext(handle.id, 0, asyncio.Event()), state,
                             start.token))
    scope = llm_scope(rt.settings.key_alias, params["model"])
    assert services(rt.settings).batches.pending_state(scope)[0] == 0


def test_a_sub_agent_taken_over_before_its_batch_turn_is_queued_queues_nothing(
        drover_env, monkeypatch):  # noqa: ANN001
    """The same through ``SubagentRun``: the delivery's claim token reaches the turn's
    checkpoint (a run that wrote it unfenced would queue the turn beside the new one's)."""
    from drover.workers.agent import SubagentRun, get_runtime
    from drover.workers.jobs import ClaimLost
    from drover.workers.limiter import llm_scope

    handle = submit(JobSpec(subtasks=["Summarise the ledger"], delivery="batch"))  # no workers
    rt = get_runtime(services())
    save_checkpoint = rt.store.checkpoints.save

    def taken_over_first(job_id: str, index: int, *args: object) -> object:
        assert rt.store.claims.takeover(job_id, index, -1, "")  # the sweep sends it again
        return save_checkpoint(job_id, index, *args)

    monkeypatch.setattr(rt.store.checkpoints, "save", taken_over_first)
    with pytest.raises(ClaimLost):
        rt.run(SubagentRun(rt, handle.id, 0).run())
    scope = llm_scope(rt.settings.key_alias, rt.settings.model)
    assert services(rt.settings).batches.pending_state(scope)[0] == 0


def test_500_subagents_with_tool_turns_by_batch_while_a_realtime_job_runs_on_the_same_slots(
        sim, spawn_worker, batch_env):  # noqa: ANN001
    """The issue's proof: 500 sub-agents, two turns each, every turn by batch; a realtime
    job submitted meanwhile finishes on the same 8 worker slots while batches still run."""
    sim.configure(batch_processing_s=3.0)
    spawn_worker(concurrency=4)
    spawn_worker(concurrency=4)
    wait_for_workers(2)
    batch_job = submit(JobSpec(subtasks=[f"Summarise filing {i}" for i in range(500)],
                               tools=["lookup_fact"], delivery="batch"))
    wait_until("a batch in progress", lambda: sim.stats()["batches"]["in_progress"], 120)
    realtime = submit(JobSpec(subtasks=[f"Check invoice {i}" for i in range(10)],
                              tools=["lookup_fact"]))
    quick = realtime.wait(timeout=120)
    # The realtime job is through while the batch job still waits on the provider: no
    # worker thread was held by a batch.
    assert quick.counts["ok"] == 10 and batch_job.result() is None
    result = batch_job.wait(timeout=300)
    assert result.counts["ok"] == 500
    stats = sim.stats()
    b = stats["batches"]
    assert all(r.turns == 2 and r.usage.batch_calls == 2 for r in result.results)
    assert b["requests"] == b["outcomes"]["succeeded"] == 1000 == result.usage.batch_calls
    # The only realtime messages.create calls were the realtime job's.
    assert stats["accepted"] == quick.usage.calls and quick.usage.batch_calls == 0
    assert stats["duplicate_accepted"] == 0 and b["duplicate_accepted"] == 0
    assert (result.usage.batch_input_tokens, result.usage.batch_output_tokens,
            result.usage.batch_cache_read_input_tokens) == (
        b["input_tokens"], b["output_tokens"], b["cache_read_input_tokens"])


def test_drover_demo_batch_shows_a_batch_job_end_to_end(drover_env, capsys) -> None:  # noqa: ANN001
    from rich.console import Console

    from drover.orchestrator.cli.demo import DemoConfig, run_demo

    console = Console(width=140, force_terminal=False)
    assert run_demo(DemoConfig(subagents=4, concurrency=4, plot=None, batch=True),
                    console) == 0
    out = capsys.readouterr().out
    assert "LLM calls by Message Batch" in out and "billed at the batch rate" in out
    assert "Message Batches: 0 open" in out


def test_auto_delivery_uses_batches_only_when_the_deadline_allows_it() -> None:
    from pydantic import ValidationError

    from drover.config import load_settings
    from drover.workers.agent import uses_batch

    settings = load_settings(batch_auto_min_deadline_s=3600)
    job = {"subtasks": ["Summarise the archive"]}
    assert not uses_batch(JobSpec(**job), settings)  # realtime is the default
    assert uses_batch(JobSpec(**job, delivery="batch", deadline_s=5), settings)
    assert uses_batch(JobSpec(**job, delivery="auto"), settings)  # no deadline
    assert uses_batch(JobSpec(**job, delivery="auto", deadline_s=7200), settings)
    assert not uses_batch(JobSpec(**job, delivery="auto", deadline_s=600), settings)
    with pytest.raises(ValidationError) as bad:
        JobSpec(**job, delivery="overnight")
    assert "'realtime', 'batch' or 'auto'" in str(bad.value)
