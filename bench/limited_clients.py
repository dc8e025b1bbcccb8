"""A burst through one client: N calls at once (``asyncio.gather``) into a binding requests
limit, through the plain ``anthropic.AsyncAnthropic`` and through ``drover.AsyncAnthropic``,
each against a fresh simulator with the same limits (docs/own-code.md).

    python -m bench.limited_clients [--calls 30] [--rpm 300]

Prints, per client: calls ok, the 429s the simulator gave, the makespan and its ratio to
the lower bound of the limits (the calls past the first bucket at the requests rate, at
drover's 95 % target). Needs a Redis at DROVER_REDIS_URL (default 127.0.0.1:6379); its keys
go under a prefix of its own, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import redis

from drover.simulator.config import SimConfig
from drover.simulator.server import SimulatorServer

MODEL = "claude-sonnet-4-6"
PREFIX = f"bench-limited-{uuid.uuid4().hex[:6]}"


def _burst(make: Callable[[str], Any], calls: int, rpm: int) -> dict[str, Any]:
    config = SimConfig(seed=1, tool_turns=0, output_tokens_mean=20, rpm=rpm, burst_s=1)
    with SimulatorServer(config) as sim:
        os.environ.update({
            "DROVER_REDIS_URL": os.environ.get("DROVER_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "DROVER_KEY_PREFIX": PREFIX, "DROVER_KEY_ALIAS": f"k{time.time_ns()}",
            "DROVER_ANTHROPIC_BASE_URL": sim.url, "ANTHROPIC_API_KEY": "sk-sim",
            "DROVER_MODEL": MODEL, "DROVER_RPM": str(rpm), "DROVER_ITPM": "10000000",
            "DROVER_OTPM": "10000000", "DROVER_BURST_SECONDS": "1"})

        async def fan_out() -> tuple[float, int]:
            llm = make(sim.url)
            started = time.monotonic()
            results = await asyncio.gather(*(llm.messages.create(
                model=MODEL, max_tokens=40, messages=[{"role": "user", "content": f"q {i}"}])
                for i in range(calls)), return_exceptions=True)
            return (time.monotonic() - started,
                    sum(not isinstance(r, BaseException) for r in results))

        took, ok = asyncio.run(fan_out())
        stats = sim.stats()
    per_s = rpm / 60 * 0.95
    bound = max(0.0, calls - per_s) / per_s  # the first bucket at once, the rest at the rate
    return {"ok": ok, "429s": stats["rejected_429"], "makespan_s": took,
            "x_bound": took / bound if bound else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rpm", type=int, default=300)
    args = parser.parse_args()
    rows = {
        "anthropic.AsyncAnthropic (max_retries=2)": _burst(
            lambda url: anthropic.AsyncAnthropic(base_url=url, api_key="sk-sim"),
            args.calls, args.rpm),
    }
    import drover

    rows["drover.AsyncAnthropic"] = _burst(lambda url: drover.AsyncAnthropic(), args.calls,
                                           args.rpm)
    print(f"{args.calls} calls at once, {args.rpm} requests a minute in 1 s buckets")
    print("| client | ok | 429s | makespan | x lower bound |\n|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['ok']} / {args.calls} | {row['429s']} | "
              f"{row['makespan_s']:.1f} s | {row['x_bound']:.2f} |")
    client = redis.Redis.from_url(os.environ["DROVER_REDIS_URL"])
    for key in client.scan_iter(match=f"{PREFIX}:*", count=1000):
        client.delete(key)


if __name__ == "__main__":
    main()
