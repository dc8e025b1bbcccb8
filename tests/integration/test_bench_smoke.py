"""`python -m bench.compare --quick` (drover and the overhead part) and
`python -m bench.acquire_cost` still run end to end, so the benchmark harness cannot rot
unnoticed. It asserts what the harness produces, not how fast anything was."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.helpers import ROOT


def test_quick_compare_runs_drover_and_writes_the_table_and_the_plot(redis_url, tmp_path):
    out, plot = tmp_path / "RESULTS.md", tmp_path / "compare.png"
    out.write_text("# Results\n\nkept as it is\n")
    env = {**os.environ, "DROVER_REDIS_URL": redis_url}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compare", "--quick", "--only", "d", "--out", str(out),
         "--plot", str(plot)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Results\n\nkept as it is\n")  # only its own section is replaced
    [row] = [line for line in text.splitlines() if line.startswith("| **(d) drover")]
    completed, lost = (int(x) for x in row.split("|")[2].split("/"))
    assert completed + lost == 30
    for row in ("| drover job |", "| bare chord, no-op tasks |",
                "| bare chord, one SDK call per task |"):
        assert row in text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_acquire_cost_runs_both_paths_and_the_breakdown_and_leaves_no_key(redis_url,
                                                                          redis_client):
    env = {**os.environ, "DROVER_REDIS_URL": redis_url}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.acquire_cost", "--n", "50", "--breakdown"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # the sync Limiter, then the worker's path
    assert len(re.findall(r"^median acquire +[\d.]+ us +ratio to PING", out, re.M)) == 2
    assert "the worker's path (AsyncLimiter" in out
    for part in ("EVALSHA returning at once", "acquire.lua (arguments built beforehand)",
                 "Limiter.acquire"):
        assert part in out
    # Its own keys only: another benchmark may be running on the same Redis.
    [prefix] = re.findall(r"^keys under (drover-bench-\w+): \d+ deleted$", out, re.M)
    assert not list(redis_client.scan_iter(match=f"{prefix}:*"))


def test_memory_quick_measures_a_job_and_leaves_no_key(redis_url, redis_client):
    env = {**os.environ, "DROVER_REDIS_URL": redis_url}
    proc = subprocess.run([sys.executable, "-m", "bench.memory", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| 50 | 20 (20) |"))
    assert int(row.split("|")[4].replace(",", "")) > 0  # peak bytes per sub-agent
    assert "at rest, bytes per sub-agent by key: " in proc.stdout
    [prefix] = re.findall(r"^keys under (drover-bench-mem-\w+): deleted$", proc.stdout, re.M)
    assert not list(redis_client.scan_iter(match=f"{prefix}:*", count=1000))


def test_gateway_quick_runs_both_parts_through_a_real_gateway(redis_url):
    """`python -m bench.gateway --quick`: the fleet and an outside caller through the gateway
    at a binding limit, then the overhead and in-flight part; every call answered."""
    env = {**os.environ, "DROVER_REDIS_URL": redis_url}
    proc = subprocess.run([sys.executable, "-m", "bench.gateway", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = {row["part"]: row for row in map(json.loads, proc.stdout.strip().splitlines())}
    binding, overhead = parts["binding"], parts["overhead"]
    assert binding["subagents_ok"] == binding["subagents"], binding
    assert binding["gateway_ok"] == binding["gateway_calls"], binding
    assert binding["ratio"] > 0 and binding["bound_s"] > 0
    assert overhead["in_flight_ok"] == overhead["in_flight_sent"], overhead
    assert overhead["sim_max_in_flight"] == overhead["in_flight_sent"], overhead
    for field in ("ttfb_direct_ms", "ttfb_gateway_ms", "added_ms"):
        assert isinstance(overhead[field], float), field


def test_own_code_quick_runs_the_limits_and_the_kill_runs(redis_url):
    """`python -m bench.own_code --quick`: a team's own sub-agents beside another process's
    burst through drover.AsyncAnthropic, then a worker killed mid-job."""
    env = {**os.environ, "DROVER_REDIS_URL": redis_url}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.own_code", "--quick", "--provider", "anthropic"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = dict(re.findall(r"^anthropic (limits|kill): (\{.*\})$", proc.stdout, re.M))
    limits, kill = json.loads(runs["limits"]), json.loads(runs["kill"])
    assert limits["ok"] == kill["ok"] == 12
    assert limits["burst"] == {"ok": 10, "errors": {}}
    assert limits["ratio"] > 0 and "in_flight_at_kill" in kill
    for run in (limits, kill):
        assert run["usage"]["calls"] == run["calls_planned"]
        assert run["billed"]["requests"] == run["accepted"]
