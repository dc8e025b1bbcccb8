"""Claude on the Anthropic API, Amazon Bedrock and Google Vertex AI in one pool, end to end:
real worker processes, real Redis, the Anthropic SDK's own clients (``AsyncAnthropic``,
``AsyncAnthropicBedrock``, ``AsyncAnthropicVertex``) over HTTP to three simulators, each
serving one of them with its own quotas, errors and streams (simulator/clouds.py).

- One job is spread over every entry by free capacity, 0 throttles anywhere, each cloud
  counted its way (Bedrock's tokens quota: input + max tokens at admission, input + 5 x output
  once done) and under no organisation (the Anthropic organisation's limits are tighter than
  the three together).
- A cloud's throttling, read from the SDK's own exception, is a rate limit that cools down that
  entry only: the organisation and the other entries go on."""

from __future__ import annotations

import asyncio
import json

import anthropic
import pytest
import redis

from drover import JobSpec, submit
from drover.config import load_settings
from drover.workers.agent.retry import classify
from drover.workers.agent.routes import Route
from drover.workers.limiter import AsyncLimiter, Limiter, org_scope, pool_scope
from drover.workers.providers import Pool, Seen, provider
from tests.helpers import configure

MODEL = "claude-sonnet-4-6"
BEDROCK_ID = "anthropic.claude-sonnet-4-6-v1:0"
VERTEX_ID = "claude-sonnet-4-6@20260101"


def _entries(tag: str, api_url: str, bed_url: str, vtx_url: str, **limits: dict) -> list[dict]:
    return [
        {"alias": f"api-{tag}", "api_key": "sk-test-not-a-secret", "base_url": api_url,
         **limits.get("api", {})},
        {"alias": f"bed-{tag}", "provider": "bedrock", "region": "us-east-1",
         "api_key": f"bedrock-key-{tag}", "base_url": bed_url, "models": {MODEL: BEDROCK_ID},
         **limits.get("bed", {})},
        {"alias": f"vtx-{tag}", "provider": "vertex", "region": "us-east5",
         "project": "proj", "access_token": f"ya29.token-{tag}", "base_url": vtx_url + "/v1",
         "models": {MODEL: VERTEX_ID}, **limits.get("vtx", {})},
    ]


def test_one_job_spreads_over_the_api_bedrock_and_vertex_with_no_throttle(
        sim, sim_factory, drover_env, monkeypatch, spawn_worker):
    # Each simulator holds its quotas in 1 s buckets, as drover's: any send past one is a 429.
    common = {"seed": 3, "tool_turns": 0, "output_tokens_mean": 80, "burst_s": 1.0,
              "overload_rate": 0.0}
    limits = {"api": {"rpm": 120, "itpm": 60_000, "otpm": 12_000},
              "bed": {"rpm": 120, "tpm": 90_000},
              "vtx": {"rpm": 120, "itpm": 60_000, "otpm": 12_000}}
    sim.configure(**common, **limits["api"])
    bed = sim_factory(provider="bedrock", **common, **limits["bed"])
    vtx = sim_factory(provider="vertex", **common, **limits["vtx"])
    tag = drover_env["DROVER_KEY_ALIAS"]
    entries = _entries(tag, sim.url, bed.url, vtx.url, **limits)
    # The organisation's limits (the Anthropic API's) hold its key only: the clouds run beside.
    configure(monkeypatch, drover_env, model=MODEL, keys=json.dumps(entries),
              limit_groups=json.dumps({f"cls-{tag}": [MODEL]}), rpm="120", itpm="60000",
              otpm="12000", late_send_s=0.4)
    for _ in range(2):
        spawn_worker(concurrency=8)

    result = submit(JobSpec(subtasks=[f"Survey harbour {i}" for i in range(60)],
                            max_tokens=300, model=MODEL)).wait(timeout=300)

    assert result.counts["ok"] == 60, [r for r in result.results if r.status != "ok"][:3]
    stats = {name: s.stats() for name, s in (("api", sim), ("bedrock", bed), ("vertex", vtx))}
    assert {name: s["rejected_429"] for name, s in stats.items()} == {
        "api": 0, "bedrock": 0, "vertex": 0}, {n: s["by_status"] for n, s in stats.items()}
    accepted = {name: s["accepted"] for name, s in stats.items()}
    assert all(n > 0 for n in accepted.values()), accepted
    assert sum(accepted.values()) == 60, accepted
    # Each cloud saw one credential (the simulator keeps a digest of it), on every call.
    assert list(stats["bedrock"]["keys_seen"].values()) == [accepted["bedrock"]]
    assert list(stats["vertex"]["keys_seen"].values()) == [accepted["vertex"]]
    # The org level counted the Anthropic API's calls only; each entry its own.
    lim = Limiter(redis.Redis.from_url(drover_env["DROVER_REDIS_URL"]),
                  prefix=drover_env["DROVER_KEY_PREFIX"])

    def requests(scope: str) -> int:
        return sum(row["requests"] for row in lim.usage(scope, 600))

    cls = f"cls-{tag}"
    counted = {alias: requests(pool_scope(f"{alias}-{tag}", cls))
               for alias in ("api", "bed", "vtx")}
    assert counted == {"api": accepted["api"], "bed": accepted["bedrock"],
                       "vtx": accepted["vertex"]}
    assert requests(org_scope(cls)) == accepted["api"]


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
def test_a_throttled_cloud_entry_cools_down_alone(sim, sim_factory, drover_env, cloud,
                                                  redis_url):
    asyncio.run(_throttled(sim, sim_factory, drover_env, cloud, redis_url))


async def _throttled(sim, sim_factory, drover_env, cloud, redis_url) -> None:  # noqa: ANN001
    throttling = sim_factory(provider=cloud, seed=1, tool_turns=0, rpm=1)
    tag = drover_env["DROVER_KEY_ALIAS"]
    entries = _entries(tag, sim.url, throttling.url, throttling.url,
                       bed={"rpm": 600, "tpm": 600_000},
                       vtx={"rpm": 600, "itpm": 600_000, "otpm": 60_000})
    settings = load_settings(model=MODEL, keys=entries, limit_groups={f"cls-{tag}": [MODEL]},
                             key_prefix=drover_env["DROVER_KEY_PREFIX"])
    alias = f"{'bed' if cloud == 'bedrock' else 'vtx'}-{tag}"
    entry = next(k for k in settings.keys if k.alias == alias)
    of = provider(cloud)
    client = of.build_key_client(entry, base_url=entry.base_url, connect_s=5, idle_s=30)
    clients = {k.alias: None for k in settings.keys} | {alias: client}
    route = Route(settings, MODEL, None, Pool(settings.keys, clients), provider("anthropic"))
    lim = AsyncLimiter(redis.asyncio.Redis.from_url(redis_url), prefix=settings.key_prefix)
    params = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    await of.stream_turn(client, params, Seen())  # the entry's one request a minute
    with pytest.raises(anthropic.RateLimitError) as throttled:
        await of.stream_turn(client, params, Seen())
    await client.close()

    failure = of.describe(throttled.value)
    assert failure.status_code == 429 and failure.kind == {
        "bedrock": "ThrottlingException", "vertex": "RESOURCE_EXHAUSTED"}[cloud]
    decision = classify(failure, attempt=0, base_s=0.2, cap_s=60)
    assert decision.action == "retry" and decision.cooldown_s is not None
    grant = await route.acquire(lim, input_tokens=10, output_tokens=10, lease_ttl_s=60,
                                prefer=alias)
    assert grant.key == alias
    await route.settle(lim, grant, input_tokens=0, output_tokens=0)
    await route.cooldown(lim, grant, decision.cooldown_s, throttled.value.response.headers)

    cls = f"cls-{tag}"
    cooling = {name: (await lim.state(scope))["cooldown_s"] for name, scope in (
        ("entry", pool_scope(alias, cls)), ("org", org_scope(cls)),
        ("api", pool_scope(f"api-{tag}", cls)))}
    assert cooling["entry"] > 0 and cooling["org"] == cooling["api"] == 0, cooling
    # Meanwhile the pool's next call goes to another entry, not into the cooldown.
    nxt = await route.acquire(lim, input_tokens=10, output_tokens=10, lease_ttl_s=60,
                              prefer=alias)
    assert nxt.granted and nxt.key != alias
    await route.release(lim, nxt)
    assert "token" not in json.dumps(failure.message) and "bedrock-key" not in failure.message
