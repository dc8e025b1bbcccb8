"""Long answers: a dozen sub-agents, one call each, answers of thousands of tokens whose
generation takes longer than a call timeout (issue 36).

    python -m bench.long_answers [--n 12] [--tps 400] [--max-tokens 8000] [--for-s 90]
                                 [--call-timeout-s 8] [--idle-s 3]

The simulator generates ``--tps`` output tokens a second, each answer 60-100% of max_tokens
(4,800-8,000 tokens at 8000: 12-20 s at 400 tokens/s, the issue's 2-3.5 minutes at 40
scaled down by ten). Two worker processes (2 threads each) with DROVER_CALL_TIMEOUT_S
below an answer's time and DROVER_STREAM_IDLE_S (where drover has it) far below it. It
prints, after the job ends or ``--for-s`` passes: sub-agents ok, the simulator's requests
(accepted, sent twice), its most requests in flight at once, answers abandoned
mid-generation, output tokens billed, and the job's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from typing import Any

from bench.recovery import kill_workers, spawn_worker
from drover.simulator import SimConfig, SimulatorServer


def run(n: int, tps: float, max_tokens: int, for_s: float, call_timeout_s: float,
        idle_s: float) -> dict[str, Any]:
    sim = SimulatorServer(SimConfig(seed=1, output_tokens_per_s=tps, ttft_s=0.5,
                                    output_share_min=0.6, output_share_max=1.0)).start()
    tag = uuid.uuid4().hex[:6]
    env = {**os.environ, "DROVER_KEY_PREFIX": f"bench-long-{tag}",
           "DROVER_QUEUE": f"bench-long-{tag}", "DROVER_KEY_ALIAS": f"bench-long-{tag}",
           "DROVER_ANTHROPIC_BASE_URL": sim.url, "ANTHROPIC_API_KEY": "sk-bench",
           "DROVER_RPM": "4000", "DROVER_ITPM": "4000000", "DROVER_OTPM": "4000000",
           "DROVER_CALL_TIMEOUT_S": str(call_timeout_s), "DROVER_STREAM_IDLE_S": str(idle_s),
           "DROVER_BACKOFF_BASE_S": "0.5"}
    os.environ.update(env)
    from drover import JobSpec, submit  # with the environment above
    from drover.config import get_settings

    get_settings.cache_clear()  # this run's prefix and queue, not the last run's

    workers = [spawn_worker(env, f"long{i}-{tag}", threads=2) for i in range(2)]
    try:
        started = time.monotonic()
        handle = submit(JobSpec(subtasks=[f"Write the full report on region {i}"
                                          for i in range(n)], max_tokens=max_tokens))
        ended = None
        while time.monotonic() - started < for_s:
            progress = handle.progress()
            if progress["pending"] == 0:
                ended = time.monotonic() - started
                break
            time.sleep(0.5)
        progress = handle.progress()
        stats = sim.stats()
        usage = None
        result = handle.result()
        if result is not None:
            usage = result.usage.model_dump()
        return {"n": n, "tps": tps, "max_tokens": max_tokens, "call_timeout_s": call_timeout_s,
                "idle_s": idle_s, "ok": progress.get("ok", 0), "pending": progress["pending"],
                "wall_s": None if ended is None else round(ended, 1),
                "sim_accepted": stats["accepted"], "sent_twice": stats["duplicate_accepted"],
                "max_in_flight": stats["max_in_flight"],
                "abandoned": stats["aborted"] + stats.get("streams", {}).get("abandoned", 0),
                "streams": stats.get("streams"),
                "billed_output_tokens": stats["billed"]["output_tokens"],
                "delivered_output_tokens": stats["output_tokens"], "job_usage": usage}
    finally:
        kill_workers(workers)
        sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=12)
    parser.add_argument("--tps", type=float, default=400.0)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--for-s", type=float, default=90.0)
    parser.add_argument("--call-timeout-s", type=float, default=8.0)
    parser.add_argument("--idle-s", type=float, default=3.0)
    args = parser.parse_args()
    print(json.dumps(run(args.n, args.tps, args.max_tokens, args.for_s, args.call_timeout_s,
                         args.idle_s), indent=1))


if __name__ == "__main__":
    main()
