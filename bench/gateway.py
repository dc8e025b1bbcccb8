"""Issue 54's goal: ``drover gateway`` keeps software outside the fleet inside the fleet's
limits, and costs a caller next to nothing.

    python -m bench.gateway [--quick] [--n 150] [--calls 100] [--samples 300] [--in-flight 500]
                            [--only binding|overhead|fairness]

1. **Shared binding limit.** 150 one-call sub-agents (a ~700-token prompt each) on two worker
   processes of 8 threads, at a binding input-tokens limit (ITPM), while another process
   sends 100 calls at once (half streamed, the plain ``anthropic`` SDK, ``max_retries=0``)
   through a gateway process. Printed: sub-agents ok, gateway calls ok, the simulator's 429s,
   the busy time (its first acceptance to its last answer) and its ratio to the lower bound of
   the combined demand: the input tokens the simulator counted, less the one bucket drover
   starts with, over the rate (bench/_binding.py, bench/tool_turns.py). Goal: all ok, 0 429s,
   ratio <= 1.10.
2. **Overhead, limits far away.** The same streamed request sent alternately straight to the
   simulator and through the gateway (one at a time, raw HTTP), the time to first byte (to the
   answer's first body bytes) of each: the gateway's added median. Goal <= 3 ms.
3. **Held in flight.** 500 streamed calls at once through the gateway, each answered 20 s
   after its admission: the simulator's most requests in flight at once. Goal: 500, all ok.
4. **Fair share between callers** (not in ``--quick``). Tenant ``flood`` sends 200 calls at
   once, tenant ``few`` 10 once the flood's are all in line, at a binding 900 RPM with a 4-s
   horizon; run with the fair-share line (``DROVER_WAIT_IN_LINE=true``, the default) and
   without it (first come, first served at the limiter), one after the other. Printed for
   each: the median and last wait of each tenant's calls, and ``few``'s median over the
   flood's. Goal: with the line, ``few`` waits about the line's length (what the flood had
   booked when it came), not behind the flood's whole backlog. At the default
   ``DROVER_MAX_IN_FLIGHT`` (32; the other parts hold hundreds of calls in flight and set
   2000).

Every figure is measured within one run, on this machine as loaded at the time (the load
average is printed with them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.contenders.common import delete_prefix
from bench.recovery import kill_workers, spawn_worker
from drover.orchestrator.ops.services import free_port
from drover.simulator import SimConfig, SimulatorServer

ROOT = Path(__file__).resolve().parents[1]
REDIS = os.environ.get("DROVER_REDIS_URL") or "redis://127.0.0.1:6379/0"
KEY = "dgw-bench-0123456789abcdef"
BURST_S = 1
PROMPT = "You are a careful port inspector; weigh the evidence. " * 50  # ~700 input tokens
MAX_TOKENS = 60


def _env(tag: str, sim: SimulatorServer, **limits: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DROVER_REDIS_URL": REDIS,
            "DROVER_KEY_PREFIX": f"bench-gw-{tag}", "DROVER_QUEUE": f"bench-gw-{tag}",
            "DROVER_KEY_ALIAS": f"bench-gw-{tag}", "DROVER_ANTHROPIC_BASE_URL": sim.url,
            "ANTHROPIC_API_KEY": "sk-bench", "DROVER_BURST_SECONDS": str(BURST_S),
            "DROVER_GATEWAY_KEYS": json.dumps([{"key": KEY, "tenant": "outside"}]),
            "DROVER_MAX_IN_FLIGHT": "2000", **limits}


def _gateway(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(os.environ.get("BENCH_GATEWAY_LOG", os.devnull), "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "drover.orchestrator.cli", "gateway",
                             "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("drover gateway did not start") from None
            time.sleep(0.2)


# --- 1. the fleet and an outside caller at a binding limit -------------------------------

def binding(n: int, calls: int, itpm: int) -> dict[str, Any]:
    sim = SimulatorServer(SimConfig(seed=1, rpm=100_000, itpm=itpm, otpm=10_000_000,
                                    burst_s=BURST_S, latency_mean_s=0.4, latency_p95_s=0.6,
                                    tool_turns=0, output_tokens_mean=40)).start()
    tag = uuid.uuid4().hex[:6]
    env = _env(tag, sim, DROVER_RPM="100000", DROVER_ITPM=str(itpm), DROVER_OTPM="10000000")
    os.environ.clear()
    os.environ.update(env)
    from drover import JobSpec, submit
    from drover.config import get_settings

    get_settings.cache_clear()
    model = get_settings().model
    workers = [spawn_worker(env, f"gw{i}-{tag}", threads=8) for i in range(2)]
    gateway, url = _gateway(env)
    try:
        time.sleep(3)  # the workers come up
        handle = submit(JobSpec(subtasks=[f"Inspect pier {i}" for i in range(n)],
                                system=PROMPT, max_tokens=MAX_TOKENS))
        caller = subprocess.run([sys.executable, "-m", "bench.gateway", "--caller", url,
                                 "--calls", str(calls), "--model", model], cwd=ROOT,
                                env=env, capture_output=True, text=True, timeout=1800)
        outside = json.loads(caller.stdout.strip().splitlines()[-1]) if caller.stdout else {
            "ok": 0, "errors": [caller.stderr[-500:]]}
        result = handle.wait(timeout=1800)
        stats = sim.stats()
        rate = itpm / 60
        bound = max((stats["billed"]["input_tokens"] - rate * BURST_S) / rate, 1e-9)
        busy = stats["last_done_ts"] - stats["first_accept_ts"]
        return {"subagents": n, "subagents_ok": result.counts["ok"], "gateway_calls": calls,
                "gateway_ok": outside["ok"], "gateway_errors": outside["errors"][:3],
                "n429": stats["rejected_429"], "accepted": stats["accepted"],
                "input_tokens": stats["billed"]["input_tokens"], "itpm": itpm,
                "busy_s": round(busy, 1), "bound_s": round(bound, 1),
                "ratio": round(busy / bound, 3), "load": round(os.getloadavg()[0], 1)}
    finally:
        kill_workers([*workers, gateway])
        sim.stop()
        delete_prefix(REDIS, env["DROVER_KEY_PREFIX"])


async def _outside_calls(url: str, calls: int, model: str) -> dict[str, Any]:
    """The other process: ``calls`` at once through the gateway, half streamed, the plain
    SDK with its retries off."""
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0, timeout=1800)

    async def one(i: int) -> int:
        params = {"model": model, "max_tokens": MAX_TOKENS, "system": PROMPT,
                  "messages": [{"role": "user", "content": f"Inspect crane {i}"}]}
        if i % 2:
            async with client.messages.stream(**params) as stream:
                return (await stream.get_final_message()).usage.output_tokens
        return (await client.messages.create(**params)).usage.output_tokens

    results = await asyncio.gather(*(one(i) for i in range(calls)), return_exceptions=True)
    errors = [f"{type(r).__name__}: {r}"[:200] for r in results if isinstance(r, BaseException)]
    return {"ok": calls - len(errors), "errors": errors}


# --- 2. time to first byte, straight and through the gateway ------------------------------

async def _first_byte(http: Any, url: str, key: str, model: str) -> float:
    body = {"model": model, "max_tokens": 20, "stream": True,
            "messages": [{"role": "user", "content": "Inspect crane 1"}]}
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    started = time.perf_counter()
    async with http.stream("POST", f"{url}/v1/messages", json=body, headers=headers) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}")
        chunks = answer.aiter_raw()
        await chunks.__anext__()
        first = time.perf_counter() - started
        async for _chunk in chunks:
            pass
    return first


def overhead(samples: int, in_flight: int) -> dict[str, Any]:
    sim = SimulatorServer(SimConfig(seed=1, rpm=10_000_000, itpm=10_000_000_000,
                                    otpm=10_000_000_000, tool_turns=0,
                                    output_tokens_mean=20)).start()
    tag = uuid.uuid4().hex[:6]
    env = _env(tag, sim, DROVER_RPM="10000000", DROVER_ITPM="10000000000",
               DROVER_OTPM="10000000000")
    model = "claude-sonnet-4-5"
    gateway, url = _gateway({**env, "DROVER_MODEL": model})
    try:
        return asyncio.run(_measure(sim, url, model, samples, in_flight))
    finally:
        kill_workers([gateway])
        sim.stop()
        delete_prefix(REDIS, env["DROVER_KEY_PREFIX"])


async def _measure(sim: SimulatorServer, url: str, model: str, samples: int,
                   in_flight: int) -> dict[str, Any]:
    import httpx2

    limits = httpx2.Limits(max_connections=in_flight + 50, max_keepalive_connections=50)
    async with httpx2.AsyncClient(limits=limits, timeout=300) as http:
        for _ in range(20):  # both paths warm (connections, the gateway's first calls)
            await _first_byte(http, sim.url, "sk-bench", model)
            await _first_byte(http, url, KEY, model)
        direct, through = [], []
        for _ in range(samples):  # alternately, so load changes hit both alike
            direct.append(await _first_byte(http, sim.url, "sk-bench", model))
            through.append(await _first_byte(http, url, KEY, model))
        sim.reset()
        # Each answer's first token comes 20 s after its admission (a long prompt read): the
        # calls overlap however slowly they start, and the streams cost no CPU meanwhile.
        sim.configure(output_tokens_mean=10, ttft_s=20.0)
        held = await asyncio.gather(*(_first_byte(http, url, KEY, model)
                                      for _ in range(in_flight)), return_exceptions=True)
    stats = sim.stats()
    failed = [f"{type(r).__name__}: {r}"[:200] for r in held if isinstance(r, BaseException)]
    med_direct, med_through = statistics.median(direct), statistics.median(through)
    return {"samples": samples, "ttfb_direct_ms": round(med_direct * 1000, 2),
            "ttfb_gateway_ms": round(med_through * 1000, 2),
            "added_ms": round((med_through - med_direct) * 1000, 2),
            "in_flight_sent": in_flight, "in_flight_ok": in_flight - len(failed),
            "in_flight_errors": failed[:3], "sim_max_in_flight": stats["max_in_flight"],
            "n429": stats["rejected_429"], "load": round(os.getloadavg()[0], 1)}


# --- 4. fair share between two callers ----------------------------------------------------

FAIR_KEYS = {"flood": "dgw-bench-flood-0123456789ab", "few": "dgw-bench-few-0123456789abcd"}


def fairness(flood: int, few: int, rpm: int) -> dict[str, Any]:
    out: dict[str, Any] = {"flood_calls": flood, "few_calls": few, "rpm": rpm}
    for line in ("on", "off"):
        sim = SimulatorServer(SimConfig(seed=1, rpm=rpm, burst_s=BURST_S, tool_turns=0,
                                        output_tokens_mean=20)).start()
        tag = uuid.uuid4().hex[:6]
        # The default in-flight leases (32): the fair share holds at the defaults.
        env = _env(tag, sim, DROVER_RPM=str(rpm), DROVER_HORIZON_S="4",
                   DROVER_MODEL="claude-sonnet-4-5", DROVER_MAX_IN_FLIGHT="32",
                   DROVER_WAIT_IN_LINE="true" if line == "on" else "false",
                   DROVER_GATEWAY_KEYS=json.dumps([{"key": key, "tenant": tenant}
                                                   for tenant, key in FAIR_KEYS.items()]))
        gateway, url = _gateway(env)
        try:
            waits = asyncio.run(_two_callers(url, env, flood, few))
            stats = sim.stats()
        finally:
            kill_workers([gateway])
            sim.stop()
            delete_prefix(REDIS, env["DROVER_KEY_PREFIX"])
        med = {t: statistics.median(w) for t, w in waits.items()}
        out[f"line_{line}"] = {
            "few_median_s": round(med["few"], 2), "few_last_s": round(max(waits["few"]), 2),
            "flood_median_s": round(med["flood"], 2),
            "flood_last_s": round(max(waits["flood"]), 2),
            "few_over_flood_median": round(med["few"] / med["flood"], 2),
            "n429": stats["rejected_429"], "accepted": stats["accepted"]}
    out["load"] = round(os.getloadavg()[0], 1)
    return out


async def _two_callers(url: str, env: dict[str, str], flood: int, few: int
                       ) -> dict[str, list[float]]:
    """Each call's time from its send to its answer, by tenant: the flood first, the few
    once every call of the flood is in the gateway's line."""
    import anthropic
    import redis

    from drover.config import load_settings
    from drover.workers.fairshare import FairShare

    settings = load_settings(key_prefix=env["DROVER_KEY_PREFIX"], queue=env["DROVER_QUEUE"])
    fs = FairShare.from_settings(redis.Redis.from_url(REDIS), settings)
    clients = {tenant: anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0,
                                                timeout=600)
               for tenant, key in FAIR_KEYS.items()}
    waits: dict[str, list[float]] = {"flood": [], "few": []}

    async def one(tenant: str, i: int) -> None:
        started = time.monotonic()
        await clients[tenant].messages.create(
            model="claude-sonnet-4-5", max_tokens=20,
            messages=[{"role": "user", "content": f"Inspect crane {i}"}])
        waits[tenant].append(time.monotonic() - started)

    await one("few", -1)  # the gateway sizes the line for the model's class
    waits["few"].clear()
    calls = [asyncio.create_task(one("flood", i)) for i in range(flood)]
    while sum(j.n for j in fs.jobs() if j.calls and j.tenant == "flood") < flood:
        await asyncio.sleep(0.05)
    calls += [asyncio.create_task(one("few", i)) for i in range(few)]
    try:
        await asyncio.gather(*calls)
    finally:
        for client in clients.values():
            await client.close()
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small run of each part (the smoke test's)")
    parser.add_argument("--n", type=int, default=150, help="sub-agents of the fleet's job")
    parser.add_argument("--calls", type=int, default=100, help="calls through the gateway")
    parser.add_argument("--itpm", type=int, default=200_000, help="the binding input limit")
    parser.add_argument("--samples", type=int, default=300, help="time-to-first-byte pairs")
    parser.add_argument("--in-flight", type=int, default=500, help="calls held at once")
    parser.add_argument("--only", choices=["binding", "overhead", "fairness"],
                        help="run one part")
    parser.add_argument("--caller", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.caller:  # the other process of part 1
        print(json.dumps(asyncio.run(_outside_calls(args.caller, args.calls, args.model))))
        return
    if args.quick:
        args.n, args.calls, args.itpm, args.samples, args.in_flight = 20, 10, 60_000, 20, 40
    base = dict(os.environ)
    if not args.only or args.only == "binding":
        print(json.dumps({"part": "binding", **binding(args.n, args.calls, args.itpm)}),
              flush=True)
        os.environ.clear()
        os.environ.update(base)
    if not args.only or args.only == "overhead":
        print(json.dumps({"part": "overhead", **overhead(args.samples, args.in_flight)}),
              flush=True)
    if args.only == "fairness" or (not args.only and not args.quick):
        print(json.dumps({"part": "fairness", **fairness(200, 10, 900)}), flush=True)


if __name__ == "__main__":
    main()
