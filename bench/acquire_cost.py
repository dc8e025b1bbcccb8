"""What one limiter decision costs: median latency of ``acquire`` against a bare PING on the
same connection, and of the whole limiter work of one LLM call (``acquire``, then ``settle``
with the response's rate-limit headers, as ``workers/llm.py`` does); acquires/s from one
process.

    python -m bench.acquire_cost [--n 5000] [--redis redis://127.0.0.1:6379/0]

Uses a key prefix of its own and deletes its keys afterwards (never flushes). The machine's
load average is printed too: on a small shared box a PING gets slower under load while the
script's own work does not, so the ratio moves with the load (see bench/RESULTS-acquire.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import redis

from workers.limiter import Limiter, ScopeLimits

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


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--redis", default=os.environ.get("DROVER_REDIS_URL",
                                                          "redis://127.0.0.1:6379/0"))
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
            lim.settle(scope, LIMITS, g, input_tokens=900, output_tokens=150, headers=HEADERS)

        ping, acq, settle, pair = [], [], [], []
        clock = time.perf_counter_ns
        load_before = os.getloadavg()[0]
        for _ in range(args.n):  # interleaved, so all see the same conditions
            t0 = clock()
            client.ping()
            t1 = clock()
            g = lim.acquire(scope, LIMITS, input_tokens=1000, output_tokens=200)
            t2 = clock()
            lim.settle(scope, LIMITS, g, input_tokens=900, output_tokens=150, headers=HEADERS)
            t3 = clock()
            ping.append(t1 - t0)
            acq.append(t2 - t1)
            settle.append(t3 - t2)
            pair.append(t3 - t1)
        load_after = os.getloadavg()[0]

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
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


if __name__ == "__main__":
    main()
