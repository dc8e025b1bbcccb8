"""drover on OpenAI (DROVER_PROVIDER=openai): real workers, the openai SDK over HTTP to the
simulator in its OpenAI mode (Chat Completions, requests and one tokens bucket)."""

from __future__ import annotations

import pytest

from drover import JobSpec, submit
from tests.helpers import configure
from tests.helpers.openai import on_openai as use_openai


@pytest.fixture
def on_openai(monkeypatch, drover_env, sim_factory):
    def start(**sim_config):
        return use_openai(monkeypatch, drover_env, sim_factory, **sim_config)
    return start


def test_tool_turns_answer_every_call_and_end_ok(on_openai, worker):
    sim = on_openai(tool_turns=2, tools_per_turn=2)
    worker(concurrency=4)
    result = submit(JobSpec(subtasks=[f"Look up fact {i}" for i in range(6)],
                            tools=["lookup_fact"], max_tokens=300)).wait(timeout=120)
    assert result.counts["ok"] == 6
    assert all(r.turns == 3 for r in result.results)  # two tool turns, then the answer
    stats = sim.stats()
    assert stats["errors_4xx"] == 0  # no protocol error: every tool call answered
    assert stats["accepted"] == 18


def test_a_binding_tpm_is_kept_without_a_429(on_openai, worker, monkeypatch, drover_env):
    # 12 calls of about 11 input + 400 max tokens each at 6,000 TPM: the limiter paces them.
    # drover's bucket is the provider's (10 s): a bucket that holds more than the unused
    # max tokens of a call is what showed the limiter crediting them back, which OpenAI
    # does not (3 429s before Route.settle kept them charged).
    sim = on_openai(tpm=6000, rpm=600, burst_s=10)
    configure(monkeypatch, drover_env, burst_seconds=10)
    worker(concurrency=8)
    result = submit(JobSpec(subtasks=[f"Summarise item {i}" for i in range(12)],
                            max_tokens=400)).wait(timeout=240)
    assert result.counts["ok"] == 12
    assert sim.stats()["rejected_429"] == 0
    # Its scope is requests and one tokens bucket, as `drover stats` shows it: the bucket
    # counts input and output together, which the counters keep apart as the answers said.
    from drover.orchestrator.ops.stats import scope_usage
    from drover.workers.limiter import llm_scope
    from drover.workers.services import services

    shared = services()
    settings = shared.settings
    scope = llm_scope(settings.key_alias, settings.limit_class(settings.model))
    usage = scope_usage(shared.limiter, settings, scope, 600)
    assert [name for name, *_ in usage.dimensions()] == ["requests", "tokens"]
    assert usage.limits["tokens"] == pytest.approx(6000)
    assert usage.limits["input_tokens"] is None and usage.limits["output_tokens"] is None
    whole = usage.last(600)
    assert whole["output_tokens"] >= 12 * 400  # each call settled to its max tokens
    assert whole["tokens"] == whole["input_tokens"] + whole["output_tokens"]


@pytest.mark.parametrize("headers", ["seconds", "ms", "none"])
def test_a_429_storm_is_retried_with_or_without_retry_headers(on_openai, worker, headers):
    sim = on_openai(inject_429_rate=0.3, inject_429_retry_after=1, retry_after_headers=headers)
    worker(concurrency=4)
    result = submit(JobSpec(subtasks=[f"Task {i}" for i in range(6)],
                            max_tokens=200)).wait(timeout=180)
    assert result.counts["ok"] == 6
    assert sim.stats()["rejected_429"] > 0


def test_a_refused_key_fails_the_job_at_once_saying_which_variable(on_openai, worker):
    on_openai(pool=[{"alias": "gone", "api_key": "sk-sim", "revoke_after_s": 0}])
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=["a", "b"], max_tokens=100)).wait(timeout=60)
    assert result.counts["failed"] == 2
    assert "OPENAI_API_KEY" in result.results[0].error


def test_a_batch_job_is_refused_at_submit_saying_why(on_openai):
    on_openai()
    with pytest.raises(ValueError, match="Message Batches"):
        submit(JobSpec(subtasks=["a"], delivery="batch"))


def test_a_stream_cut_mid_answer_counts_the_prompt_it_was_billed(on_openai, worker):
    # OpenAI says a prompt's count only in a stream's last chunk, and bills the prompt at
    # admission: a stream cut before that chunk cost its whole prompt (it counted 0 input).
    sim = on_openai(tool_turns=0, output_tokens_per_s=4000.0)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=["Write the long report [[sim:out=3000]] [[sim:cut=6]] "
                                      + "with the background below. " + "context " * 400],
                            max_tokens=8000)).wait(timeout=120)
    stats = sim.stats()
    assert result.counts["ok"] == 1
    assert stats["streams"]["cut"] == 1 and stats["accepted"] == 2
    usage = result.usage
    assert usage.unanswered_calls == 1
    # Billed twice (the cut attempt and its retry); the answered one's count is exact, the
    # cut one's is drover's estimate of the same prompt (it counted 0).
    answered_in = usage.input_tokens
    assert stats["billed"]["input_tokens"] == 2 * answered_in
    assert 0.9 * answered_in <= usage.unanswered_input_tokens <= 1.5 * answered_in



def test_a_worker_on_openai_runs_a_job_without_importing_the_anthropic_sdk(
        on_openai, spawn_worker, monkeypatch, drover_env):
    # Each provider converts its answers to drover's own Answer at its edge: a worker on
    # OpenAI plans, runs tool turns and joins with a synthesis, and never imports anthropic
    # (it did: OpenAI's answers were rebuilt as Anthropic Message objects, and the providers
    # room imported Anthropic's module with itself).
    import json
    import time

    import redis

    from drover.config import get_settings
    from tests.helpers.sdk_probe import sdk_probe_key

    on_openai(tool_turns=1, tools_per_turn=1)
    configure(monkeypatch, drover_env, tool_modules=json.dumps(
        ["drover.workers.tools.demo", "tests.helpers.sdk_probe"]))
    # A fresh interpreter, as in production: the tests' zygote (tests/helpers/zygote.py)
    # forks workers from a Python that has imported the anthropic SDK already.
    monkeypatch.setenv("TEST_ZYGOTE", "0")
    spawn_worker(concurrency=2)
    result = submit(JobSpec(goal="Compare three storage engines", max_subtasks=3,
                            tools=["lookup_fact"], synthesize=True,
                            max_tokens=300)).wait(timeout=180)
    assert result.counts["ok"] == len(result.results) > 0
    assert result.synthesis and not result.synthesis.startswith("(synthesis")
    r = redis.Redis.from_url(get_settings().redis_url, decode_responses=True)
    told: list[dict[str, object]] = []
    for _ in range(100):  # the join's own line comes right after the job's end
        told = [json.loads(x) for x in r.lrange(sdk_probe_key(), 0, -1)]
        if any(t["task"] == "drover.join_results" for t in told):
            break
        time.sleep(0.1)
    r.delete(sdk_probe_key())
    r.close()
    tasks = {t["task"] for t in told}
    assert {"drover.plan_job", "drover.run_subagent", "drover.join_results"} <= tasks
    assert all(t["sdks"] == ["openai"] for t in told), told
