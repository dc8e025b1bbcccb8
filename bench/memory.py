"""What a sub-agent costs in Redis: bytes per sub-agent at peak (during the job) and at rest
(once the joined result is stored), for answers of about 50, 500 and 2,000 tokens.

    python -m bench.memory [--n 300] [--tokens 50,500,2000] [--workers 1] [--concurrency 8]
                           [--quick] [--out bench/RESULTS-memory.md]

Per answer size: one job of N one-call sub-agents on real `celery worker` processes against
the bundled simulator (``output_tokens_mean`` set to the size, no limits, no latency). A
thread samples ``MEMORY USAGE key SAMPLES 0`` over every key of the job
(``{prefix}:job:{id}:*``) every 0.2 s while the job runs; the peak and the figure at rest
are divided by N. The answer's own size is the mean length (UTF-8 bytes) of the sub-agents'
findings (``JobHandle.report(i).findings``), so "overhead" is what Redis holds beyond one
copy of the answer. ``--quick``: 20 sub-agents, 50 tokens, nothing written.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench.contenders.common import SimProcess, celery_workers, delete_prefix
from bench.workload import MODEL

UNLIMITED = {"DROVER_RPM": "1e9", "DROVER_ITPM": "1e12", "DROVER_OTPM": "1e12",
             "DROVER_MAX_IN_FLIGHT": "100000"}


def job_bytes(client: redis.Redis, pattern: str, parts: dict[str, int] | None = None
              ) -> tuple[int, int]:
    """(bytes, keys) of every key matching ``pattern``, by MEMORY USAGE (exact: SAMPLES 0);
    with ``parts``, the bytes per kind of key added to it (``ckpt:{n}`` for every checkpoint)."""
    keys = list(client.scan_iter(match=pattern, count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    sizes = [n or 0 for n in pipe.execute()]
    if parts is not None:
        for key, size in zip(keys, sizes, strict=True):
            kind = ":".join("{n}" if p.isdigit() else p
                            for p in key.decode().split(":")[len(pattern.split(":")) - 1:])
            parts[kind] = parts.get(kind, 0) + size
    return sum(sizes), len(keys)


class Sampler(threading.Thread):
    def __init__(self, redis_url: str, pattern: str, every_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(redis_url)
        self.pattern, self.every_s = pattern, every_s
        self.peak = self.peak_keys = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            size, keys = job_bytes(self.client, self.pattern)
            if size > self.peak:
                self.peak, self.peak_keys = size, keys
            self.stop.wait(self.every_s)


def run(redis_url: str, n: int, sizes: list[int], workers: int, concurrency: int
        ) -> list[dict[str, Any]]:
    run_id = uuid.uuid4().hex[:8]
    prefix, queue = f"drover-bench-mem-{run_id}", f"bench-mem-{run_id}"
    env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
           "DROVER_KEY_ALIAS": queue, "ANTHROPIC_API_KEY": f"sk-bench-mem-{run_id}",
           "DROVER_MODEL": MODEL, **UNLIMITED}
    os.environ.update({"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix})
    from drover import JobSpec, submit  # after the environment names this run's prefix
    from drover.config import load_settings
    from drover.simulator.config import SimConfig
    from drover.workers.app import app

    subtasks = [f"Summarise item {i} of the catalogue." for i in range(n)]
    rows = []
    client = redis.Redis.from_url(redis_url)
    try:
        with SimProcess(SimConfig(seed=1)) as sim:
            env["DROVER_ANTHROPIC_BASE_URL"] = sim.url
            settings = load_settings(queue=queue, key_alias=queue, key_prefix=prefix,
                                     redis_url=redis_url, anthropic_base_url=sim.url)
            with celery_workers("drover.workers.app", env, queue, workers, concurrency, app):
                for tokens in sizes:
                    sim.configure(output_tokens_mean=tokens)
                    spec = JobSpec(subtasks=subtasks, model=MODEL, max_tokens=8192, max_turns=2)
                    started = time.perf_counter()
                    handle = submit(spec, settings=settings)
                    submit_s = time.perf_counter() - started
                    pattern = f"{prefix}:job:{handle.id}:*"
                    sampler = Sampler(redis_url, pattern)
                    sampler.start()
                    # As a caller of a large job would: the result without its records, then
                    # the records a page at a time (never all of them in memory at once).
                    result = handle.wait(timeout=3600, poll_s=0.5, records=False)
                    done_s = time.perf_counter() - started
                    sampler.stop.set()
                    sampler.join()
                    paged = sum(1 for record in handle.records() if record.status == "ok")
                    time.sleep(0.5)
                    parts: dict[str, int] = {}
                    rest, rest_keys = job_bytes(client, pattern, parts)
                    answers = [len(handle.report(i).findings.encode())  # type: ignore[union-attr]
                               for i in range(0, n, max(1, n // 50))]
                    answer = statistics.mean(answers)
                    print(f"  submit {submit_s:.2f} s, joined after {done_s:.0f} s "
                          f"({n / done_s:.0f} sub-agents/s); records paged: {paged} ok; this "
                          f"process's peak RSS {_peak_rss_mb():.0f} MB", flush=True)
                    rows.append({"n": n, "tokens": tokens, "ok": result.counts["ok"],
                                 "answer": answer, "peak": sampler.peak / n,
                                 "peak_keys": sampler.peak_keys, "rest": rest / n,
                                 "rest_keys": rest_keys})
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
                    print("  at rest, bytes per sub-agent by key: " + ", ".join(
                        f"{kind} {size / n:,.0f}" for kind, size in
                        sorted(parts.items(), key=lambda kv: -kv[1])), flush=True)
    finally:
        client.close()
        delete_prefix(redis_url, prefix)
        print(f"keys under {prefix}: deleted")
    return rows


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| answer tokens | sub-agents (ok) | answer bytes | peak B/sub-agent | "
             "peak - answer | at rest B/sub-agent | rest - answer | keys at peak / rest |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['n']} ({r['ok']}) | {r['answer']:,.0f} | "
                     f"{r['peak']:,.0f} | {r['peak'] - r['answer']:,.0f} | {r['rest']:,.0f} | "
                     f"{r['rest'] - r['answer']:,.0f} | {r['peak_keys']} / {r['rest_keys']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--tokens", default="50,500,2000")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    redis_url = os.environ.get("DROVER_REDIS_URL", "redis://127.0.0.1:6379/0")
    n, sizes = args.n, [int(t) for t in args.tokens.split(",")]
    if args.quick:
        n, sizes = 20, [50]
    rows = run(redis_url, n, sizes, args.workers, args.concurrency)
    text = table(rows)
    print(text)
    if args.out and not args.quick:
        with args.out.open("a") as out:
            out.write("\n" + text + "\n")


if __name__ == "__main__":
    main()
