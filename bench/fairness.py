"""Fair share between jobs, tenants and priorities on one queue and one key.

    python -m bench.fairness [--workers 4] [--concurrency 4] [--only small,tenants,priority]

Real worker processes, the simulator in a process of its own, the real SDK. Each scenario
runs with fair share (the dispatch window = the workers' slots) and, for comparison, with
the window opened wide (``DROVER_DISPATCH_WINDOW=1000000``: every member published at
submit, which is drover's FIFO behaviour before fair share).

- small: a 400-sub-agent job, then a 10-sub-agent job 6 s later, the key binding (the
  simulator's 1,500 RPM, drover planning to 95 % of it) and the slots nearly so. The small
  job's time from submit to its last record; the big job's makespan against its makespan
  alone and the small job's own time alone; 429s.
- tenants: two tenants of weights 2:1 with 200 sub-agents each, the key binding: their token
  use over the contended period.
- priority: 10 ``interactive`` sub-agents submitted 5 s into a 400-sub-agent ``batch`` job
  (time to their first record, which bounds their first LLM call), then a 300-sub-agent
  ``interactive`` job over the batch one: the batch job's share of the work meanwhile
  against its guaranteed floor (10 % of its tenant's part).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

from bench.contenders.common import SimProcess, celery_workers, delete_prefix

WIDE_OPEN = "1000000"


@contextlib.contextmanager
def fleet(redis_url: str, prefix: str, sim_url: str, workers: int, concurrency: int,
          **settings: str) -> Iterator[Any]:
    """Worker processes on a queue of their own with ``settings``; yields the Settings the
    submitter uses (the same environment)."""
    from drover.config import get_settings
    from drover.workers.app import app
    from drover.workers.connections.redis_clients import sync_redis
    from drover.workers.fairshare import FairShare

    queue = f"bench-fair-{uuid.uuid4().hex[:8]}"
    env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
           "DROVER_KEY_ALIAS": queue, "DROVER_ANTHROPIC_BASE_URL": sim_url,
           "ANTHROPIC_API_KEY": f"sk-bench-fair-{queue}", "DROVER_BACKOFF_BASE_S": "0.2",
           # Requests bind (the simulator's RPM), tokens stay far away.
           "DROVER_ITPM": "100000000", "DROVER_OTPM": "100000000",
           **{f"DROVER_{k.upper()}": v for k, v in settings.items()}}
    saved = dict(os.environ)
    os.environ.update(env)
    get_settings.cache_clear()
    try:
        with celery_workers("drover.workers.app", env, queue, workers, concurrency, app):
            s = get_settings()
            fs = FairShare.from_settings(sync_redis(redis_url), s)
            deadline = time.monotonic() + 30
            while fs.live_slots() < workers * concurrency and time.monotonic() < deadline:
                time.sleep(0.2)
            yield s
    finally:
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()


def _spec(n: int, what: str, **fields: Any) -> Any:
    from drover import JobSpec

    return JobSpec(subtasks=[f"{what} {i}" for i in range(n)], max_tokens=64, **fields)


def _last(result: Any) -> float:
    return max(r.finished_at for r in result.results)


def _tokens(results: list[Any], start: float, end: float) -> int:
    return sum(r.usage.input_tokens + r.usage.output_tokens for r in results
               if start <= r.finished_at <= end)


# --- scenarios --------------------------------------------------------------------------------

# drover's buckets hold DROVER_BURST_SECONDS (1 s) of refill: every 400-sub-agent run starts
# after this pause, so each starts with a full bucket (a run right after another would start
# with an empty one and lose that burst: a third of a second at 1,500 RPM, as much as the
# growth measured).
BUCKET_REFILL_S = 2.0
SMALL_SIM = {"tool_turns": 0, "latency_mean_s": 0.5, "latency_p95_s": 0.6, "rpm": 1500,
             "output_tokens_mean": 60, "seed": 5}


def small_after_big(redis_url: str, prefix: str, workers: int, concurrency: int,
                    repeat: int = 1) -> dict[str, Any]:
    """With fair share, ``repeat`` rounds of: the 10 alone, the 400 alone, the 400 with the
    10 six seconds in (medians reported: one run moves by +-0.5 s here); then once without."""
    from drover import submit
    from drover.simulator import SimConfig

    runs: dict[str, list[float]] = {}
    out: dict[str, Any] = {"fair_ok": 0, "fair_429": 0}
    with SimProcess(SimConfig(**SMALL_SIM)) as sim:
        for mode, window in (("fair", "0"), ("fifo", WIDE_OPEN)):
            with fleet(redis_url, prefix, sim.url, workers, concurrency, rpm="1500",
                       dispatch_window=window) as settings:
                for _ in range(repeat if mode == "fair" else 1):
                    if mode == "fair":
                        at = time.time()
                        alone = submit(_spec(10, "Check invoice"), settings=settings).wait(300)
                        runs.setdefault("small_alone_s", []).append(_last(alone) - at)
                        time.sleep(BUCKET_REFILL_S)
                        runs.setdefault("big_alone_s", []).append(submit(
                            _spec(400, "Summarise contract"), settings=settings).wait(600).wall_s)
                    sim.reset()
                    time.sleep(BUCKET_REFILL_S)
                    big = submit(_spec(400, "Summarise contract"), settings=settings)
                    time.sleep(6)
                    at = time.time()
                    small = submit(_spec(10, "Check invoice"), settings=settings)
                    small_result, big_result = small.wait(600), big.wait(600)
                    runs.setdefault(f"{mode}_small_s", []).append(_last(small_result) - at)
                    runs.setdefault(f"{mode}_big_s", []).append(big_result.wall_s)
                    if mode == "fair":
                        runs.setdefault("growth_s", []).append(
                            big_result.wall_s - runs["big_alone_s"][-1])
                    out[f"{mode}_ok"] = (out.get(f"{mode}_ok", 0) + small_result.counts["ok"]
                                         + big_result.counts["ok"])
                    out[f"{mode}_429"] = out.get(f"{mode}_429", 0) + sim.stats()["rejected_429"]
    out.update({name: statistics.median(values) for name, values in runs.items()})
    out["repeat"], out["growths"] = repeat, runs["growth_s"]
    return out


def tenants(redis_url: str, prefix: str, workers: int, concurrency: int) -> dict[str, Any]:
    from drover import submit
    from drover.simulator import SimConfig

    out: dict[str, Any] = {}
    config = {**SMALL_SIM, "latency_mean_s": 0.05, "latency_p95_s": 0.08}
    with SimProcess(SimConfig(**config)) as sim:
        with fleet(redis_url, prefix, sim.url, workers, concurrency, rpm="1500",
                   tenant_weights='{"red": 2, "blue": 1}') as settings:
            red = submit(_spec(200, "Translate page", tenant="red"), settings=settings)
            blue = submit(_spec(200, "Translate page", tenant="blue"), settings=settings)
            red_result, blue_result = red.wait(600), blue.wait(600)
        start = min(r.finished_at for r in blue_result.results) + 1.0
        end = min(_last(red_result), _last(blue_result))
        out["contended_s"] = end - start
        out["ratio"] = (_tokens(red_result.results, start, end)
                        / _tokens(blue_result.results, start, end))
        out["ok"] = red_result.counts["ok"] + blue_result.counts["ok"]
        out["429"] = sim.stats()["rejected_429"]
    return out


def priority(redis_url: str, prefix: str, workers: int, concurrency: int) -> dict[str, Any]:
    from drover import submit
    from drover.simulator import SimConfig

    out: dict[str, Any] = {}
    with SimProcess(SimConfig(**SMALL_SIM)) as sim:
        for mode, window in (("fair", "0"), ("fifo", WIDE_OPEN)):
            with fleet(redis_url, prefix, sim.url, workers, concurrency, rpm="1500",
                       dispatch_window=window) as settings:
                batch = submit(_spec(400, "Classify ticket", priority="batch"),
                               settings=settings)
                time.sleep(5)
                at = time.time()
                first = submit(_spec(10, "Answer user", priority="interactive"),
                               settings=settings)
                record = next(iter(first.as_completed(timeout=600)))
                out[f"{mode}_first_s"] = record.finished_at - at
                first.wait(600)
                if mode == "fair":
                    load = submit(_spec(300, "Answer user question", priority="interactive"),
                                  settings=settings)
                    load_result = load.wait(600)
                batch_result = batch.wait(900)
                if mode == "fair":
                    start = min(r.finished_at for r in load_result.results) + 0.5
                    end = _last(load_result) - 1.0  # its tail frees places for batch
                    done = [r for r in batch_result.results + load_result.results
                            if start <= r.finished_at <= end]
                    out["batch_share"] = (sum(r.job_id == batch.id for r in done)
                                          / max(1, len(done)))
                    out["load_s"] = end - start
                out[f"{mode}_429"] = sim.stats()["rejected_429"]
                sim.reset()
    return out


def describe(name: str, o: dict[str, Any]) -> str:
    if name == "small":
        return (f"small after big: the 10-sub-agent job ends {o['fair_small_s']:.1f} s after "
                f"its submit with fair share, {o['fifo_small_s']:.1f} s without (alone: "
                f"{o['small_alone_s']:.1f} s); the 400-sub-agent job's makespan "
                f"{o['fair_big_s']:.1f} s (alone {o['big_alone_s']:.1f} s, growth "
                f"{o['growth_s']:+.2f} s vs the small job's own {o['small_alone_s']:.2f} s; "
                f"without fair share {o['fifo_big_s']:.1f} s); medians of {o['repeat']} "
                f"(growths {', '.join(f'{g:+.2f}' for g in o['growths'])}); "
                f"ok {o['fair_ok']}/{410 * o['repeat']}, 429s {o['fair_429']} "
                f"(fifo {o['fifo_429']})")
    if name == "tenants":
        return (f"tenants 2:1: token use red:blue = {o['ratio']:.2f} over "
                f"{o['contended_s']:.1f} s of contention; ok {o['ok']}/400, 429s {o['429']}")
    return (f"priority: interactive behind batch, first record {o['fair_first_s']:.2f} s after "
            f"its submit with fair share, {o['fifo_first_s']:.2f} s without; batch did "
            f"{o['batch_share']:.1%} of the work over {o['load_s']:.1f} s of interactive load "
            f"(guaranteed at least 10 %); 429s {o['fair_429']} (fifo {o['fifo_429']})")


SCENARIOS = {"small": small_after_big, "tenants": tenants, "priority": priority}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of the small-after-big scenario (medians reported)")
    parser.add_argument("--redis-url", default=os.environ.get("DROVER_REDIS_URL",
                                                             "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    from bench.contenders import drover

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    drover.use_prefix(args.redis_url, prefix)
    try:
        for name in args.only.split(","):
            extra = {"repeat": args.repeat} if name == "small" else {}
            result = SCENARIOS[name](args.redis_url, prefix, args.workers, args.concurrency,
                                     **extra)
            print(describe(name, result), flush=True)
    finally:
        delete_prefix(args.redis_url, prefix)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
