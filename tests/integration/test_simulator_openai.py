"""The simulator's OpenAI mode (SimConfig.provider="openai"), over real HTTP, through the real
openai SDK (max_retries=0): Chat Completions shapes, tool calls, streaming with usage, and
OpenAI's limit structure (requests and one tokens bucket charged input + max tokens at
admission) with its x-ratelimit-* headers and 429s (../shared/openai-api.md)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from drover.simulator import SimulatorServer
from drover.simulator.openai import duration

MODEL = "gpt-sim-1"
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "lookup_fact", "description": "Look a fact up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                   "required": ["q"]}}}]


def client_for(server: SimulatorServer, api_key: str = "sk-sim") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)


def chat(client: openai.OpenAI, text: str, **kwargs: Any) -> Any:
    kwargs.setdefault("max_completion_tokens", 200)
    return client.chat.completions.create(model=MODEL, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": text}], **kwargs)


@pytest.fixture
def openai_sim(sim_factory: Callable[..., SimulatorServer]) -> Callable[..., SimulatorServer]:
    return lambda **config: sim_factory(provider="openai", seed=1, **config)


def test_a_tool_turn_is_answered_by_tool_messages_and_then_ends(openai_sim):
    client = client_for(openai_sim(tool_turns=1, tools_per_turn=2))
    messages: list[Any] = [{"role": "user", "content": "find x"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                           max_completion_tokens=300)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 2
    assert first.usage.prompt_tokens > 0 and first.usage.completion_tokens > 0
    messages.append(choice.message.model_dump(exclude_none=True))
    for call in choice.message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                            max_completion_tokens=300)
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content


def test_a_tool_call_left_unanswered_is_a_400_that_names_it(openai_sim):
    client = client_for(openai_sim(tool_turns=1))
    messages: list[Any] = [{"role": "user", "content": "find x"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                           max_completion_tokens=300)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "and?"})
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                       max_completion_tokens=300)
    assert first.choices[0].message.tool_calls[0].id in caught.value.message


def test_a_stream_ends_with_a_usage_chunk(openai_sim):
    client = client_for(openai_sim(output_tokens_mean=80))
    chunks = list(chat(client, "tell", stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_the_tokens_bucket_is_charged_input_plus_max_tokens_at_admission(openai_sim):
    client = client_for(openai_sim(rpm=1000, tpm=60_000))
    began = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, max_completion_tokens=5000,
        messages=[{"role": "user", "content": "hello"}])
    took_s = time.monotonic() - began
    answer = raw.parse()
    headers = raw.headers
    assert headers["x-ratelimit-limit-tokens"] == "60000"
    assert headers["x-ratelimit-limit-requests"] == "1000"
    charged = 60_000 - int(headers["x-ratelimit-remaining-tokens"])
    # The whole max tokens stays charged, not what the answer used, less what the bucket
    # (1,000 tokens a second) refilled between the admission and the headers: at most the
    # call's time (a full run at load 14: 20 tokens, over a fixed 10 of slack).
    assert charged >= answer.usage.prompt_tokens + 5000 - math.ceil(took_s * 1000) - 1
    assert re.fullmatch(r"(\d+ms|[\d.]+s|\d+m[\d.]+s)", headers["x-ratelimit-reset-tokens"])


@pytest.mark.parametrize("mode, seconds, ms", [("seconds", True, False), ("ms", False, True),
                                               ("both", True, True), ("none", False, False)])
def test_a_429_names_the_tokens_bucket_and_carries_the_retry_headers_asked_for(
        openai_sim, mode, seconds, ms):
    client = client_for(openai_sim(rpm=1000, tpm=6000, retry_after_headers=mode))
    chat(client, "first", max_completion_tokens=5000)
    with pytest.raises(openai.RateLimitError) as caught:
        chat(client, "second", max_completion_tokens=5000)
    error = caught.value
    assert error.body["code"] == "rate_limit_exceeded" and error.body["type"] == "tokens"
    assert "TPM" in error.message
    assert ("retry-after" in error.response.headers) is seconds
    assert ("retry-after-ms" in error.response.headers) is ms
    assert error.response.headers["x-ratelimit-remaining-tokens"] is not None


def test_the_spend_cap_is_insufficient_quota_and_overload_a_503(openai_sim):
    client = client_for(openai_sim(overload_rate=1.0))
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, "hi")
    assert caught.value.status_code == 503
    client = client_for(openai_sim())
    with pytest.raises(openai.RateLimitError) as quota:
        chat(client, "hi [[sim:spend_cap]]")
    assert quota.value.body["code"] == "insufficient_quota"


def test_a_refused_key_is_a_401_invalid_api_key(openai_sim):
    pool = [{"alias": "a", "api_key": "sk-a", "revoke_after_s": 0}]
    client = client_for(openai_sim(pool=pool), api_key="sk-a")
    with pytest.raises(openai.AuthenticationError) as caught:
        chat(client, "hi")
    assert caught.value.body["code"] == "invalid_api_key"


def test_a_reset_is_written_as_openai_writes_durations():
    assert [duration(s) for s in (0.12, 1.0, 1.5, 360.0)] == ["120ms", "1s", "1.5s", "6m0s"]
