"""What one scrape of ``drover metrics`` costs with a busy fleet in Redis.

Builds, under a key prefix of its own, a fleet's state as the workers and submitters leave
it: ``--jobs`` active jobs of ``--subagents`` sub-agents each (a third of them finished, in
each job's record hash and event stream), ``--scopes`` limiter scopes with real acquires and
settles, ``--procs`` worker heartbeats with running sub-agents, and the counters and
histograms of several models, scopes and tools. Then serves it with the real exporter
(``drover.orchestrator.ops.metrics.serve``'s collector over HTTP) and times GET /metrics:

- the first scrape (it reads every job's stream from the start);
- ``--scrapes`` steady-state scrapes, with ``--finish`` more sub-agents finishing between two
  scrapes (what a fleet does between Prometheus' scrapes).

    python -m bench.metrics_scrape [--jobs 100] [--subagents 50] [--scrapes 20]

Deletes its keys afterwards (never flushes). The broker queue is read too (one passive
declare per queue) when ``--broker`` is given; by default only Redis state is read.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import urllib.request
import uuid

from drover.config.settings import load_settings
from drover.orchestrator.ops.metrics import DroverCollector
from drover.orchestrator.ops.services import free_port
from drover.workers.connections.redis_clients import sync_redis
from drover.workers.jobs.records import SubagentResult
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.store import JobStore
from drover.workers.limiter import Limiter, ScopeLimits, llm_scope, tool_scope
from drover.workers.services import Services
from drover.workers.telemetry import CALL_OUTCOMES, TOKEN_TYPES, Recorder, register_job


def build_fleet(settings, args):  # noqa: ANN001, ANN201
    client = sync_redis(settings.redis_url)
    store = JobStore(client, prefix=settings.key_prefix)
    limiter = Limiter(client, prefix=settings.key_prefix)
    limits = ScopeLimits(rpm=1e6, itpm=1e9, otpm=1e9)
    scopes = [llm_scope(f"key{i % 3}", f"model-{i}") for i in range(args.scopes - 2)]
    scopes += [tool_scope("search"), tool_scope("fetch")]
    for scope in scopes:
        for _ in range(20):
            grant = limiter.acquire(scope, limits, input_tokens=500, output_tokens=100)
            limiter.settle(scope, limits, grant, input_tokens=480, output_tokens=90)
    pending: list[tuple[str, int]] = []
    rng = random.Random(1)
    for j in range(args.jobs):
        job_id = f"bench{j:04d}"
        store.specs.create(job_id, JobSpec(subtasks=["x"]),
                           [f"task {i}" for i in range(args.subagents)],
                           status="queued", queue="drover")
        store.meta.claim_launch(job_id)
        register_job(client, settings.key_prefix, job_id, f"tenant{j % 5}", keep_s=3600)
        done = args.subagents // 3
        for i in range(done):
            store.records.put(_record(job_id, i, rng))
        pending += [(job_id, i) for i in range(done, args.subagents)]
    recorders = []
    for p in range(args.procs):
        rec = Recorder(sync_redis(settings.redis_url), settings.key_prefix, flush_s=3600)
        rec.worker_ready(f"celery@bench{p}")
        for j in range(args.jobs):
            if (j + p) % 4 == 0:
                rec.running(f"bench{j:04d}", 2)
        for scope in scopes[:-2]:
            model = scope.rsplit(":", 1)[1]
            for outcome in CALL_OUTCOMES:
                rec.inc("drover_llm_calls", (scope, outcome), 10)
            rec.observe("drover_limiter_acquire_wait_seconds", (scope,), rng.random())
            genai = ("chat", "anthropic", model)
            rec.observe("drover_gen_ai_client_operation_duration_seconds", (*genai, ""), 1.0)
            for kind in TOKEN_TYPES:
                rec.inc("drover_gen_ai_client_token_usage", (*genai, kind), 1000)
        for tool in ("search", "fetch", "calculator"):
            rec.inc("drover_tool_calls", (tool, "ok"))
            rec.observe("drover_tool_call_duration_seconds", (tool,), 0.05)
        rec.flush()
        recorders.append(rec)
    rng.shuffle(pending)
    return store, pending, recorders


def _record(job_id: str, index: int, rng: random.Random) -> SubagentResult:
    return SubagentResult(job_id=job_id, index=index, status=rng.choice(["ok"] * 8 + ["failed"]),
                          summary="s" * 400, turns=2, finished_at=time.time())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--subagents", type=int, default=50)
    parser.add_argument("--scopes", type=int, default=10)
    parser.add_argument("--procs", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--finish", type=int, default=200,
                        help="sub-agents that finish between two scrapes")
    parser.add_argument("--broker", action="store_true", help="also read the broker queue")
    parser.add_argument("--redis", default=os.environ.get("DROVER_REDIS_URL",
                                                          "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    prefix = f"drover-bench-{uuid.uuid4().hex[:8]}"
    settings = load_settings(redis_url=args.redis, key_prefix=prefix,
                             metrics_max_jobs=args.jobs)
    recorders = []
    try:
        t = time.perf_counter()
        store, pending, recorders = build_fleet(settings, args)
        print(f"fleet built in {time.perf_counter() - t:.1f} s: {args.jobs} active jobs x "
              f"{args.subagents} sub-agents, {args.scopes} scopes, {args.procs} worker processes")
        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(DroverCollector(Services(settings), broker_queues=args.broker))
        port = free_port()
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        url = f"http://127.0.0.1:{port}/metrics"

        def scrape() -> tuple[float, int]:
            start = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as response:
                body = response.read()
            return time.perf_counter() - start, len(body)

        first, size = scrape()
        rng = random.Random(2)
        times = []
        for _ in range(args.scrapes):
            for job_id, index in pending[:args.finish]:
                store.records.put(_record(job_id, index, rng))
            del pending[:args.finish]
            took, size = scrape()
            times.append(took)
        series = sum(1 for line in urllib.request.urlopen(url).read().decode().splitlines()
                     if line and not line.startswith("#"))
        print(f"first scrape (reads every stream): {first * 1000:.1f} ms")
        print(f"steady scrapes ({args.scrapes}, {args.finish} sub-agents finishing between "
              f"two): median {statistics.median(times) * 1000:.1f} ms, "
              f"max {max(times) * 1000:.1f} ms")
        print(f"exposition: {size / 1024:.0f} KiB, {series} samples; load average "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        server.shutdown()
        thread.join(timeout=5)
    finally:
        for rec in recorders:
            rec.close()
        client = sync_redis(args.redis)
        deleted = 0
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            deleted += client.delete(key)
        client.close()
        print(f"keys under {prefix}: {deleted} deleted")


if __name__ == "__main__":
    main()
