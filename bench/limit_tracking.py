"""How closely a run tracks the provider's limits, from the provider's side (the simulator).

`figures()` is what `bench.compare` prints per contender. Run as a script, it runs drover
alone on the 200-sub-agent workload and takes its makespan apart:

    python -m bench.limit_tracking [--repeat N] [--concurrency C] [--env DROVER_X=V ...]
                                   [--sim other_share=0.4 --sim burst_s=60 ...]
    python -m bench.limit_tracking --binding rpm|itpm [--subagents 2000] [--pairs 1]
                                   [--threads 16] [--rate 60]

(``--binding``: see ``bench/_binding.py``: the key the bottleneck, with and without the
limiter's line, task messages per sub-agent counted from Celery's events.)

- start: from `submit()` to the provider's first accepted request;
- saturated: while the binding dimension runs at >= 80% of the limit (its mean there is the
  steady-state utilisation; drover aims at DROVER_TARGET_UTILIZATION = 95%);
- tail: the rest of the busy period (the last sub-agents' remaining calls, one after another);
- join: from the last answer to the stored JobResult;
- unused: the binding limit's capacity (its bucket, full at the start, plus its refill) that
  the provider had to give by the end of the saturated period and did not admit, in seconds
  of refill: what the limiter left on the table while the job was limit-bound. The lower
  bound is that capacity's end, so makespan - bound = start + unused + (the tail, less the
  refill time of the tokens it still admitted) + join.

A sampler reads the limiter's bucket every 0.25 s: a negative level means callers are queued
(the job is limit-bound), so time without a queue is time the limiter did not slow anything.
`--sim NAME=VALUE` changes the simulator's config (e.g. `other_share=0.4`: another user of
the key takes 40% of every limit; the run then also reports the makespan against the bound
for the share that is left, the 429s per request and the use of what is left over the busy
period, and the phases count against the rate that is left). Results are recorded by hand in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from bench.contenders.common import Outcome, RunContext, SimProcess, delete_prefix
from bench.workload import FULL, MODEL, QUICK, Workload

# (stats total, stats max_60s key, timeline column) per limit
DIMS = {"rpm": ("accepted", "requests", "requests"),
        "itpm": ("input_tokens", "input_tokens", "input_tokens"),
        "otpm": ("output_tokens", "output_tokens", "output_tokens")}
SATURATED = 0.80


def figures(workload: Workload, stats: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The per-contender row: outcome, provider-side errors, peaks and utilisation."""
    limits = workload.limits
    busy_s = None
    if stats.get("first_accept_ts") is not None and stats.get("last_done_ts") is not None:
        busy_s = stats["last_done_ts"] - stats["first_accept_ts"]
    peaks = {dim: stats["max_60s"][window] for dim, (_, window, _) in DIMS.items()}
    return {
        "completed": outcome.completed, "lost": outcome.lost, "errors": outcome.errors,
        "n429": stats["rejected_429"], "n529": stats["overloaded_529"],
        "accepted": stats["accepted"],
        "makespan_s": outcome.makespan_s,
        "ratio": outcome.makespan_s / workload.lower_bound_s,
        "peaks": peaks,
        "peak_fraction": {dim: peaks[dim] / limits[dim] for dim in DIMS},
        "busy_s": busy_s,
        "utilisation": ({dim: stats[total] / busy_s / (limits[dim] / 60)
                         for dim, (total, _, _) in DIMS.items()} if busy_s else None),
        "extra": outcome.extra,
    }


def phases(workload: Workload, stats: dict[str, Any], outcome: Outcome, other: float = 0.0,
           sim_burst_s: float | None = None) -> dict[str, float]:
    """The makespan taken apart (see the module docstring); seconds, and the utilisations.
    ``other``: the share of every limit another user of the key takes (the rates count what
    is left); ``sim_burst_s``: the simulator's bucket, when not the workload's."""
    dim = workload.binding
    column = DIMS[dim][2]
    rate = workload.limits[dim] / 60 * (1 - other)
    capacity = workload.limits[dim] / 60 * (sim_burst_s or workload.burst_s)
    timeline = stats["timeline"]
    per_s = {row["t"]: row[column] for row in timeline}
    last = max(per_s) if per_s else 0
    saturated = [t for t in range(last + 1) if per_s.get(t, 0) >= SATURATED * rate]
    # Timeline seconds count from the first request; the first accept is at most a second in.
    first, end = (saturated[0], saturated[-1] + 1) if saturated else (0, 0)
    steady = [per_s.get(t, 0) for t in range(first + 1, end - 1)] or [0]
    busy_s = stats["last_done_ts"] - stats["first_accept_ts"]
    admitted = sum(per_s.get(t, 0) for t in range(end))
    return {
        "start_s": stats["first_accept_ts"] - outcome.started_at,
        "saturated_s": float(end - first),
        "unused_s": (capacity + rate * end - admitted) / rate if end else 0.0,
        "tail_s": max(0.0, busy_s - end),
        "busy_s": busy_s,
        "join_s": outcome.finished_at - stats["last_done_ts"],
        "steady_utilisation": statistics.mean(steady) / rate,
        "busy_utilisation": stats[DIMS[dim][0]] / busy_s / rate,
    }


class LimiterSampler:
    """Reads the scope's bucket every `every_s` while entered (as drover.run's probe)."""

    def __init__(self, redis_url: str, every_s: float = 0.25) -> None:
        self.redis_url = redis_url
        self.every_s = every_s
        self.samples: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def __call__(self, settings: Any) -> Iterator[None]:
        import redis

        from drover.workers.limiter import Limiter, llm_scope

        client = redis.Redis.from_url(self.redis_url)
        limiter = Limiter(client, prefix=settings.key_prefix)
        scope = llm_scope(settings.key_alias, MODEL)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(self.every_s):
                with contextlib.suppress(Exception):
                    state = limiter.state(scope)
                    if state.get("input_tokens"):
                        self.samples.append(state)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            client.close()

    def queued_fraction(self, dim: str = "input_tokens") -> float:
        """Share of the samples with calls in flight in which callers were queued."""
        active = [s for s in self.samples if s["leases"] > 0 and s.get(dim)]
        return sum(1 for s in active if s[dim]["level"] < 0) / len(active) if active else 0.0


def run_once(workload: Workload, redis_url: str, prefix: str, concurrency: int,
             env: dict[str, str], sim_changes: dict[str, str] | None = None
             ) -> tuple[dict[str, Any], dict[str, float], float]:
    """One drover run; ``drover.use_prefix(redis_url, prefix)`` must have been called."""
    from bench.contenders import drover

    sampler = LimiterSampler(redis_url)
    config = workload.sim_config(**(sim_changes or {}))
    try:
        with SimProcess(config) as sim:
            ctx = RunContext(workload, sim.url, redis_url, f"sk-bench-{prefix}", prefix,
                             concurrency=concurrency)
            outcome = drover.run(ctx, probe=sampler, env=env)
            stats = sim.stats()
    finally:
        delete_prefix(redis_url, prefix)
    return figures(workload, stats, outcome), \
        phases(workload, stats, outcome, config.other_share, config.burst_s), \
        sampler.queued_fraction()


def describe(fig: dict[str, Any], ph: dict[str, float], queued: float) -> str:
    return (f"makespan {fig['makespan_s']:.1f} s = {fig['ratio']:.3f} x lower bound; "
            f"429s {fig['n429']}, 529s {fig['n529']}, lost {fig['lost']}; start "
            f"{ph['start_s']:.1f} s, saturated {ph['saturated_s']:.0f} s at "
            f"{ph['steady_utilisation']:.1%} of the limit (unused {ph['unused_s']:.1f} s), tail "
            f"{ph['tail_s']:.1f} s, join "
            f"{ph['join_s']:.1f} s; busy period at {ph['busy_utilisation']:.1%}; callers "
            f"queued in {queued:.0%} of limiter samples; peak 60 s "
            + ", ".join(f"{d} {v:.1%}" for d, v in fig["peak_fraction"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.limit_tracking",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 sub-agents (smoke run)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker")
    parser.add_argument("--env", action="append", default=[], metavar="DROVER_X=VALUE",
                        help="extra settings for the workers (repeatable)")
    parser.add_argument("--sim", action="append", default=[], metavar="NAME=VALUE",
                        help="simulator config changes, e.g. other_share=0.4 (repeatable)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--binding", choices=("rpm", "itpm"),
                        help="the key the bottleneck (RPM, or ITPM at about 1,000 tokens a "
                        "call), one-call sub-agents, with and without the limiter's line, "
                        "interleaved")
    parser.add_argument("--subagents", type=int, default=2000, help="with --binding")
    parser.add_argument("--pairs", type=int, default=1, help="with --binding")
    parser.add_argument("--threads", type=int, default=16,
                        help="with --binding: threads per worker (2 workers)")
    parser.add_argument("--rate", type=float, default=60.0,
                        help="with --binding: calls a minute the binding limit allows (RPM, "
                        "or ITPM / 1,000 tokens a call)")
    args = parser.parse_args(argv)
    if args.binding:
        from bench._binding import main as binding_main

        binding_main(args.binding, args.subagents, args.pairs, args.redis_url, args.threads,
                     args.rate)
        return 0
    env = dict(item.split("=", 1) for item in args.env)
    sim_changes = dict(item.split("=", 1) for item in args.sim)
    workload = QUICK if args.quick else FULL
    print(f"workload: {workload.subagents} sub-agents, {workload.demand.requests} calls; lower "
          f"bound {workload.lower_bound_s:.1f} s ({workload.binding}); limits "
          f"{workload.limits}; workers 4 x {args.concurrency}; env {env or 'defaults'}; "
          f"simulator {sim_changes or 'as the workload says'}")
    other = float(sim_changes.get("other_share", 0))
    burst = workload.burst_s  # drover's bucket, whatever the simulator's holds
    from bench.contenders import drover

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    drover.use_prefix(args.redis_url, prefix)  # once: drover's Celery app reads it at import
    for i in range(args.repeat):
        started = time.monotonic()
        fig, ph, queued = run_once(workload, args.redis_url, prefix, args.concurrency, env,
                                   sim_changes)
        left = ""
        if other:
            bound = (workload.lower_bound_s + burst) / (1 - other) - burst
            sent = fig["accepted"] + fig["n429"] + fig["n529"]
            left = (f"; {fig['makespan_s'] / bound:.3f} x the bound for the {1 - other:.0%} "
                    f"left ({bound:.1f} s); 429s per request {fig['n429'] / sent:.1%}; use of "
                    f"what is left over the busy period {ph['busy_utilisation']:.1%}")
        print(f"run {i + 1}: {describe(fig, ph, queued)}{left} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
