"""What one limiter decision costs: median latency of ``acquire`` against a bare PING on the
same connection, and of the whole limiter work of one LLM call (``acquire``, then ``settle``
with the response's rate-limit headers, as ``workers/agent/llm.py`` does); acquires/s from one
process. Measured twice: with the sync ``Limiter`` over ``redis.Redis``, and on the path a
worker takes for every LLM call, ``AsyncLimiter`` over ``redis.asyncio`` (PING on the same
async connection).

    python -m bench.acquire_cost [--n 5000] [--redis redis://127.0.0.1:6379/0] [--breakdown]

``--breakdown`` also times, interleaved with PING in the same loop, what an acquire is made
of: a script that returns at once (with acquire's keys and arguments), the acquire script
alone (arguments built beforehand), and ``Limiter.acquire``.

Uses a key prefix of its own and deletes its keys afterwards (never flushes). The machine's
load average is printed too: on a small shared box a PING gets slower under load while the
script's own work does not, so the ratio moves with the load (see bench/RESULTS-acquire.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

import redis
import redis.asyncio

from drover.workers.limiter import AsyncLimiter, Limiter, ScopeLimits
from drover.workers.providers import ANTHROPIC

# Limits high enough that nothing waits: we measure the decision, not the queue.
LIMITS = ScopeLimits(rpm=1e9, itpm=1e12, otpm=1e12, max_in_flight=10**9)
# What a response carries (limits configured, so only the -remaining values are used).
HEADERS = {
    "anthropic-ratelimit-requests-limit": "4000",
    "anthropic-ratelimit-requests-remaining": "3999",
    "anthropic-ratelimit-input-tokens-limit": "2000000",
    "anthropic-ratelimit-input-tokens-remaining": "1999000",
    "anthropic-ratelimit-output-tokens-limit": "400000",
    "anthropic-ratelimit-output-tokens-remaining": "399800",
}
READINGS = ANTHROPIC.read_limits(HEADERS)


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


_ACQUIRE_LUA = "acquire.lua (arguments built beforehand)"


def _breakdown(client: redis.Redis, lim: Limiter, scope: str,
               n: int) -> dict[str, tuple[float, float]]:
    """Median of each part of an acquire, and its ratio to the median PING of the same loop.
    Each sample follows an acquire and a settle, as in the main loop, so caches are as cold."""
    at_once = client.register_script("return {'ok', '0', '1700000000000000'}")
    names = ("EVALSHA returning at once", _ACQUIRE_LUA, "Limiter.acquire")
    samples: dict[str, list[int]] = {"PING": [], **{name: [] for name in names}}
    clock = time.perf_counter_ns
    for _ in range(n):
        for name in names:
            g = lim.acquire(scope, LIMITS, input_tokens=1000, output_tokens=200)
            lim.settle(scope, LIMITS, g, input_tokens=900, output_tokens=150, readings=READINGS)
            call = lim._acquire(scope, LIMITS, 1000, 200, 180.0)
            script = at_once if name == names[0] else lim._scripts["acquire"]
            t0 = clock()
            client.ping()
            t1 = clock()
            if name == "Limiter.acquire":
                grant = lim.acquire(scope, LIMITS, input_tokens=1000, output_tokens=200)
            else:
                reply = script(keys=call.keys, args=call.args)
            t2 = clock()
            if name == "Limiter.acquire":
                lim.release(scope, grant)
            elif name == _ACQUIRE_LUA:
                lim.release(scope, call.finish(reply))
            samples["PING"].append(t1 - t0)
            samples[name].append(t2 - t1)
    ping = statistics.median(samples["PING"])
    return {name: (_median_us(s), statistics.median(s) / ping) for name, s in samples.items()}


async def _worker_path(url: str, prefix: str, n: int) -> tuple[float, float, float]:
    """Median PING, acquire and settle (us) through AsyncLimiter on one async connection."""
    client = redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool.from_url(
        url, max_connections=1))
    lim = AsyncLimiter(client, prefix=prefix)
    scope = "llm:bench:async"
    ping, acq, settle = [], [], []
    clock = time.perf_counter_ns
    try:
        for i in range(n + 500):  # the first 500 warm up
            t0 = clock()
            await client.ping()
            t1 = clock()
            g = await lim.acquire(scope, LIMITS, input_tokens=1000, output_tokens=200)
            t2 = clock()
            await lim.settle(scope, LIMITS, g, input_tokens=900, output_tokens=150,
                             readings=READINGS)
            t3 = clock()
            if i >= 500:
                ping.append(t1 - t0)
                acq.append(t2 - t1)
                settle.append(t3 - t2)
    finally:
        await client.aclose()
    return _median_us(ping), _median_us(acq), _median_us(settle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--redis", default=os.environ.get("DROVER_REDIS_URL",
                                                          "redis://127.0.0.1:6379/0"))
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the parts of an acquire (see the module docstring)")
    args = parser.parse_args()

    prefix = f"drover-bench-{uuid.uuid4().hex[:8]}"
    pool = redis.ConnectionPool.from_url(args.redis, max_connections=1)  # one connection
    client = redis.Redis(connection_pool=pool)
    lim = Limiter(client, prefix=prefix)
    scope = "llm:bench:model"
    try:
        for _ in range(500):  # warm up: scripts loaded, connection open
            client.ping()
            g = lim.acquire(scope, LIMITS, input_tokens=1000, output_tokens=200)
            lim.settle(scope, LIMITS, g, input_tokens=900, output_tokens=150, readings=READINGS)

        ping, acq, settle, pair = [], [], [], []
        clock = time.perf_counter_ns
        load_before = os.getloadavg()[0]
        for _ in range(args.n):  # interleaved, so all see the same conditions
            t0 = clock()
            client.ping()
            t1 = clock()
            g = lim.acquire(scope, LIMITS, input_tokens=1000, output_tokens=200)
            t2 = clock()
            lim.settle(scope, LIMITS, g, input_tokens=900, output_tokens=150, readings=READINGS)
            t3 = clock()
            ping.append(t1 - t0)
            acq.append(t2 - t1)
            settle.append(t3 - t2)
            pair.append(t3 - t1)
        load_after = os.getloadavg()[0]
        breakdown = _breakdown(client, lim, scope, args.n // 2) if args.breakdown else None

        count, t_end = 0, time.perf_counter() + 3.0
        start = time.perf_counter()
        while time.perf_counter() < t_end:
            lim.acquire(scope, LIMITS, input_tokens=1000, output_tokens=200, lease_ttl_s=1.0)
            count += 1
        rate = count / (time.perf_counter() - start)

        p, a, s, ap = (_median_us(x) for x in (ping, acq, settle, pair))
        print(f"samples                    {args.n} (interleaved)")
        print(f"median PING                {p:8.1f} us")
        print(f"median acquire             {a:8.1f} us   ratio to PING {a / p:.2f}")
        print(f"median settle (+headers)   {s:8.1f} us   ratio to PING {s / p:.2f}")
        print(f"median acquire + settle    {ap:8.1f} us   ratio to PING {ap / p:.2f}"
              "   (the limiter's work per LLM call: 2 round trips)")
        print(f"p99 acquire                {sorted(acq)[int(0.99 * len(acq))] / 1000:8.1f} us")
        print(f"acquires/s, one process    {rate:8.0f}   (sequential, one connection)")
        print(f"nproc                      {os.cpu_count()}")
        print(f"load average (1 min)       {load_before:.2f} before, {load_after:.2f} after")
        wp, wa, ws = asyncio.run(_worker_path(args.redis, prefix, args.n))
        print("\nthe worker's path (AsyncLimiter over redis.asyncio, as "
              "workers/agent/llm.py calls it):")
        print(f"median PING                {wp:8.1f} us")
        print(f"median acquire             {wa:8.1f} us   ratio to PING {wa / wp:.2f}")
        print(f"median settle (+headers)   {ws:8.1f} us   ratio to PING {ws / wp:.2f}")
        if breakdown:
            print("\nwhat an acquire is made of (medians, interleaved with PING in one loop):")
            for name, (us, ratio) in breakdown.items():
                print(f"  {name:44} {us:8.1f} us   x PING {ratio:.2f}")
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        print(f"\nkeys under {prefix}: {len(keys)} deleted")
        client.close()


if __name__ == "__main__":
    main()
