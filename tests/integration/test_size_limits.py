"""Bounded sizes: a job spec over DROVER_MAX_SPEC_BYTES is refused before anything is stored
or enqueued; a tool result over DROVER_MAX_TOOL_RESULT_CHARS is cut with a marker the model
sees (in the next request, so in the checkpoint), and the log says so once."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import redis

from drover import JobSpec, submit
from drover.config import get_settings
from drover.orchestrator.client.jobs import check_spec, spec_bytes
from drover.workers.tools import get_tools, run_turn
from tests.helpers import configure

TOOL_MODULES = json.dumps(["drover.workers.tools.demo", "tests.helpers.agent_tools"])


def test_a_spec_over_the_cap_is_refused_before_anything_is_stored_or_enqueued(
        monkeypatch, drover_env, redis_url):
    configure(monkeypatch, drover_env, max_spec_bytes=50_000)
    spec = JobSpec(subtasks=[f"{i}: " + "a" * 999 for i in range(60)])  # about 60 kB
    size = spec_bytes(spec)
    assert 60_000 < size < 62_000
    with pytest.raises(ValueError) as refused:
        submit(spec)
    message = str(refused.value)
    assert f"{size:,} bytes" in message and "DROVER_MAX_SPEC_BYTES" in message
    assert "50,000" in message
    client = redis.Redis.from_url(redis_url)
    prefix, queue = drover_env["DROVER_KEY_PREFIX"], drover_env["DROVER_QUEUE"]
    try:
        # No job of this test's queue in Redis, no task on its broker queue.
        queues = [client.hget(f"{prefix}:job:{j.decode()}:meta", "queue")
                  for j in client.zrange(f"{prefix}:jobs", 0, -1)]
        assert queue.encode() not in queues
        assert client.llen(f"{prefix}:celery:{queue}") == 0
    finally:
        client.close()
    # Under the cap the same spec goes through.
    configure(monkeypatch, drover_env, max_spec_bytes=size)
    check_spec(spec, get_settings())


def test_a_long_tool_result_is_cut_with_a_marker_and_logged_once(caplog):
    from drover.workers.tools import _tools as tools_mod
    tools_mod._CUT_LOGGED.discard("probe_huge")
    import tests.helpers.agent_tools  # noqa: F401  (registers probe_huge)

    async def save(_id: str, _result: dict) -> None:
        return None

    calls = [{"id": f"c{i}", "name": "probe_huge", "input": {"item": "a"}} for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="drover.workers.tools"):
        results = asyncio.run(run_turn(calls, {t.name: t for t in get_tools(["probe_huge"])},
                                       done={}, max_parallel=4, max_calls=32,
                                       default_timeout=5, save=save, max_result_chars=1_000))
    for result in results:
        assert len(result["content"]) == 1_000 and not result["is_error"]
        assert "cut to 1,000 of 200,000 characters" in result["content"]
        assert "DROVER_MAX_TOOL_RESULT_CHARS" in result["content"]
    cuts = [r for r in caplog.records if "DROVER_MAX_TOOL_RESULT_CHARS" in r.getMessage()]
    assert len(cuts) == 1 and "probe_huge returned 200000 characters" in cuts[0].getMessage()


def test_the_model_gets_the_cut_result_through_the_whole_stack(sim, worker, monkeypatch,
                                                               drover_env):
    configure(monkeypatch, drover_env, tool_modules=TOOL_MODULES, max_tool_result_chars=2_000)
    sim.configure(tool_turns=1, tools_per_turn=1)
    worker(concurrency=2)
    handle = submit(JobSpec(subtasks=["Read the long page"], tools=["probe_huge"]))
    result = handle.wait(timeout=60)
    assert result.counts["ok"] == 1, result
    answers = [block for message in handle.transcript(0) if message["role"] == "user"
               and isinstance(message["content"], list) for block in message["content"]
               if block.get("type") == "tool_result"]
    assert answers and all(len(b["content"]) == 2_000 and "cut to 2,000 of 200,000"
                           in b["content"] for b in answers)
    # The request that carried it was billed as what it held: far below 200,000 characters.
    assert result.usage.input_tokens < 20_000
