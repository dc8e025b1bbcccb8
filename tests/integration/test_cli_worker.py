"""A worker whose API key is missing or refused: one clear line per job, a ``failed`` record
per sub-agent with ``error_type`` ``authentication_error``, no traceback, and exit status 1
from ``drover submit --wait`` (the job fails at once: no call of it can succeed)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import anthropic
import pytest

from drover import JobSpec, submit
from drover.workers.agent.retry import classify
from tests.helpers import ROOT, stop_process_group, wait_until
from tests.helpers.api_errors import api_error


def test_a_401_and_a_missing_key_are_authentication_errors_that_fail_at_once():
    for error in (api_error(401, "authentication_error", "invalid x-api-key"),
                  api_error(401, "", "")):  # a proxy's bare 401
        decision = classify(error, attempt=0, base_s=1, cap_s=10)
        assert (decision.action, decision.error_type, decision.status_code) == (
            "fail", "authentication_error", 401)
    client = anthropic.Anthropic(api_key=None, base_url="http://127.0.0.1:9", max_retries=0)
    with pytest.raises(TypeError) as raised:  # the SDK refuses before sending anything
        client.messages.create(model="m", max_tokens=1, messages=[{"role": "user",
                                                                   "content": "hi"}])
    decision = classify(raised.value, attempt=0, base_s=1, cap_s=10)
    assert (decision.action, decision.error_type) == ("fail", "authentication_error")
    assert "ANTHROPIC_API_KEY" in decision.message


def test_a_keyless_worker_starts_with_a_warning_and_every_subagent_fails_once_per_job(
        sim, drover_env, tmp_path):
    env = {k: v for k, v in {**os.environ, **drover_env}.items() if k != "ANTHROPIC_API_KEY"}
    env.pop("COLUMNS", None)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "drover.orchestrator.cli", "worker", "--concurrency", "4",
             "--without-gossip", "--without-mingle", "-n", f"keyless-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until("the worker to be ready", lambda: "ready." in log.read_text())
        spec = tmp_path / "job.json"
        spec.write_text('{"subtasks": ["one", "two", "three", "four"], "max_tokens": 32}')
        proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "submit", str(spec),
                               "--wait"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        stop_process_group(worker)
    text = log.read_text(errors="replace")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # failed: nothing is ok
    # The fleet's only key was refused: the job fails at once, its reason once and each
    # sub-agent's record with the same words.
    assert proc.stdout.count("authentication_error") == 5, proc.stdout
    assert "failed (no API key" in proc.stdout and "ANTHROPIC_API_KEY=sk-sim" in proc.stdout
    assert "failed=4" in proc.stdout
    assert proc.stdout.count("ANTHROPIC_API_KEY=sk-sim") == 1, proc.stdout  # the advice once
    assert proc.stdout.count("the job's reason, above") == 4, proc.stdout
    assert "warning: no ANTHROPIC_API_KEY" in text
    auth_lines = [line for line in text.splitlines() if "type=authentication_error" in line]
    assert len(auth_lines) == 1, auth_lines  # one line for the job, not one per sub-agent
    assert "check ANTHROPIC_API_KEY" in auth_lines[0]
    assert "Traceback" not in text + proc.stderr
    assert sim.stats()["accepted"] == 0


def test_no_credentials_at_all_fail_each_subagent_without_a_traceback_or_a_claimed_send(
        sim, worker, drover_env, caplog, monkeypatch):
    """The SDK's own refusal (no key, no base URL to omit it for) is classified too."""
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    worker(concurrency=4)
    rt = get_runtime(services())
    monkeypatch.delenv("ANTHROPIC_API_KEY")  # the SDK would read it from the environment
    keyless = anthropic.AsyncAnthropic(api_key=None, base_url=sim.url, max_retries=0)
    original, rt.client = rt.client, keyless
    try:
        with caplog.at_level(logging.INFO):
            result = submit(JobSpec(subtasks=["a", "b", "c"], max_tokens=16)).wait(timeout=60)
    finally:
        rt.client = original
        rt.run(keyless.close())
    assert [r.status for r in result.results] == ["failed"] * 3
    assert {r.error_type for r in result.results} == {"authentication_error"}
    assert "sent=yes" not in caplog.text
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
    assert caplog.text.count("type=authentication_error") == 1
    assert sim.stats()["accepted"] == 0


def _debug_worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "drover.orchestrator.cli", "worker", "--concurrency", "4",
             "--loglevel", "DEBUG", "--without-gossip", "--without-mingle",
             "-n", f"debug-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_no_prompt_text_or_key_in_the_worker_log_even_at_debug(sim, drover_env, tmp_path):
    log = tmp_path / "worker.log"
    worker = _debug_worker({**os.environ, **drover_env}, log)
    try:
        marker = f"PROMPT-TEXT-{uuid.uuid4().hex[:8]}"
        handle = submit(JobSpec(subtasks=[f"{marker} topic {i}" for i in range(3)],
                                system=f"System {marker}", tools=["lookup_fact"],
                                max_tokens=64))
        assert handle.wait(timeout=90).counts["ok"] == 3
    finally:
        stop_process_group(worker)
    text = log.read_text(errors="replace")
    assert "llm call outcome=ok" in text and "DEBUG" in text  # it did log at DEBUG
    assert marker not in text
    assert drover_env["ANTHROPIC_API_KEY"] not in text


def test_submit_wait_says_when_no_worker_consumes_the_queue(drover_env, key_prefix, tmp_path):
    """The job id on stdout, and the hint once on stderr: the submit says it at once, and the
    wait, which would ask again after NO_WORKER_HINT_AFTER_S, does not repeat it. A key prefix
    of its own: no worker of an earlier test is alive under it (the session's may have one)."""
    from drover.orchestrator.cli import NO_WORKER_HINT_AFTER_S

    spec = tmp_path / "job.json"
    spec.write_text('{"subtasks": ["nobody runs this"], "max_tokens": 16}')
    env = {**os.environ, **drover_env, "DROVER_KEY_PREFIX": key_prefix}
    proc = subprocess.Popen([sys.executable, "-m", "drover.orchestrator.cli", "submit", str(spec),
                             "--wait"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    guard = threading.Timer(60, lambda: stop_process_group(proc, timeout=5))  # never hang
    guard.start()
    try:
        job_id = proc.stdout.readline().strip()  # blocks until the id (or the end)
        line = proc.stderr.readline()  # blocks until the hint (or the end of the process)
        # Past the moment the wait would ask the workers (within 2 s) and say it again.
        time.sleep(NO_WORKER_HINT_AFTER_S + 5)
    finally:
        guard.cancel()
        stop_process_group(proc)
    assert job_id, line + proc.stderr.read()
    assert f"job {job_id} is queued, but no worker serves it yet" in line, line
    assert f"DROVER_QUEUE={drover_env['DROVER_QUEUE']}" in line and "drover worker" in line
    rest = proc.stderr.read()
    assert "no worker" not in rest, rest
    assert NO_WORKER_HINT_AFTER_S <= 15


def test_a_wait_says_once_when_no_worker_consumes_the_queue(drover_env, caplog):
    """In Python: no worker serves the job's queue. The submit says so (when no worker is alive
    under the prefix at all) or its first wait does, never both; a handle attached later (it
    heard nothing) says it once nothing finished for NO_WORKER_HINT_AFTER_S. (A later wait of
    the submit's handle says it again: test_first_day.)"""
    from drover.errors import WaitTimeout
    from drover.orchestrator.cli import NO_WORKER_HINT_AFTER_S
    from drover.orchestrator.client.jobs import JobHandle

    caplog.set_level(logging.WARNING, logger="drover.orchestrator.client")
    handle = submit(JobSpec(subtasks=["nobody runs this"], max_tokens=16))
    for waiter in (handle, JobHandle.attach(handle.id)):
        # Past the moment the wait asks the workers (their answer is waited for in any case).
        with pytest.raises(WaitTimeout) as timed_out:
            waiter.wait(timeout=NO_WORKER_HINT_AFTER_S + 3)
        said = [r.getMessage() for r in caplog.records if "no worker" in r.getMessage()]
        assert len(said) == 1 and handle.id in said[0], said
        caplog.clear()
    assert "no worker" in str(timed_out.value), timed_out.value
