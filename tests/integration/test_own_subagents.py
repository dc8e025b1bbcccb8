"""A team's own sub-agents (``@drover.subagent``) run as jobs: real Redis, real Celery
workers, the real SDK over HTTP to the simulator. The functions are in
``tests/helpers/own_subagents.py``, loaded through DROVER_TOOL_MODULES as a team's are.
(A worker killed mid-job: tests/system/test_own_subagents_loss.py.)
"""

from __future__ import annotations

import json
import time

import pytest
import redis
from pydantic import ValidationError

from drover import JobRefused, JobSpec, submit
from tests.helpers import configure, wait_until
from tests.helpers.cli import clean_env, drover
from tests.helpers.openai import on_openai

MODULES = json.dumps(["drover.workers.tools.demo", "tests.helpers.own_subagents"])


@pytest.fixture
def own(monkeypatch, drover_env):
    """The team's module on DROVER_TOOL_MODULES, here and on the workers."""
    configure(monkeypatch, drover_env, tool_modules=MODULES)
    return drover_env


def _jobs(redis_url: str, prefix: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return client.zcard(f"{prefix}:jobs")
    finally:
        client.close()


def test_a_job_of_a_teams_function_ends_ok_with_each_output(own, worker, sim):
    worker(concurrency=8)
    inputs = [{"topic": f"supplier {i}", "checks": 1 + i % 4} for i in range(8)]
    handle = submit(JobSpec(subagent="research", inputs=inputs))
    result = handle.wait(timeout=120)

    assert result.status == "done" and result.counts["ok"] == 8, [
        r.error for r in result.results]
    for record, item in zip(result.results, inputs, strict=True):
        assert record.output["topic"] == item["topic"]
        assert len(record.output["checks"]) == item["checks"]  # parsed each answer
        assert all(words > 0 for words in record.output["checks"])
        assert handle.record(record.index).output == record.output
        assert record.usage.calls == item["checks"] + 2  # each call counted in its record
    # Every call the functions made reached the simulator, each body once, and the job's
    # usage is what the simulator billed.
    calls = sum(item["checks"] + 2 for item in inputs)
    stats = sim.stats()
    assert stats["accepted"] == calls and stats["duplicate_accepted"] == 0
    assert result.usage.calls == calls
    assert result.usage.input_tokens + result.usage.cache_creation_input_tokens == stats[
        "billed"]["input_tokens"]
    assert result.usage.output_tokens == stats["billed"]["output_tokens"]


def test_a_function_that_gathers_its_own_calls_has_each_counted_once(own, worker, sim):
    worker(concurrency=4)
    inputs = [{"topic": f"lane {i}", "n": 3 + i} for i in range(4)]
    result = submit(JobSpec(subagent="side_by_side", inputs=inputs)).wait(timeout=120)

    assert result.counts["ok"] == 4, [r.error for r in result.results]
    assert [len(r.output["angles"]) for r in result.results] == [3, 4, 5, 6]
    assert [r.usage.calls for r in result.results] == [4, 5, 6, 7]
    assert result.usage.calls == sim.stats()["accepted"] == 22


def test_a_functions_budgets_hold_as_the_loops_do(own, worker, sim):
    """max_turns caps a function's calls, subagent_token_budget its tokens and token_budget
    the job's: the call past one is not sent and the sub-agent ends budget_exceeded with
    what it had spent, as drover's own loop does."""
    worker(concurrency=4)
    inputs = [{"topic": f"dock {i}", "checks": 4} for i in range(3)]  # 6 calls each
    turns = submit(JobSpec(subagent="research", inputs=inputs, max_turns=2)).wait(timeout=120)
    assert [r.status for r in turns.results] == ["budget_exceeded"] * 3, turns.results
    assert all("turn cap of 2 reached" in (r.error or "") for r in turns.results)
    assert [(r.usage.calls, r.turns) for r in turns.results] == [(2, 2)] * 3
    assert sim.stats()["accepted"] == 6  # the third call of each was never sent

    tokens = submit(JobSpec(subagent="research", inputs=inputs[:1],
                            subagent_token_budget=1)).wait(timeout=120)
    assert tokens.results[0].status == "budget_exceeded", tokens.results
    assert "sub-agent token budget of 1 spent" in (tokens.results[0].error or "")
    assert tokens.results[0].usage.calls == 1

    job = submit(JobSpec(subagent="research", inputs=inputs, token_budget=1)).wait(timeout=120)
    assert {r.status for r in job.results} == {"budget_exceeded"}, job.results
    # The calls in flight when the budget went were paid for; none was sent after it.
    assert job.usage.calls <= len(inputs) and sim.stats()["accepted"] == 6 + 1 + job.usage.calls


def test_an_exception_fails_that_sub_agent_only(own, worker):
    worker(concurrency=4)
    inputs = [{"topic": "a"}, {"topic": "b", "fail": "raise"}, {"topic": "c"},
              {"topic": "d", "fail": "not_json"}]
    result = submit(JobSpec(subagent="fragile", inputs=inputs)).wait(timeout=120)

    assert [r.status for r in result.results] == ["ok", "failed", "ok", "failed"]
    raised, not_json = result.results[1], result.results[3]
    assert raised.error == "KeyError: 'no source for b'" and raised.error_type == "exception"
    assert raised.output is None
    assert "returned a set, which is not JSON" in not_json.error
    assert not_json.error_type == "output_not_json"
    assert result.results[0].output == {"topic": "a"}


def test_a_cancel_stops_the_running_functions_and_the_rest(own, worker, sim):
    sim.configure(latency_mean_s=0.3, latency_p95_s=0.5)
    worker(concurrency=4)
    inputs = [{"topic": f"slow {i}", "checks": 6, "pause_s": 0.5} for i in range(12)]
    handle = submit(JobSpec(subagent="research", inputs=inputs))
    wait_until("calls under way", lambda: sim.stats()["accepted"] >= 4, 60)
    assert handle.cancel("enough")
    result = handle.wait(timeout=60)

    assert result.status == "cancelled"
    assert result.counts["cancelled"] == 12, [r.status for r in result.results]
    assert all(r.error == "enough" for r in result.results)
    sent = sim.stats()["accepted"]
    time.sleep(1.5)
    assert sim.stats()["accepted"] == sent  # nothing more goes out after the cancel


@pytest.mark.parametrize("how", ["stream", "create", "wait"])
def test_a_cancel_mid_stream_closes_the_functions_stream_and_counts_what_it_streamed(
        own, worker, sim, how):
    """The job's cancel reaches a function's call while its answer streams: the stream is
    closed at the provider then (not left to run to its end), the sub-agent ends cancelled,
    and its usage counts what had streamed, unanswered. ``create``: the function reads
    ``messages.create(stream=True)``, which it never closes itself; ``wait``: it reads it in
    a task of its own that it waits for (``asyncio.wait``), which the function's cancel
    does not cancel."""
    # 8,000 tokens at 500 a second: 16 s, cancelled once it is under way.
    sim.configure(output_tokens_per_s=500.0, tool_turns=0)
    worker(concurrency=2)
    handle = submit(JobSpec(subagent="long_answer",
                            inputs=[{"topic": "the book", "out": 8000, "how": how}]))
    wait_until("the stream to be generating",
               lambda: sim.stats()["streams"]["tokens_sent"] >= 500, timeout=60)
    assert handle.cancel("enough")
    result = handle.wait(timeout=60)
    # Closed by the cancel, not by its end: the answer had 8,000 tokens to go at 500 a second.
    wait_until("the stream closed", lambda: sim.stats()["in_flight"] == 0, timeout=10)
    stats = sim.stats()
    record = result.results[0]
    assert (record.status, record.error) == ("cancelled", "enough"), record
    assert handle.generating() == 0
    assert (stats["accepted"], stats["streams"]["begun"], stats["streams"]["abandoned"]) == (
        1, 1, 1)
    billed = stats["billed"]["output_tokens"]
    assert 0 < billed < 8000
    assert (record.usage.calls, record.usage.unanswered_calls) == (0, 1)
    assert 0 < record.usage.unanswered_output_tokens <= billed + 50
    assert record.usage.input_tokens + record.usage.unanswered_input_tokens > 0


def test_a_deadline_ends_the_functions_still_running(own, worker, sim):
    worker(concurrency=4)
    inputs = [{"topic": f"long {i}", "checks": 3, "pause_s": 30} for i in range(4)]
    handle = submit(JobSpec(subagent="research", inputs=inputs, deadline_s=3))
    result = handle.wait(timeout=60)

    assert result.counts["cancelled"] == 4, [(r.status, r.error) for r in result.results]
    assert all(r.error == "deadline" for r in result.results)


def test_on_openai_the_function_gets_an_openai_client_inside_a_binding_tpm(
        monkeypatch, drover_env, sim_factory, worker):
    # 8 sub-agents of 3-5 calls (about 20 input + 120 max tokens each) at 12,000 TPM in a
    # 10 s bucket: more than the bucket holds, so the calls wait in the fleet's line.
    sim = on_openai(monkeypatch, drover_env, sim_factory, tpm=12000, rpm=600, burst_s=10)
    configure(monkeypatch, drover_env, tool_modules=MODULES, burst_seconds=10)
    worker(concurrency=8)
    inputs = [{"topic": f"route {i}", "checks": 1 + i % 3} for i in range(8)]
    result = submit(JobSpec(subagent="research", inputs=inputs)).wait(timeout=240)

    assert result.counts["ok"] == 8, [r.error for r in result.results]
    assert [len(r.output["checks"]) for r in result.results] == [i["checks"] for i in inputs]
    stats = sim.stats()
    assert stats["rejected_429"] == 0
    assert result.usage.calls == stats["accepted"] == sum(i["checks"] + 2 for i in inputs)


# --- bad input: refused at submit, nothing enqueued -------------------------------------------

def test_an_unknown_name_is_refused_with_the_closest_registered_one(own, redis_url):
    before = _jobs(redis_url, own["DROVER_KEY_PREFIX"])
    with pytest.raises(JobRefused) as refused:
        submit(JobSpec(subagent="reserch", inputs=[1]))
    message = str(refused.value)
    assert "unknown sub-agent 'reserch' (did you mean 'research'?)" in message
    assert ("registered sub-agents: fragile, long_answer, not_async, research, side_by_side, "
            "takes_one." in message)  # the team's only: not drover's own loop
    assert "tests.helpers.own_subagents" in message and "\n" not in message
    assert _jobs(redis_url, own["DROVER_KEY_PREFIX"]) == before


@pytest.mark.parametrize("name, says", [
    ("not_async", "the @subagent function 'not_async' is not `async def`: write it as "
                  "`async def not_async(item, llm)`"),
    ("takes_one", "the @subagent function 'takes_one' takes (item), not (item, "
                  "llm): write it as `async def takes_one(item, llm)`"),
])
def test_a_function_that_cannot_run_as_one_is_refused(own, redis_url, name, says):
    before = _jobs(redis_url, own["DROVER_KEY_PREFIX"])
    with pytest.raises(JobRefused) as refused:
        submit(JobSpec(subagent=name, inputs=[1]))
    assert str(refused.value) == says
    assert _jobs(redis_url, own["DROVER_KEY_PREFIX"]) == before


@pytest.mark.parametrize("fields, says", [
    ({"inputs": [{"when": time}]}, "inputs[0] is not JSON (a module)"),
    ({"inputs": [1, float("inf")]}, "inputs[1] is not JSON (the float inf)"),
    ({"inputs": [{1: "a"}]}, "inputs[0] is not JSON (a dict with a key that is not a string)"),
    ({"inputs": [1], "subtasks": ["a"]}, "give inputs=[...], and no subtasks or goal"),
    ({"inputs": [1], "goal": "plan it"}, "give inputs=[...], and no subtasks or goal"),
    ({"inputs": []}, "needs inputs: a non-empty list of JSON values"),
    ({"inputs": [1], "tools": ["lookup_fact"]}, "tools: only drover's own loop reads it"),
])
def test_a_bad_spec_of_an_own_job_says_what_to_fix(fields, says):
    with pytest.raises(ValidationError) as refused:
        JobSpec(subagent="research", **fields)
    assert says in str(refused.value)
    assert "the float" in says or "{" not in str(refused.value)  # no input value repeated


def test_inputs_without_a_subagent_are_refused():
    with pytest.raises(ValidationError, match="name its @subagent function with subagent="):
        JobSpec(inputs=[1, 2])


# --- the CLI --------------------------------------------------------------------------------

def test_drover_submit_runs_an_own_job_and_refuses_a_bad_one(own, worker, tmp_path, redis_url):
    worker(concurrency=4)
    env = clean_env(**own)
    before = _jobs(redis_url, own["DROVER_KEY_PREFIX"])
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"subagent": "research",
                                "inputs": [{"topic": "x", "checks": 1}, {"topic": "y"}]}))
    proc = drover(["submit", str(spec), "--wait"], env, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    spec.write_text(json.dumps({"subagent": "reserch", "inputs": [1]}))
    proc = drover(["submit", str(spec)], env, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "did you mean 'research'?" in proc.stderr
    spec.write_text(json.dumps({"subagent": "research", "inputs": [1], "subtasks": ["a"]}))
    proc = drover(["submit", str(spec)], env, tmp_path)
    assert proc.returncode == 2 and "no subtasks or goal" in proc.stderr, proc.stderr
    assert _jobs(redis_url, own["DROVER_KEY_PREFIX"]) == before + 1  # the first job only


def test_a_retry_after_the_spend_limit_replays_what_was_answered_and_pays_nothing_twice(
        own, worker, sim, drover_env, tmp_path):
    # A sub-agent stopped half-way by the provider's spend limit is run again from the start
    # by `drover retry`: its answered calls come from its journal, only the rest are sent.
    sim.configure(tool_turns=0, spend_limit_calls=10)
    worker(concurrency=4)
    inputs = [{"topic": f"port {i}", "checks": 3} for i in range(4)]  # 5 calls each
    handle = submit(JobSpec(subagent="research", inputs=inputs))
    first = handle.wait(timeout=120)
    assert first.counts["ok"] < 4 and sim.stats()["accepted"] == 10, first.counts
    sim.configure(spend_limit_calls=None)  # the owner raised the limit
    enabled = drover(["keys", "enable", drover_env["DROVER_KEY_ALIAS"]],
                     clean_env(**drover_env), tmp_path)
    assert enabled.returncode == 0, enabled.stderr
    assert handle.retry()
    result = handle.wait(timeout=120)
    assert result.counts["ok"] == 4, [r.error for r in result.results]
    assert sim.stats()["accepted"] == 20  # the 10 paid for before were replayed, not re-sent
    assert [len(r.output["checks"]) for r in result.results] == [3, 3, 3, 3]
