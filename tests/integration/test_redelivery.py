"""A task that runs past the broker's visibility timeout is delivered again by the broker
(Redis transport: unacked for longer than ``visibility_timeout`` means lost, to kombu); the
copy finds the running delivery's claim and stops before any call, so nothing runs twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid

from drover import JobSpec, submit
from tests.helpers import ROOT, configure


def test_a_task_running_past_the_visibility_timeout_is_not_run_twice(
        sim, drover_env, monkeypatch, tmp_path):
    # Five calls of 4 s: about 20 s of work against a visibility timeout of 12 s, and kombu
    # looks for overdue unacked messages every second (config/celery.py).
    sim.configure(latency_mean_s=4, latency_p95_s=4, tool_turns=4, tools_per_turn=1)
    configure(monkeypatch, drover_env, visibility_timeout_s=12, countdown_cap_s=1,
              task_time_limit_s=10, call_timeout_s=8)
    env = {**os.environ, **drover_env}
    logs, procs = [], []
    for i in range(2):
        log = tmp_path / f"worker{i}.log"
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker", "--pool",
             "threads", "--concurrency", "4", "--queues", env["DROVER_QUEUE"], "--loglevel",
             "WARNING", "--without-gossip", "--without-mingle",
             "-n", f"v{i}-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True))
    try:
        result = submit(JobSpec(subtasks=["Write the long survey"],
                                tools=["lookup_fact"])).wait(timeout=120)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    [record] = result.results
    assert record.status == "ok" and record.usage.calls == 5
    stats = sim.stats()
    assert stats["accepted"] == 5 and stats["duplicate_accepted"] == 0  # no call twice
    text = "".join(log.read_text() for log in logs)
    assert "a late copy of its task" in text  # the broker did hand it out again
