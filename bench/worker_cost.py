"""What one one-call sub-agent costs a worker: CPU (user, system), context switches, and the
Redis commands it sends, for drover or for the bare Celery chord of `bench.scale`.

    python -m bench.worker_cost [-n 2000] [--bare [--noop]] [--monitor] [--workers 4]
                                [--concurrency 16]
    python -m bench.worker_cost --ab /path/to/checkout-a,/path/to/checkout-b --repeat 3

The workload is `bench.scale`'s (one short call each, limits far away, a simulator with no
latency). CPU is the worker processes' own (`/proc`), context switches summed over their
threads; ``--monitor`` counts the commands `MONITOR` shows under this run's key prefix (the
commands inside Lua scripts too, so a script's HSET counts), per sub-agent, by command and key.
``--bare --noop``: the bare chord of tasks that make no call, Celery's own work per task.
``--ab`` runs this module from each checkout in turn, ``--repeat`` times, and prints the
medians: on a shared 2-core box only interleaved runs compare.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import redis

from bench.contenders.common import SimProcess, celery_workers, cpu_seconds, delete_prefix
from bench.scale import UNLIMITED
from bench.workload import MODEL


def _proc_usage(pids: list[int]) -> tuple[float, float, int]:
    """User and system CPU seconds and context switches (all threads) of the processes."""
    user = system = switches = 0
    for pid in pids:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/status") as status:
                    switches += sum(int(line.split()[1]) for line in status
                                    if "ctxt_switches" in line)
            except OSError:
                pass
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick, switches


def _monitor(url: str, prefix: str, counts: collections.Counter, stop: threading.Event) -> None:
    client = redis.Redis.from_url(url)
    with client.monitor() as monitor:
        for command in monitor.listen():
            if stop.is_set():
                return
            text = command["command"]
            if prefix not in text:
                continue
            parts = text.split()
            name = parts[0].upper()
            key = parts[3] if name in ("EVALSHA", "EVAL") and len(parts) > 3 else (
                parts[1] if len(parts) > 1 else "")
            key = re.sub(r"[0-9a-f]{32}|[0-9a-f]{8}|\d+", "#", key.replace(prefix, "P"))
            counts[f"{name} {key}"] += 1


def measure(n: int, bare: bool, workers: int, concurrency: int, monitor: bool,
            redis_url: str, noop: bool = False) -> dict[str, Any]:
    from bench.contenders import drover

    prefix = f"cost-{uuid.uuid4().hex[:8]}"
    drover.use_prefix(redis_url, prefix)
    from drover.simulator import SimConfig

    subtasks = [f"Sub-agent {i}: give one short finding about market {i}." for i in range(n)]
    counts: collections.Counter = collections.Counter()
    stop = threading.Event()
    try:
        with SimProcess(SimConfig(output_tokens_mean=20, tool_turns=0, seed=3)) as sim:
            queue = alias = f"bench-cost-{uuid.uuid4().hex[:8]}"
            if bare:
                from celery import chord

                from bench.contenders.bare_chord import make_app

                app: Any = make_app()
                module = "bench.contenders.bare_chord"
                env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix,
                       "DROVER_QUEUE": queue, "BENCH_SIM_URL": sim.url,
                       "BENCH_API_KEY": f"sk-bench-cost-{prefix}"}
            else:
                from drover import JobSpec, submit
                from drover.config import load_settings
                from drover.workers.app import app

                module = "drover.workers.app"
                env = {"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix,
                       "DROVER_QUEUE": queue, "DROVER_KEY_ALIAS": alias,
                       "DROVER_ANTHROPIC_BASE_URL": sim.url,
                       "ANTHROPIC_API_KEY": f"sk-bench-cost-{prefix}", "DROVER_MODEL": MODEL,
                       **UNLIMITED}
                settings = load_settings(queue=queue, key_alias=alias)
            with celery_workers(module, env, queue, workers, concurrency, app) as procs:
                pids = [p.pid for p in procs]
                if monitor:
                    threading.Thread(target=_monitor, args=(redis_url, prefix, counts, stop),
                                     daemon=True).start()
                    time.sleep(0.5)
                before, cpu_before = _proc_usage(pids), sum(cpu_seconds(p) for p in pids)
                started = time.monotonic()
                if bare:
                    header = [app.signature("bench.noop", args=(i,), queue=queue) if noop
                              else app.signature("bench.one_call", args=(i, MODEL, task),
                                                 queue=queue)
                              for i, task in enumerate(subtasks)]
                    done = chord(header, app=app)(app.signature("bench.collect", queue=queue))
                    assert done.get(timeout=1800, interval=0.05) == n
                else:
                    handle = submit(JobSpec(subtasks=subtasks, model=MODEL, max_tokens=1024,
                                            max_turns=2), settings=settings)
                    assert handle.wait(timeout=1800, poll_s=0.05).counts["ok"] == n
                wall = time.monotonic() - started
                after, cpu_after = _proc_usage(pids), sum(cpu_seconds(p) for p in pids)
                stop.set()
    finally:
        delete_prefix(redis_url, prefix)
    user, system, switches = (a - b for a, b in zip(after, before, strict=True))
    return {"n": n, "wall_s": wall, "cpu_ms": (cpu_after - cpu_before) / n * 1000,
            "user_ms": user / n * 1000, "sys_ms": system / n * 1000, "switches": switches / n,
            "commands": {k: v / n for k, v in counts.most_common()}}


def describe(o: dict[str, Any]) -> str:
    return (f"n={o['n']} wall={o['wall_s']:.1f}s cpu_ms={o['cpu_ms']:.2f} "
            f"user_ms={o['user_ms']:.2f} sys_ms={o['sys_ms']:.2f} switches={o['switches']:.1f} "
            f"load={os.getloadavg()[0]:.1f}")


def ab(roots: list[str], repeat: int, args: list[str]) -> None:
    found: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    for _ in range(repeat):
        for root in roots:
            out = subprocess.run([sys.executable, "-m", "bench.worker_cost", *args], cwd=root,
                                 env={**os.environ, "PYTHONPATH": root}, capture_output=True,
                                 text=True).stdout
            line = next((x for x in out.splitlines() if x.startswith("n=")), "")
            print(f"{root}: {line or out[-500:]}", flush=True)
            if line:
                found[root].append({k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)})
    for root, rows in found.items():
        print(f"{root}: medians of {len(rows)}: " + " ".join(
            f"{k}={statistics.median(r[k] for r in rows):.2f}"
            for k in ("wall", "cpu_ms", "user_ms", "sys_ms", "switches")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--bare", action="store_true", help="the bare Celery chord instead")
    parser.add_argument("--noop", action="store_true",
                        help="with --bare: tasks that make no call (Celery's own cost)")
    parser.add_argument("--monitor", action="store_true", help="count Redis commands")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--ab", default="", metavar="ROOT,ROOT",
                        help="checkouts to compare, interleaved")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("DROVER_REDIS_URL",
                                                             "redis://127.0.0.1:6379/0"))
    args = parser.parse_args(argv)
    if args.ab:
        passed = ["-n", str(args.n), "--workers", str(args.workers), "--concurrency",
                  str(args.concurrency)] + (["--bare"] if args.bare else []) + (
                      ["--noop"] if args.noop else [])
        ab(args.ab.split(","), args.repeat, passed)
        return 0
    out = measure(args.n, args.bare, args.workers, args.concurrency, args.monitor,
                  args.redis_url, noop=args.noop)
    print(describe(out))
    if out["commands"]:
        print(f"Redis commands per sub-agent: {sum(out['commands'].values()):.1f}")
        for name, per in out["commands"].items():
            print(f"  {per:7.3f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
