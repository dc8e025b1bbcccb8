"""drover at scale: submit latency, dispatch rate, end-to-end rate and memory for 1,000 to
10,000 one-call sub-agents, side by side with a bare Celery chord of the same calls.

    python -m bench.scale [--sizes 1000,5000,10000] [--workers 4] [--concurrency 16]
                          [--out bench/RESULTS-scale.md]

Per size, in one run: a bare Celery chord of N tasks that each make the one call with the
plain sync SDK (`bench/contenders/bare_chord.py`: drover's own Celery settings, no limiter),
then a drover job of the same N one-call sub-agents (limits far away), each on W fresh
worker processes x C threads, against one simulator with no limits and no latency.

- submit: how long the caller is blocked (`chord(...)()` / `submit()`);
- publish: N / the time to put N sub-agent messages on a queue no worker consumes (the bare
  chord: `chord(...)()`; drover: `drover.workers.tasklayer.dispatch.dispatch`, which is what a
  job's window, a drain and a batch-mode job are sent with). During a drover run the messages go
  out as fair share frees places (one window ahead of the workers), so there it is the end-to-end
  rate that counts;
- end to end: N / the time from the start of submit until the joined result is stored;
- CPU per sub-agent: the worker processes' CPU time / N (the simulator's apart), and the
  submitting process's (this one: the bare chord's sender publishes every message; drover's
  submit and its wait for the result) over the same span;
- memory: peak RSS (VmHWM) of each worker process, and how much the submitting process grew.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

from celery import chord

from bench.contenders.common import (
    SimProcess,
    celery_workers,
    cpu_seconds,
    delete_prefix,
    peak_rss_kb,
)
from bench.workload import MODEL

UNLIMITED = {"DROVER_RPM": "1e9", "DROVER_ITPM": "1e12", "DROVER_OTPM": "1e12",
             "DROVER_MAX_IN_FLIGHT": "100000"}
EXTRA_ENV: dict[str, str] = {}  # --env: more DROVER_* settings for drover's workers


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _bare(redis_url: str, prefix: str, subtasks: list[str], workers: int, concurrency: int,
          sim_url: str) -> dict[str, Any]:
    from bench.contenders.bare_chord import make_app

    n = len(subtasks)
    queue = f"bench-bare-{uuid.uuid4().hex[:8]}"
    env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
           "BENCH_SIM_URL": sim_url, "BENCH_API_KEY": f"sk-bench-scale-{prefix}"}
    sender = make_app()
    with celery_workers("bench.contenders.bare_chord", env, queue, workers, concurrency,
                        sender) as procs:
        cpu_before = sum(cpu_seconds(p.pid) for p in procs)
        rss_before, own_before = rss_kb(), time.process_time()
        started = time.monotonic()
        header = [sender.signature("bench.one_call", args=(i, MODEL, task), queue=queue)
                  for i, task in enumerate(subtasks)]
        result = chord(header, app=sender)(sender.signature("bench.collect", queue=queue))
        submit_s = time.monotonic() - started
        assert result.get(timeout=1800, interval=0.05) == n
        wall = time.monotonic() - started
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu_before
        own = time.process_time() - own_before
        rss = [peak_rss_kb(p.pid) for p in procs]
        grew = rss_kb() - rss_before
    sender.close()
    return {"submit_s": submit_s, "wall_s": wall, "cpu_s": cpu, "submitter_cpu_s": own,
            "worker_rss_kb": rss, "submitter_grew_kb": grew, "ok": n}


def _drover(redis_url: str, prefix: str, subtasks: list[str], workers: int, concurrency: int,
            sim_url: str) -> dict[str, Any]:
    # a process's first submit imports it: not timed
    importlib.import_module("drover.workers.tasklayer.tasks")
    from drover import JobSpec, submit
    from drover.config import load_settings
    from drover.workers.app import app

    run_id = uuid.uuid4().hex[:8]
    queue = alias = f"bench-scale-{run_id}"
    env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
           "DROVER_KEY_ALIAS": alias, "DROVER_ANTHROPIC_BASE_URL": sim_url,
           "ANTHROPIC_API_KEY": f"sk-bench-scale-{prefix}", "DROVER_MODEL": MODEL, **UNLIMITED,
           **EXTRA_ENV}
    settings = load_settings(queue=queue, key_alias=alias)
    spec_args = {"subtasks": subtasks, "model": MODEL, "max_tokens": 1024, "max_turns": 2}
    with celery_workers("drover.workers.app", env, queue, workers, concurrency, app) as procs:
        cpu_before = sum(cpu_seconds(p.pid) for p in procs)
        rss_before, own_before = rss_kb(), time.process_time()
        started = time.monotonic()
        handle = submit(JobSpec(**spec_args), settings=settings)
        submit_s = time.monotonic() - started
        result = handle.wait(timeout=1800, poll_s=0.05)
        wall = time.monotonic() - started
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu_before
        own = time.process_time() - own_before
        rss = [peak_rss_kb(p.pid) for p in procs]
        grew = rss_kb() - rss_before
    return {"submit_s": submit_s, "wall_s": wall, "cpu_s": cpu, "submitter_cpu_s": own,
            "worker_rss_kb": rss, "submitter_grew_kb": grew, "ok": result.counts["ok"],
            "result_bytes": len(result.model_dump_json())}


def _bare_publish(n: int) -> float:
    """Seconds for ``chord(...)()`` of n one-call tasks to a queue with no consumer."""
    from bench.contenders.bare_chord import make_app
    from drover.config import get_settings

    sender = make_app()
    queue = f"bench-publish-{uuid.uuid4().hex[:8]}"
    header = [sender.signature("bench.one_call", args=(i, MODEL, f"task {i}"), queue=queue)
              for i in range(n)]
    started = time.monotonic()
    chord(header, app=sender)(sender.signature("bench.collect", queue=queue))
    took = time.monotonic() - started
    sender.close()
    delete_prefix(get_settings().redis_url, f"{get_settings().key_prefix}:celery:{queue}")
    return took


def _publish_rate(n: int) -> float:
    """Seconds for ``drover.workers.tasklayer.dispatch.dispatch`` to publish n chord members to a
    queue with no consumer (what a window, a drain or a batch-mode job costs to send), the queue
    then deleted."""
    from drover.config import get_settings
    from drover.workers.tasklayer.dispatch import dispatch

    queue = f"bench-publish-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    dispatch(uuid.uuid4().hex, range(n), queue)
    took = time.monotonic() - started
    delete_prefix(get_settings().redis_url, f"{get_settings().key_prefix}:celery:{queue}")
    return took


def cancel_at_scale(redis_url: str, prefix: str, n: int, workers: int, concurrency: int,
                    after_s: float = 3.0) -> dict[str, Any]:
    """Submit n sub-agents whose calls take 0.5 s, cancel after ``after_s``; how long until
    the job has its JobResult, and with how many records."""
    from drover import JobSpec, submit
    from drover.config import load_settings
    from drover.simulator import SimConfig
    from drover.workers.app import app

    importlib.import_module("drover.workers.tasklayer.tasks")
    run_id = uuid.uuid4().hex[:8]
    queue = alias = f"bench-cancel-{run_id}"
    try:
        with SimProcess(SimConfig(output_tokens_mean=20, tool_turns=0, seed=3,
                                  latency_mean_s=0.5, latency_p95_s=0.6)) as sim:
            env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix,
                   "DROVER_QUEUE": queue, "DROVER_KEY_ALIAS": alias,
                   "DROVER_ANTHROPIC_BASE_URL": sim.url,
                   "ANTHROPIC_API_KEY": f"sk-bench-scale-{prefix}", "DROVER_MODEL": MODEL,
                   **UNLIMITED}
            settings = load_settings(queue=queue, key_alias=alias)
            subtasks = [f"Sub-agent {i}: one finding about market {i}." for i in range(n)]
            with celery_workers("drover.workers.app", env, queue, workers, concurrency, app):
                handle = submit(JobSpec(subtasks=subtasks, model=MODEL, max_tokens=1024,
                                        max_turns=2), settings=settings)
                time.sleep(after_s)
                started = time.monotonic()
                handle.cancel()
                cancel_s = time.monotonic() - started
                result = handle.wait(timeout=600, poll_s=0.05)
                ended_s = time.monotonic() - started
    finally:
        delete_prefix(redis_url, prefix)
    return {"n": n, "cancel_call_s": cancel_s, "ended_s": ended_s,
            "records": len(result.results), "counts": result.counts,
            "result_bytes": len(result.model_dump_json()), "record_chars": result.record_chars}


def measure(redis_url: str, prefix: str, n: int, workers: int, concurrency: int,
            log: Any = print) -> dict[str, Any]:
    from drover.simulator import SimConfig

    subtasks = [f"Sub-agent {i}: give one short finding about market {i}." for i in range(n)]
    out: dict[str, Any] = {"n": n}
    try:
        with SimProcess(SimConfig(output_tokens_mean=20, tool_turns=0, seed=3)) as sim:
            for name, run in (("bare", _bare), ("drover", _drover)):
                sim.reset()
                sim_cpu = cpu_seconds(sim.proc.pid)
                out[name] = run(redis_url, prefix, subtasks, workers, concurrency, sim.url)
                out[name]["sim_cpu_s"] = cpu_seconds(sim.proc.pid) - sim_cpu
                out[name]["calls"] = sim.stats()["accepted"]
                out[name]["publish_s"] = _publish_rate(n) if name == "drover" else _bare_publish(n)
                log(f"scale: {n} {name}: {describe_one(n, out[name])}")
    finally:
        delete_prefix(redis_url, prefix)
    return out


def describe_one(n: int, o: dict[str, Any]) -> str:
    return (f"submit {o['submit_s'] * 1000:.0f} ms, publish {n / o['publish_s']:,.0f}/s, "
            f"end to end {o['wall_s']:.1f} s = {n / o['wall_s']:,.0f}/s, {o['ok']} ok, "
            f"{o['calls']} calls, worker CPU {o['cpu_s'] / n * 1000:.2f} ms/sub-agent "
            f"(+ simulator {o['sim_cpu_s'] / n * 1000:.2f}, submitter "
            f"{o['submitter_cpu_s'] / n * 1000:.2f}), peak worker RSS "
            f"{max(o['worker_rss_kb']) / 1024:.0f} MB, submitter grew "
            f"{o['submitter_grew_kb'] / 1024:.1f} MB")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| N | contender | submit | publish | end to end | drover / bare (end to end) "
             "| worker CPU per sub-agent | submitter CPU per sub-agent | peak RSS per worker "
             "| submitter grew |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        n = row["n"]
        ratio = row["bare"]["wall_s"] / row["drover"]["wall_s"]
        for name in ("bare", "drover"):
            o = row[name]
            label = "bare Celery chord, plain SDK" if name == "bare" else "**drover**"
            rss = "/".join(f"{kb / 1024:.0f}" for kb in o["worker_rss_kb"])
            lines.append(
                f"| {n:,} | {label} | {o['submit_s'] * 1000:,.0f} ms | "
                f"{n / o['publish_s']:,.0f}/s | {o['wall_s']:.1f} s ({n / o['wall_s']:,.0f}/s) "
                f"| {f'**{ratio:.2f} x**' if name == 'drover' else '1'} | "
                f"{o['cpu_s'] / n * 1000:.2f} ms | {o['submitter_cpu_s'] / n * 1000:.2f} ms | "
                f"{rss} MB | "
                f"{o['submitter_grew_kb'] / 1024:.1f} MB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--env", action="append", default=[], metavar="DROVER_X=V",
                        help="a setting for drover's workers and submit (repeatable)")
    parser.add_argument("--publish", type=int, default=0, metavar="N",
                        help="also time publishing N sub-agent messages, no workers running")
    parser.add_argument("--cancel", type=int, default=0, metavar="N",
                        help="also cancel a job of N sub-agents 3 s in and time its end")
    parser.add_argument("--out", type=Path, default=None,
                        help="append the table (markdown) to this file")
    parser.add_argument("--redis-url", default=os.environ.get("DROVER_REDIS_URL",
                                                             "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    from bench.contenders import drover

    for item in args.env:
        name, _, value = item.partition("=")
        EXTRA_ENV[name] = value
        os.environ[name] = value  # submit reads its settings here too
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    drover.use_prefix(args.redis_url, prefix)
    rows = [measure(args.redis_url, prefix, int(n), args.workers, args.concurrency)
            for n in args.sizes.split(",") if n]
    text = table(rows) if rows else ""
    if args.publish:
        drover_s, bare_s = _publish_rate(args.publish), _bare_publish(args.publish)
        text += (f"\n\nPublishing {args.publish:,} sub-agent messages with no worker running: "
                 f"`drover.workers.tasklayer.dispatch.dispatch` {args.publish / drover_s:,.0f}/s, "
                 f"a bare "
                 f"`chord(...)()` {args.publish / bare_s:,.0f}/s.")
    if args.cancel:
        c = cancel_at_scale(args.redis_url, prefix, args.cancel, args.workers, args.concurrency)
        text += (f"\n\nCancel at scale: {c['n']:,} sub-agents cancelled 3 s after submit: "
                 f"`cancel()` took {c['cancel_call_s'] * 1000:,.0f} ms, the JobResult was stored "
                 f"{c['ended_s']:.1f} s after the cancel with {c['records']:,} records "
                 f"({c['counts']}); JobResult {c['result_bytes'] / 1e6:.1f} MB, record text "
                 f"cut to {c['record_chars']} characters.")
    print(text)
    if args.out:
        with args.out.open("a") as out:
            out.write(f"\n{time.strftime('%Y-%m-%d %H:%M')} `python -m bench.scale --sizes "
                      f"{args.sizes} --workers {args.workers} --concurrency "
                      f"{args.concurrency}" + (f" --publish {args.publish}" if args.publish else "")
                      + (f" --cancel {args.cancel}" if args.cancel else "")
                      + "".join(f" --env {item}" for item in args.env)
                      + f"`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
