"""Tools: registration, and one turn's many tool calls run bounded, in order, and answered.

The tools in ``tests/helpers/agent_tools.py`` measure themselves in Redis (how many run at once, the
order of writes); the turns come from the simulator through the real SDK.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from drover import JobSpec, submit
from drover._signals import ClaimLost
from drover.workers.limiter import Limiter, tool_scope
from drover.workers.tools import REGISTRY, get_tools, run_turn, tool
from tests.helpers import agent_tools, configure

TOOL_MODULES = json.dumps(["drover.workers.tools.demo", "tests.helpers.agent_tools"])


@pytest.fixture
def probes(monkeypatch, drover_env, redis_url):
    """The test tools loaded, and a reader of what they recorded during this test."""
    configure(monkeypatch, drover_env, tool_modules=TOOL_MODULES)
    from drover.config import get_settings

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = agent_tools.probe_key(get_settings())

    def log() -> list[dict[str, Any]]:
        return [json.loads(x) for x in client.lrange(f"{key}:log", 0, -1)]

    yield log
    client.delete(f"{key}:log", f"{key}:running", f"{key}:writing")
    client.close()


def _turn(handle, index: int = 0) -> tuple[list[dict], list[dict]]:
    """The first assistant turn's tool_use blocks and the user message answering them."""
    transcript = handle.transcript(index)
    for position, message in enumerate(transcript):
        if message["role"] == "assistant":
            uses = [b for b in message["content"] if b["type"] == "tool_use"]
            if uses:
                return uses, transcript[position + 1]["content"]
    raise AssertionError("no tool turn in the transcript")


# --- registration ---------------------------------------------------------------------------

class Order(BaseModel):
    sku: str
    quantity: int = 1


def test_schema_comes_from_type_hints_and_the_docstring():
    @tool(name="t_hints", kind="read", timeout_s=3)
    def forecast(city: str, days: int = 3, metric: bool | None = None) -> str:
        """Weather forecast for a city."""
        return city

    registered = REGISTRY["t_hints"]
    assert registered.description == "Weather forecast for a city."
    assert registered.kind == "read" and registered.timeout_s == 3
    schema = registered.input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["city"]
    assert schema["properties"]["city"] == {"type": "string"}
    assert schema["properties"]["days"] == {"type": "integer", "default": 3}
    assert registered.definition() == {"name": "t_hints", "description": registered.description,
                                       "input_schema": schema}


def test_schema_of_a_pydantic_parameter_is_the_models_and_the_tool_gets_the_model():
    quote = REGISTRY["probe_quote"]
    assert quote.input_schema["required"] == ["symbol"]
    assert quote.input_schema["properties"]["days"]["maximum"] == 365
    seen: list[object] = []

    @tool(name="t_model", kind="write")
    def place(order: Order) -> str:
        """Place an order."""
        seen.append(order)
        return "placed"

    assert REGISTRY["t_model"].input_schema == {
        "type": "object", "required": ["sku"],
        "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer", "default": 1}}}
    results = _run([{"id": "a", "name": "t_model", "input": {"sku": "X1", "quantity": "2"}},
                    {"id": "b", "name": "t_model", "input": {"quantity": 2}}],
                   get_tools(["t_model"]))
    assert results[0] == {"type": "tool_result", "tool_use_id": "a", "content": "placed",
                          "is_error": False}
    assert seen == [Order(sku="X1", quantity=2)]
    assert results[1]["is_error"] and "bad input" in results[1]["content"]
    assert "sku" in results[1]["content"]  # says what was wrong


def test_tool_registration_refuses_a_bad_kind_and_a_missing_description():
    with pytest.raises(ValueError, match="read.*write"):
        tool(kind="delete")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="description"):
        @tool(name="t_nodoc")
        def nodoc(x: str) -> str:
            return x


def test_failures_and_unknown_tools_become_error_results_that_say_why():
    @tool(name="t_boom")
    def boom(x: str) -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    results = _run([{"id": "1", "name": "t_boom", "input": {"x": "a"}},
                    {"id": "2", "name": "nope", "input": {}}], get_tools(["t_boom"]))
    assert [r["tool_use_id"] for r in results] == ["1", "2"]
    assert results[0]["is_error"] and "RuntimeError: disk on fire" in results[0]["content"]
    assert results[1]["is_error"] and "unknown tool 'nope'" in results[1]["content"]
    assert "t_boom" in results[1]["content"]  # names the tools it may use


@pytest.mark.parametrize("error", [ClaimLost("j/3: claim 7 was superseded"),
                                   redis.ConnectionError("Redis went away")])
def test_a_save_that_fails_ends_the_turn_with_that_error_itself_not_a_group(error):
    """The sub-agent stops on a superseded claim and retries on Redis away by the error's
    type; one wrapped in the turn's task group read as a crash (a traceback, a failed record)."""
    @tool(name="t_echo_save")
    def echo(x: str) -> str:
        """Echoes."""
        return x

    async def save(_id: str, _result: dict) -> None:
        raise error

    calls = [{"id": str(i), "name": "t_echo_save", "input": {"x": "a"}} for i in range(3)]
    with pytest.raises(type(error)) as raised:
        asyncio.run(run_turn(calls, {t.name: t for t in get_tools(["t_echo_save"])}, done={},
                             max_parallel=4, max_calls=32, default_timeout=5, save=save))
    assert raised.value is error


def _run(calls: list[dict], tools: list) -> list[dict]:
    async def save(_id: str, _result: dict) -> None:
        return None

    return asyncio.run(run_turn(calls, {t.name: t for t in tools}, done={}, max_parallel=4,
                                max_calls=32, default_timeout=5, save=save))


# --- one turn, many calls, through the whole stack ------------------------------------------

def test_twelve_tool_calls_with_a_cap_of_four_never_run_more_than_four_and_answer_in_order(
        sim, worker, probes):
    sim.configure(tool_turns=1, tools_per_turn=12)
    worker(concurrency=2)
    handle = submit(JobSpec(subtasks=["Survey twelve suppliers"], tools=["probe_read"],
                            max_parallel_tools=4))
    result = handle.wait(timeout=90)

    assert result.counts["ok"] == 1
    runs = [e for e in probes() if e["tool"] == "probe_read"]
    assert len(runs) == 12
    assert max(e["running"] for e in runs) == 4  # the bound held, and was used
    uses, answers = _turn(handle)
    assert len(uses) == 12
    assert [a["tool_use_id"] for a in answers] == [u["id"] for u in uses]
    assert all(a["type"] == "tool_result" and not a["is_error"] for a in answers)
    assert [a["content"] for a in answers] == [f"read {u['input']['item']}" for u in uses]
    assert sim.stats()["errors_4xx"] == 0


def test_write_tools_never_overlap_and_run_in_the_models_order(sim, worker, probes):
    sim.configure(tool_turns=1, tools_per_turn=12)
    worker(concurrency=2)
    handle = submit(JobSpec(subtasks=["Record twelve supplier quotes"],
                            tools=["probe_read", "probe_write"], max_parallel_tools=6))
    result = handle.wait(timeout=90)

    assert result.counts["ok"] == 1
    uses, answers = _turn(handle)
    write_ids = [u["id"] for u in uses if u["name"] == "probe_write"]
    assert len(write_ids) == 6  # the simulator alternates the two tools
    writes = [e for e in probes() if e["tool"] == "probe_write"]
    assert max(e["writing"] for e in writes) == 1
    assert [e["id"] for e in writes] == write_ids  # idempotency key = tool_use id
    reads = [e for e in probes() if e["tool"] == "probe_read"]
    assert max(e["running"] for e in reads + writes) > 1  # reads ran alongside
    assert [a["tool_use_id"] for a in answers] == [u["id"] for u in uses]


@pytest.mark.parametrize("hung_tool", ["probe_hang", "probe_hang_sync"])
def test_a_hung_tool_times_out_as_an_error_result_and_the_loop_goes_on(sim, worker, probes,
                                                                       hung_tool):
    agent_tools.RELEASE_HUNG.clear()
    sim.configure(tool_turns=1, tools_per_turn=3)
    worker(concurrency=2)
    try:
        handle = submit(JobSpec(subtasks=["Ask the slow service"],
                                tools=[hung_tool, "lookup_fact"]))
        result = handle.wait(timeout=60)
    finally:
        agent_tools.RELEASE_HUNG.set()

    record = result.results[0]
    assert record.status == "ok" and record.turns == 2  # the model got its answers, went on
    assert sim.stats()["accepted"] == 2
    uses, answers = _turn(handle)
    by_id = {a["tool_use_id"]: a for a in answers}
    hung = [by_id[u["id"]] for u in uses if u["name"] == hung_tool]
    assert hung and all(a["is_error"] and "timed out after 0.5 s" in a["content"] for a in hung)
    fine = [by_id[u["id"]] for u in uses if u["name"] == "lookup_fact"]
    assert fine and not any(a["is_error"] for a in fine)
    assert any(hung_tool in line for line in handle.report(0).failed)


def test_calls_beyond_the_per_turn_cap_get_error_results_and_do_not_run(sim, worker, probes,
                                                                       monkeypatch, drover_env):
    configure(monkeypatch, drover_env, max_tool_calls_per_turn=5)
    sim.configure(tool_turns=1, tools_per_turn=12)
    worker(concurrency=2)
    handle = submit(JobSpec(subtasks=["Survey twelve suppliers"], tools=["probe_read"]))
    result = handle.wait(timeout=60)

    assert result.counts["ok"] == 1
    assert len([e for e in probes() if e["tool"] == "probe_read"]) == 5
    uses, answers = _turn(handle)
    assert [a["tool_use_id"] for a in answers] == [u["id"] for u in uses]  # one answer each
    assert [a["is_error"] for a in answers] == [False] * 5 + [True] * 7
    assert all("more than 5 tool calls in one turn" in a["content"] for a in answers[5:])
    assert sim.stats()["errors_4xx"] == 0


def test_a_tool_with_a_rate_limit_goes_through_its_global_limiter_scope(sim, worker, probes,
                                                                       redis_url, drover_env):
    # (the conftest module's constants are another copy when imported by name: take the env)
    limiter = Limiter(redis.Redis.from_url(redis_url), prefix=drover_env["DROVER_KEY_PREFIX"])
    scope = tool_scope("probe_rps")

    def counted(name: str) -> int:
        return sum(row[name] for row in limiter.usage(scope, 600))

    before = counted("requests"), counted("waits")
    sim.configure(tool_turns=1, tools_per_turn=6)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=["Poll the rate-limited service"],
                            tools=["probe_rps"])).wait(timeout=60)

    assert result.counts["ok"] == 1
    assert len([e for e in probes() if e["tool"] == "probe_rps"]) == 6
    assert counted("requests") - before[0] == 6
    # 4 per second with a 1 s burst: six calls at once cannot all go at once.
    assert counted("waits") - before[1] >= 2
    assert limiter.state(scope)["requests"]["limit_per_min"] == 4 * 60
    assert limiter.state(scope)["leases"] == 0


def test_a_pydantic_tool_is_called_with_its_model_through_the_whole_stack(sim, worker, probes):
    sim.configure(tool_turns=1, tools_per_turn=2)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=["Check ACME"], tools=["probe_quote"])).wait(timeout=60)

    assert result.counts["ok"] == 1
    calls = [e for e in probes() if e["tool"] == "probe_quote"]
    assert len(calls) == 2 and all(e["type"] == "Quote" and e["days"] == 5 for e in calls)


def test_drover_tool_rps_limits_a_tool_that_declares_no_rate_and_overrides_one_that_does(
        sim, worker, probes, redis_url, drover_env, monkeypatch):
    configure(monkeypatch, drover_env, tool_rps=json.dumps({"probe_read": 3, "probe_rps": 2}))
    limiter = Limiter(redis.Redis.from_url(redis_url), prefix=drover_env["DROVER_KEY_PREFIX"])
    names = ("probe_read", "probe_rps")

    def counted(name: str) -> int:  # tool scopes are shared by the test session: count deltas
        return sum(row["requests"] for row in limiter.usage(tool_scope(name), 600))

    before = {name: counted(name) for name in names}
    sim.configure(tool_turns=1, tools_per_turn=4)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=["Poll the services"], tools=list(names))).wait(timeout=60)

    assert result.counts["ok"] == 1
    calls = {name: len([e for e in probes() if e["tool"] == name]) for name in names}
    assert sum(calls.values()) == 4 and all(calls.values()), calls
    for name, rps in (("probe_read", 3), ("probe_rps", 2)):
        assert counted(name) - before[name] == calls[name]
        assert limiter.state(tool_scope(name))["requests"]["limit_per_min"] == rps * 60
