"""Issue 38's goal, on both providers: 150 sub-agents, each two turns of two function calls
(run side by side under drover's tool limits) and then its answer, at a binding tokens limit.

    python -m bench.tool_turns [--provider openai,anthropic] [--n 150] [--runs 1]

OpenAI's structure: requests/min and one tokens/min bucket, charged input + max_tokens at
admission and not given back within the minute (../shared/openai-api.md); Anthropic's:
requests, input tokens and output tokens (debited as generated). Two worker processes of 8
threads against the simulator, bursts of 1 s, 0.4 s latency. Per run it prints: sub-agents
ok, the simulator's 429s, its 4xx (a function call left unanswered before the next turn is a
400 there: a protocol error), the busy time (the first acceptance to the last answer) and its
ratio to the lower bound the binding limit sets: what that limit counted, less one bucket,
over its rate.
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

MAX_TOKENS, BURST_S, RPM = 200, 1, 6000
# The binding limit of each: about a minute of work for 150 sub-agents (450 calls).
TPM = 150_000                        # OpenAI: input + max_tokens per call
ITPM, OTPM = 80_000, 1_000_000       # Anthropic: the input binds


def run(provider: str, n: int) -> dict[str, Any]:
    limits = ({"tpm": TPM} if provider == "openai" else {"itpm": ITPM, "otpm": OTPM})
    sim = SimulatorServer(SimConfig(provider=provider, seed=1, rpm=RPM, burst_s=BURST_S,
                                    latency_mean_s=0.4, latency_p95_s=0.6, tool_turns=2,
                                    tools_per_turn=2, output_tokens_mean=80,
                                    **limits)).start()
    tag = uuid.uuid4().hex[:6]
    env = {**os.environ, "DROVER_KEY_PREFIX": f"bench-tt-{tag}", "DROVER_QUEUE": f"bench-tt-{tag}",
           "DROVER_KEY_ALIAS": f"bench-tt-{tag}", "DROVER_PROVIDER": provider,
           "DROVER_RPM": str(RPM),
           "DROVER_BURST_SECONDS": str(BURST_S)}
    if provider == "openai":
        env.update(DROVER_OPENAI_BASE_URL=sim.url + "/v1", DROVER_OPENAI_API_KEY="sk-bench",
                   DROVER_MODEL="gpt-sim-1", DROVER_TPM=str(TPM))
    else:
        env.update(DROVER_ANTHROPIC_BASE_URL=sim.url, ANTHROPIC_API_KEY="sk-bench",
                   DROVER_ITPM=str(ITPM), DROVER_OTPM=str(OTPM))
    os.environ.clear()
    os.environ.update(env)
    from drover import JobSpec, submit  # with the environment above
    from drover.config import get_settings

    get_settings.cache_clear()  # this run's provider, prefix and queue, not the last run's
    workers = [spawn_worker(env, f"tt{i}-{tag}", threads=8) for i in range(2)]
    try:
        time.sleep(3)  # the workers come up
        result = submit(JobSpec(subtasks=[f"Look up the facts of account {i}" for i in range(n)],
                                tools=["lookup_fact"], max_tokens=MAX_TOKENS)).wait(timeout=900)
        stats = sim.stats()
        counted_in = stats["billed"]["input_tokens"]
        if provider == "openai":
            counted, rate = counted_in + stats["accepted"] * MAX_TOKENS, TPM / 60
        else:
            counted, rate = counted_in, ITPM / 60
        bound = max((counted - rate * BURST_S) / rate, stats["accepted"] / (RPM / 60))
        busy = stats["last_done_ts"] - stats["first_accept_ts"]
        return {"provider": provider, "n": n, "ok": result.counts["ok"],
                "turns": sorted({r.turns for r in result.results}),
                "n429": stats["rejected_429"], "n429_by_limit": stats["rejected_429_by_limit"],
                "n429_at_s": [row["t"] for row in stats["timeline"] if row["n429"]],
                "errors_4xx": stats["errors_4xx"],
                "accepted": stats["accepted"], "counted_tokens": counted,
                "busy_s": round(busy, 1), "bound_s": round(bound, 1),
                "ratio": round(busy / bound, 3), "load": round(os.getloadavg()[0], 1)}
    finally:
        kill_workers(workers)
        sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="openai,anthropic")
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    base = dict(os.environ)
    for _ in range(args.runs):
        for provider in args.provider.split(","):
            print(json.dumps(run(provider, args.n)), flush=True)
            os.environ.clear()
            os.environ.update(base)


if __name__ == "__main__":
    main()
