"""A small key (issue 36, item 3): 60 RPM, 40,000 ITPM, 12,000 OTPM, bursts of 1 s.

    python -m bench.small_keys [--n 60] [--runs 1] [--mix]

60 one-call sub-agents (answers of 80-240 tokens, 0.4 s latency) through two worker
processes (4 threads each) against the simulator enforcing those limits (output counted as
generated). Per run it prints: sub-agents ok, the simulator's 429s, the wall time from submit
to the last record, the busy time (the simulator's first acceptance to its last answer) and
its ratio to the lower bound that the limits set: max(requests / RPM, counted input / ITPM,
output / OTPM) minutes, less the 1 s burst; and the task messages per sub-agent (Celery's
``task-received`` events of the run's workers: one per delivery, limiter retries included).

``--mix`` (issue 53, item 3): the three dimensions bind in turn, in blocks of ten sub-agents
in the job's order: short prompts and answers (the requests bind: 1 s a call), long prompts
(about 900 input tokens by the simulator's count: 1.35 s a call of the input limit, more than
its 1 s bucket holds), long answers (about 320 output tokens: 1.6 s a call of the output
limit). Its bound adds each block's (the slowest of its three dimensions, the block's
tokens as the simulator counted them in the answers), less one burst for each block whose
binding dimension is not the last block's (its bucket filled meanwhile): sub-agents are
served in order, so this is what the limits allow in that order (``bound_s``);
``bound_any_order_s`` is the usual bound of the totals, which only reordering reaches.
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
BLOCK = 10  # --mix: sub-agents of one kind in a row
LONG_PROMPT = " ".join(["ledger entry"] * 225)  # 900 tokens as the simulator counts


def _mixed(i: int) -> str:
    """--mix: sub-agent i's task; its block's kind binds requests, input or output."""
    kind = (i // BLOCK) % 3
    if kind == 1:
        return f"Summarise account {i} in a few lines [[sim:out=100]]: {LONG_PROMPT}"
    return f"Summarise account {i} in a few lines [[sim:out={320 if kind == 2 else 100}]]"


def _bound_in_order(results: list[Any]) -> float:
    """--mix: each block's slowest dimension, added, less a burst where the binding one
    changes (its bucket filled while another bound)."""
    by_index = sorted(results, key=lambda r: r.index)
    total, last = 0.0, None
    for start in range(0, len(by_index), BLOCK):
        block = by_index[start:start + BLOCK]
        seconds = {"requests": sum(r.usage.calls for r in block) / RPM * 60,
                   "input": sum(r.usage.input_tokens for r in block) / ITPM * 60,
                   "output": sum(r.usage.output_tokens for r in block) / OTPM * 60}
        binding = max(seconds, key=seconds.__getitem__)
        total += seconds[binding] - (BURST_S if binding != last else 0.0)
        last = binding
    return total


def run(n: int, mix: bool = False) -> dict[str, Any]:
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
        handle = submit(JobSpec(subtasks=[_mixed(i) if mix else
                                          f"Summarise account {i} in a few lines"
                                          for i in range(n)], max_tokens=600 if mix else 400))
        result = handle.wait(timeout=600)
        time.sleep(2.0)  # the last events arrive
        wall = max(r.finished_at for r in result.results) - (time.time() - (
            time.monotonic() - started))
        stats = sim.stats()
        counted_in = stats["billed"]["input_tokens"]
        out = stats["billed"]["output_tokens"]
        bound = any_order = max(stats["accepted"] / RPM, counted_in / ITPM,
                                out / OTPM) * 60 - BURST_S
        if mix:
            bound = _bound_in_order(result.results)
        # Busy: the provider's first acceptance to its last answer (the workers' start-up,
        # slow on a loaded box, is not the limiter's doing); wall: from the submit.
        busy = stats["last_done_ts"] - stats["first_accept_ts"]
        return {"n": n, "ok": result.counts["ok"], "n429": stats["rejected_429"],
                "n429_by_limit": stats["rejected_429_by_limit"],
                "n429_after_last_accept_s": stats["rejected_429_gaps_s"],
                "accepted": stats["accepted"], "input_tokens": counted_in,
                "output_tokens": out, "wall_s": round(wall, 1), "busy_s": round(busy, 1),
                "bound_s": round(bound, 1), "bound_any_order_s": round(any_order, 1),
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
    parser.add_argument("--mix", action="store_true",
                        help="blocks of sub-agents that bind requests, input, output in turn")
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps({"load_before": round(os.getloadavg()[0], 1), **run(args.n, args.mix)}),
              flush=True)


if __name__ == "__main__":
    main()
