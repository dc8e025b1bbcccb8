"""The spine: a fan-out job runs end to end on real Redis, a real Celery worker and the real
Anthropic SDK talking HTTP to the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from drover import JobSpec, submit
from tests.helpers import ROOT


def test_forty_subagents_all_ok_and_provider_agrees_with_the_job(sim, worker):
    worker(concurrency=8)
    handle = submit(JobSpec(subtasks=[f"Research topic number {i}" for i in range(40)],
                            system="You are a careful researcher.", max_tokens=300))
    result = handle.wait(timeout=120)

    assert result.status == "done"
    assert [r.index for r in result.results] == list(range(40))
    assert result.counts["ok"] == 40
    stats = sim.stats()
    assert stats["accepted"] == result.usage.calls == 40
    assert stats["input_tokens"] == result.usage.input_tokens
    assert stats["output_tokens"] == result.usage.output_tokens
    assert stats["duplicate_accepted"] == 0
    assert all(r.summary for r in result.results)
    assert handle.progress() == {"ok": 40, "failed": 0, "cancelled": 0, "budget_exceeded": 0,
                                 "total": 40, "pending": 0}


def test_tool_turns_answer_every_tool_use_and_count_each_call(sim, worker):
    sim.configure(tool_turns=2, tools_per_turn=3)
    worker(concurrency=4)
    handle = submit(JobSpec(subtasks=["Look up facts about ports", "Compute freight costs"],
                            tools=["lookup_fact", "calculator"], max_tokens=200))
    result = handle.wait(timeout=60)
    assert result.counts["ok"] == 2
    assert all(r.usage.calls == 3 and r.turns == 3 for r in result.results)
    assert sim.stats()["errors_4xx"] == 0  # every tool_use had its tool_result
    transcript = handle.transcript(0)
    results = [b for m in transcript if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"]]
    assert len(results) == 6 and all(b["type"] == "tool_result" for b in results)


def test_a_bad_request_fails_one_subagent_and_the_others_finish(sim, worker):
    worker(concurrency=4)
    subtasks = [f"Task {i}" for i in range(6)]
    subtasks[3] = "Task 3 [[sim:400]]"
    result = submit(JobSpec(subtasks=subtasks)).wait(timeout=60)

    assert result.status == "done"  # partial mode: failures are reported, the rest go on
    failed = result.by_status("failed")
    assert [r.index for r in failed] == [3]
    assert failed[0].status_code == 400
    assert failed[0].error_type == "invalid_request_error"
    assert failed[0].attempts == 1
    assert result.counts["ok"] == 5
    assert sim.stats()["errors_4xx"] == 1  # no retry of a 400


def test_unknown_tools_are_refused_before_anything_is_enqueued(drover_env, redis_url):
    client = redis.Redis.from_url(redis_url)
    queue = drover_env["DROVER_QUEUE"].encode()

    def jobs_and_queue() -> set[bytes]:
        # What a submit writes: a job's keys, the job index, this test's queue (broker, fair
        # share). The session's prefix is shared: other keys (heartbeats of workers still
        # stopping, telemetry) may change meanwhile.
        return {k for k in client.scan_iter(match=f"{drover_env['DROVER_KEY_PREFIX']}:*")
                if b":job" in k or queue in k}

    before = jobs_and_queue()
    with pytest.raises(ValueError, match="unknown tool.*no_such_tool.*registered tools"):
        submit(JobSpec(subtasks=["a"], tools=["no_such_tool"]))
    assert jobs_and_queue() == before


def test_cli_refuses_a_bad_spec_file_and_says_what_to_fix(tmp_path, drover_env):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"subtasks": ["ok"], "max_tokens": -1}))
    proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "submit", str(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "max_tokens" in proc.stderr and "nothing was enqueued" in proc.stderr


def test_task_messages_carry_ids_only(drover_env):
    from drover.workers.tasklayer.tasks import run_subagent

    signature = run_subagent.s("job123", 4)
    assert signature.args == ("job123", 4) and not signature.kwargs


