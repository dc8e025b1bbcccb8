"""A worker logs one key=value line per LLM call outcome (scope, status, wait, tokens), and
neither the API key nor any prompt text, at INFO."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

from drover import JobSpec, submit
from tests.helpers import ROOT, stop_process_group

LINE = re.compile(r"llm call (outcome=\S+(?: [a-z_]+=\S+)+)$")
KEYS_OK = ["outcome", "scope", "status", "job", "sub", "wait_s", "call_s", "in", "out",
           "cache_read", "est_in", "reserved_in", "reserved_out", "ttft_s", "out_per_s"]
KEYS_FAILED = ["outcome", "scope", "status", "type", "job", "sub", "wait_s", "call_s", "in",
               "out", "next", "countdown"]


def _worker_at_info(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker", "--pool",
             "threads",
             "--concurrency", "4", "--queues", env["DROVER_QUEUE"], "--loglevel", "INFO",
             "--without-gossip", "--without-mingle", "-n", f"logs-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)


def test_worker_logs_one_line_per_call_outcome_without_secrets_or_prompts(
        sim, drover_env, tmp_path):
    log = tmp_path / "worker.log"
    proc = _worker_at_info(drover_env, log)
    try:
        marker = f"PROMPT-TEXT-{uuid.uuid4().hex[:8]}"
        subtasks = [f"{marker} topic {i}" for i in range(4)]
        subtasks[1] += " [[sim:529:1]]"
        subtasks[2] += " [[sim:429:1]]"
        subtasks[3] += " [[sim:500:1]]"
        handle = submit(JobSpec(subtasks=subtasks, system=f"System {marker}",
                                tools=["lookup_fact"], max_tokens=120))
        result = handle.wait(timeout=90)
        assert result.counts["ok"] == 4
    finally:
        stop_process_group(proc)
    text = log.read_text(errors="replace")
    provider = sim.stats()

    calls = [dict(kv.split("=", 1) for kv in m.group(1).split())
             for m in (LINE.search(line) for line in text.splitlines()) if m]
    outcomes = [c["outcome"] for c in calls]
    assert outcomes.count("ok") == provider["accepted"] == result.usage.calls
    assert sorted(o for o in outcomes if o != "ok") == ["n429", "n529", "n5xx"]
    for call in calls:
        assert list(call) == (KEYS_OK if call["outcome"] == "ok" else KEYS_FAILED), call
        assert call["job"] == handle.id
        assert call["scope"] == f"llm:{drover_env['DROVER_KEY_ALIAS']}:claude-sonnet-4-6"
        float(call["wait_s"]), float(call["call_s"])  # numbers, seconds
    by_outcome = {c["outcome"]: c for c in calls}
    assert (by_outcome["n429"]["status"], by_outcome["n529"]["status"],
            by_outcome["n5xx"]["status"]) == ("429", "529", "500")
    assert sum(int(c["in"]) for c in calls) == provider["input_tokens"]
    assert sum(int(c["out"]) for c in calls) == provider["output_tokens"]

    assert "Task drover.run_subagent" in text  # the log is at INFO and has Celery's lines
    assert drover_env["ANTHROPIC_API_KEY"] not in text
    assert marker not in text
    assert "HTTP Request:" not in text  # httpx's duplicate line per call is turned down
