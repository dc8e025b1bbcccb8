"""A pool of keys against one key of the same total limits, interleaved.

    python -m bench.pool [--quick] [--repeat N] [--concurrency C] [--sim-burst S]

The workload is bench.workload's (200 sub-agents, or 30 with --quick), 4 worker processes.
Each repeat runs it twice against a simulator of its own, in alternating order:

- one key: the workload's limits L (DROVER_RPM/ITPM/OTPM = the simulator's);
- a pool: the organisation's limits are L, and three keys (DROVER_KEYS) hold 50%, 40% and
  30% of each of L as their own workspace limits (1.2 x L in sum), so the pool's throughput
  is min(L, 1.2 L) = L and both runs share one lower bound (per dimension, demand less the
  bucket over the rate).

Reported per run: makespan / lower bound, 429s (by level for the pool), lost sub-agents,
each key's share of the requests. Goal: the pool within 2% of the one key's figure, zero
429s. The simulator's buckets hold ``--sim-burst`` seconds (1, drover's own burst, as
bench.limit_tracking; the provider's hold a minute). Results: bench/RESULTS-pool.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

from bench.contenders.common import RunContext, SimProcess, delete_prefix
from bench.limit_tracking import figures
from bench.workload import FULL, MODEL, QUICK, Workload

SHARES = {"a": 0.5, "b": 0.4, "c": 0.3}


def _pool(workload: Workload, tag: str) -> list[dict[str, Any]]:
    return [{"alias": f"{alias}{tag}", "api_key": f"sk-bench-{tag}-{alias}",
             **{dim: round(value * share) for dim, value in workload.limits.items()}}
            for alias, share in SHARES.items()]


def run_once(workload: Workload, redis_url: str, prefix: str, concurrency: int, pooled: bool,
             sim_burst_s: float) -> dict[str, Any]:
    from bench.contenders import drover

    tag = uuid.uuid4().hex[:6]
    pool = _pool(workload, tag) if pooled else []
    config = workload.sim_config(burst_s=sim_burst_s, pool=tuple(pool))
    env: dict[str, str] = {}
    if pooled:  # the organisation's limits stay DROVER_RPM/ITPM/OTPM (the workload's)
        env["DROVER_KEYS"] = json.dumps(pool)
        # the pool's organisation scope is per class: this run's own
        env["DROVER_LIMIT_GROUPS"] = json.dumps({f"bench-{tag}": [MODEL]})
    try:
        with SimProcess(config) as sim:
            ctx = RunContext(workload, sim.url, redis_url, f"sk-bench-{tag}", prefix,
                             concurrency=concurrency)
            outcome = drover.run(ctx, env=env)
            stats = sim.stats()
    finally:
        delete_prefix(redis_url, prefix)
    fig = figures(workload, stats, outcome)
    fig["per_key"] = stats.get("per_key", {})
    return fig


def describe(fig: dict[str, Any]) -> str:
    text = (f"{fig['makespan_s']:.1f} s = {fig['ratio']:.3f} x lower bound; 429s {fig['n429']},"
            f" lost {fig['lost']}")
    per_key = fig.get("per_key") or {}
    if per_key:
        total = sum(row["accepted"] for row in per_key.values()) or 1
        text += "; keys " + ", ".join(
            f"{alias[:1]} {row['accepted'] / total:.0%} (429 key {row['n429_key']}, org "
            f"{row['n429_org']})" for alias, row in sorted(per_key.items()))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pool",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 sub-agents (smoke run)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker")
    parser.add_argument("--sim-burst", type=float, default=1.0,
                        help="seconds of refill the simulator's buckets hold")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)
    workload = QUICK if args.quick else FULL
    print(f"workload: {workload.subagents} sub-agents, {workload.demand.requests} calls; lower "
          f"bound {workload.lower_bound_s:.1f} s ({workload.binding}); limits "
          f"{workload.limits}; pool shares {SHARES} of each; workers 4 x {args.concurrency}; "
          f"simulator burst {args.sim_burst:g} s", flush=True)
    from bench.contenders import drover

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    drover.use_prefix(args.redis_url, prefix)  # once: drover's Celery app reads it at import
    ratios: dict[str, list[float]] = {"one key": [], "pool": []}
    for i in range(args.repeat):
        order = [False, True] if i % 2 == 0 else [True, False]  # interleaved
        for pooled in order:
            started = time.monotonic()
            fig = run_once(workload, args.redis_url, prefix, args.concurrency, pooled,
                           args.sim_burst)
            name = "pool" if pooled else "one key"
            ratios[name].append(fig["ratio"])
            print(f"run {i + 1} {name}: {describe(fig)} ({time.monotonic() - started:.0f} s)",
                  flush=True)
    one, pool = (statistics.median(ratios[k]) for k in ("one key", "pool"))
    print(f"median makespan / lower bound: one key {one:.3f}, pool {pool:.3f} "
          f"({pool / one - 1:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
