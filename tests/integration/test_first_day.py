"""A new user's first day (issue 39): a misspelled setting is named by the worker and by
``submit`` (an error when asked for strictness), an empty variable counts as unset, and the
worker's start says what it loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.helpers import ROOT, stop_process_group, wait_until
from tests.helpers.cli import drover

TYPO = "DROVER_RPMM is not a drover setting; did you mean DROVER_RPM?"


def _env(drover_env: dict[str, str], **values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DROVER_", "COLUMNS"))}
    return {**env, **drover_env, "PYTHONPATH": str(ROOT), **values}


def _start_worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "drover.orchestrator.cli", "worker", "--concurrency", "4",
             "--without-gossip", "--without-mingle", "-n", f"day1-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_a_misspelled_setting_is_named_by_the_worker_and_by_submit_and_empty_ones_are_unset(
        sim, drover_env, tmp_path):
    # Empty variables (a shell's `export X=`, a compose file's `X:`) count as unset.
    env = _env(drover_env, DROVER_RPMM="10", DROVER_LIMITS="", DROVER_KEYS="",
               DROVER_TOOL_RPS="")
    log = tmp_path / "worker.log"
    worker = _start_worker(env, log)
    try:
        wait_until("the worker to be ready", lambda: "ready." in log.read_text(), timeout=90)
        spec = tmp_path / "job.json"
        spec.write_text('{"subtasks": ["one", "two"], "max_tokens": 32}')
        (tmp_path / ".env").write_text("DROVER_OTPMM=5\nDROVER_FLOWER_BASIC_AUTH=\n")
        done = drover(["submit", str(spec), "--wait"], env, tmp_path, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stderr.count(TYPO) == 1, done.stderr
        assert ("DROVER_OTPMM (in .env) is not a drover setting; did you mean DROVER_OTPM?"
                in done.stderr)
        assert "FLOWER" not in done.stderr  # read by `drover flower`: not a typo
        # An empty DROVER_ANTHROPIC_BASE_URL is unset too (submit sends nothing to it).
        empty = drover(["submit", str(spec)], {**env, "DROVER_ANTHROPIC_BASE_URL": ""},
                       tmp_path)
        assert empty.returncode == 0, empty.stdout + empty.stderr
        # Strictness turns the warning into the settings error (exit 2, nothing submitted).
        strict = drover(["submit", str(spec)], {**env, "DROVER_STRICT_SETTINGS": "true"},
                        tmp_path)
        assert strict.returncode == 2, strict.stdout + strict.stderr
        assert TYPO in strict.stderr and "DROVER_STRICT_SETTINGS" in strict.stderr
        assert "submitted" not in strict.stdout.lower()
    finally:
        stop_process_group(worker)
    text = log.read_text(errors="replace")
    assert text.count(TYPO) >= 1, text
    assert "Traceback" not in text
    # After Celery's banner the worker says what it loaded, and where it sends.
    banner = text.index("[queues]")
    from drover.workers.tools import REGISTRY
    from drover.workers.tools import demo as demo_tools  # noqa: F401  (registers the demo's tools)

    demo = sorted(n for n, t in REGISTRY.items() if t.fn.__module__ == demo_tools.__name__)
    assert f"tool module drover.workers.tools.demo: {', '.join(demo)}" in text, text
    scope = f"llm:{drover_env['DROVER_KEY_ALIAS']}:claude-sonnet-4-6"
    assert (f"limits of {scope}: rpm 6,000 (DROVER_RPM), itpm 10,000,000 "
            "(DROVER_ITPM), otpm 10,000,000 (DROVER_OTPM)") in text, text
    where = (f"key prefix {drover_env['DROVER_KEY_PREFIX']}, queue {drover_env['DROVER_QUEUE']}, "
             f"provider endpoint {sim.url}")
    assert where in text and text.index(where) > banner, text
    assert drover_env["ANTHROPIC_API_KEY"] not in text


def test_a_strict_worker_refuses_to_start_naming_the_misspelled_setting(drover_env, tmp_path):
    env = _env(drover_env, DROVER_RPMM="10", DROVER_STRICT_SETTINGS="1")
    proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "worker"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert TYPO in proc.stderr and "Traceback" not in proc.stderr


def test_a_python_wait_with_no_worker_warns_naming_the_queue_and_keeps_waiting(
        drover_env, worker, caplog):
    import logging
    import threading

    from drover import JobSpec, submit

    caplog.set_level(logging.WARNING, logger="drover.orchestrator.client")
    queue = drover_env["DROVER_QUEUE"]
    handle = submit(JobSpec(subtasks=["nobody runs this yet"], max_tokens=16))
    try:
        for _ in handle.as_completed(timeout=10):
            raise AssertionError("no worker runs: nothing can complete")
        raise AssertionError("as_completed ended without its records")
    except TimeoutError as error:
        said = str(error)
    assert "1 of 1 sub-agents pending" in said and "drover worker" in said, said
    warned = [r.getMessage() for r in caplog.records if handle.id in r.getMessage()]
    assert warned and f"DROVER_QUEUE={queue}" in warned[0] and "drover worker" in warned[0]
    # The wait goes on after its warning, and ends once a worker comes.
    results = []
    waiting = threading.Thread(target=lambda: results.append(handle.wait(timeout=120)))
    waiting.start()
    wait_until("wait's own warning", lambda: sum(handle.id in r.getMessage()
                                                 for r in caplog.records) >= 2, timeout=20)
    assert waiting.is_alive()
    worker(concurrency=2)
    waiting.join(timeout=120)
    assert results and results[0].counts.get("ok") == 1, results


def test_a_pool_key_revoked_mid_job_takes_at_most_three_more_sends(
        sim, drover_env, monkeypatch, spawn_worker):
    """Grants queued ahead on the revoked key, on every worker, are held back before their
    send once one worker has disabled it: the simulator counts each 401 it answers."""
    import json

    from bench.workload import MAX_TOKENS, MODEL, QUICK, SYSTEM, TOOL_NAMES
    from drover import JobSpec, submit
    from tests.helpers import configure

    tag = drover_env["DROVER_KEY_ALIAS"]
    org = QUICK.limits
    shares = {"a": 0.5, "b": 0.4, "c": 0.3}
    pool = [{"alias": f"{alias}-{tag}", "api_key": f"sk-sim-{tag}-{alias}",
             **{dim: round(value * share) for dim, value in org.items()}}
            for alias, share in shares.items()]
    sim.configure(**QUICK.sim_config(overload_rate=0.0, pool=pool).to_dict())
    configure(monkeypatch, drover_env, model=MODEL, keys=json.dumps(pool),
              limit_groups=json.dumps({f"cls-{tag}": [MODEL]}),
              **{dim: f"{v:g}" for dim, v in org.items()})
    for _ in range(2):
        spawn_worker(concurrency=8)
    handle = submit(JobSpec(subtasks=QUICK.tasks, system=SYSTEM, tools=TOOL_NAMES,
                            max_tokens=MAX_TOKENS, model=MODEL, max_turns=10))
    b = pool[1]["alias"]
    wait_until("key b to serve some calls",
               lambda: sim.stats()["per_key"].get(b, {}).get("accepted", 0) >= 5, 120)
    sim.configure(revoked=[b])
    result = handle.wait(timeout=300)
    per_key = sim.stats()["per_key"]
    assert result.counts["ok"] == QUICK.subagents, result.counts
    # its first 401, and at most 3 more sends (those already on the wire)
    assert 1 <= per_key[b]["n401"] <= 4, per_key


def test_the_only_key_refused_ends_a_paced_job_at_once_with_its_cause_once(
        sim, drover_env, monkeypatch, spawn_worker):
    """30 sub-agents at the default 50 RPM: most wait in the fair-share line, unpublished.
    The first 401 records them all failed and the join goes out (it used to wait for ever
    for members never published), with one send to the provider."""
    from drover import JobSpec, submit
    from tests.helpers import configure, wait_for_workers

    sim.configure(pool=[{"alias": "only", "api_key": drover_env["ANTHROPIC_API_KEY"],
                         "revoke_after_s": 0}])
    configure(monkeypatch, drover_env, rpm=50, itpm=30000, otpm=8000)
    spawn_worker(concurrency=8)
    wait_for_workers(1)
    result = submit(JobSpec(subtasks=[f"task {i}" for i in range(30)])).wait(timeout=30)
    assert result.status == "failed" and result.counts["failed"] == 30, result.counts
    assert {r.error for r in result.results} == {result.reason}
    assert sim.stats()["per_key"]["only"]["n401"] <= 3, sim.stats()["per_key"]


def test_drover_stats_explains_many_waits_at_low_use_by_the_burst(sim, worker, drover_env,
                                                                   monkeypatch):
    """20 calls at once against 120 RPM: a sixth of the minute's limit, yet most wait, since
    the bucket holds a second of refill (about 2 requests). (At 600 RPM, a bucket of about 9,
    a full run at load 14 started the worker's 20 threads so far apart that fewer than the 5
    waits the explanation needs were counted.)"""
    from rich.console import Console

    from drover import JobSpec, submit
    from drover.config import get_settings
    from drover.orchestrator.ops.stats import print_stats
    from drover.workers.services import services
    from tests.helpers import configure

    configure(monkeypatch, drover_env, rpm=120)
    worker(concurrency=20)
    result = submit(JobSpec(subtasks=[f"task {i}" for i in range(20)],
                            max_tokens=16)).wait(timeout=120)
    assert result.counts["ok"] == 20
    console = Console(record=True, width=250)
    assert print_stats(console, services(get_settings())) == 0
    text = console.export_text()
    assert "of the request limit: the limiter's bucket holds DROVER_BURST_SECONDS=1 s" in text, \
        text
