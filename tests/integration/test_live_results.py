"""Live results: records stream as sub-agents finish, each exactly once, also across a
reconnect from another process; jobs are submitted and followed from hosts that run no
worker. Real Redis, worker subprocesses, the simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drover import JobHandle, JobNotFound, JobSpec, submit
from tests.helpers import ROOT

FOLLOW = """
import json, sys
from drover import JobHandle
handle = JobHandle.attach(sys.argv[1])
print(json.dumps([r.index for r in handle.as_completed(timeout=90, after=sys.argv[2])]))
"""


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=timeout)


def test_as_completed_streams_records_long_before_the_end_and_each_once_across_reconnects(
        sim, spawn_worker, drover_env):
    sim.configure(latency_mean_s=0.3, latency_p95_s=0.6, tool_turns=1, tools_per_turn=1)
    spawn_worker(concurrency=8)
    n = 48
    handle = submit(JobSpec(subtasks=[f"Profile carrier {i}" for i in range(n)],
                            tools=["lookup_fact"]))
    stream = handle.as_completed(timeout=90)
    first = next(stream)
    # The first record arrived while the job was still running.
    assert handle.result() is None and handle.progress()["pending"] > 0
    seen = [first] + [next(stream) for _ in range(9)]
    stream.close()  # the caller goes away after 10 records...
    resume_from = handle.last_event

    # ...and another process picks up where it left off.
    rest = _run("-c", FOLLOW, handle.id, resume_from)
    assert rest.returncode == 0, rest.stderr
    later = json.loads(rest.stdout)
    indices = [r.index for r in seen] + later
    assert sorted(indices) == list(range(n))  # every sub-agent, none twice

    result = handle.wait(timeout=60)
    assert result.counts["ok"] == n
    ended = float(handle.store.meta.get(handle.id)["finished"])
    assert first.finished_at < max(r.finished_at for r in result.results) <= ended
    # A fresh handle replays the whole stream, again each sub-agent once.
    replay = [r.index for r in JobHandle.attach(handle.id).as_completed(timeout=30)]
    assert sorted(replay) == list(range(n))
    assert [r.index for r in seen] == replay[:10]  # in the order they finished


def test_progress_counts_each_status(sim, worker):
    worker(concurrency=4)
    subtasks = [f"Task {i}" for i in range(6)]
    subtasks[2] = "Task 2 [[sim:400]]"
    handle = submit(JobSpec(subtasks=subtasks, max_turns=1, tools=["lookup_fact"]))
    before = handle.progress()
    assert before["total"] == 6 and before["pending"] + before["ok"] <= 6
    handle.wait(timeout=60)
    # max_turns=1 and a tool turn: each stops at its turn cap, except the one that failed.
    assert handle.progress() == {"ok": 0, "failed": 1, "cancelled": 0, "budget_exceeded": 5,
                                 "total": 6, "pending": 0}


def test_drover_submit_works_from_a_host_with_no_worker_and_watch_follows_it(
        sim, spawn_worker, drover_env, tmp_path):
    sim.configure(latency_mean_s=0.2, latency_p95_s=0.4, tool_turns=0)
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"subtasks": [f"Rate warehouse {i}" for i in range(12)]}))
    submitted = _run("-m", "drover.orchestrator.cli", "submit", str(spec))  # nothing else runs here
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert JobHandle.attach(job_id).status in ("queued", "running")
    assert sim.stats()["accepted"] == 0  # queued: no worker anywhere yet

    spawn_worker(concurrency=4)
    watched = _run("-m", "drover.orchestrator.cli", "watch", job_id)
    assert watched.returncode == 0, watched.stderr
    for i in range(12):
        assert f"#{i} ok" in watched.stdout
    assert "ok=12" in watched.stdout and "status=done" in watched.stdout
    shown = _run("-m", "drover.orchestrator.cli", "result", job_id, "--json")
    assert json.loads(shown.stdout)["counts"]["ok"] == 12


def test_attach_refuses_an_unknown_job_with_a_clear_message(drover_env):
    with pytest.raises(JobNotFound, match="no job 'nope'"):
        JobHandle.attach("nope")
    shown = _run("-m", "drover.orchestrator.cli", "watch", "nope")
    assert shown.returncode != 0 and "no job 'nope'" in shown.stderr
