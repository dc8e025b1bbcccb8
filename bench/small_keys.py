"""A small key (issue 36, item 3): 60 RPM, 40,000 ITPM, 12,000 OTPM, bursts of 1 s.

    python -m bench.small_keys [--n 60] [--runs 1]

60 one-call sub-agents (answers of 80-240 tokens, 0.4 s latency) through two worker
processes (4 threads each) against the simulator enforcing those limits (output counted as
generated). Per run it prints: sub-agents ok, the simulator's 429s, the wall time from submit
to the last record, the busy time (the simulator's first acceptance to its last answer) and
its ratio to the lower bound that the limits set: max(requests / RPM, counted input / ITPM,
output / OTPM) minutes, less the 1 s burst; and the task messages per sub-agent (Celery's
``task-received`` events of the run's workers: one per delivery, limiter retries included).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from typing import Any

from bench._binding import _events
from bench.recovery import kill_workers, spawn_worker
from drover.simulator import SimConfig, SimulatorServer

RPM, ITPM, OTPM, BURST_S = 60, 40_000, 12_000, 1


def run(n: int) -> dict[str, Any]:
    sim = SimulatorServer(SimConfig(seed=1, rpm=RPM, itpm=ITPM, otpm=OTPM, burst_s=BURST_S,
                                    latency_mean_s=0.4, latency_p95_s=0.6, tool_turns=0,
                                    output_tokens_mean=160)).start()
    tag = uuid.uuid4().hex[:6]
    env = {**os.environ, "DROVER_KEY_PREFIX": f"bench-small-{tag}",
           "DROVER_QUEUE": f"bench-small-{tag}", "DROVER_KEY_ALIAS": f"bench-small-{tag}",
           "DROVER_ANTHROPIC_BASE_URL": sim.url, "ANTHROPIC_API_KEY": "sk-bench",
           "DROVER_RPM": str(RPM), "DROVER_ITPM": str(ITPM), "DROVER_OTPM": str(OTPM),
           "DROVER_BURST_SECONDS": str(BURST_S)}
    os.environ.update(env)
    from drover import JobSpec, submit  # with the environment above
    from drover.config import get_settings

    get_settings.cache_clear()  # this run's prefix and queue, not the last run's

    names = {f"small{i}-{tag}" for i in range(2)}
    stop, counts = threading.Event(), {}
    listener = threading.Thread(target=_events, daemon=True, args=(
        get_settings().broker_url or get_settings().redis_url, env["DROVER_KEY_PREFIX"], names,
        stop, counts))
    listener.start()
    time.sleep(1.0)  # bound to the events exchange before the workers start
    workers = [spawn_worker(env, name, threads=4, events=True) for name in sorted(names)]
    try:
        time.sleep(3)  # the workers come up
        started = time.monotonic()
        handle = submit(JobSpec(subtasks=[f"Summarise account {i} in a few lines"
                                          for i in range(n)], max_tokens=400))
        result = handle.wait(timeout=600)
        time.sleep(2.0)  # the last events arrive
        wall = max(r.finished_at for r in result.results) - (time.time() - (
            time.monotonic() - started))
        stats = sim.stats()
        counted_in = stats["billed"]["input_tokens"]
        out = stats["billed"]["output_tokens"]
        bound = max(stats["accepted"] / RPM, counted_in / ITPM, out / OTPM) * 60 - BURST_S
        # Busy: the provider's first acceptance to its last answer (the workers' start-up,
        # slow on a loaded box, is not the limiter's doing); wall: from the submit.
        busy = stats["last_done_ts"] - stats["first_accept_ts"]
        return {"n": n, "ok": result.counts["ok"], "n429": stats["rejected_429"],
                "n429_by_limit": stats["rejected_429_by_limit"],
                "n429_after_last_accept_s": stats["rejected_429_gaps_s"],
                "accepted": stats["accepted"], "input_tokens": counted_in,
                "output_tokens": out, "wall_s": round(wall, 1), "busy_s": round(busy, 1),
                "bound_s": round(bound, 1),
                "ratio": round(busy / bound, 3) if bound > 0 else None,
                "messages_per_subagent": round(counts.get("task-received", 0) / n, 2),
                "load": round(os.getloadavg()[0], 1)}
    finally:
        stop.set()
        kill_workers(workers)
        sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps(run(args.n)))


if __name__ == "__main__":
    main()
