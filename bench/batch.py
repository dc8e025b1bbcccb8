"""Realtime vs Message Batches: the same 1,000-sub-agent workload, delivery="realtime" and
delivery="batch", against the simulator's limits. Measures cost (tokens at each rate, priced),
makespan, and worker-thread occupancy (busy thread-seconds / (threads x makespan): how much
of the fleet a job holds).

    python -m bench.batch [--subagents 1000] [--workers 2] [--concurrency 8]
                          [--batch-processing-s 30] [--write bench/RESULTS-batch.md]

The simulator's batches end within ``--batch-processing-s`` (the provider's: most within an
hour, all within 24 h), so the batch makespan here is a compressed picture: what it shows is
the number of batch rounds (one per turn) and that no worker thread waits on them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.contenders.common import celery_workers
from drover.simulator import SimConfig, SimulatorServer

MODEL = "claude-sonnet-4-6"
# Standard prices (USD per million tokens) of a Sonnet-class model; batches bill 50% of them.
PRICE = {"input_tokens": 3.0, "output_tokens": 15.0, "cache_creation_input_tokens": 3.75,
         "cache_read_input_tokens": 0.30}
LIMITS = {"rpm": 2000, "itpm": 2_000_000, "otpm": 400_000}


@dataclass
class Run:
    delivery: str
    makespan_s: float
    ok: int
    calls: int
    batch_calls: int
    tokens: dict[str, int]
    cost_usd: float
    occupancy: float
    realtime_requests: int
    batch_requests: int
    batches: int


def _cost(usage: Any, batch: bool) -> tuple[dict[str, int], float]:
    tokens = {name: int(getattr(usage, name)) for name in PRICE}
    rate = 0.5 if batch else 1.0
    return tokens, sum(tokens[n] * PRICE[n] for n in PRICE) / 1e6 * rate


def run_one(delivery: str, args: argparse.Namespace, redis_url: str, prefix: str) -> Run:
    from drover import JobSpec, submit
    from drover.config import load_settings
    from drover.workers.app import app

    run_id = uuid.uuid4().hex[:8]
    queue = alias = f"bbench-{run_id}"
    with SimulatorServer(SimConfig(
            rpm=LIMITS["rpm"], itpm=LIMITS["itpm"], otpm=LIMITS["otpm"], burst_s=1.0,
            latency_mean_s=0.5, latency_p95_s=1.2, output_tokens_mean=150, tool_turns=1,
            tools_per_turn=1, seed=3, batch_processing_s=args.batch_processing_s,
            batch_rpm=50, batch_queue_cap=100_000)) as sim:
        env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix,
               "DROVER_QUEUE": queue, "DROVER_KEY_ALIAS": alias,
               "DROVER_ANTHROPIC_BASE_URL": sim.url, "ANTHROPIC_API_KEY": "sk-bench",
               "DROVER_MODEL": MODEL, "DROVER_RPM": str(LIMITS["rpm"]),
               "DROVER_ITPM": str(LIMITS["itpm"]), "DROVER_OTPM": str(LIMITS["otpm"]),
               "DROVER_BATCH_RPM": "50", "DROVER_BATCH_LINGER_S": "2",
               "DROVER_BATCH_POLL_S": "5",
               "DROVER_TOOL_MODULES": "drover.workers.tools.demo,bench.batch_probe"}
        settings = load_settings(queue=queue, key_alias=alias)
        spec = JobSpec(subtasks=[f"Summarise filing {i} for the quarterly review"
                                 for i in range(args.subagents)],
                       tools=["lookup_fact"], max_tokens=512, model=MODEL,
                       delivery=delivery)  # type: ignore[arg-type]
        logs = Path(args.log_dir) if args.log_dir else None
        with celery_workers("drover.workers.app", env, queue, args.workers, args.concurrency, app,
                            log_dir=logs):
            started = time.monotonic()
            result = submit(spec, settings=settings).wait(timeout=3600, poll_s=0.1)
            makespan = time.monotonic() - started
        client = redis.Redis.from_url(redis_url)
        busy = float(client.get(f"{prefix}:bench:busy:{queue}") or 0.0)
        client.close()
        stats = sim.stats()
    tokens, cost = _cost(result.usage, batch=delivery == "batch")
    threads = args.workers * args.concurrency
    return Run(delivery, makespan, result.counts["ok"], result.usage.calls,
               result.usage.batch_calls, tokens, cost, busy / (threads * makespan),
               stats["accepted"], stats["batches"]["requests"],
               stats["batches"]["batches_created"])


def table(runs: list[Run], args: argparse.Namespace) -> str:
    lines = ["| delivery | ok | LLM calls (by batch) | realtime / batch requests at the "
             "provider | batches | input / output tokens | billed at | cost (USD) | makespan "
             "| worker-thread occupancy |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r.delivery} | {r.ok} | {r.calls:,} ({r.batch_calls:,}) | "
            f"{r.realtime_requests:,} / {r.batch_requests:,} | {r.batches} | "
            f"{r.tokens['input_tokens'] + r.tokens['cache_creation_input_tokens']:,} / "
            f"{r.tokens['output_tokens']:,} | {'50%' if r.delivery == 'batch' else '100%'} | "
            f"{r.cost_usd:.2f} | {r.makespan_s:.1f} s | {r.occupancy:.1%} |")
    rt, bt = runs
    lines += ["", f"Ratios (batch / realtime): cost **{bt.cost_usd / rt.cost_usd:.2f}**, "
              f"makespan **{bt.makespan_s / rt.makespan_s:.2f}**, worker-thread occupancy "
              f"**{bt.occupancy / max(rt.occupancy, 1e-9):.3f}**."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subagents", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch-processing-s", type=float, default=30.0)
    parser.add_argument("--redis-url", default=os.environ.get("DROVER_REDIS_URL",
                                                              "redis://127.0.0.1:6379/0"))
    parser.add_argument("--write", metavar="FILE.md", help="also write the table here")
    parser.add_argument("--log-dir", help="keep the workers' logs here")
    args = parser.parse_args(argv)
    prefix = f"bbench-{uuid.uuid4().hex[:8]}"
    os.environ.update({"DROVER_REDIS_URL": args.redis_url, "DROVER_KEY_PREFIX": prefix})
    from drover.config import get_settings

    get_settings.cache_clear()
    try:
        runs = [run_one(d, args, args.redis_url, prefix) for d in ("realtime", "batch")]
    finally:
        client = redis.Redis.from_url(args.redis_url)
        with contextlib.suppress(redis.RedisError):
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                client.delete(key)
        client.close()
    text = table(runs, args)
    print(text)
    if args.write:
        with open(args.write, "w") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
