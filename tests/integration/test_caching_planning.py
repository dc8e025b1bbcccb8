"""Prompt caching, planning, synthesis and the structured records, through the real SDK and
the simulator; and the example of docs/jobs.md, run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
import redis

from drover import JobSpec, plan, submit
from drover.orchestrator.cli.demo import SYSTEM as LONG_SYSTEM
from drover.workers.agent.join import SYNTHESIS_PROMPT, synthesis_request
from drover.workers.agent.planning import fit_plan
from drover.workers.jobs.records import SubagentResult
from drover.workers.limiter import Limiter, llm_scope
from tests.helpers import ROOT, configure

TOOL_MODULES = json.dumps(["drover.workers.tools.demo", "tests.helpers.agent_tools"])


def _limiter(redis_url: str, env: dict[str, str]) -> tuple[Limiter, str]:
    from drover.config import get_settings

    limiter = Limiter(redis.Redis.from_url(redis_url), prefix=env["DROVER_KEY_PREFIX"])
    return limiter, llm_scope(env["DROVER_KEY_ALIAS"], get_settings().model)


@pytest.fixture
def bodies(sim, monkeypatch) -> list[dict[str, Any]]:
    """Every Messages request body the simulator receives during the test."""
    seen: list[dict[str, Any]] = []
    original = sim.engine.begin_message

    def record(headers: Any, raw: bytes, *args: Any, **kwargs: Any) -> Any:
        seen.append(json.loads(raw))
        return original(headers, raw, *args, **kwargs)

    monkeypatch.setattr(sim.engine, "begin_message", record)
    return seen


# --- prompt caching -------------------------------------------------------------------------

@pytest.mark.parametrize("reads_count", [False, True])
def test_the_shared_system_prompt_is_read_from_the_cache_from_the_second_subagent_on(
        sim, worker, monkeypatch, drover_env, redis_url, bodies, reads_count):
    sim.configure(tool_turns=0, cache_reads_count=reads_count)
    configure(monkeypatch, drover_env, cache_reads_count=str(reads_count).lower())
    worker(concurrency=1)  # one after another: the first writes the cache, the rest read it
    result = submit(JobSpec(subtasks=[f"Assess vendor {i}" for i in range(4)],
                            system=LONG_SYSTEM, tools=["lookup_fact"])).wait(timeout=60)

    first, *rest = sorted(result.results, key=lambda r: r.finished_at)
    assert first.usage.cache_creation_input_tokens >= 1024
    assert first.usage.cache_read_input_tokens == 0
    for record in rest:
        assert record.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
        assert record.usage.cache_creation_input_tokens == 0
    stats = sim.stats()
    assert stats["cache_read_input_tokens"] == result.usage.cache_read_input_tokens
    # The system prompt and the last tool definition carry the cache breakpoints.
    assert all(b["system"][-1]["cache_control"] == {"type": "ephemeral"} for b in bodies)
    assert all(b["tools"][-1]["cache_control"] == {"type": "ephemeral"} for b in bodies)
    # The limiter counted input as the provider's ITPM does, cache reads per the setting.
    limiter, scope = _limiter(redis_url, drover_env)
    counted = sum(row["input_tokens"] for row in limiter.usage(scope, 600))
    u = result.usage
    expected = u.input_tokens + u.cache_creation_input_tokens
    expected += u.cache_read_input_tokens if reads_count else 0
    assert counted == expected == sum(row["input_tokens"] for row in stats["timeline"])


# --- planning -------------------------------------------------------------------------------

def test_plan_keeps_to_max_subtasks_when_the_model_proposes_more(sim, drover_env):
    sim.configure(plan_items=10)
    subtasks = plan("Map the European freight market", max_subtasks=3)

    assert len(subtasks) == 3
    merged = " ".join(subtasks)
    proposed = [f"sample-{i}" for i in range(1, 11)]  # what the simulator's plan contains
    assert all(re.search(rf"\b{item}\b", merged) for item in proposed)  # merged, not dropped
    assert sim.stats()["accepted"] == 1


def test_a_job_with_a_goal_plans_first_and_fans_out_to_at_most_max_subtasks(sim, worker):
    sim.configure(plan_items=9, tool_turns=0)
    worker(concurrency=4)
    handle = submit(JobSpec(goal="Assess last-mile delivery options", max_subtasks=4))
    result = handle.wait(timeout=60)

    assert result.counts["ok"] == 4 and len(result.results) == 4
    assert len(handle.store.specs.subtasks(handle.id)) == 4
    assert sim.stats()["accepted"] == 1 + 4


def test_the_fanout_cap_applies_to_plans_whatever_the_spec_asks(sim, worker, monkeypatch,
                                                                 drover_env):
    configure(monkeypatch, drover_env, max_fanout=2)
    sim.configure(plan_items=7, tool_turns=0)
    worker(concurrency=2)
    result = submit(JobSpec(goal="Assess depots", max_subtasks=6)).wait(timeout=60)
    assert len(result.results) == 2


def test_a_plan_with_no_usable_subtasks_fails_the_job_and_says_why(sim, worker):
    sim.configure(plan_items=0)
    worker(concurrency=1)
    result = submit(JobSpec(goal="Do nothing at all")).wait(timeout=60)
    assert result.status == "failed" and "no usable subtasks" in result.reason
    assert result.results == []


def test_fit_plan_drops_empty_and_duplicate_items_and_merges_the_smallest_neighbours():
    plan_ = fit_plan(["Costs", "", "costs", "Vendors A", "B", "Risks of building"], 3)
    assert plan_ == ["Costs", "Vendors A; B", "Risks of building"]
    assert fit_plan(["a", "b"], 5) == ["a", "b"]


# --- synthesis and the records --------------------------------------------------------------

def test_synthesis_names_the_failed_subagent_to_the_synthesiser(sim, worker, monkeypatch,
                                                                drover_env, redis_url, bodies):
    configure(monkeypatch, drover_env, tool_modules=TOOL_MODULES, max_attempts=2)
    sim.configure(tool_turns=1, tools_per_turn=1)
    worker(concurrency=1)
    # The first tool answer in this test carries a 500 trigger: that sub-agent fails.
    handle = submit(JobSpec(subtasks=[f"Review contract {i}" for i in range(4)],
                            tools=["probe_poison"], synthesize=True))
    result = handle.wait(timeout=60)

    failed = result.by_status("failed")
    assert len(failed) == 1 and result.counts["ok"] == 3
    assert result.synthesis and not result.synthesis.startswith("(synthesis failed")
    requests = [b for b in bodies if b.get("system") == SYNTHESIS_PROMPT]
    assert len(requests) == 1
    prompt = requests[0]["messages"][0]["content"]
    bad = failed[0]
    assert f"## Sub-agent {bad.index} (FAILED, no findings): Review contract {bad.index}" in prompt
    assert f"Reason: {bad.error}" in prompt
    for record in result.by_status("ok"):
        assert f"## Sub-agent {record.index} (ok)" in prompt and record.summary in prompt
    # The synthesis went through the limiter like every other call.
    limiter, scope = _limiter(redis_url, drover_env)
    stats = sim.stats()
    assert sum(r["requests"] for r in limiter.usage(scope, 600)) == (
        stats["accepted"] + stats["errors_5xx"])


def test_a_job_that_thinks_thinks_in_its_synthesis_too(sim, worker, bodies):
    """JobSpec.thinking reaches the synthesis call as the API's thinking parameter; the
    synthesis is its text, without the thinking block the answer starts with."""
    sim.configure(tool_turns=0)
    worker(concurrency=2)
    result = submit(JobSpec(subtasks=["Review contract 0", "Review contract 1"],
                            max_tokens=4000, thinking=2000, synthesize=True)).wait(timeout=60)
    assert result.counts["ok"] == 2
    requests = [b for b in bodies if b.get("system") == SYNTHESIS_PROMPT]
    assert len(requests) == 1
    assert requests[0]["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    assert all(b.get("thinking") for b in bodies)  # the sub-agents' turns think as well
    assert result.synthesis and not result.synthesis.startswith("(synthesis failed")


def test_synthesis_request_marks_cancelled_and_failed_subagents_explicitly():
    spec = JobSpec(goal="Compare routing vendors", synthesize=True)
    records = [
        SubagentResult(job_id="j", index=0, status="ok", summary="Vendor A costs 40k."),
        SubagentResult(job_id="j", index=1, status="cancelled", error="deadline"),
        SubagentResult(job_id="j", index=2, status="failed", error="529 overloaded"),
        SubagentResult(job_id="j", index=3, status="budget_exceeded", summary="partial",
                       error="turn cap of 2 reached"),
    ]
    request = synthesis_request(spec, "m", records, ["vendor A", "vendor B", "vendor C", "D"])
    text = request["messages"][0]["content"]
    assert request["system"] == SYNTHESIS_PROMPT
    assert "Job goal: Compare routing vendors" in text
    assert "## Sub-agent 0 (ok): vendor A\nVendor A costs 40k." in text
    assert "## Sub-agent 1 (CANCELLED, no findings): vendor B\nReason: deadline" in text
    assert "## Sub-agent 2 (FAILED, no findings): vendor C\nReason: 529 overloaded" in text
    assert "Sub-agent 3 (BUDGET_EXCEEDED" in text


def test_subagents_leave_a_structured_record_and_a_retrievable_transcript(sim, worker):
    sim.configure(tool_turns=1, tools_per_turn=2)
    worker(concurrency=1)
    handle = submit(JobSpec(subtasks=["Work out the fleet's fuel bill"], tools=["calculator"]))
    result = handle.wait(timeout=60)

    record = result.results[0]
    report = handle.report(0)
    assert record.status == "ok" and record.summary == report.findings[:400]
    assert report.tried == ["calculator(expression='sample-1')",
                            "calculator(expression='sample-2')"]
    assert len(report.failed) == 2 and all(
        line.startswith("calculator: tool calculator raised ValueError: cannot evaluate")
        for line in report.failed)
    roles = [m["role"] for m in handle.transcript(0)]
    assert roles == ["user", "assistant", "user", "assistant"]
    # What the join receives is the compact record, never the conversation.
    assert "messages" not in record.model_dump() and len(record.model_dump_json()) < 1500


# --- the example of docs/jobs.md --------------------------------------------------------------

def _readme_files() -> dict[str, str]:
    text = (ROOT / "docs" / "jobs.md").read_text()
    section = text.split("## Write your own tools and jobs", 1)[1].split("\n## ", 1)[0]
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        name = re.match(r"# (\w+\.py)", block)
        assert name, "each Python block of the section starts with '# FILE.py'"
        files[name.group(1)] = block
    return files


def test_the_readme_example_runs_as_written(sim, spawn_worker, drover_env, tmp_path):
    files = _readme_files()
    assert set(files) == {"my_tools.py", "run_job.py"}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    sim.configure(plan_items=7, tool_turns=1, tools_per_turn=2)
    env = {**os.environ, **drover_env,
           "DROVER_TOOL_MODULES": json.dumps(["drover.workers.tools.demo", "my_tools"]),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    spawn_worker(concurrency=4, DROVER_TOOL_MODULES=env["DROVER_TOOL_MODULES"],
                 PYTHONPATH=env["PYTHONPATH"])
    run = subprocess.run([sys.executable, "run_job.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)

    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("job ")
    records = [line for line in lines if re.match(r"#\d ok calls=2 ", line)]
    assert len(records) == 5  # planned 7, capped at max_subtasks=5, each streamed once
    counts = next(line for line in lines if line.startswith("{'ok'"))
    assert "'ok': 5" in counts
    cache_reads = next(line for line in lines if line.startswith("cache reads:"))
    assert int(cache_reads.split(":")[1]) >= 0
    assert len(lines) > lines.index(cache_reads) + 1  # the synthesis follows
    assert sim.stats()["accepted"] == 1 + 5 * 2 + 1  # plan, two turns each, synthesis
