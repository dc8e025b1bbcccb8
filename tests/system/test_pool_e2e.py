"""A pool of keys end to end: real worker processes, real Redis, the real SDK over HTTP to a
simulator that keeps each key's (workspace's) limits inside the organisation's, with the
headers of the most restrictive limit in effect, and that revokes a key on request."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

from bench.workload import MAX_TOKENS, MODEL, QUICK, SYSTEM, TOOL_NAMES
from drover import JobSpec, submit
from drover.config import get_settings
from drover.orchestrator.ops.metrics import DroverCollector
from drover.workers.limiter import Limiter
from drover.workers.services import services
from tests.helpers import configure, wait_until
from tests.helpers.metrics import scrape, value

SHARES = {"a": 0.5, "b": 0.4, "c": 0.3}  # of each organisation limit: 1.2 x in sum


def _spec(subtasks: list[str], model: str = MODEL) -> JobSpec:
    return JobSpec(subtasks=subtasks, system=SYSTEM, tools=TOOL_NAMES, max_tokens=MAX_TOKENS,
                   model=model, max_turns=10)


def _pool(env: dict[str, str], shares: dict[str, float], org: dict[str, float],
          **revoke: float) -> list[dict]:
    """The same pool for the simulator and for drover: each key a share of the org's limits.
    Aliases carry the test's own tag: a key disabled here is disabled for this test only."""
    tag = env["DROVER_KEY_ALIAS"]
    return [{"alias": f"{alias}-{tag}", "api_key": f"sk-sim-{tag}-{alias}",
             **{dim: round(value * share) for dim, value in org.items()},
             **({"revoke_after_s": revoke[alias]} if alias in revoke else {})}
            for alias, share in shares.items()]


def _use_pool(monkeypatch, env: dict[str, str], pool: list[dict], org: dict[str, float],
              **more: object) -> str:
    """drover's settings for ``pool``; returns the model class, the test's own (so is the
    organisation's scope: the test session shares one key prefix)."""
    keys = [{k: v for k, v in e.items() if k != "revoke_after_s"} for e in pool]
    cls = f"cls-{env['DROVER_KEY_ALIAS']}"
    configure(monkeypatch, env, model=MODEL, keys=json.dumps(keys),
              limit_groups=json.dumps({cls: [MODEL]}),
              **{dim: f"{v:g}" for dim, v in org.items()}, **more)
    return cls


def _limiter(env: dict[str, str]) -> Limiter:
    return Limiter(redis.Redis.from_url(env["DROVER_REDIS_URL"]),
                   prefix=env["DROVER_KEY_PREFIX"])


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _short(per_key: dict[str, dict], env: dict[str, str]) -> dict[str, dict]:
    tail = f"-{env['DROVER_KEY_ALIAS']}"
    return {alias.removesuffix(tail): row for alias, row in per_key.items()}


def test_three_keys_under_an_org_limit_below_their_sum_no_429_and_every_key_used(
        sim, drover_env, monkeypatch, spawn_worker):
    workload = QUICK
    org = workload.limits
    pool = _pool(drover_env, SHARES, org)
    # The provider's buckets hold 1 s, as drover's do: a key's bucket holds only a few
    # requests, so a first burst estimated low would tip it (about one run in three on a
    # loaded box, before the uncalibrated margin of c704122; 7 of 7 at load 3-5 since); the
    # 60 s windows below are held to every limit.
    sim.configure(**workload.sim_config(overload_rate=0.0, pool=pool, burst_s=1.0).to_dict())
    cls = _use_pool(monkeypatch, drover_env, pool, org)
    # A send may be late by the box's load: beside a CPU hog a key's bucket of a few requests
    # drew one 429 at its second second in one fresh-clone run of three (the sends of two
    # seconds met in one). docs/limiter.md: raise DROVER_LATE_SEND_S on a host busier than
    # 0.2 s; what this test proves (the pool shares the org limits with no 429, every key
    # used, no 60 s window over a limit) does not depend on how late a send may be.
    configure(monkeypatch, drover_env, late_send_s=0.4)
    for _ in range(2):
        spawn_worker(concurrency=8)

    result = submit(_spec(workload.tasks)).wait(timeout=300)

    stats = sim.stats()
    assert result.counts["ok"] == workload.subagents, [
        r for r in result.results if r.status != "ok"][:3]
    assert stats["rejected_429"] == 0, json.dumps([stats["per_key"], stats["timeline"][:4]])
    assert stats["accepted"] == workload.demand.requests
    for dim, window in (("rpm", "requests"), ("itpm", "input_tokens")):
        assert stats["max_60s"][window] <= org[dim]
    per_key = stats["per_key"]
    assert len(per_key) == len(SHARES), per_key
    for entry in pool:
        mine = per_key[entry["alias"]]
        assert mine["accepted"] > 0, per_key
        assert mine["max_60s"]["input_tokens"] <= entry["itpm"], (entry["alias"], mine)
    levels = _limiter(drover_env).scopes()
    assert f"pool/llm:org:{cls}" in levels and all(
        f"pool/llm:{e['alias']}:{cls}" in levels for e in pool), levels


def test_a_key_revoked_mid_job_costs_only_that_key(sim, drover_env, monkeypatch,
                                                    spawn_worker):
    workload = QUICK
    org = workload.limits
    pool = _pool(drover_env, SHARES, org)
    sim.configure(**workload.sim_config(overload_rate=0.0, pool=pool).to_dict())
    cls = _use_pool(monkeypatch, drover_env, pool, org)
    for _ in range(2):
        spawn_worker(concurrency=8)

    handle = submit(_spec(workload.tasks))
    b = pool[1]["alias"]
    wait_until("key b to serve some calls",
               lambda: sim.stats()["per_key"].get(b, {}).get("accepted", 0) >= 5, 120)
    sim.configure(revoked=[b])
    result = handle.wait(timeout=300)

    per_key = _short(sim.stats()["per_key"], drover_env)
    assert result.counts["ok"] == workload.subagents, [
        r for r in result.results if r.status != "ok"][:3]
    # The calls already on the wire when the first 401 came back (b's share of the rate x
    # the latency: about two), and a request or two more: the flag is set before the refused
    # call moves on, and every acquire after it honours the flag.
    assert 1 <= per_key["b"]["n401"] <= 5, per_key
    assert per_key["a"]["accepted"] > 0 and per_key["c"]["accepted"] > 0
    disabled = _limiter(drover_env).disabled_keys()
    assert b in disabled and "401" in disabled[b]["reason"], disabled
    assert not {e["alias"] for e in pool if e["alias"] != b} & set(disabled)
    assert "sk-sim" not in json.dumps(disabled)

    # Visible: drover stats and drover keys name it, the metrics flag it, per key and org
    # scopes carry the limits and use; enabling it again lets it rejoin.
    stats = _cli("stats")
    assert f"key {b}: DISABLED" in stats and "401 authentication_error" in stats, stats
    assert f"pool/llm:org:{cls}" in stats and f"pool/llm:{b}:{cls}" in stats
    families = scrape(DroverCollector(services(get_settings()), broker_queues=False))
    assert value(families, "drover_pool_key_disabled", key=b) == 1
    assert value(families, "drover_pool_key_disabled", key=pool[0]["alias"]) == 0
    assert value(families, "drover_scope_limit_per_second", scope=f"pool/llm:{b}:{cls}",
                 dimension="input_tokens") == pytest.approx(pool[1]["itpm"] / 60)
    assert "enabled" in _cli("keys", "enable", b)
    assert f"key {b}: enabled" in _cli("keys")
    for text in (stats, _cli("keys")):
        assert "sk-sim" not in text


def test_two_models_of_one_class_share_one_limit(sim, drover_env, monkeypatch, spawn_worker):
    workload = QUICK
    limits = {dim: v / 2 for dim, v in workload.limits.items()}
    classes = {MODEL: "fam", "claude-sonnet-4-5": "fam"}
    sim.configure(**workload.sim_config(overload_rate=0.0, rpm=limits["rpm"],
                                        itpm=limits["itpm"], otpm=limits["otpm"],
                                        model_classes=classes).to_dict())
    configure(monkeypatch, drover_env, model=MODEL,
              limit_groups=json.dumps({"fam": list(classes)}),
              **{dim: f"{v:g}" for dim, v in limits.items()})
    for _ in range(2):
        spawn_worker(concurrency=8)
    half = workload.subagents // 2
    first = submit(_spec(workload.tasks[:half], MODEL))
    second = submit(_spec(workload.tasks[half:], "claude-sonnet-4-5"))
    results = [first.wait(timeout=300), second.wait(timeout=300)]

    stats = sim.stats()
    assert [r.counts["ok"] for r in results] == [half, workload.subagents - half]
    assert stats["rejected_429"] == 0
    assert stats["max_60s"]["input_tokens"] <= limits["itpm"]
    scopes = [s for s in _limiter(drover_env).scopes() if drover_env["DROVER_KEY_ALIAS"] in s]
    assert scopes == [f"llm:{drover_env['DROVER_KEY_ALIAS']}:fam"], scopes


def test_the_only_key_refused_fails_the_whole_job_at_once(sim, drover_env, monkeypatch,
                                                          spawn_worker):
    alias = drover_env["DROVER_KEY_ALIAS"]
    sim.configure(pool=[{"alias": "only", "api_key": drover_env["ANTHROPIC_API_KEY"],
                         "revoke_after_s": 0}])
    spawn_worker(concurrency=4)

    result = submit(JobSpec(subtasks=[f"task {i}" for i in range(30)])).wait(timeout=120)

    assert result.status == "failed" and result.counts["failed"] == 30, result.counts
    assert alias in result.reason and "ANTHROPIC_API_KEY" in result.reason, result.reason
    assert {r.error for r in result.results} == {result.reason}
    assert {r.status_code for r in result.results} == {401}
    # at once: the sub-agents that had not sent yet never do
    assert sim.stats()["per_key"]["only"]["n401"] <= 8, sim.stats()["per_key"]


def test_every_key_of_a_pool_refused_fails_the_job_naming_them(sim, drover_env, monkeypatch,
                                                               spawn_worker):
    org = {"rpm": 6000.0, "itpm": 1e7, "otpm": 1e7}
    pool = _pool(drover_env, {"x": 0.5, "y": 0.5}, org, x=0, y=0)
    sim.configure(pool=pool)
    _use_pool(monkeypatch, drover_env, pool, org)
    spawn_worker(concurrency=4)


    result = submit(JobSpec(subtasks=[f"task {i}" for i in range(30)])).wait(timeout=120)

    assert result.status == "failed" and result.counts["failed"] == 30, result.counts
    for entry in pool:
        assert f"{entry['alias']}: 401" in result.reason, result.reason
    assert "drover keys enable" in result.reason
    # the calls in flight at the first 401, and a few more
    per_key = _short(sim.stats()["per_key"], drover_env)
    assert per_key["x"]["n401"] + per_key["y"]["n401"] <= 4 + 3, per_key
    assert "sk-sim" not in result.model_dump_json()
