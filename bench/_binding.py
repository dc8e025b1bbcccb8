"""``python -m bench.limit_tracking --binding rpm|itpm``: far more one-call sub-agents than
the limiter serves within its horizon, the key the bottleneck, DROVER_TARGET_UTILIZATION=1.0,
two worker processes of 16 threads, default settings otherwise; each pair of runs is drover
with the limiter's line (``DROVER_WAIT_IN_LINE=true``, the default) and without it (``false``:
the window is the workers' slots only, as before issue 31), interleaved.

Per run: busy period (the simulator's first accepted request to its last answer) against the
lower bound (the calls at the binding rate, less the 1 s bucket drover starts with), task
messages per sub-agent (Celery's ``task-received`` events of the job: one per message a worker
took off the broker, so a retry's countdown message counts), retries and 429s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench.contenders.common import delete_prefix
from bench.recovery import kill_workers
from drover.simulator import SimConfig, SimulatorServer

ROOT = Path(__file__).resolve().parents[1]
THREADS = 16  # per worker (--threads): the case needs more slots than the horizon holds
SYSTEM = "You are a careful port inspector. " * 100  # about 1,000 input tokens a call


def _events(broker: str, prefix: str, names: set[str], stop: threading.Event,
            counts: dict[str, int]) -> None:
    """Count the sub-agent task events of this run's workers (their node names)."""
    from celery import Celery

    app = Celery(broker=broker)
    app.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:celery:"}

    def handler(kind: str):  # noqa: ANN202
        def on(event: dict[str, Any]) -> None:
            if str(event.get("hostname", "")).split("@")[0] in names and (
                    kind == "task-retried" or event.get("name") == "drover.run_subagent"):
                counts[kind] = counts.get(kind, 0) + 1
        return on

    with app.connection() as conn:
        receiver = app.events.Receiver(conn, handlers={
            k: handler(k) for k in ("task-received", "task-retried")})
        while not stop.is_set():
            try:
                receiver.capture(limit=None, timeout=1.0, wakeup=False)
            except TimeoutError:
                continue
            except OSError:
                continue


def one_run(kind: str, n: int, wait_in_line: bool, redis_url: str,
            threads: int = THREADS, calls_per_min: float = 60.0) -> dict[str, Any]:
    # ITPM: about 1,000 input tokens a call, so the same calls a minute.
    rpm, itpm = ((calls_per_min, 100_000_000.0) if kind == "rpm"
                 else (100_000.0, calls_per_min * 1000.0))
    with SimulatorServer(SimConfig(seed=1, tool_turns=0, output_tokens_mean=20,
                                   latency_mean_s=0.3, latency_p95_s=0.6, rpm=rpm,
                                   itpm=itpm)) as sim:
        prefix, queue = f"bench-bind-{uuid.uuid4().hex[:6]}", f"q-{uuid.uuid4().hex[:6]}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DROVER_REDIS_URL": redis_url,
               "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
               "DROVER_KEY_ALIAS": f"b-{uuid.uuid4().hex[:6]}",
               "DROVER_ANTHROPIC_BASE_URL": sim.url, "ANTHROPIC_API_KEY": "sk-bench",
               "DROVER_RPM": f"{rpm:g}", "DROVER_ITPM": f"{itpm:g}",
               "DROVER_OTPM": "100000000", "DROVER_TARGET_UTILIZATION": "1.0",
               "DROVER_WAIT_IN_LINE": "true" if wait_in_line else "false"}
        workers: list[subprocess.Popen] = []
        stop, counts = threading.Event(), {}
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            names = {f"b{i}-{uuid.uuid4().hex[:4]}" for i in range(2)}
            listener = threading.Thread(target=_events, daemon=True,
                                        args=(redis_url, prefix, names, stop, counts))
            listener.start()
            time.sleep(1.0)  # bound to the events exchange before the workers start
            workers = [subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker",
                 "--pool", "threads", "--concurrency", str(threads), "--queues", queue,
                 "--loglevel", "ERROR", "--without-gossip", "--without-mingle", "-E",
                 "-n", f"{name}@%h"], cwd=ROOT, env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                for name in sorted(names)]
            deadline = time.monotonic() + 120
            while len(r.hgetall(f"{prefix}:fs:{{{queue}}}:slots")) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError("the workers did not report their slots")
                time.sleep(0.2)
            from drover import JobSpec

            spec = JobSpec(subtasks=[f"Weigh container {i}" for i in range(n)], max_tokens=40,
                           system=SYSTEM if kind == "itpm" else None)
            done = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "submit",
                                   "-"], input=spec.model_dump_json(), capture_output=True,
                                  text=True, cwd=ROOT, env=env, timeout=120, check=True)
            job_id = done.stdout.split()[-1]
            deadline = time.monotonic() + 1800
            while not r.exists(f"{prefix}:job:{job_id}:result"):
                if time.monotonic() > deadline:
                    raise TimeoutError("the job did not end")
                time.sleep(0.5)
            time.sleep(2.0)  # the last events arrive
            stats = sim.stats()
            calls, rate = ((stats["accepted"], rpm / 60) if kind == "rpm"
                           else (stats["input_tokens"], itpm / 60))
            bound = max(1e-9, (calls - rate * 1.0) / rate)
            busy = stats["last_done_ts"] - stats["first_accept_ts"]
            return {"busy_s": busy, "bound_s": bound, "ratio": busy / bound,
                    "messages": counts.get("task-received", 0) / n,
                    "retries": counts.get("task-retried", 0), "n429": stats["rejected_429"],
                    "accepted": stats["accepted"]}
        finally:
            stop.set()
            kill_workers(workers)
            delete_prefix(redis_url, prefix)


def main(kind: str, n: int, pairs: int, redis_url: str, threads: int = THREADS,
         calls_per_min: float = 60.0) -> None:
    print(f"binding {kind.upper()} at {calls_per_min:g} calls a minute: {n} one-call "
          f"sub-agents, 2 workers x {threads}, target 1.0; load {os.getloadavg()[0]:.2f}",
          flush=True)
    for pair in range(pairs):
        for line in (True, False):
            out = one_run(kind, n, line, redis_url, threads, calls_per_min)
            print(f"pair {pair + 1} wait_in_line={str(line).lower()}: busy {out['busy_s']:.1f} s"
                  f" / bound {out['bound_s']:.1f} s = {out['ratio']:.3f} x; "
                  f"{out['messages']:.2f} task messages per sub-agent; retries "
                  f"{out['retries']}; 429s {out['n429']}; load {os.getloadavg()[0]:.2f}",
                  flush=True)
