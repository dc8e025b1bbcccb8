"""The simulator, over real HTTP, through the real anthropic SDK (max_retries=0)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from typing import Any

import anthropic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drover.simulator import SimConfig, SimulatorServer, count_text, count_tokens
from drover.simulator.buckets import KeyBuckets
from drover.simulator.engine import lognormal_params
from drover.simulator.stats import WINDOW_S, SlidingMax

MODEL = "claude-sim-1"

TOOLS: list[dict[str, Any]] = [
    {"name": "web_search", "description": "Search the web for a query.",
     "input_schema": {"type": "object",
                      "properties": {"query": {"type": "string"},
                                     "max_results": {"type": "integer"},
                                     "verbose": {"type": "boolean"}},
                      "required": ["query", "max_results"]}},
    {"name": "get_quote", "description": "Latest quote of a ticker.",
     "input_schema": {"type": "object",
                      "properties": {"symbol": {"type": "string"},
                                     "window": {"type": "object",
                                                "properties": {"days": {"type": "number"}},
                                                "required": ["days"]}},
                      "required": ["symbol", "window"]}},
]

PLAN_TOOL: dict[str, Any] = {
    "name": "make_plan", "description": "Split the goal into subtasks.",
    "input_schema": {"type": "object",
                     "properties": {"subtasks": {"type": "array", "items": {"type": "string"}}},
                     "required": ["subtasks"]},
}




@pytest.fixture
def sim(sim_factory: Callable[..., SimulatorServer]) -> SimulatorServer:
    return sim_factory()


def client_for(server: SimulatorServer, api_key: str = "sk-test") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0)


def ask(client: anthropic.Anthropic, text: str, **kwargs: Any) -> anthropic.types.Message:
    kwargs.setdefault("max_tokens", 1024)
    return client.messages.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                  **kwargs)


def raw_post(server: SimulatorServer, path: str, body: bytes,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(server.url + path, data=body, method="POST",
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


# -- round trips ----------------------------------------------------------------------------

def test_plain_message_round_trips_with_consistent_usage(sim: SimulatorServer) -> None:
    client = client_for(sim)
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=1024, system="You are terse.",
        messages=[{"role": "user", "content": "Survey the market for electric bikes"}])
    message = raw.parse()
    assert raw.headers["request-id"].startswith("req_")
    assert message.id.startswith("msg_") and message.model == MODEL
    assert message.role == "assistant" and message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    [block] = message.content
    assert block.text.startswith("Findings on Survey the market for electric bikes:")
    assert message.usage.output_tokens == count_text(block.text) > 0
    body = {"model": MODEL, "system": "You are terse.",
            "messages": [{"role": "user", "content": "Survey the market for electric bikes"}]}
    assert message.usage.input_tokens == count_tokens(body)
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.cache_read_input_tokens == 0


def test_token_count_is_word_like_not_length_over_four() -> None:
    assert count_text("a b c d") == 4  # four words, len/4 would say 1 or 2
    assert count_text("internationalization") == 5  # 20 chars -> ceil(20/4)
    assert count_text("x = f(y);") == 7


def test_count_tokens_endpoint_matches_usage_of_an_uncached_request(sim: SimulatorServer) -> None:
    client = client_for(sim)
    messages = [{"role": "user", "content": "Compare three vector databases for latency"}]
    counted = client.messages.count_tokens(model=MODEL, messages=messages, tools=TOOLS,
                                           system="Be precise.")
    message = client.messages.create(model=MODEL, max_tokens=512, messages=messages,
                                     tools=TOOLS, system="Be precise.")
    assert counted.input_tokens == message.usage.input_tokens > 0
    assert sim.stats()["accepted"] == 1  # count_tokens is not a model call


def test_max_tokens_truncates_with_stop_reason_max_tokens(sim: SimulatorServer) -> None:
    message = ask(client_for(sim), "Write a long report on solar panels", max_tokens=5)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5 == count_text(message.content[0].text)


# -- tools ----------------------------------------------------------------------------------

def test_tool_turns_then_end_turn_through_the_sdk(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(tool_turns=2, tools_per_turn=2)
    client = client_for(sim)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Research ACME's stock"}]
    seen_ids: set[str] = set()
    stop_reasons = []
    for _ in range(5):
        message = client.messages.create(model=MODEL, max_tokens=2048, tools=TOOLS,
                                         messages=messages)
        stop_reasons.append(message.stop_reason)
        if message.stop_reason != "tool_use":
            break
        uses = [b for b in message.content if b.type == "tool_use"]
        assert message.content[0].type == "text"
        assert len(uses) == 2
        for use in uses:
            assert use.id.startswith("toolu_") and use.id not in seen_ids
            seen_ids.add(use.id)
            schema = next(t for t in TOOLS if t["name"] == use.name)["input_schema"]
            assert set(use.input) == set(schema["required"])
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                          for b in message.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id, "content": f"result of {u.name}"}
            for u in uses]})
    assert stop_reasons == ["tool_use", "tool_use", "end_turn"]
    assert sim.stats()["duplicate_accepted"] == 0


def test_turns_and_out_knobs_in_the_task_hold_for_the_whole_conversation(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(tool_turns=1, tools_per_turn=1, output_tokens_mean=20)
    client = client_for(sim)

    def converse(task: str) -> list[anthropic.types.Message]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        replies = []
        for _ in range(10):
            message = client.messages.create(model=MODEL, max_tokens=4096, tools=TOOLS,
                                             messages=messages)
            replies.append(message)
            if message.stop_reason != "tool_use":
                return replies
            messages.append({"role": "assistant", "content": [
                b.model_dump(exclude_none=True) for b in message.content]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                for b in message.content if b.type == "tool_use"]})
        return replies

    assert len(converse("Research ACME")) == 2  # tool_turns=1, then the answer
    long = converse("Research ACME [[sim:turns=4]] [[sim:out=900]]")
    assert [m.stop_reason for m in long] == ["tool_use"] * 4 + ["end_turn"]
    assert 450 <= long[-1].usage.output_tokens <= 1350  # [mean/2, 1.5 mean] of out=900
    assert len(converse("Research ACME [[sim:turns=0]]")) == 1


def test_missing_tool_result_is_a_bad_request(sim: SimulatorServer) -> None:
    client = client_for(sim)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Research ACME"}]
    first = client.messages.create(model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages)
    uses = [b for b in first.content if b.type == "tool_use"]
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                      for b in first.content]})
    # Answer only the first of the two tool calls.
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": "ok"}]})
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages)
    assert uses[1].id in info.value.message
    assert info.value.body["error"]["type"] == "invalid_request_error"


def test_forced_tool_choice_returns_one_tool_use_with_plan_items(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(plan_items=7)
    message = client_for(sim).messages.create(
        model=MODEL, max_tokens=2048, tools=[PLAN_TOOL] + TOOLS,
        tool_choice={"type": "tool", "name": "make_plan"},
        messages=[{"role": "user", "content": "Plan a study of coffee prices"}])
    assert message.stop_reason == "tool_use"
    [use] = message.content
    assert use.type == "tool_use" and use.name == "make_plan"
    subtasks = use.input["subtasks"]
    assert len(subtasks) == 7 and len(set(subtasks)) == 7
    assert all(isinstance(s, str) for s in subtasks)


def test_tool_trigger_calls_an_unknown_tool(sim: SimulatorServer) -> None:
    message = ask(client_for(sim), "Look it up [[sim:tool=no_such_tool]]", tools=TOOLS)
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses[0].name == "no_such_tool"


def test_tool_choice_none_answers_with_text(sim: SimulatorServer) -> None:
    message = ask(client_for(sim), "Research ACME", tools=TOOLS, tool_choice={"type": "none"})
    assert message.stop_reason == "end_turn"
    assert [b.type for b in message.content] == ["text"]


# -- validation and faults ------------------------------------------------------------------

def test_missing_api_key_is_401_with_the_error_shape(sim: SimulatorServer) -> None:
    request = {"model": MODEL, "max_tokens": 10,
               "messages": [{"role": "user", "content": "hi"}]}
    status, headers, body = raw_post(sim, "/v1/messages", json.dumps(request).encode())
    assert status == 401
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert body["request_id"].startswith("req_") and headers["request-id"] == body["request_id"]


_USER_X = [{"role": "user", "content": "x"}]


def _body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "parsing"),
    (_body(max_tokens=5, messages=_USER_X), "model"),
    (_body(model=MODEL, messages=_USER_X), "max_tokens"),
    (_body(model=MODEL, max_tokens=0, messages=_USER_X), "max_tokens"),
    (_body(model=MODEL, max_tokens=5, messages=[]), "messages"),
    (_body(model=MODEL, max_tokens=5, messages=[{"role": "assistant", "content": "x"}]), "user"),
    (_body(model=MODEL, max_tokens=5,
           messages=[*_USER_X, {"role": "user", "content": "y"}]), "alternate"),
])
def test_invalid_bodies_are_400_naming_the_problem(sim: SimulatorServer, body: bytes,
                                                   fragment: str) -> None:
    status, headers, reply = raw_post(sim, "/v1/messages", body, {"x-api-key": "sk-test"})
    assert status == 400
    assert reply["error"]["type"] == "invalid_request_error"
    assert fragment in reply["error"]["message"]
    assert headers["request-id"].startswith("req_")


def test_400_trigger_is_a_bad_request(sim: SimulatorServer) -> None:
    with pytest.raises(anthropic.BadRequestError):
        ask(client_for(sim), "Summarise this [[sim:400]]")
    assert sim.stats()["errors_4xx"] == 1


def test_spend_cap_trigger_is_a_429_without_retry_after(sim: SimulatorServer) -> None:
    with pytest.raises(anthropic.RateLimitError) as info:
        ask(client_for(sim), "Summarise this [[sim:spend_cap]]")
    assert "retry-after" not in info.value.response.headers
    assert info.value.body["error"]["details"]["error_code"] == "enforced_spend_limit_reached"
    stats = sim.stats()
    assert stats["spend_cap_429"] == 1 and stats["rejected_429"] == 0


def test_triggers_in_a_tool_result_apply(sim: SimulatorServer) -> None:
    client = client_for(sim)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Research ACME"}]
    first = client.messages.create(model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages)
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                      for b in first.content]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b.id, "content": "boom [[sim:500]]"}
        for b in first.content if b.type == "tool_use"]})
    with pytest.raises(anthropic.InternalServerError) as info:
        client.messages.create(model=MODEL, max_tokens=1024, tools=TOOLS, messages=messages)
    assert info.value.status_code == 500


def test_overload_rate_one_gives_overloaded_error(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(overload_rate=1.0)
    with pytest.raises(anthropic.OverloadedError) as info:
        ask(client_for(sim), "Anything")
    assert info.value.status_code == 529
    assert info.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    sim.configure(overload_rate=0.0)
    assert ask(client_for(sim), "Anything").stop_reason == "end_turn"
    assert sim.stats()["overloaded_529"] == 1


def test_counted_529_trigger_fails_then_recovers(sim: SimulatorServer) -> None:
    client = client_for(sim)
    for _ in range(2):
        with pytest.raises(anthropic.OverloadedError):
            ask(client, "Flaky task [[sim:529:2]]")
    assert ask(client, "Flaky task [[sim:529:2]]").stop_reason == "end_turn"


def test_random_faults_differ_across_retries_of_the_same_body(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(overload_rate=0.5)
    client = client_for(sim)
    outcomes = set()
    for _ in range(30):
        try:
            ask(client, "The same body every time")
            outcomes.add(200)
        except anthropic.OverloadedError:
            outcomes.add(529)
    assert outcomes == {200, 529}


def test_injected_429_carries_the_configured_retry_after(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(inject_429_rate=1.0, inject_429_retry_after=3)
    with pytest.raises(anthropic.RateLimitError) as info:
        ask(client_for(sim), "Anything")
    assert info.value.response.headers["retry-after"] == "3"
    assert sim.stats()["rejected_429"] == 1


# -- rate limits ----------------------------------------------------------------------------

def test_sixth_immediate_request_over_rpm_5_is_rate_limited(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(rpm=5, itpm=100_000, otpm=50_000)
    client = client_for(sim)
    for i in range(5):
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": f"task {i}"}])
        assert raw.headers["anthropic-ratelimit-requests-remaining"] == str(4 - i)
    with pytest.raises(anthropic.RateLimitError) as info:
        ask(client, "task 5", max_tokens=100)
    headers = info.value.response.headers
    assert re.fullmatch(r"[1-9][0-9]*", headers["retry-after"])
    assert 1 <= int(headers["retry-after"]) <= 12  # one request refills in 60/5 s
    assert "5 requests per minute" in info.value.message
    for dim in ("requests", "input-tokens", "output-tokens", "tokens"):
        for part in ("limit", "remaining", "reset"):
            assert f"anthropic-ratelimit-{dim}-{part}" in headers
    assert headers["anthropic-ratelimit-requests-limit"] == "5"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "100000"
    assert int(headers["anthropic-ratelimit-input-tokens-remaining"]) % 1000 == 0
    datetime.strptime(headers["anthropic-ratelimit-requests-reset"], "%Y-%m-%dT%H:%M:%SZ")
    stats = sim.stats()
    assert stats["accepted"] == 5 and stats["rejected_429"] == 1
    assert stats["max_60s"]["requests"] == 5


def test_input_token_limit_names_input_tokens(sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(itpm=600)
    client = client_for(sim)
    prompt = " ".join(f"word{i}" for i in range(150))  # ~300 tokens
    ask(client, prompt, max_tokens=10)
    with pytest.raises(anthropic.RateLimitError) as info:
        ask(client, prompt + " again", max_tokens=10)
    assert "600 input tokens per minute" in info.value.message


def test_request_larger_than_the_bucket_is_admitted_when_full(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(itpm=100, burst_s=60)
    message = ask(client_for(sim), " ".join(f"w{i}" for i in range(400)), max_tokens=10)
    assert message.usage.input_tokens > 100


def test_refuse_oversized_answers_429_every_time_to_a_request_over_a_minute(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(itpm=100, otpm=1000, otpm_mode="max_tokens", burst_s=1,
                      refuse_oversized=True)
    client = client_for(sim)
    # Over the bucket (100 / 60 x 1 s) but within the minute: admitted once full, as before.
    assert ask(client, " ".join(f"w{i}" for i in range(60)), max_tokens=10).usage.input_tokens
    for _ in range(2):  # full buckets or not, the answer is the same
        with pytest.raises(anthropic.RateLimitError) as info:
            ask(client, " ".join(f"w{i}" for i in range(400)), max_tokens=10)
        assert "100 input tokens per minute" in info.value.message
        assert int(info.value.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.RateLimitError) as info:
        ask(client, "short", max_tokens=1001)
    assert "1,000 output tokens per minute" in info.value.message


def test_max_tokens_mode_reserves_max_tokens(sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(otpm=1000, otpm_mode="max_tokens")
    client = client_for(sim)
    ask(client, "short", max_tokens=600)  # reserves 600, refunds what was not generated
    with pytest.raises(anthropic.RateLimitError) as info:
        ask(client, "short again", max_tokens=900)
    assert "output tokens per minute" in info.value.message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 400), min_size=1, max_size=300), st.integers(1, 30))
def test_rpm_bucket_never_admits_more_than_capacity_plus_refill(arrivals: list[float],
                                                               rpm: int) -> None:
    buckets = KeyBuckets(SimConfig(rpm=rpm, burst_s=60), now=0.0)
    admitted = [t for t in sorted(arrivals) if buckets.try_admit(1, 1, now=t) is None]
    for start in admitted:  # any 60 s window: a full bucket plus one minute of refill
        assert sum(1 for t in admitted if start <= t < start + 60) <= 2 * rpm


def test_bucket_retry_after_and_refill_are_exact() -> None:
    buckets = KeyBuckets(SimConfig(rpm=60, itpm=6000, burst_s=10), now=0.0)
    assert buckets.try_admit(900, 10, now=0.0) is None  # input capacity is 1000
    rejection = buckets.try_admit(900, 10, now=0.0)
    assert rejection is not None and rejection.limit_name == "input tokens"
    assert rejection.retry_after_s == 8  # (900 - 100) / 100 per second
    assert buckets.try_admit(900, 10, now=8.0) is None


# -- caching --------------------------------------------------------------------------------

def test_second_request_reads_the_cached_system_prompt(sim: SimulatorServer) -> None:
    client = client_for(sim)
    system = [{"type": "text", "text": " ".join(f"rule{i}." for i in range(700)),
               "cache_control": {"type": "ephemeral"}}]
    first = ask(client, "First question", system=system)
    second = ask(client, "Second question", system=system)
    created = first.usage.cache_creation_input_tokens
    assert created >= 1024 and first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == created
    assert second.usage.cache_creation_input_tokens == 0
    total = count_tokens({"model": MODEL, "system": system,
                          "messages": [{"role": "user", "content": "Second question"}]})
    assert second.usage.input_tokens == total - created
    # Another API key has its own cache.
    other = ask(client_for(sim, api_key="sk-other"), "Third question", system=system)
    assert other.usage.cache_creation_input_tokens == created
    stats = sim.stats()
    assert stats["cache_read_input_tokens"] == created
    assert stats["cache_creation_input_tokens"] == 2 * created


def test_short_prefix_is_not_cached(sim: SimulatorServer) -> None:
    system = [{"type": "text", "text": "Short.", "cache_control": {"type": "ephemeral"}}]
    client = client_for(sim)
    for _ in range(2):
        usage = ask(client, "Q", system=system).usage
        assert usage.cache_creation_input_tokens == 0 == usage.cache_read_input_tokens


def test_cache_reads_count_toward_itpm_only_when_configured(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    system = [{"type": "text", "text": " ".join(f"rule{i}." for i in range(700)),
               "cache_control": {"type": "ephemeral"}}]
    for reads_count, expected_extra in ((False, 0), (True, 1)):
        sim = sim_factory(cache_reads_count=reads_count)
        client = client_for(sim)
        first = ask(client, "A", system=system).usage
        second = ask(client, "B", system=system).usage
        counted = sim.stats()["max_60s"]["input_tokens"]
        expected = (first.input_tokens + first.cache_creation_input_tokens
                    + second.input_tokens + expected_extra * second.cache_read_input_tokens)
        assert counted == expected


# -- determinism and stats ------------------------------------------------------------------

def test_same_seed_and_body_give_the_same_content_on_two_servers(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    replies = []
    for seed in (7, 7, 8):
        client = client_for(sim_factory(seed=seed))
        text = ask(client, "Assess supply chain risk").content[0].text
        tools = ask(client, "Assess supply chain risk", tools=TOOLS).content
        replies.append((text, [b.model_dump() for b in tools]))
    assert replies[0] == replies[1]
    assert replies[0] != replies[2]


def test_stats_count_duplicates_and_the_busiest_minute(sim: SimulatorServer) -> None:
    client = client_for(sim)
    replies = [ask(client, "Alpha"), ask(client, "Beta"),
               ask(client, "Alpha")]  # the same turn again: a repeated LLM call
    stats = sim.stats()
    assert stats["accepted"] == 3 and stats["duplicate_accepted"] == 1
    assert stats["max_60s"]["requests"] == 3
    assert stats["max_60s"]["output_tokens"] == stats["output_tokens"]
    assert stats["input_tokens"] == sum(r.usage.input_tokens for r in replies)
    assert stats["output_tokens"] == sum(r.usage.output_tokens for r in replies)
    assert stats["by_status"] == {"200": 3}
    assert stats["max_in_flight"] >= 1
    assert sum(row["requests"] for row in stats["timeline"]) == 3
    assert stats["first_accept_ts"] <= stats["last_done_ts"]
    sim.reset()
    assert sim.stats()["accepted"] == 0


def test_unknown_path_answers_in_the_error_shape(sim: SimulatorServer) -> None:
    status, headers, body = raw_post(sim, "/v1/nothing", b"{}")
    assert status == 404 and body["error"]["type"] == "not_found_error"
    assert headers["request-id"] == body["request_id"]


def test_control_endpoints_over_http(sim: SimulatorServer) -> None:
    status, _, config = raw_post(sim, "/_sim/config", json.dumps({"rpm": 120, "seed": 3}).encode())
    assert status == 200 and config["rpm"] == 120 and config["seed"] == 3
    status, _, error = raw_post(sim, "/_sim/config", json.dumps({"no_such": 1}).encode())
    assert status == 400 and "no_such" in error["error"]["message"]
    ask(client_for(sim), "Hello")
    with urllib.request.urlopen(sim.url + "/_sim/stats") as response:
        assert json.loads(response.read())["limits"]["rpm"] == 120
    status, _, _ = raw_post(sim, "/_sim/reset", b"")
    assert status == 200 and sim.stats()["accepted"] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 300), st.integers(0, 50)), max_size=40))
def test_sliding_window_max_matches_brute_force(events: list[tuple[float, int]]) -> None:
    events.sort()
    window = SlidingMax()
    for ts, amount in events:
        window.add(ts, amount)
    brute = max((sum(a for t, a in events if end - WINDOW_S < t <= end) for end, _ in events),
                default=0)
    assert window.max == brute


def test_lognormal_latency_parameters_hit_mean_and_p95() -> None:
    import math
    mu, sigma = lognormal_params(1.0, 2.5)
    assert math.isclose(math.exp(mu + sigma ** 2 / 2), 1.0, rel_tol=1e-9)
    assert math.isclose(math.exp(mu + 1.6448536269514722 * sigma), 2.5, rel_tol=1e-9)


def test_a_request_is_judged_when_it_arrived_not_when_a_starved_loop_reads_it(sim):
    """Two requests one after the other against a bucket of one request that refills in 2 s:
    the second must draw a 429, also when the simulator's event loop is blocked for 3 s as it
    arrives (a loaded host). Judged when the loop got to it, the bucket would have refilled
    and it would pass: a burst the sender never made, or, here, room it never had."""
    import threading
    import time

    sim.configure(rpm=30, burst_s=2)  # capacity 1 request, one more every 2 s
    client = client_for(sim)
    ask(client, "first")
    blocked = threading.Event()

    def starve() -> None:  # what a CPU-starved loop does: nothing, for a while
        blocked.set()
        time.sleep(3.0)

    sim._loop.call_soon_threadsafe(starve)
    assert blocked.wait(10)
    with pytest.raises(anthropic.RateLimitError):
        ask(client, "second")
    stats = sim.stats()
    assert (stats["accepted"], stats["rejected_429"]) == (1, 1)


# -- streaming and generation physics -------------------------------------------------------

THINKING = {"type": "enabled", "budget_tokens": 2048}


def _streamed(client: anthropic.Anthropic, **kwargs: Any
              ) -> tuple[list[str], anthropic.types.Message, float, float]:
    """The event types of one ``messages.stream``, its final message, and (monotonic) when
    the first content delta and the end arrived, counted from the call."""
    import time
    kinds: list[str] = []
    start = time.monotonic()
    first = 0.0
    with client.messages.stream(**kwargs) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and not first:
                first = time.monotonic() - start
        message = stream.get_final_message()
    return kinds, message, first, time.monotonic() - start


def test_the_sdks_stream_parses_text_tool_use_and_thinking_events(sim: SimulatorServer) -> None:
    client = client_for(sim)
    kinds, text, _, _ = _streamed(client, model=MODEL, max_tokens=400,
                                  messages=[{"role": "user", "content": "Summarise risk"}])
    assert kinds[0] == "message_start" and "message_stop" in kinds
    assert {"content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "text"} <= set(kinds)
    plain = ask(client, "Summarise risk", max_tokens=400)
    assert text.content[0].text == plain.content[0].text  # the same answer, streamed
    assert text.usage.output_tokens == plain.usage.output_tokens == count_text(
        text.content[0].text)

    kinds, turn, _, _ = _streamed(client, model=MODEL, max_tokens=4000, tools=TOOLS,
                                  thinking=THINKING,
                                  messages=[{"role": "user", "content": "Research ACME"}])
    assert [b.type for b in turn.content][0] == "thinking" and turn.stop_reason == "tool_use"
    assert {"thinking", "signature", "input_json"} <= set(kinds)
    uses = [b for b in turn.content if b.type == "tool_use"]
    assert uses and all(set(b.input) >= {"query", "max_results"} or "symbol" in b.input
                        for b in uses)
    thinking_tokens = count_text(turn.content[0].thinking)
    assert turn.usage.output_tokens > thinking_tokens  # thinking counts as output
    # The tool turn answered with the thinking block passed back unchanged is accepted ...
    history = [{"role": "user", "content": "Research ACME"},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                 for b in turn.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id,
                                             "content": "ok"} for b in uses]}]
    _, after, _, _ = _streamed(client, model=MODEL, max_tokens=4000, tools=TOOLS,
                               thinking=THINKING, messages=history)
    assert after.content[0].type == "thinking"
    # ... and refused when the thinking block is dropped or altered, as the API does.
    for blocks in ([b for b in history[1]["content"] if b["type"] != "thinking"],
                   [{**history[1]["content"][0], "thinking": "edited"},
                    *history[1]["content"][1:]]):
        with pytest.raises(anthropic.BadRequestError, match="thinking"):
            client.messages.create(model=MODEL, max_tokens=4000, tools=TOOLS,
                                   thinking=THINKING, messages=[history[0], {
                                       "role": "assistant", "content": blocks}, history[2]])
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        ask(client, "x", max_tokens=2000, thinking=THINKING)
    assert sim.stats()["streams"]["begun"] == 3


def test_generation_time_grows_with_the_answer(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    tps, ttft = 4000.0, 0.05
    sim = sim_factory(output_tokens_per_s=tps, ttft_s=ttft)
    client = client_for(sim)
    _, short, short_first, short_s = _streamed(client, model=MODEL, max_tokens=8000, messages=[
        {"role": "user", "content": "brief [[sim:out=100]]"}])
    _, long, long_first, long_s = _streamed(client, model=MODEL, max_tokens=8000, messages=[
        {"role": "user", "content": "report [[sim:out=6000]]"}])
    assert long.usage.output_tokens > 20 * short.usage.output_tokens
    # Lower bounds only (physics, not load): the first token after ttft, the end after the
    # answer's generation time; the long answer takes longer than the short one.
    assert short_first >= ttft and long_first >= ttft
    assert long_s >= ttft + long.usage.output_tokens / tps
    assert long_s > short_s
    # The non-streaming path keeps the same physics.
    import time
    start = time.monotonic()
    plain = ask(client, "report [[sim:out=6000]]", max_tokens=8000)
    assert time.monotonic() - start >= ttft + plain.usage.output_tokens / tps


def test_answers_use_the_chosen_share_of_max_tokens(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(output_share_min=0.6, output_share_max=1.0)
    client = client_for(sim)
    outs = [ask(client, f"report {i}", max_tokens=2000).usage.output_tokens for i in range(8)]
    assert all(1100 <= n <= 2000 for n in outs), outs


@pytest.mark.parametrize("trigger,error", [("cut", anthropic.APIConnectionError),
                                           ("cut_error", anthropic.APIStatusError)])
def test_a_stream_cut_after_n_events_is_billed_what_it_generated_then_recovers(
        sim: SimulatorServer, trigger: str, error: type[Exception]) -> None:
    client = client_for(sim)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4000, "messages": [
        {"role": "user", "content": f"long report [[sim:out=2000]] [[sim:{trigger}=6]]"}]}
    seen: list[str] = []
    with pytest.raises(error) as raised:
        with client.messages.stream(**body) as stream:
            for event in stream:
                seen.append(event.type)
    if trigger == "cut_error":
        assert "overloaded_error" in str(raised.value)
    assert "message_stop" not in seen and "message_delta" not in seen
    cut = sim.stats()
    assert cut["streams"]["cut"] == 1
    assert 0 < cut["billed"]["output_tokens"] < 2000 // 2  # billed what it generated
    _, again, _, _ = _streamed(client, **body)  # the retry of the same body goes through
    after = sim.stats()
    assert (after["streams"]["begun"], after["streams"]["cut"]) == (2, 1)
    assert after["billed"]["output_tokens"] == cut["billed"]["output_tokens"] + \
        again.usage.output_tokens
    assert after["duplicate_accepted"] == 1


def test_a_stream_closed_by_its_client_stops_the_bill(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    import time
    sim = sim_factory(output_tokens_per_s=2000.0)
    client = client_for(sim)
    with client.messages.stream(model=MODEL, max_tokens=8000, messages=[
            {"role": "user", "content": "report [[sim:out=6000]]"}]) as stream:
        for event in stream:
            if event.type == "text":
                break  # the client leaves after its first text
    for _ in range(200):  # the server notices within its 50 ms step
        snap = sim.stats()
        if snap["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert snap["in_flight"] == 0
    assert snap["streams"]["abandoned"] == 1
    assert 0 < snap["billed"]["output_tokens"] < 3000


def test_a_streamed_answer_draws_on_the_output_bucket_as_it_is_generated(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    """The provider counts output as it is generated: while a long answer streams, its
    tokens so far are already out of the output bucket, so a request that arrives then finds
    it in debt (429) rather than full. 60,000 OTPM in 1 s bursts: a bucket of 1,000 tokens,
    refilled at 1,000 a second, against an answer generated at 3,000 a second."""
    sim = sim_factory(otpm=60_000, burst_s=1, output_tokens_per_s=3000.0)
    client = client_for(sim)
    texts = 0
    with client.messages.stream(model=MODEL, max_tokens=8000, messages=[
            {"role": "user", "content": "report [[sim:out=6000]]"}]) as stream:
        for event in stream:
            texts += event.type == "text"
            if texts == 8:  # 8 deltas of 300 tokens: 2,400 generated, at most 800 refilled
                with pytest.raises(anthropic.RateLimitError) as refused:
                    ask(client, "brief", max_tokens=100)
                assert "output tokens" in str(refused.value)
                break
    assert texts == 8
