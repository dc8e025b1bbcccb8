"""The provider's spend limit, once per key: the first refusal stops the key for every worker
and client; a pool goes on with its other keys; with no key left the job's unfinished
sub-agents end at once naming the limit and how to raise it. Worker subprocesses, real Redis,
the real SDKs over HTTP to the simulator, whose spend limit is reached after N paid calls.

``python -m pytest tests/system/test_spend_limit.py -n 0 -q -s -p no:cacheprovider`` prints
the figures of docs/cost.md."""

from __future__ import annotations

import json
import time

from drover import JobSpec, submit
from drover.workers.services import services
from tests.helpers import configure, wait_for_workers
from tests.helpers.cli import clean_env
from tests.helpers.cli import drover as run_drover
from tests.helpers.openai import MODEL as OPENAI_MODEL
from tests.helpers.openai import on_openai

SLOTS = 16  # two workers of 8: at most this many calls in flight


def _limited_job(sim, spawn_worker, model: str | None = None):
    for _ in range(2):
        spawn_worker(concurrency=SLOTS // 2)
    wait_for_workers(2)
    handle = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(120)],
                            max_tokens=200, model=model))
    result = handle.wait(timeout=300)
    ended = time.time()
    stats = sim.stats()
    return handle, result, ended, stats


def _check_stopped(result, ended: float, stats: dict, alias: str, words: str) -> None:
    first = stats["first_spend_limited_at"]
    refused = stats["spend_cap_429"]
    unfinished = [r for r in result.results if r.status != "ok"]
    print(f"\n{words}: {result.counts}, {stats['accepted']} paid calls, {refused} refused "
          f"requests (at most {SLOTS} in flight), the job ended {ended - first:.2f} s after "
          "the first refusal")
    assert stats["accepted"] == 50 and result.counts["ok"] == 50, (result.counts, stats)
    assert first is not None and ended - first <= 30.0
    assert 1 <= refused <= SLOTS, refused
    assert unfinished and all("spend limit" in (r.error or "") and f"drover keys enable "
                              f"{alias}" in (r.error or "") for r in unfinished), unfinished[:2]
    off = services().limiter.disabled_keys()
    assert alias in off and off[alias]["reason"].startswith("spend limit"), off


def test_the_one_keys_spend_limit_ends_the_job_at_once_naming_it(
        sim, spawn_worker, drover_env):
    sim.configure(tool_turns=0, latency_mean_s=0.3, latency_p95_s=0.5, spend_limit_calls=50)
    handle, result, ended, stats = _limited_job(sim, spawn_worker)
    _check_stopped(result, ended, stats, drover_env["DROVER_KEY_ALIAS"],
                   "anthropic, spend limit after 50 paid calls")
    # drover keys shows it; a submit now sends nothing on the stopped key.
    env = clean_env(**drover_env)
    keys = run_drover(["keys"], env, handle.settings and __import__("pathlib").Path("."))
    assert "DISABLED" in keys.stdout and "spend limit" in keys.stdout, keys.stdout
    before = sim.stats()["accepted"] + sim.stats()["spend_cap_429"]
    again = submit(JobSpec(subtasks=["one more"], max_tokens=50)).wait(timeout=120)
    assert again.counts["failed"] == 1 and "spend limit" in again.results[0].error
    assert sim.stats()["accepted"] + sim.stats()["spend_cap_429"] == before


def test_openais_insufficient_quota_stops_the_key_the_same_way(
        sim_factory, spawn_worker, drover_env, monkeypatch):
    sim = on_openai(monkeypatch, drover_env, sim_factory, tool_turns=0, latency_mean_s=0.3,
                    latency_p95_s=0.5, spend_limit_calls=50)
    _, result, ended, stats = _limited_job(sim, spawn_worker, OPENAI_MODEL)
    _check_stopped(result, ended, stats, drover_env["DROVER_KEY_ALIAS"],
                   "openai, insufficient_quota after 50 paid calls")
    assert "billing page" in result.results[-1].error or any(
        "billing page" in (r.error or "") for r in result.results)


def test_a_pool_takes_the_spend_limited_key_out_and_finishes_on_the_other(
        sim, spawn_worker, drover_env, monkeypatch):
    tag = drover_env["DROVER_KEY_ALIAS"]
    a, b = f"a-{tag}", f"b-{tag}"
    pool = [{"alias": a, "api_key": f"sk-sim-{tag}-a"}, {"alias": b, "api_key": f"sk-sim-{tag}-b"}]
    sim.configure(tool_turns=0, latency_mean_s=0.2, latency_p95_s=0.4, pool=pool,
                  key_spend_limit_calls={a: 10})
    configure(monkeypatch, drover_env, keys=json.dumps(pool))
    for _ in range(2):
        spawn_worker(concurrency=SLOTS // 2)
    wait_for_workers(2)
    result = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(120)],
                            max_tokens=200)).wait(timeout=300)
    stats = sim.stats()
    per_key = stats["per_key"]
    print(f"\npool of two, key a's spend limit after 10 paid calls: {result.counts}; key a "
          f"{per_key[a]['accepted']} paid, key b {per_key[b]['accepted']} paid, "
          f"{stats['spend_cap_429']} refused requests")
    assert result.counts["ok"] == 120, [r.error for r in result.results if r.status != "ok"][:3]
    assert per_key[a]["accepted"] == 10 and per_key[b]["accepted"] == 110, per_key
    assert 1 <= stats["spend_cap_429"] <= SLOTS
    off = services().limiter.disabled_keys()
    assert a in off and b not in off and off[a]["reason"].startswith("spend limit")
