"""Every call drover sends is counted once: answered calls with their usage, calls sent whose
answer never came back as ``unanswered_*`` at their reservation's estimate.

Worker subprocesses, the real SDK against the simulator, which bills every request it admitted
(``stats()["billed"]``: its input, and the whole reply's output whether or not it was
delivered).
"""

from __future__ import annotations

import contextlib
import os
import signal

from drover import JobSpec, submit
from tests.helpers import configure, stop_process_group, wait_for_workers, wait_until


def _billed_total(stats: dict) -> int:
    return stats["billed"]["input_tokens"] + stats["billed"]["output_tokens"]


def test_a_cancel_mid_job_counts_the_aborted_calls_and_brackets_the_bill(
        sim, spawn_worker, drover_env, monkeypatch):
    # One call per sub-agent, about a second each: the cancel lands with many in flight.
    sim.configure(tool_turns=0, latency_mean_s=1.0, latency_p95_s=1.5, output_tokens_mean=60)
    configure(monkeypatch, drover_env, max_in_flight=24)
    workers = [spawn_worker(concurrency=12), spawn_worker(concurrency=12)]
    wait_for_workers(2)
    handle = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(200)],
                            max_tokens=200))
    early = 0
    for _ in handle.as_completed(timeout=120):
        early += 1
        if early == 30:
            break
    assert handle.cancel()
    result = handle.wait(timeout=120)
    for proc in workers:  # any request still on its way has arrived once they are gone
        stop_process_group(proc)

    stats = sim.stats()
    usage = result.usage
    assert result.status == "cancelled"
    # Every request the provider took is in the usage once: answered or unanswered.
    assert usage.calls + usage.unanswered_calls == stats["accepted"], (usage, stats["accepted"])
    assert usage.unanswered_calls >= 1, "the cancel came with calls in flight"
    # Answered usage is the answers' own. A reply the simulator wrote out just as the cancel
    # closed that connection is a 200 to it and unanswered to drover: no more than that.
    answered_200 = stats["by_status"].get("200", 0)
    assert usage.calls <= answered_200 <= usage.calls + usage.unanswered_calls, (
        usage, stats["by_status"])
    assert usage.output_tokens <= stats["output_tokens"], (usage, stats["output_tokens"])
    if usage.calls == answered_200:
        assert usage.output_tokens == stats["output_tokens"]
    # Answered plus the unanswered estimate brackets what the provider billed (within 10%).
    counted = usage.input_tokens + usage.output_tokens + usage.unanswered_tokens
    billed = _billed_total(stats)
    print(f"\ncancel after {early} of 200: provider took {stats['accepted']} requests, billed "
          f"{billed:,} tokens; drover counts {usage.calls} answered + {usage.unanswered_calls} "
          f"unanswered, {counted:,} tokens ({counted / billed - 1:+.1%})")
    assert abs(counted - billed) <= 0.10 * billed, (counted, billed, usage)
    # What `drover result` and `drover watch` print.
    from drover.orchestrator.cli.watch import usage_lines

    lines = usage_lines(usage)
    assert lines[0].startswith(f"usage: {usage.calls} answered calls")
    assert lines[1].startswith(f"unanswered: {usage.unanswered_calls} calls sent")
    # The per-record usage adds up to the job's (no job-level calls here).
    records = list(handle.records())
    assert sum(r.usage.unanswered_calls for r in records) == usage.unanswered_calls
    for record in records:
        if record.usage.unanswered_calls:
            assert record.status == "cancelled" and record.usage.unanswered_input_tokens > 0
            # What its stream had delivered when the cancel closed it (0 before the first
            # token: the provider bills a closed stream what it generated), up to max_tokens.
            assert 0 <= record.usage.unanswered_output_tokens <= 200


def test_a_worker_killed_mid_call_counts_the_lost_call_once_and_its_redo_as_answered(
        sim, spawn_worker, drover_env):
    sim.configure(tool_turns=0, latency_mean_s=60, latency_p95_s=60, output_tokens_mean=40)
    victim = spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=["Write the long report"], max_tokens=100))
    wait_until("the call on its way to the provider", lambda: sim.stats()["in_flight"] == 1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(victim.pid, signal.SIGKILL)  # a crash: nothing saved, nothing acked
    victim.wait()
    sim.configure(latency_mean_s=0.05, latency_p95_s=0.1)  # the redo is answered at once
    spawn_worker(concurrency=2)
    result = handle.wait(timeout=120)  # the recovery sweep resends it once the heartbeat ends

    record = result.results[0]
    stats = sim.stats()
    assert record.status == "ok", record
    assert stats["accepted"] == 2 and stats["duplicate_accepted"] == 1
    assert record.usage.calls == 1 and record.usage.unanswered_calls == 1, record.usage
    assert result.usage.calls == 1 and result.usage.unanswered_calls == 1
    # The lost call's estimate is of the same request as its redo.
    answered_in = record.usage.input_tokens + record.usage.cache_creation_input_tokens
    assert abs(record.usage.unanswered_input_tokens - answered_in) <= 0.25 * answered_in + 8
    assert 0 < record.usage.unanswered_output_tokens <= 100


def _crash_and_redo(sim, victim, spawn_worker, handle):  # noqa: ANN001, ANN202
    """SIGKILL the worker (a crash: nothing saved, nothing acked); a new worker, on a provider
    that now answers at once, redoes the lost part once the dead one's heartbeat ends."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    sim.configure(latency_mean_s=0.05, latency_p95_s=0.1)
    spawn_worker(concurrency=2)
    return handle.wait(timeout=120)


def test_a_worker_killed_mid_planning_counts_the_lost_planning_call_once(
        sim, spawn_worker, drover_env):
    """The job's own calls are marked before they go out too: the planning call a killed
    worker sent is counted once as unanswered, its redo as answered."""
    sim.configure(plan_items=2, tool_turns=0, latency_mean_s=60, latency_p95_s=60,
                  output_tokens_mean=40)
    victim = spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(goal="Inspect two depots", max_subtasks=2, max_tokens=100))
    wait_until("the planning call on its way to the provider",
               lambda: sim.stats()["in_flight"] == 1)
    result = _crash_and_redo(sim, victim, spawn_worker, handle)

    stats = sim.stats()
    assert result.status == "done" and result.counts["ok"] == 2, result.counts
    assert stats["accepted"] == 1 + 1 + 2  # the lost planning call, its redo, two sub-agents
    assert result.usage.calls == 1 + 2, result.usage
    assert result.usage.unanswered_calls == 1, result.usage
    assert result.usage.unanswered_input_tokens > 0


def test_a_worker_killed_mid_synthesis_counts_the_lost_synthesis_call_once(
        sim, spawn_worker, drover_env):
    """The synthesis call is marked before it goes out like planning's: a worker killed while
    it is on its way to the provider leaves a billed call no answer accounts for; the join's
    redo counts it once as unanswered (``count_lost_job_call``) beside its own answer. Not
    counting it, or counting it at each redo, fails this."""
    # The sub-agent's call is drawn a second's latency; the synthesis call, sent after it,
    # a minute's: the kill lands with only the synthesis call in flight.
    sim.configure(tool_turns=0, latency_mean_s=1.0, latency_p95_s=1.0, output_tokens_mean=40)
    victim = spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=["Inspect the depot"], synthesize=True, max_tokens=100))
    wait_until("the sub-agent's call on its way to the provider",
               lambda: sim.stats()["in_flight"] == 1)
    sim.configure(latency_mean_s=60, latency_p95_s=60)
    wait_until("the synthesis call on its way to the provider",
               lambda: (lambda s: s["accepted"] == 2 and s["in_flight"] == 1)(sim.stats()))
    result = _crash_and_redo(sim, victim, spawn_worker, handle)

    stats = sim.stats()
    assert result.status == "done" and result.counts["ok"] == 1, result.counts
    assert result.synthesis and "synthesis failed" not in result.synthesis, result.synthesis
    assert stats["accepted"] == 1 + 1 + 1  # the sub-agent, the lost synthesis call, its redo
    assert result.usage.calls == 1 + 1, result.usage
    assert result.usage.unanswered_calls == 1, result.usage
    assert result.usage.unanswered_input_tokens > 0
    assert 0 < result.usage.unanswered_output_tokens <= 100


def test_an_aborted_call_is_reported_once_spends_the_tenant_budget_and_counts_in_metrics(
        sim, monkeypatch, drover_env, redis_url):
    import asyncio
    import json
    import threading

    import redis

    from drover.config import get_settings
    from drover.orchestrator.ops.metrics import DroverCollector
    from drover.workers.agent.errors import Cancelled
    from drover.workers.agent.llm import CallContext, create_message
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.limiter import Limiter, llm_scope
    from drover.workers.services import services
    from tests.helpers.metrics import scrape, value

    configure(monkeypatch, drover_env, tenant_budgets=json.dumps(
        {"acme": {"per_minute": 1_000_000}}))
    sim.configure(latency_mean_s=30, latency_p95_s=30)
    rt = get_runtime(services())
    settings = get_settings()
    scope = llm_scope(settings.key_alias, settings.model)
    collector = DroverCollector(services(settings), broker_queues=False)

    def tokens(kind: str) -> float:
        try:
            return value(scrape(collector), "drover_gen_ai_client_token_usage",
                         "drover_gen_ai_client_token_usage_total", gen_ai_token_type=kind,
                         gen_ai_request_model=settings.model)
        except AssertionError:  # no such sample yet
            return 0.0

    before = tokens("unanswered_input"), tokens("unanswered_output")
    params = {"model": settings.model, "max_tokens": 80,
              "messages": [{"role": "user", "content": "Summarise the contract " * 20}]}
    told: list[tuple[int, int]] = []

    async def note(est_in: int, est_out: int, model: str | None = None) -> None:
        told.append((est_in, est_out))

    # Watched, not changed: the stream's events as drover's call path folds them in. The
    # cancel waits for its first (message_start) to be read: cancelled between the provider's
    # admission and that read (a full run at load 11-16: the headers' round trip to record a
    # paced send's admission), the call cannot know that nothing was generated, and rightly
    # counts up to max_tokens of output.
    began = threading.Event()
    provider_class = type(rt.route(settings.model).provider)
    fold = provider_class.on_stream_event

    def watched(self, seen, event):  # noqa: ANN001, ANN202
        fold(self, seen, event)
        began.set()

    monkeypatch.setattr(provider_class, "on_stream_event", watched)

    async def aborted() -> BaseException:
        cancel = asyncio.Event()
        call = asyncio.ensure_future(create_message(rt, params, CallContext(
            "j", 0, cancel, tenant="acme", unanswered=note)))
        while sim.stats()["in_flight"] < 1 or not began.is_set():  # its stream began
            await asyncio.sleep(0.01)
        cancel.set()
        try:
            await call
        except BaseException as error:  # noqa: BLE001
            return error
        raise AssertionError("the call was not aborted")

    assert isinstance(rt.run(aborted()), Cancelled)
    assert len(told) == 1
    est_in, est_out = told[0]
    # Closed before its first token (the simulator answers after 30 s): its input counts, as
    # the provider bills it, and no output, since none was generated.
    assert est_in > 20 and est_out == 0
    # The tenant's budget paid the estimate: the input, and the output seen (none).
    limiter = Limiter(redis.Redis.from_url(redis_url), prefix=settings.key_prefix)
    spent = sum(row["input_tokens"] for row in limiter.usage("tenant:acme:minute", 60))
    assert spent == est_in + est_out
    # The metrics: one call of outcome "unanswered", and its tokens by type.
    services().recorder.flush()
    families = scrape(collector)
    assert value(families, "drover_llm_calls", "drover_llm_calls_total", scope=scope,
                 outcome="unanswered") == 1
    assert value(families, "drover_llm_calls", "drover_llm_calls_total", scope=scope,
                 outcome="cancelled") == 0
    after = tokens("unanswered_input"), tokens("unanswered_output")
    assert (after[0] - before[0], after[1] - before[1]) == (est_in, est_out)
    # drover stats says so, per scope.
    from rich.console import Console

    from drover.orchestrator.ops.stats import print_stats
    from drover.workers.services import services

    console = Console(width=400, record=True, force_terminal=False)
    print_stats(console, services(settings))
    out = console.export_text()
    assert f"{scope}: 1 calls sent and never answered" in out, out
    assert f"about {est_in:,} input and up to {est_out:,} output tokens" in out


def test_the_jobs_own_calls_planning_and_synthesis_count_in_its_usage(sim, worker):
    sim.configure(plan_items=3, tool_turns=0)
    worker(concurrency=3)
    result = submit(JobSpec(goal="Assess three depots", max_subtasks=3,
                            synthesize=True)).wait(timeout=60)
    stats = sim.stats()
    assert result.status == "done" and result.synthesis
    assert stats["accepted"] == 1 + 3 + 1 == result.usage.calls
    assert sum(r.usage.calls for r in result.results) == 3
    assert result.usage.input_tokens == stats["input_tokens"]
    assert result.usage.output_tokens == stats["output_tokens"]
