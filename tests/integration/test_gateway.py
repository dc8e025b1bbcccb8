"""``drover gateway`` (issue 54): the provider's own HTTP API in front of the fleet's global
limits, for software that cannot import drover. A real gateway process, the real Redis, the
plain ``anthropic`` / ``openai`` SDKs (retries off), raw HTTP and the TypeScript SDK, against
the simulator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import httpx2
import pytest

from drover.workers.limiter import llm_scope
from drover.workers.telemetry import TelemetryReader
from tests.helpers import configure, wait_until
from tests.helpers.gateway import GATEWAY_KEYS, fingerprint
from tests.helpers.openai import MODEL as OPENAI_MODEL
from tests.helpers.openai import on_openai
from tests.helpers.private_redis import PrivateRedis

WEB, BATCH = GATEWAY_KEYS["web"], GATEWAY_KEYS["batch"]


def _settings():  # noqa: ANN202
    from drover.config import get_settings

    return get_settings()


def _limiter(settings):  # noqa: ANN001, ANN202
    from drover.workers.services import services

    return services(settings).limiter


def _scope(settings) -> str:  # noqa: ANN001
    return llm_scope(settings.key_alias, settings.limit_class(settings.model))


def _limiter_usage(settings) -> dict[str, int]:  # noqa: ANN001
    """What the limiter counted in the last minute on the default model's scope."""
    rows = _limiter(settings).usage(_scope(settings), 60)
    return {name: sum(row.get(name, 0) for row in rows)
            for name in ("requests", "input_tokens", "output_tokens")}


def _ask(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {i}: what changed in the quarter?"}]


def _client(gw, key: str = WEB, **kwargs) -> anthropic.Anthropic:  # noqa: ANN001, ANN003
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, **kwargs)


@contextlib.asynccontextmanager
async def _callers(gw) -> AsyncIterator[dict[str, anthropic.AsyncAnthropic]]:  # noqa: ANN001
    """An async client of each tenant of GATEWAY_KEYS on ``gw`` (retries off), closed after."""
    clients = {tenant: anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0,
                                                timeout=120)
               for tenant, key in GATEWAY_KEYS.items()}
    try:
        yield clients
    finally:
        for client in clients.values():
            await client.close()


def _post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    """A raw HTTP POST (no SDK): status, headers, body."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_a_wrong_or_missing_gateway_key_gets_the_providers_401_and_nothing_is_forwarded(
        drover_env, sim, gateway):
    """A key that is not one of DROVER_GATEWAY_KEYS (the provider's own key included) is
    refused with Anthropic's 401 shape, so the SDK raises AuthenticationError; nothing reaches
    the provider and nothing is reserved."""
    gw = gateway()
    settings = _settings()
    for key in ("dgw-not-one-of-ours-0123456789", drover_env["ANTHROPIC_API_KEY"]):
        with pytest.raises(anthropic.AuthenticationError) as refused:
            _client(gw, key).messages.create(model=settings.model, max_tokens=20,
                                             messages=_ask(0))
        assert "DROVER_GATEWAY_KEYS" in str(refused.value)
    status, _, body = _post(f"{gw.url}/v1/messages", {"model": settings.model,
                                                      "max_tokens": 20, "messages": _ask(1)},
                            {"anthropic-version": "2023-06-01"})
    assert status == 401
    assert json.loads(body)["error"]["type"] == "authentication_error"
    stats = sim.stats()
    assert stats["by_status"] == {} and stats["keys_seen"] == {}, stats["by_status"]
    assert _limiter_usage(settings)["requests"] == 0


def test_raw_http_and_the_sdk_get_answers_streamed_and_not_on_the_providers_key(
        drover_env, sim, gateway):
    """A raw HTTP request (no SDK, the key as a bearer token) gets a normal message; the plain
    SDK gets its message, its stream event by event and count_tokens. Every request reached
    the provider on the provider's key only; the limiter counted exactly what the provider
    billed; each tenant's requests and tokens are in the fleet's metrics."""
    sim.configure(tool_turns=0, output_tokens_mean=60)
    gw = gateway(DROVER_METRICS_FLUSH_S="0.2")
    settings = _settings()

    def tenants() -> dict[tuple[str, ...], float]:
        from drover.workers.services import services

        reader = TelemetryReader(services(settings).redis, settings.key_prefix)
        return {(name, *labels): value for name, labels, part, value in reader.counters()
                if name.startswith(("drover_gateway_", "drover_cost_usd")) and part is None}

    # The session's counters hold what earlier tests' gateways counted for the same tenants.
    before = tenants()
    status, headers, body = _post(
        f"{gw.url}/v1/messages", {"model": settings.model, "max_tokens": 80,
                                  "messages": _ask(1)},
        {"authorization": f"Bearer {BATCH}", "anthropic-version": "2023-06-01"})
    assert status == 200, body
    raw = json.loads(body)
    assert raw["type"] == "message" and raw["content"][0]["text"] and raw["usage"]["output_tokens"]
    assert drover_env["ANTHROPIC_API_KEY"].encode() not in body + json.dumps(headers).encode()

    client = _client(gw)
    whole = client.messages.create(model=settings.model, max_tokens=80, messages=_ask(2))
    assert whole.content[0].text and whole.usage.output_tokens > 0
    kinds = []
    with client.messages.stream(model=settings.model, max_tokens=80, messages=_ask(3)) as stream:
        for event in stream:
            kinds.append(event.type)
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and "content_block_delta" in kinds
    assert streamed.usage.output_tokens > 0
    assert client.messages.count_tokens(model=settings.model, messages=_ask(4)).input_tokens > 0

    stats = sim.stats()
    assert stats["keys_seen"] == {fingerprint(drover_env["ANTHROPIC_API_KEY"]): 4}
    assert stats["accepted"] == 3 and stats["rejected_429"] == 0
    counted = _limiter_usage(settings)
    assert counted == {"requests": 3, "input_tokens": stats["billed"]["input_tokens"],
                       "output_tokens": stats["billed"]["output_tokens"]}

    def counted() -> dict[tuple[str, ...], float]:
        now = tenants()
        return {k: v - before.get(k, 0.0) for k, v in now.items()}

    seen = wait_until("the gateway's counts in Redis",
                      lambda: (t := counted()).get(("drover_gateway_requests", "web", "ok")) == 3
                      and t)
    assert seen[("drover_gateway_requests", "batch", "ok")] == 1
    assert seen[("drover_gateway_tokens", "batch", "output")] == raw["usage"]["output_tokens"]
    assert seen[("drover_gateway_tokens", "web", "output")] == (
        whole.usage.output_tokens + streamed.usage.output_tokens)
    # Each answer's dollars counted once, as its caller's tenant's.
    price = settings.price_of(settings.model)
    assert seen[("drover_cost_usd", settings.model, "web")] == pytest.approx(sum(
        price.cost(u.input_tokens, u.output_tokens) for u in (whole.usage, streamed.usage)))
    # Neither a prompt nor a key is in the gateway's log (one line per request: --verbose).
    log = gw.log.read_text()
    assert "tenant=web path=/v1/messages status=200" in log
    for secret in ("what changed in the quarter", WEB, BATCH, drover_env["ANTHROPIC_API_KEY"]):
        assert secret not in log
    # drover stats shows each tenant's use of the gateway.
    from io import StringIO

    from rich.console import Console

    from drover.orchestrator.ops.stats import print_stats
    from drover.workers.services import services

    out = StringIO()
    print_stats(Console(file=out, width=200), services(settings))
    line = next(x for x in out.getvalue().splitlines() if x.startswith("gateway tenant=web"))
    total = tenants()  # since the counters began: this test's calls and earlier tests'
    assert f"ok {int(total[('drover_gateway_requests', 'web', 'ok')])}" in line and \
        f"output {int(total[('drover_gateway_tokens', 'web', 'output')]):,}" in line, line


def test_two_gateway_processes_together_stay_inside_the_limits(
        monkeypatch, drover_env, sim, gateway):
    """40 calls at once (half streamed) through two gateway processes into 5 requests a
    second: sent straight to the provider, 35 would be refused; through the gateways they
    wait in the fleet's one line, all answered, no 429."""
    sim.configure(rpm=300, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=300, burst_seconds=1)
    gateways = [gateway(), gateway()]
    settings = _settings()

    async def one(i: int) -> int:
        gw = gateways[i % 2]
        client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=WEB if i % 3 else BATCH,
                                          max_retries=0, timeout=120)
        try:
            if i % 4 < 2:
                async with client.messages.stream(model=settings.model, max_tokens=40,
                                                  messages=_ask(i)) as stream:
                    return (await stream.get_final_message()).usage.output_tokens
            return (await client.messages.create(model=settings.model, max_tokens=40,
                                                 messages=_ask(i))).usage.output_tokens
        finally:
            await client.close()

    async def fan_out() -> list[object]:
        return await asyncio.gather(*(one(i) for i in range(40)), return_exceptions=True)

    results = asyncio.run(fan_out())
    failed = [r for r in results if isinstance(r, BaseException)]
    stats = sim.stats()
    assert not failed, failed[:2]
    assert stats["rejected_429"] == 0, stats["timeline"]
    assert stats["accepted"] == 40
    assert stats["max_60s"]["requests"] <= 300


def test_a_gateway_that_loses_redis_answers_503_and_forwards_nothing(
        drover_env, sim, gateway, tmp_path):
    """With its Redis gone the gateway cannot keep the limits: it says so with a 503 in the
    provider's shape (the SDK's InternalServerError) and sends nothing unlimited."""
    private = PrivateRedis(tmp_path)
    private.start()
    try:
        gw = gateway(DROVER_REDIS_URL=private.url)
        settings = _settings()
        client = _client(gw)
        assert client.messages.create(model=settings.model, max_tokens=20,
                                      messages=_ask(0)).usage.output_tokens > 0
        private.kill()
        wait_until("the gateway's /health to say its Redis is gone", lambda: not gw.healthy(),
                   30)
        with pytest.raises(anthropic.InternalServerError) as refused:
            client.messages.create(model=settings.model, max_tokens=20, messages=_ask(1))
        assert refused.value.status_code == 503
        assert "Redis" in str(refused.value) and "not forwarded" in str(refused.value)
        assert sim.stats()["by_status"] == {"200": 1}
        gw.kill()
    finally:
        private.kill()


def test_a_caller_that_leaves_mid_stream_releases_its_lease_and_is_billed_what_streamed(
        drover_env, sim, gateway):
    """A streamed answer whose caller closes the connection after a few events: the gateway
    closes it at the provider, releases its lease and settles what the provider billed (the
    output generated until the close), not the whole answer nor nothing."""
    sim.configure(tool_turns=0, output_tokens_mean=600, output_tokens_per_s=150)
    gw = gateway()
    settings = _settings()
    body = {"model": settings.model, "max_tokens": 1200, "stream": True, "messages": _ask(0)}
    headers = {"x-api-key": WEB, "anthropic-version": "2023-06-01"}
    events = 0
    with httpx2.Client(timeout=60) as http, http.stream("POST", f"{gw.url}/v1/messages",
                                                      json=body, headers=headers) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            events += line.startswith("event: content_block_delta")
            if events == 5:
                break  # leaving the block closes the connection mid-answer
    scope = _scope(settings)
    wait_until("the lease released", lambda: _limiter(settings).state(scope)["leases"] == 0, 20)
    wait_until("the simulator saw the stream abandoned",
               lambda: sim.stats()["streams"]["abandoned"] == 1, 20)
    stats = sim.stats()
    counted = wait_until("the stream settled",
                         lambda: (c := _limiter_usage(settings))["output_tokens"] and c, 20)
    billed = stats["billed"]["output_tokens"]
    assert counted["requests"] == 1 and counted["input_tokens"] == stats["billed"]["input_tokens"]
    assert 0 < billed < 600 and 0 < counted["output_tokens"] < 600, (counted, billed)
    # What it counted is what had streamed to the gateway, within the few events in flight.
    assert abs(counted["output_tokens"] - billed) <= max(20, billed // 2), (counted, billed)


def test_a_caller_that_leaves_while_waiting_in_line_is_never_sent(
        monkeypatch, drover_env, sim, gateway):
    """One request a second (a bucket of one): a call waiting its turn behind another whose
    caller gives up leaves the line; it is never sent and its reservation goes back."""
    sim.configure(rpm=60, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=60, burst_seconds=1)
    gw = gateway(DROVER_METRICS_FLUSH_S="0.2")
    settings = _settings()
    client = _client(gw)
    assert client.messages.create(model=settings.model, max_tokens=20,
                                  messages=_ask(0)).usage.output_tokens > 0
    with pytest.raises(anthropic.APITimeoutError):  # the caller leaves after 0.3 s
        _client(gw, timeout=0.3).messages.create(model=settings.model, max_tokens=20,
                                                 messages=_ask(1))
    scope = _scope(settings)
    from drover.workers.services import services

    reader = TelemetryReader(services(settings).redis, settings.key_prefix)
    # The gateway's handler has seen the caller leave (counted once its call left the line):
    # before that, under load, the call may not even have reserved yet.
    wait_until("the gateway to see the caller leave", lambda: any(
        name == "drover_gateway_requests" and labels == ("web", "disconnected") and value
        for name, labels, _, value in reader.counters()), 20)
    wait_until("the reservation given back", lambda: _limiter_usage(settings)["requests"] == 1,
               20)
    assert _limiter(settings).state(scope)["leases"] == 0
    assert client.messages.create(model=settings.model, max_tokens=20,
                                  messages=_ask(2)).usage.output_tokens > 0
    stats = sim.stats()
    assert stats["accepted"] == 2 and stats["rejected_429"] == 0


def test_on_the_openai_provider_chat_completions_go_through_streamed_and_not(
        monkeypatch, drover_env, sim_factory, gateway):
    """DROVER_PROVIDER=openai: the gateway speaks Chat Completions; the plain openai SDK (its
    key as a bearer token) gets its answers, streamed and not, counted as billed."""
    import openai

    oai = on_openai(monkeypatch, drover_env, sim_factory, tool_turns=0, output_tokens_mean=30)
    gw = gateway()
    settings = _settings()
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=WEB, max_retries=0)
    whole = client.chat.completions.create(model=OPENAI_MODEL, max_tokens=60,
                                           messages=_ask(1))
    assert whole.choices[0].message.content and whole.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(
        model=OPENAI_MODEL, max_tokens=60, messages=_ask(2), stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-wrong", max_retries=0
                      ).chat.completions.create(model=OPENAI_MODEL, max_tokens=5,
                                                messages=_ask(3))
    stats = oai.stats()
    assert stats["accepted"] == 2 and stats["keys_seen"] == {fingerprint("sk-sim"): 2}
    assert _limiter_usage(settings)["requests"] == 2


# --- the TypeScript SDK ------------------------------------------------------------------

TS_SDK = "@anthropic-ai/sdk"
TS_SCRIPT = """
import Anthropic from '@anthropic-ai/sdk';
const client = new Anthropic({baseURL: process.env.GATEWAY_URL, apiKey: process.env.GATEWAY_KEY,
                              maxRetries: 0});
const params = {model: process.env.MODEL, max_tokens: 60,
                messages: [{role: 'user', content: 'what changed in the quarter?'}]};
const whole = await client.messages.create(params);
let deltas = 0;
const stream = client.messages.stream(params);
stream.on('text', () => { deltas += 1; });
const streamed = await stream.finalMessage();
let refused = '';
try {
  await new Anthropic({baseURL: process.env.GATEWAY_URL, apiKey: 'dgw-wrong-0123456789abc',
                       maxRetries: 0}).messages.create(params);
} catch (error) { refused = error.constructor.name + ' ' + error.status; }
console.log(JSON.stringify({text: whole.content[0].text, out: whole.usage.output_tokens,
                            streamed_out: streamed.usage.output_tokens, deltas, refused}));
"""


def _ts_sdk() -> Path:
    """A directory of this test's own holding @anthropic-ai/sdk from npm (installed once, in
    the user's cache); skips, saying why, where node or npm or the registry is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the TypeScript SDK test needs node and npm on PATH")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "drover-tests" / "gateway-ts"
    if not (home / "node_modules" / "@anthropic-ai" / "sdk" / "package.json").is_file():
        home.mkdir(parents=True, exist_ok=True)
        (home / "package.json").write_text('{"private": true, "type": "module"}\n')
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", TS_SDK],
                              cwd=home, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.skip(f"npm could not install {TS_SDK} (no registry?): "
                        f"{(done.stderr or done.stdout).strip()[-300:]}")
    return home


def test_the_typescript_sdk_gets_its_answers_streamed_and_not(drover_env, sim, gateway):
    """The TypeScript SDK, pointed at the gateway by its baseURL and a gateway key, gets a
    message and a stream of text events; a wrong key is its AuthenticationError."""
    home = _ts_sdk()
    sim.configure(tool_turns=0, output_tokens_mean=40)
    gw = gateway()
    settings = _settings()
    script = home / "gateway_check.mjs"
    script.write_text(TS_SCRIPT)
    done = subprocess.run(["node", str(script)], cwd=home, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "GATEWAY_URL": gw.url,
                                            "GATEWAY_KEY": WEB, "MODEL": settings.model})
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["text"] and said["out"] > 0 and said["streamed_out"] > 0 and said["deltas"] > 0
    assert said["refused"] == "AuthenticationError 401"
    stats = sim.stats()
    assert stats["accepted"] == 2 and stats["rejected_429"] == 0
    assert _limiter_usage(settings)["requests"] == 2


@pytest.mark.parametrize("missing", ["DROVER_GATEWAY_KEYS", "ANTHROPIC_API_KEY"])
def test_a_gateway_without_its_callers_keys_or_the_providers_key_refuses_to_start(
        drover_env, missing):
    """Without callers' keys every request would be refused, without the provider's key
    every call would be: drover gateway says which in one line and exits 2."""
    import sys

    from tests.helpers import ROOT

    env = {**os.environ, **drover_env, "DROVER_GATEWAY_KEYS": json.dumps(
        [{"key": WEB, "tenant": "web"}])}
    env.pop(missing)
    env.pop("DROVER_ANTHROPIC_BASE_URL")  # a keyless endpoint would need no key
    done = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "gateway",
                           "--port", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert missing in line and "Traceback" not in done.stderr


def _answered(gw) -> list[str]:  # noqa: ANN001
    """The tenants of the gateway's answers in the order it gave them (its log's lines)."""
    return [line.split("tenant=")[1].split()[0] for line in gw.log.read_text().splitlines()
            if "gateway tenant=" in line]


def test_a_caller_flooding_the_gateway_leaves_a_second_caller_its_fair_share(
        monkeypatch, drover_env, sim, gateway):
    """Tenant batch sends 200 calls at once, tenant web 10 once batch's are all in line, into
    15 requests a second with a 4-s horizon (a line of 54 calls) and the default 32 leases in
    flight: web's calls take their tenant's half of the places that free up, as a fleet
    job's tenant would, instead of waiting behind batch's whole backlog at the limiter (first
    come, first served: all 200 of batch's would go before web's last). The places stay
    within the leases: a call beyond them would poll the limiter for one, and web's would
    draw lots with batch's for each lease that frees (seen: 119 of batch's answered first).
    Asserted on the order the answers came in."""
    sim.configure(rpm=900, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=900, burst_seconds=1, horizon_s=4)
    gw = gateway()
    settings = _settings()
    from drover.orchestrator.ops.metrics import DroverCollector
    from drover.workers.fairshare import FairShare
    from drover.workers.services import services
    from tests.helpers.metrics import scrape, value

    fs = FairShare.from_settings(services(settings).redis, settings)
    assert _client(gw).messages.create(model=settings.model, max_tokens=20,
                                       messages=_ask(0)).usage.output_tokens > 0
    cap = wait_until("the gateway to size the line", fs.cap, 20)
    leases = int(fs.r.get(fs.leases_key))
    assert leases == settings.max_in_flight < cap  # the default leases bind, not the rate
    held = min(cap, leases)  # calls that hold a place at once
    came: list[int] = []  # batch's calls answered when web's were all in line

    def in_line(tenant: str, what: str = "n") -> int:
        return sum(getattr(j, what) for j in fs.jobs() if j.calls and j.tenant == tenant)

    async def run() -> list[object]:
        async with _callers(gw) as clients:
            return await flood_then_few(clients)

    async def flood_then_few(clients: dict[str, anthropic.AsyncAnthropic]) -> list[object]:
        def one(tenant: str, i: int) -> asyncio.Task:
            return asyncio.create_task(clients[tenant].messages.create(
                model=settings.model, max_tokens=20, messages=_ask(i)))

        flood = [one("batch", i) for i in range(200)]
        entered = in_line("batch") + 200
        while in_line("batch") < entered:  # every one of batch's calls is in line first
            await asyncio.sleep(0.05)
        web_entered = in_line("web") + 10
        few = [one("web", i) for i in range(10)]
        # Sent as soon as batch's are all in line, and counted from when web's are in the
        # gateway's line, not from when this loop (busy reading batch's answers) sent them:
        # under load that took seconds while batch's were answered (89 ahead of web's last, at
        # load 18). The scrape comes after: at load 10-18 it took long enough that batch's line
        # had drained to 51 of 200 before web's came (149 answered), too few left for the
        # order to tell fair share from first come, first served.
        while in_line("web") < web_entered:
            await asyncio.sleep(0.02)
        came.append(in_line("batch", "done"))
        # What the exporter (and the dashboard's gateway row) says meanwhile, in one
        # snapshot of the line (web's in it too): each of batch's calls not yet answered waits
        # in line or holds a place, and at most the places (the cap, within the leases) hold
        # one. (Calls are answered while the scrape runs: how many, the load decides; the
        # answers before and after it bound it.)
        done_before = in_line("batch", "done")
        families = scrape(DroverCollector(services(settings), broker_queues=False))
        done_after = in_line("batch", "done")
        waiting = value(families, "drover_gateway_calls", tenant="batch", state="in_line")
        out = value(families, "drover_gateway_calls", tenant="batch", state="out")
        assert out <= held and waiting > 0
        assert entered - done_after <= waiting + out <= entered - done_before
        return await asyncio.gather(*flood, *few, return_exceptions=True)

    results = asyncio.run(run())
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, failed[:2]
    assert sim.stats()["rejected_429"] == 0
    answered = _answered(gw)[1:]  # after the first call, web's
    last_web = max(i for i, tenant in enumerate(answered) if tenant == "web")
    ahead = answered[:last_web].count("batch") - came[0]
    print(f"line cap {cap}, {leases} leases; of batch's {200 - came[0]} calls left when "
          f"web's came, {ahead} were answered before web's last")
    # Ahead of web's: the places batch held when web's calls were in line (at most the
    # leases), and answers that overtook in flight. First come,
    # first served: all of them.
    assert ahead <= held + 30 < 200 - came[0], (ahead, cap, leases, came)


def test_a_key_over_its_own_limit_waits_in_line_while_other_keys_go(
        monkeypatch, drover_env, sim, gateway):
    """web's key has a limit of its own, 60 requests a minute (one a second), far below the
    key's: its 6 calls sent at once wait in line for it, one a second, and are never sent
    past it; batch's key, with none, has its 6 answered at once meanwhile. Asserted on the
    order the gateway answered in and on the key's scope in the limiter."""
    from drover.orchestrator.gateway._callers import key_scope

    sim.configure(tool_turns=0, output_tokens_mean=20)
    keys = [{"key": WEB, "tenant": "web", "rpm": 60},
            {"key": BATCH, "tenant": "batch"}]
    gw = gateway(DROVER_GATEWAY_KEYS=json.dumps(keys))
    settings = _settings()

    async def run() -> list[object]:
        async with _callers(gw) as clients:
            return await asyncio.gather(*(clients[tenant].messages.create(
                model=settings.model, max_tokens=20, messages=_ask(i))
                for i in range(6) for tenant in ("web", "batch")), return_exceptions=True)

    results = asyncio.run(run())
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, failed[:2]
    stats = sim.stats()
    assert stats["accepted"] == 12 and stats["rejected_429"] == 0
    answered = _answered(gw)
    # The key's bucket holds one request (a second of refill): web's first goes at once,
    # each of the others a second after the one before, batch's meanwhile all at once.
    webs = [i for i, tenant in enumerate(answered) if tenant == "web"]
    assert max(i for i, tenant in enumerate(answered) if tenant == "batch") < webs[2], answered
    from drover.config import GatewayKey
    from drover.workers.limiter import ScopeLimits

    scope = key_scope(GatewayKey(key=WEB, tenant="web"))
    state = _limiter(settings).state(scope, ScopeLimits(rpm=60))
    assert state["leases"] == 0
    assert sum(row.get("requests", 0) for row in _limiter(settings).usage(scope, 60)) == 6
    from io import StringIO

    from rich.console import Console

    from drover.orchestrator.ops.stats import print_stats
    from drover.workers.services import services

    out = StringIO()
    print_stats(Console(file=out, width=200), services(settings))
    assert scope in out.getvalue() and WEB not in out.getvalue()


def test_the_places_of_a_gateway_killed_mid_flood_go_back_to_the_other_gateways_callers(
        monkeypatch, drover_env, sim, gateway):
    """Two gateways and no worker, 60 requests a minute (a line of 12 calls): one gateway
    holds the whole line with 30 calls of tenant batch when it is killed (kill -9). Its calls
    job stays in the window until its liveness mark lapses; then the other gateway frees its
    places, and web's calls through the other gateway are answered."""
    sim.configure(rpm=60, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=60, burst_seconds=1)
    doomed, other = gateway(), gateway()
    settings = _settings()
    from drover.workers.fairshare import FairShare
    from drover.workers.services import services

    fs = FairShare.from_settings(services(settings).redis, settings)
    assert _client(other).messages.create(model=settings.model, max_tokens=20,
                                          messages=_ask(0)).usage.output_tokens > 0
    cap = wait_until("the line sized", fs.cap, 20)
    flood = subprocess.Popen(  # a caller of its own, left hanging when its gateway dies
        [sys.executable, "-c", (
            "import asyncio, anthropic\n"
            "async def main():\n"
            f"    c = anthropic.AsyncAnthropic(base_url={doomed.url!r}, api_key={BATCH!r},"
            " max_retries=0, timeout=600)\n"
            f"    await asyncio.gather(*(c.messages.create(model={settings.model!r},"
            " max_tokens=20, messages=[{'role': 'user', 'content': 'x'}]) for _ in range(30)),"
            " return_exceptions=True)\n"
            "asyncio.run(main())\n")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def held() -> int:
            return sum(j.out for j in fs.jobs() if j.calls and j.tenant == "batch")

        wait_until("the doomed gateway's calls to hold the line",
                   lambda: held() >= cap and all(
                       j.waiting for j in fs.jobs() if j.calls and j.tenant == "batch"), 30)
        doomed.kill()
        answered = asyncio.run(_few(other, settings.model, 3))
        assert answered == 3
        assert not [j for j in fs.jobs() if j.calls and j.tenant == "batch"]
    finally:
        flood.kill()
        flood.wait()


async def _few(gw, model: str, n: int) -> int:  # noqa: ANN001
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=WEB, max_retries=0, timeout=120)
    try:
        done = await asyncio.gather(*(client.messages.create(
            model=model, max_tokens=20, messages=_ask(i)) for i in range(n)))
        return len(done)
    finally:
        await client.close()
