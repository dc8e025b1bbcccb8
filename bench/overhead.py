"""drover at scale: what dispatching and joining a sub-agent costs, next to a bare Celery chord.

    python -m bench.overhead [--n 2000] [--workers 8] [--concurrency 4]

drover runs N one-call sub-agents (a short prompt, no tools) on W worker processes against a
simulator with no limits and no latency, so what is measured is drover itself: the chord,
the Redis job state, the limiter round trips, one HTTP call, the records and the join. The
baseline is a bare Celery chord of N no-op tasks on the same number of workers with the same
Celery configuration (`drover.config.celery.celery_config`: JSON, late acks, prefetch 1, Redis
broker and result backend). Per sub-agent = wall time / N, from sending the chord to the
stored join result; the ratio is drover's over the bare chord's. Peak memory is the largest
VmHWM (peak RSS) among the worker processes.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from celery import chord

from bench.contenders.common import (
    RunContext,
    SimProcess,
    celery_workers,
    cpu_seconds,
    delete_prefix,
    peak_rss_kb,
)
from bench.workload import FULL, MODEL

# --- the baseline ---------------------------------------------------------------------------

def _bare_chord(redis_url: str, prefix: str, subtasks: list[str], workers: int,
                concurrency: int, sim_url: str | None = None) -> tuple[float, int, float]:
    """(wall s, peak worker RSS kB, workers' CPU s) of one chord of no-op tasks, or with
    ``sim_url`` of tasks that each make one SDK call."""
    from bench.contenders.bare_chord import make_app

    n = len(subtasks)
    queue = f"bench-bare-{uuid.uuid4().hex[:8]}"
    env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
           "BENCH_SIM_URL": sim_url or "", "BENCH_API_KEY": f"sk-bench-bare-{prefix}"}
    sender = make_app()
    with celery_workers("bench.contenders.bare_chord", env, queue, workers, concurrency,
                        sender) as procs:
        cpu_before = sum(cpu_seconds(p.pid) for p in procs)
        started = time.monotonic()
        header = [sender.signature("bench.noop", args=(i,), queue=queue) if sim_url is None
                  else sender.signature("bench.one_call", args=(i, MODEL, task), queue=queue)
                  for i, task in enumerate(subtasks)]
        result = chord(header, app=sender)(sender.signature("bench.collect", queue=queue))
        assert result.get(timeout=600, interval=0.05) == n
        wall = time.monotonic() - started
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu_before
        rss = max(peak_rss_kb(p.pid) for p in procs)
    sender.close()
    return wall, rss, cpu


# --- drover ---------------------------------------------------------------------------------

def measure(redis_url: str, prefix: str, n: int = 2000, workers: int = 8,
            concurrency: int = 4, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both runs. drover's Celery app reads its settings once per process, so the caller
    must have called ``drover.use_prefix(redis_url, prefix)`` before anything imported it."""
    from bench.contenders import drover

    unlimited = {"DROVER_RPM": "1e9", "DROVER_ITPM": "1e12", "DROVER_OTPM": "1e12",
                 "DROVER_MAX_IN_FLIGHT": "100000"}
    subtasks = [f"Sub-agent {i}: give one short finding about market {i}." for i in range(n)]
    from drover.simulator import SimConfig

    try:
        bare_s, bare_rss, bare_cpu = _bare_chord(redis_url, prefix, subtasks, workers,
                                                 concurrency)
        log(f"overhead: bare chord of {n} no-op tasks {bare_s:.1f} s")
        with SimProcess(SimConfig(output_tokens_mean=20, tool_turns=0, seed=3)) as sim:
            call_s, _, call_cpu = _bare_chord(redis_url, prefix, subtasks, workers, concurrency,
                                              sim_url=sim.url)
            log(f"overhead: bare chord of {n} one-call tasks {call_s:.1f} s")
            sim.reset()
            ctx = RunContext(FULL, sim.url, redis_url, f"sk-bench-overhead-{prefix}", prefix,
                             workers=workers, concurrency=concurrency, time_cap_s=900)
            sim_cpu = cpu_seconds(sim.proc.pid)
            outcome = drover.run(ctx, subtasks=subtasks, max_turns=2, env=unlimited)
            sim_cpu = cpu_seconds(sim.proc.pid) - sim_cpu
            accepted = sim.stats()["accepted"]
    finally:
        delete_prefix(redis_url, prefix)
    return {
        "n": n, "workers": workers, "concurrency": concurrency, "model": MODEL,
        "bare_s": bare_s, "bare_per_ms": bare_s / n * 1000, "bare_rss_mb": bare_rss / 1024,
        "drover_s": outcome.makespan_s, "drover_per_ms": outcome.makespan_s / n * 1000,
        "drover_rss_mb": outcome.extra["worker_peak_rss_mb"], "drover_ok": outcome.completed,
        "calls": accepted, "ratio": outcome.makespan_s / bare_s,
        # CPU per sub-agent: the 2 cores are the bottleneck of both runs
        "bare_cpu_ms": bare_cpu / n * 1000,
        "call_s": call_s, "call_per_ms": call_s / n * 1000, "call_cpu_ms": call_cpu / n * 1000,
        "call_ratio": outcome.makespan_s / call_s,
        "drover_cpu_ms": outcome.extra["worker_cpu_s"] / n * 1000,
        "sim_cpu_ms": sim_cpu / n * 1000,
    }


def describe(o: dict[str, Any]) -> str:
    return (f"overhead: {o['n']} sub-agents on {o['workers']} workers x {o['concurrency']}: "
            f"drover {o['drover_s']:.1f} s ({o['drover_per_ms']:.2f} ms each, {o['drover_ok']} "
            f"ok, {o['calls']} calls), bare chord {o['bare_s']:.1f} s ({o['bare_per_ms']:.2f} ms "
            f"each): ratio {o['ratio']:.2f}; chord of one-call tasks {o['call_s']:.1f} s "
            f"({o['call_per_ms']:.2f} ms each): ratio {o['call_ratio']:.2f}; worker CPU per "
            f"sub-agent drover {o['drover_cpu_ms']:.2f} ms (+ simulator {o['sim_cpu_ms']:.2f} "
            f"ms), one-call chord {o['call_cpu_ms']:.2f} ms, no-op chord {o['bare_cpu_ms']:.2f} "
            f"ms; peak worker RSS drover {o['drover_rss_mb']:.0f} MB, bare "
            f"{o['bare_rss_mb']:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--redis-url", default=os.environ.get("DROVER_REDIS_URL",
                                                             "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    from bench.contenders import drover

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    drover.use_prefix(args.redis_url, prefix)
    print(describe(measure(args.redis_url, prefix, args.n, args.workers, args.concurrency)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
