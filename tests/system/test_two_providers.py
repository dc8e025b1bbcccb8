"""One fleet serves Anthropic and OpenAI: a pool of a key of each (DROVER_KEYS with
``"provider"``), a model on OpenAI (DROVER_MODEL_PROVIDERS). Real worker processes, the real
SDKs over HTTP, a simulator per API: each job is served by its own provider's key."""

from __future__ import annotations

import json

from drover import JobSpec, submit
from tests.helpers import configure, wait_for_workers

GPT = "gpt-sim-1"


def test_one_fleet_serves_an_anthropic_job_and_an_openai_job_each_on_its_key(
        sim, sim_factory, spawn_worker, drover_env, monkeypatch):
    sim.configure(tool_turns=1, tools_per_turn=2, pool=[{"alias": "ant", "api_key": "sk-ant"}])
    openai_sim = sim_factory(provider="openai", seed=1, tool_turns=1, tools_per_turn=2,
                             pool=[{"alias": "oai", "api_key": "sk-oai"}])
    keys = [{"alias": "ant", "api_key": "sk-ant", "base_url": sim.url},
            {"alias": "oai", "api_key": "sk-oai", "provider": "openai",
             "base_url": openai_sim.url + "/v1"}]
    configure(monkeypatch, drover_env, keys=json.dumps(keys),
              model_providers=json.dumps({GPT: "openai"}),
              limits=json.dumps({GPT: {"rpm": 6000, "tpm": 10_000_000}}))
    spawn_worker(concurrency=8)
    wait_for_workers(1)

    on_anthropic = submit(JobSpec(subtasks=[f"Assess berth {i}" for i in range(4)],
                                  tools=["lookup_fact"], max_tokens=200))
    on_openai = submit(JobSpec(subtasks=[f"Assess crane {i}" for i in range(3)],
                               tools=["lookup_fact"], max_tokens=200, model=GPT))
    ant, oai = on_anthropic.wait(timeout=120), on_openai.wait(timeout=120)

    assert ant.counts["ok"] == 4 and oai.counts["ok"] == 3
    assert all(r.turns == 2 for r in ant.results + oai.results)  # one tool turn, the answer
    for server, alias, result in ((sim, "ant", ant), (openai_sim, "oai", oai)):
        stats = server.stats()
        # Every call of the job reached its provider's simulator with its provider's key,
        # and no call of the other job did; no protocol error on either API.
        assert stats["errors_4xx"] == 0
        assert stats["accepted"] == stats["per_key"][alias]["accepted"] == result.usage.calls
        assert result.usage.calls == 2 * len(result.results)
