"""A small key (issue 36, item 3): 60 RPM, 40,000 ITPM, 12,000 OTPM, bursts of 1 s.

    python -m bench.small_keys [--n 60] [--runs 1] [--mix]

60 one-call sub-agents (answers of 80-240 tokens, 0.4 s latency) through two worker
processes (4 threads each) against the simulator enforcing those limits (output counted as
generated). Per run it prints: sub-agents ok, the simulator's 429s, the wall time from submit
to the last record, the busy time (the simulator's first acceptance to its last answer) and
its ratio to the lower bound (``bound_s``): the busy time of an ideal client that sends each
call, in the job's order, the moment the simulator's buckets would admit it, knowing every
call's tokens (``_bound_replay``); and the task messages per sub-agent (Celery's
``task-received`` events of the run's workers: one per delivery, limiter retries included).
``bound_before_s`` / ``ratio_before``: the bound of the earlier rows of
bench/RESULTS-small.md (max(requests / RPM, counted input / ITPM, output / OTPM) minutes less
the 1 s burst; --mix: the blocks' formula below), for comparison.

``--mix`` (issue 53, item 3): the three dimensions bind in turn, in blocks of ten sub-agents
in the job's order: short prompts and answers (the requests bind: 1 s a call), long prompts
(about 900 input tokens by the simulator's count: 1.35 s a call of the input limit, more than
its 1 s bucket holds), long answers (about 320 output tokens: 1.6 s a call of the output
limit). Sub-agents are served in order, so the bound is what the limits allow in that order;
``bound_any_order_s`` is the usual bound of the totals, which only reordering reaches. The
blocks' formula of the earlier rows (each block's slowest dimension, added, less one burst
where the binding dimension changes) undercounts it: see ``_bound_blocks``.
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
LATENCY_S = 0.4  # the answers' mean time


def _mixed(i: int) -> str:
    """--mix: sub-agent i's task; its block's kind binds requests, input or output."""
    kind = (i // BLOCK) % 3
    if kind == 1:
        return f"Summarise account {i} in a few lines [[sim:out=100]]: {LONG_PROMPT}"
    return f"Summarise account {i} in a few lines [[sim:out={320 if kind == 2 else 100}]]"


def _bound_blocks(results: list[Any]) -> float:
    """--mix, the bound as first written (kept for comparison with the earlier rows of
    bench/RESULTS-small.md): each block's slowest dimension, added, less a burst where the
    binding one changes. It undercounts what the provider allows in this order: a bucket of
    one request holds any two calls 1 s apart across a block's edge too (a block of ten
    calls that the requests bind lasts 10 s up to the next block's first call, not 9), and
    a long prompt's input debt holds the next block's first call as long (see
    ``_bound_replay``)."""
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


def _bound_replay(calls: list[tuple[int, int]], latency_s: float = LATENCY_S,
                  sends: list[float] | None = None) -> float:
    """The busy time (first admission to last answer) of an ideal client that sends each
    call, in the job's order, at the first instant the simulator's own buckets
    (simulator/buckets.py: continuous refill, 1 s of burst, a prompt larger than the
    input bucket admitted once it is full, output debited as generated and admitted while
    the output bucket is above 0) would admit it, knowing every call's counted input and
    answer in advance, each answer taking the mean latency. ``calls``: (input as the
    simulator counted it, output tokens) per call, in order. Sending each call as early as
    the buckets admit it is the fastest schedule in that order (an earlier debit never
    leaves a bucket lower later), so no limiter serving the job in order can be faster,
    but for the lognormal spread of the answers' times around their mean. ``sends``, if
    given, receives each call's send, in seconds from the first."""
    from drover.simulator.buckets import TokenBucket

    req, inp, out = (TokenBucket(limit, BURST_S, 0.0) for limit in (RPM, ITPM, OTPM))
    pending: list[tuple[float, int]] = []  # (when, tokens): answers' output, by time
    t = done = 0.0
    for n_in, n_out in calls:
        while True:
            while pending and pending[0][0] <= t:
                at, tokens = pending.pop(0)
                for bucket in (req, inp, out):
                    bucket.refill(at)
                out.level -= tokens
            for bucket in (req, inp, out):
                bucket.refill(t)
            wait = max(req.shortfall_s(1), inp.shortfall_s(n_in),
                       out.shortfall_s(0, strictly_positive=True))
            if wait <= 1e-9:
                break
            # An answer's output debited before then changes the wait: look again there.
            t = min(t + wait, pending[0][0]) if pending else t + wait
        req.level -= 1
        inp.level -= n_in
        pending.append((t + latency_s, n_out))
        pending.sort()
        done = max(done, t + latency_s)
        if sends is not None:
            sends.append(t)
    return done


def _trace(sim: SimulatorServer, prefix: str, stop: threading.Event,
           rows: dict[str, list[dict[str, Any]]]) -> None:
    """--trace: the provider's buckets at each admission (``rows["admissions"]``: its levels
    before the debit, the call's counted input and answer, monotonic time) and the scope's
    limiter bucket hash read every 50 ms (``rows["limiter"]``: Redis' own instants in us in
    its fields; ``wall`` and ``t``, this process's clock, to line them up)."""
    import redis

    from drover.config import get_settings

    stats, admitted = sim.engine.stats, sim.engine.stats.admitted

    def on_admitted(now: float, digest: bytes, counted_input: int, usage: dict[str, int],
                    model: str = "") -> None:
        keys = next(iter(sim.engine._buckets.values()))
        levels = [b.level if b.ts >= now else min(b.capacity, b.level + (now - b.ts) * b.rate)
                  for b in (keys.requests, keys.input, keys.output)]
        rows["admissions"].append({"t": now, "in": counted_input, "out": usage["output_tokens"],
                                   "r": levels[0] + 1, "i": levels[1] + counted_input,
                                   "o": levels[2]})
        admitted(now, digest, counted_input, usage, model)

    stats.admitted = on_admitted  # type: ignore[method-assign]
    r = redis.Redis.from_url(get_settings().redis_url, decode_responses=True)
    key = None
    while not stop.is_set():
        if key is None:
            key = next((k for k in r.scan_iter(match=f"{prefix}:*:b", count=1000)
                        if r.hexists(k, "Lr")), None)
        if key is not None:
            rows["limiter"].append({"t": time.monotonic(), "wall": time.time(), **r.hgetall(key)})
        time.sleep(0.05)


def _held(rows: dict[str, list[dict[str, Any]]]) -> list[dict[str, float]]:
    """--trace, per admission of a long answer's call: the provider's output bucket when it
    came (tokens above 0: it could have come level / rate seconds sooner, unless the request
    bucket held it) and, that long before it, how far ahead of then the limiter's model of
    the provider's output bucket (hold_back.lua's ``so``) stood, against its burst."""
    adm, lim = rows["admissions"], rows["limiter"]
    if not lim:
        return []
    offset = lim[0]["wall"] - lim[0]["t"]
    out = []
    for k in range(1, len(adm)):
        a = adm[k]
        if a["out"] <= 200:
            continue
        sooner = max(0.0, min(a["o"] / (OTPM / 60), a["t"] - adm[k - 1]["t"] - 60 / RPM))
        at = a["t"] - sooner
        row = next((p for p in reversed(lim) if p["t"] <= at), None)
        if row is None or "so" not in row:
            continue
        out.append({"at_s": round(a["t"] - adm[0]["t"], 2), "provider_out_level": round(a["o"]),
                    "sooner_s": round(sooner, 2),
                    "so_ahead_s": round((float(row["so"]) - (at + offset) * 1e6) / 1e6, 2),
                    "burst_s": float(row["burst"])})
    return out


def run(n: int, mix: bool = False, trace: str | None = None) -> dict[str, Any]:
    sim = SimulatorServer(SimConfig(seed=1, rpm=RPM, itpm=ITPM, otpm=OTPM, burst_s=BURST_S,
                                    latency_mean_s=LATENCY_S, latency_p95_s=0.6, tool_turns=0,
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
    rows: dict[str, list[dict[str, Any]]] = {"admissions": [], "limiter": []}
    if trace:
        threading.Thread(target=_trace, daemon=True,
                         args=(sim, env["DROVER_KEY_PREFIX"], stop, rows)).start()
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
        any_order = max(stats["accepted"] / RPM, counted_in / ITPM, out / OTPM) * 60 - BURST_S
        by_index = sorted(result.results, key=lambda r: r.index)
        sends: list[float] = []
        bound = _bound_replay([(r.usage.input_tokens + r.usage.cache_creation_input_tokens,
                                r.usage.output_tokens) for r in by_index if r.usage.calls],
                              sends=sends)
        # Where the time went, per block of ten (--mix: one kind each): from one block's first
        # answer to the next block's (the last: to its last answer), against the same in the
        # ideal schedule (its sends; answers a mean latency later).
        done = [r.finished_at for r in by_index]
        edges = list(range(0, len(by_index), BLOCK))
        spans = [round((done[edges[k + 1]] if k + 1 < len(edges) else max(done)) - done[e], 2)
                 for k, e in enumerate(edges)]
        ideal = [round((sends[edges[k + 1]] if k + 1 < len(edges) else sends[-1]) - sends[e], 2)
                 for k, e in enumerate(edges)] if len(sends) == len(by_index) else []
        blocks = _bound_blocks(result.results) if mix else any_order
        # Busy: the provider's first acceptance to its last answer (the workers' start-up,
        # slow on a loaded box, is not the limiter's doing); wall: from the submit.
        busy = stats["last_done_ts"] - stats["first_accept_ts"]
        if trace:
            held = _held(rows)
            with open(trace, "w") as f:
                json.dump({**rows, "held": held}, f)
            print(json.dumps({"held": held}), flush=True)
        return {"n": n, "ok": result.counts["ok"], "n429": stats["rejected_429"],
                "n429_by_limit": stats["rejected_429_by_limit"],
                "n429_after_last_accept_s": stats["rejected_429_gaps_s"],
                "accepted": stats["accepted"], "input_tokens": counted_in,
                "output_tokens": out, "wall_s": round(wall, 1), "busy_s": round(busy, 1),
                "bound_s": round(bound, 1), "bound_any_order_s": round(any_order, 1),
                "ratio": round(busy / bound, 3) if bound > 0 else None,
                # The bound as the earlier rows of bench/RESULTS-small.md took it (--mix:
                # the blocks' formula; else the totals' less a burst) and the ratio to it.
                "bound_before_s": round(blocks, 1),
                "ratio_before": round(busy / blocks, 3) if blocks > 0 else None,
                "block_spans_s": spans, "block_spans_ideal_s": ideal,
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
    parser.add_argument("--trace", metavar="FILE",
                        help="write the provider's buckets at each admission and the limiter's "
                        "bucket every 50 ms to FILE (JSON), and print, per long answer's call, "
                        "how long before it the provider had room")
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps({"load_before": round(os.getloadavg()[0], 1),
                          **run(args.n, args.mix, args.trace)}), flush=True)


if __name__ == "__main__":
    main()
