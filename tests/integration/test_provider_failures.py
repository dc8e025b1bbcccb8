"""What drover does with a provider's failures (real in-process workers, the SDKs over HTTP
to the simulator; mostly OpenAI's mode, DROVER_PROVIDER=openai): a stream cut mid-answer, a
429 that is no rate limit (no credit left), a 429's retry headers. Each test names the
behaviour it guards; each was seen to fail with that behaviour broken on purpose (issue 53).

These are about output and cooldowns, not the prompt a cut stream was billed (that is
tests/integration/test_openai_provider.py's)."""

from __future__ import annotations

import pytest

from drover import JobSpec, submit
from tests.helpers import configure, wait_until
from tests.helpers.openai import on_openai as use_openai

# A long answer, cut after its sixth event on its first attempt only (the retry answers).
CUT = "Write the long report [[sim:out=3000]] [[sim:cut=6]]"


@pytest.fixture
def on_openai(monkeypatch, drover_env, sim_factory):
    def start(**sim_config):
        return use_openai(monkeypatch, drover_env, sim_factory, **sim_config)
    return start


def _scope_usage(seconds: int = 600) -> dict[str, float]:
    """What the limiter's settles counted on this test's OpenAI scope over ``seconds``."""
    from drover.orchestrator.ops.stats import scope_usage
    from drover.workers.limiter import llm_scope
    from drover.workers.services import services

    shared = services()
    settings = shared.settings
    scope = llm_scope(settings.key_alias, settings.limit_class(settings.model))
    return scope_usage(shared.limiter, settings, scope, seconds).last(seconds)


def test_a_cut_stream_that_had_streamed_text_counts_unanswered_output(on_openai, worker):
    sim = on_openai(tool_turns=0, output_tokens_per_s=4000.0)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=[CUT], max_tokens=8000)).wait(timeout=120)
    stats = sim.stats()
    assert result.counts["ok"] == 1
    assert stats["streams"]["cut"] == 1 and stats["accepted"] == 2  # cut once, then answered
    cut_billed = stats["billed"]["output_tokens"] - result.usage.output_tokens
    assert cut_billed > 0  # the cut stream had streamed text, which the provider billed
    assert result.usage.unanswered_calls == 1
    assert result.usage.unanswered_output_tokens > 0, (
        "a cut stream that had streamed text reported 0 unanswered output tokens")


def test_a_cancelled_stream_that_had_streamed_text_counts_unanswered_output(on_openai, worker):
    # 8,000 tokens at 500 a second: 16 s, cancelled once it is under way.
    sim = on_openai(tool_turns=0, output_tokens_per_s=500.0)
    worker(concurrency=2)
    handle = submit(JobSpec(subtasks=["Write the whole book [[sim:out=8000]]"],
                            max_tokens=8000))
    wait_until("the stream to be generating",
               lambda: sim.stats()["streams"]["tokens_sent"] >= 500, 60)
    assert handle.cancel()
    result = handle.wait(timeout=60)
    wait_until("the stream closed", lambda: sim.stats()["in_flight"] == 0, 10)
    stats = sim.stats()
    assert result.results[0].status == "cancelled"
    assert 0 < stats["billed"]["output_tokens"] < 8000  # closed early, billed in part
    assert result.usage.unanswered_calls == 1
    assert result.usage.unanswered_output_tokens > 0, (
        "a cancelled stream that had streamed text reported 0 unanswered output tokens")


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_the_limiter_counts_at_least_the_output_a_cut_stream_was_billed(
        on_openai, worker, sim, monkeypatch, drover_env, provider):
    """The limiter's settle of a cut call (not only the job's usage) counts at least the
    output the provider billed for it: a settle below that lets the next grants spend output
    the provider has already counted, and draws its 429s. One attempt, so the cut call is
    the scope's only one (an answered retry's count would hide it). Anthropic and OpenAI
    settle it differently: Anthropic's, the characters received at 3 a token (at 4, the
    usage's estimate, it settled 1,200 where 1,284 were billed);
    OpenAI's tokens bucket, its max tokens, charged at admission and never given back. The
    job's usage keeps its estimate, which brackets the bill with the answered calls."""
    configure(monkeypatch, drover_env, max_attempts=1)
    if provider == "openai":
        sim = on_openai(tool_turns=0, output_tokens_per_s=4000.0)
    else:
        sim.configure(tool_turns=0, output_tokens_per_s=4000.0)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=[CUT], max_tokens=8000)).wait(timeout=120)
    stats = sim.stats()
    assert result.counts["failed"] == 1 and stats["streams"]["cut"] == 1
    billed = stats["billed"]["output_tokens"]
    assert billed > 0  # the cut stream had generated output, which the provider billed
    counted = _scope_usage()
    assert counted["output_tokens"] >= billed, (counted, stats["billed"])


def test_a_429_insufficient_quota_fails_the_sub_agent_at_once(on_openai, worker):
    sim = on_openai(tool_turns=0)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=["Summarise the ledger [[sim:spend_cap]]"],
                            max_tokens=200)).wait(timeout=120)
    record = result.results[0]
    assert record.status == "failed", record
    assert sim.stats()["spend_cap_429"] == 1, "retried"  # one request, no retry
    assert record.attempts == 1, f"retried {record.attempts - 1} times: {record.error}"
    assert record.error_type == "spend_limit_reached"  # insufficient_quota, in drover's words


@pytest.mark.parametrize("headers", ["seconds", "ms"])
def test_a_429s_retry_after_starts_the_scopes_cooldown(on_openai, worker, headers):
    """Every worker of the scope waits out a 429's retry-after (or retry-after-ms), not only
    the call that drew it: the limiter's cooldown on the scope covers it. 30 s, far beyond
    the backoff a 429 without the header gets, so the cooldown is the header's."""
    sim = on_openai(tool_turns=0, inject_429_rate=1.0, inject_429_retry_after=30,
                    retry_after_headers=headers)
    worker(concurrency=2)
    handle = submit(JobSpec(subtasks=["Summarise the ledger"], max_tokens=200))
    wait_until("the 429", lambda: sim.stats()["rejected_429"] >= 1, 60)
    from drover.workers.limiter import llm_scope
    from drover.workers.services import services

    shared = services()
    scope = llm_scope(shared.settings.key_alias, shared.settings.limit_class(
        shared.settings.model))
    wait_until("the scope's cooldown from the 429's retry headers",
               lambda: shared.limiter.state(scope)["cooldown_s"] > 20, 30)
    assert handle.cancel()
    handle.wait(timeout=60)
