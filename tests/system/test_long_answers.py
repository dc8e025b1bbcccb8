"""Answers that take a long time (issue 36): every realtime call streams, is judged by the gap
between its events, never by a total, and counts what it generated however it ends.

Real Redis, worker subprocesses, the real SDK's ``messages.stream`` against the simulator
generating at a set speed. Nothing here asserts a duration: what the simulator counted (requests
accepted, sent twice, streams cut or abandoned, tokens billed) says what happened.
"""

from __future__ import annotations

import json

import pytest

from drover import JobSpec, submit
from tests.helpers import configure, wait_for_workers, wait_until

# Answers of 60-100% of max_tokens (4,800-8,000 tokens at 8000) at 1,000 tokens a second:
# 5-8 s each, longer than the old total timeout set below, far longer than the idle limit.
LONG = {"output_tokens_per_s": 1000.0, "ttft_s": 0.3, "output_share_min": 0.6,
        "output_share_max": 1.0, "tool_turns": 0}


def test_a_dozen_long_answers_stream_to_their_end_and_none_is_sent_twice(
        sim, spawn_worker, drover_env, monkeypatch):
    sim.configure(**LONG)
    # A total timeout below every answer's time: streamed calls never meet it.
    configure(monkeypatch, drover_env, call_timeout_s=3, stream_idle_s=3)
    spawn_worker(concurrency=3)
    spawn_worker(concurrency=3)
    wait_for_workers(2)
    handle = submit(JobSpec(subtasks=[f"Write the full report on region {i}" for i in range(12)],
                            max_tokens=8000))
    result = handle.wait(timeout=180)
    stats = sim.stats()
    assert result.counts["ok"] == 12, [r.error for r in result.results if r.status != "ok"]
    assert stats["accepted"] == 12 and stats["duplicate_accepted"] == 0
    assert (stats["streams"]["begun"], stats["streams"]["cut"],
            stats["streams"]["abandoned"]) == (12, 0, 0)
    assert stats["max_in_flight"] <= 6  # one per worker slot: drover's in-flight is the provider's
    outputs = [r.usage.output_tokens for r in result.results]
    assert all(4800 <= n <= 8000 for n in outputs), outputs
    # Counted as the provider billed it, nothing unanswered.
    assert result.usage.output_tokens == stats["billed"]["output_tokens"]
    assert result.usage.unanswered_calls == 0


@pytest.mark.parametrize("cut", ["cut", "cut_error"])
def test_a_stream_cut_mid_answer_is_retried_once_with_its_partial_tokens_counted(
        sim, spawn_worker, drover_env, cut):
    sim.configure(output_tokens_per_s=4000.0, tool_turns=0)
    spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Write the long report [[sim:out=3000]] [[sim:{cut}=6]]",
                                      "Write a short note"], max_tokens=8000))
    result = handle.wait(timeout=120)
    stats = sim.stats()
    assert result.counts["ok"] == 2
    assert stats["streams"]["cut"] == 1 and stats["streams"]["abandoned"] == 0
    assert stats["accepted"] == 3 and stats["duplicate_accepted"] == 1  # retried once
    # The cut stream's tokens are in the usage: unanswered, at what it had generated (the
    # provider billed them beside the two answers).
    cut_tokens = stats["billed"]["output_tokens"] - result.usage.output_tokens
    assert cut_tokens > 0
    assert result.usage.unanswered_calls == 1
    assert 0 < result.usage.unanswered_output_tokens < 3000


def test_a_cancel_mid_stream_closes_it_and_counts_what_it_generated(
        sim, spawn_worker, drover_env):
    # 8,000 tokens at 500 a second: 16 s, cancelled once it is under way.
    sim.configure(output_tokens_per_s=500.0, tool_turns=0)
    spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=["Write the whole book [[sim:out=8000]]"],
                            max_tokens=8000))
    wait_until("the stream to be generating",
               lambda: sim.stats()["streams"]["tokens_sent"] >= 500, timeout=60)
    wait_until("drover watch's count of it", lambda: handle.generating() == 1, timeout=10)
    assert handle.cancel()
    result = handle.wait(timeout=60)
    wait_until("the stream closed", lambda: sim.stats()["in_flight"] == 0, timeout=10)
    stats = sim.stats()
    assert result.results[0].status == "cancelled"
    assert handle.generating() == 0  # its stream is closed
    assert (stats["streams"]["begun"], stats["streams"]["abandoned"]) == (1, 1)
    # Closed early: the provider billed part of the answer, and the job counts about that.
    billed = stats["billed"]["output_tokens"]
    assert 0 < billed < 8000
    assert result.usage.unanswered_calls == 1
    assert 0 < result.usage.unanswered_output_tokens <= billed + 50


def test_tool_turns_with_thinking_stream_and_pass_the_thinking_back_unchanged(
        sim, spawn_worker, drover_env):
    # One tool turn, then the answer; the simulator refuses a tool turn whose thinking block
    # is missing or altered (its signature), as the API does.
    sim.configure(tool_turns=1, tools_per_turn=1, output_tokens_per_s=5000.0)
    spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(3)],
                            tools=["lookup_fact"], max_tokens=4000, thinking=2048))
    result = handle.wait(timeout=120)
    stats = sim.stats()
    assert result.counts["ok"] == 3, [r.error for r in result.results]
    assert stats["errors_4xx"] == 0 and stats["duplicate_accepted"] == 0
    assert stats["streams"]["begun"] == 6 and result.usage.calls == 6
    for record in result.results:  # the record holds the answer's text, never its thinking
        dumped = record.model_dump_json()
        assert record.summary and "considering" not in dumped and "sig_" not in dumped
    # The transcript keeps the thinking's place, not its text (DROVER_RECORD_THINKING is off).
    transcript = json.dumps(handle.transcript(0))
    assert '"thinking"' in transcript and "considering" not in transcript


def test_a_stream_silent_for_the_idle_limit_is_closed_and_retried(
        sim, spawn_worker, drover_env, monkeypatch):
    # The first attempt's stream says message_start and ping, then nothing for 4 s: past
    # DROVER_STREAM_IDLE_S (1 s) it is closed, counted unanswered, and the turn retried.
    sim.configure(tool_turns=0)
    configure(monkeypatch, drover_env, stream_idle_s=1)
    spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=["Write the report [[sim:stall=4]]"]))
    result = handle.wait(timeout=120)
    stats = sim.stats()
    assert result.counts["ok"] == 1
    assert stats["accepted"] == 2 and stats["duplicate_accepted"] == 1
    assert stats["streams"]["abandoned"] == 1
    assert result.usage.unanswered_calls == 1 and result.usage.calls == 1
    assert result.usage.unanswered_output_tokens == 0  # nothing generated before the silence


def test_a_first_token_a_minute_and_more_away_on_a_pinged_stream_is_waited_for(
        sim, spawn_worker, drover_env):
    # 16 calls whose first token comes 75 s after admission, the stream pinged every 5 s
    # meanwhile (as the API pings a long prompt's read or hidden thinking), at the default
    # idle limit (60 s): the connection is alive, so each call is sent once and answered.
    # Timed on the SDK's events (which drop pings) every one was abandoned at 60 s and sent
    # again, each attempt billed.
    sim.configure(tool_turns=0, ping_every_s=5.0)
    spawn_worker(concurrency=16)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Read the whole archive {i} [[sim:think=75]]"
                                      for i in range(16)]))
    result = handle.wait(timeout=400)
    stats = sim.stats()
    assert result.counts["ok"] == 16, [r.error for r in result.results if r.status != "ok"]
    assert stats["accepted"] == 16 and stats["duplicate_accepted"] == 0
    assert (stats["streams"]["begun"], stats["streams"]["abandoned"]) == (16, 0)
    assert result.usage.unanswered_calls == 0
