"""What a lost worker costs: time to recover after ``kill -9``, and what liveness costs Redis.

    python -m bench.recovery [--kills 5] [--broker redis|amqp://...] [--n 60]
    python -m bench.recovery --tight [--kills 10] [--broker ...] [--n 30] [--seed 1]

Each round starts a redis-server of its own (so its command counts are ours alone) and two
worker processes (16 threads each, default settings), queues a job of N sub-agents of three
calls each against the simulator (0.5 s mean latency), and once the victim holds at least 8
sub-agents kills it with SIGKILL. Time to recover = from the kill until every sub-agent the
victim held runs (or ran) on the other worker; the median over the rounds is reported.

``--tight``: the key is the bottleneck (60 RPM at the simulator and in drover, one call per
sub-agent, so most sub-agents wait for the limiter or in the window's line at any moment) and
the default dispatch window; each round kills the victim at a random moment of the job (after
a random number of records, drawn with ``--seed``) and reports the time from the kill to the
job's last record, whether every sub-agent ended ``ok`` once, and what the window still held.

Round trips: Redis's MONITOR sees every command. The ones liveness and claims add to a job
are counted apart: the claim on receipt (``receive.lua``, one round trip per delivery), the
release after a retry (``release.lua``), heartbeats (a SET + ZADD pipeline per worker every
DROVER_HEARTBEAT_S) and the sweep (its lock, and what it reads when it holds it). The claim
at start, the fenced writes and the claim check before each call ride in round trips the
sub-agent makes anyway (a pipeline, or a script in place of a plain SET), so they add none;
a no-fault round (no retries) is measured as well.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from drover.orchestrator.ops.services import free_port
from drover.simulator import SimConfig, SimulatorServer

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "workers" / "jobs" / "lua"
THREADS = 16


def script_names() -> dict[str, str]:
    return {hashlib.sha1(p.read_text().encode()).hexdigest(): p.stem for p in LUA.glob("*.lua")}


class Monitor:
    """Counts the commands Redis runs (MONITOR), by kind."""

    def __init__(self, url: str):
        self.r = redis.Redis.from_url(url)
        self.counts: collections.Counter[str] = collections.Counter()
        self.scripts = script_names()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self.r.monitor() as m:
            for event in m.listen():
                if self._stop:
                    return
                parts = event["command"].split()
                if not parts:
                    continue
                name = parts[0].upper()
                if name in ("EVALSHA", "EVAL") and len(parts) > 1:
                    name = f"{name} {self.scripts.get(parts[1].strip(chr(34)), 'other')}"
                elif name in ("SET", "ZADD", "EXISTS", "ZRANGE", "SMEMBERS") and len(parts) > 1:
                    key = parts[1].strip('"')
                    if ":worker:" in key or key.endswith(":workers"):
                        name += " (liveness)"
                    elif ":recovery:" in key or key.endswith(":recovering"):
                        name += " (sweep)"
                self.counts[name] += 1

    def stop(self) -> None:
        self._stop = True
        self.r.ping()  # wakes the listener so it sees the flag


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH (Debian: apt-get install redis-server)")
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def spawn_worker(env: dict[str, str], name: str, threads: int = THREADS,
                 events: bool = False) -> subprocess.Popen:
    """``events``: the worker sends Celery's task events (-E), for a bench that counts them."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "drover.workers.app", "worker", "--pool", "threads",
         "--concurrency", str(threads), "--queues", env["DROVER_QUEUE"], "--loglevel", "ERROR",
         "--without-gossip", "--without-mingle", *(["-E"] if events else []),
         "-n", f"{name}@%h"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)


def kill_workers(workers: list[subprocess.Popen]) -> None:
    """SIGKILL each worker's process group and reap it."""
    for proc in workers:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()


def submit(env: dict[str, str], n: int) -> str:
    from drover import JobSpec

    spec = JobSpec(subtasks=[f"Inspect pier {i}" for i in range(n)], tools=["lookup_fact"],
                   max_tokens=60)
    done = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "submit", "-"],
                          input=spec.model_dump_json(), capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120, check=True)
    return done.stdout.split()[-1]


def wait(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)
    return value


def one_round(broker: str | None, n: int, overload: float, kill: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, SimulatorServer(SimConfig(
            seed=1, tool_turns=2, tools_per_turn=1, output_tokens_mean=20,
            latency_mean_s=0.5, latency_p95_s=1.0, overload_rate=overload)) as sim:
        redis_proc, url = start_redis(Path(tmp))
        r = redis.Redis.from_url(url, decode_responses=True)
        prefix, queue = "bench", f"q-{uuid.uuid4().hex[:6]}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DROVER_REDIS_URL": url,
               "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
               "DROVER_ANTHROPIC_BASE_URL": sim.url, "ANTHROPIC_API_KEY": "sk-bench",
               "DROVER_RPM": "6000", "DROVER_ITPM": "10000000", "DROVER_OTPM": "10000000",
               "DROVER_MAX_ATTEMPTS": "15", "DROVER_COUNTDOWN_CAP_S": "5"}
        if broker:
            env["DROVER_BROKER_URL"] = broker
        workers: list[subprocess.Popen] = []
        monitor = Monitor(url)  # from before the job: every command of it is counted
        try:
            job = submit(env, n)
            workers = [spawn_worker(env, f"b{i}-{uuid.uuid4().hex[:4]}") for i in range(2)]

            def worker_id(proc: subprocess.Popen) -> str | None:
                # ZRANGEBYSCORE, not the sweep's ZRANGE: the count of those stays the sweep's.
                return next((w for w in r.zrangebyscore(f"{prefix}:workers", "-inf", "+inf")
                             if w.split(":")[-2] == str(proc.pid)), None)

            ids = wait("heartbeats", lambda: all(i := [worker_id(p) for p in workers]) and i)
            out: dict[str, Any] = {}
            if kill:
                victim = ids[0]
                held = wait("the victim busy", lambda: (
                    h if len(h := r.hkeys(f"{prefix}:worker:{victim}:claims")) >= 8 else None))
                os.killpg(workers[0].pid, signal.SIGKILL)
                killed = time.monotonic()

                def moved_on() -> bool:
                    for field in held:
                        job_id, part = field.rsplit("|", 1)
                        if r.hexists(f"{prefix}:job:{job_id}:records", part):
                            continue
                        claim = r.hget(f"{prefix}:job:{job_id}:claims", part) or ""
                        if claim.split("|")[1:2] in (["running"], ["held"]) and \
                                not claim.endswith(victim):
                            continue
                        return False
                    return True

                wait("recovery", moved_on, 120)
                out["recover_s"] = time.monotonic() - killed
                out["held"] = len(held)
            wait("the job's result", lambda: r.exists(f"{prefix}:job:{job}:result"), 300)
            monitor.stop()
            out["counts"] = dict(monitor.counts)
            out["n"] = n
            out["dup"] = sim.stats()["duplicate_accepted"]
            return out
        finally:
            monitor.stop()
            for proc in workers:
                with_suppress(lambda p=proc: os.killpg(p.pid, signal.SIGKILL))
                proc.wait()
            redis_proc.kill()
            redis_proc.wait()


TIGHT_RPM = 60


def tight_round(broker: str | None, n: int, kill_after: int) -> dict[str, Any]:
    """One round under a binding 60 RPM: kill -9 the victim once ``kill_after`` records are
    in; the time from the kill to the job's last record."""
    with tempfile.TemporaryDirectory() as tmp, SimulatorServer(SimConfig(
            seed=1, tool_turns=0, output_tokens_mean=20, latency_mean_s=0.3,
            latency_p95_s=0.6, rpm=TIGHT_RPM)) as sim:
        redis_proc, url = start_redis(Path(tmp))
        r = redis.Redis.from_url(url, decode_responses=True)
        prefix, queue = "bench", f"q-{uuid.uuid4().hex[:6]}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DROVER_REDIS_URL": url,
               "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
               "DROVER_ANTHROPIC_BASE_URL": sim.url, "ANTHROPIC_API_KEY": "sk-bench",
               "DROVER_RPM": str(TIGHT_RPM), "DROVER_ITPM": "10000000",
               "DROVER_OTPM": "10000000"}
        if broker:
            env["DROVER_BROKER_URL"] = broker
        workers: list[subprocess.Popen] = []
        try:
            from drover import JobSpec

            spec = JobSpec(subtasks=[f"Weigh container {i}" for i in range(n)], max_tokens=40)
            job = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "submit",
                                  "-"], input=spec.model_dump_json(), capture_output=True,
                                 text=True, cwd=ROOT, env=env, timeout=120,
                                 check=True).stdout.split()[-1]
            workers = [spawn_worker(env, f"t{i}-{uuid.uuid4().hex[:4]}") for i in range(2)]
            records = f"{prefix}:job:{job}:records"
            wait("the moment of the kill", lambda: r.hlen(records) >= kill_after, 300)
            victim_ids = [w for w in r.zrangebyscore(f"{prefix}:workers", "-inf", "+inf")
                          if w.split(":")[-2] == str(workers[0].pid)]
            held = sum(r.hlen(f"{prefix}:worker:{w}:claims") for w in victim_ids)
            os.killpg(workers[0].pid, signal.SIGKILL)
            killed = time.monotonic()
            wait("every record", lambda: r.hlen(records) >= n, 600)
            last_s = time.monotonic() - killed
            wait("the job's result", lambda: r.exists(f"{prefix}:job:{job}:result"), 120)
            statuses = collections.Counter(
                v.split('"status":"', 1)[1].split('"', 1)[0] for v in r.hvals(records))
            left = r.hgetall(f"{prefix}:fs:{{{queue}}}:jobs")
            return {"kill_after": kill_after, "held": held, "last_s": last_s,
                    "ok": statuses.get("ok", 0), "n": n, "window_left": len(left),
                    "n429": sim.stats()["rejected_429"]}
        finally:
            for proc in workers:
                with_suppress(lambda p=proc: os.killpg(p.pid, signal.SIGKILL))
                proc.wait()
            redis_proc.kill()
            redis_proc.wait()


def tight_main(broker: str | None, label: str, n: int, kills: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(kills):
        out = tight_round(broker, n, rng.randint(1, n - 3))
        rows.append(out)
        print(f"kill {i + 1} ({label}, {TIGHT_RPM} RPM, {n} sub-agents): after "
              f"{out['kill_after']} records, the victim holding {out['held']} parts; last "
              f"record {out['last_s']:.1f} s after the kill; {out['ok']}/{n} ok, "
              f"window entries left {out['window_left']}, 429s {out['n429']}", flush=True)
    times = [row["last_s"] for row in rows]
    print(f"tight limits ({label}): kill to last record median {statistics.median(times):.1f} s,"
          f" max {max(times):.1f} s over {len(rows)} kills; every sub-agent ok in "
          f"{sum(row['ok'] == n for row in rows)} of {len(rows)} runs; load "
          f"{os.getloadavg()[0]:.2f}")


def with_suppress(fn: Any) -> None:
    try:
        fn()
    except ProcessLookupError:
        pass


LIVENESS_KINDS = ("EVALSHA receive", "EVALSHA release", "SET (liveness)", "ZADD (liveness)",
                  "EXISTS (liveness)", "ZRANGE (liveness)", "SET (sweep)", "SMEMBERS (sweep)",
                  "EVALSHA takeover")


def round_trips(counts: dict[str, int]) -> int:
    """Round trips among the liveness commands: a heartbeat's SET and ZADD are one pipeline,
    and so are the sweep's EXISTS of every worker (one per sweep that read the workers)."""
    return (counts.get("EVALSHA receive", 0) + counts.get("EVALSHA release", 0)
            + counts.get("EVALSHA takeover", 0) + counts.get("SET (liveness)", 0)
            + counts.get("SET (sweep)", 0) + 2 * counts.get("ZRANGE (liveness)", 0)  # + EXISTS
            + counts.get("SMEMBERS (sweep)", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--broker", default="redis",
                        help="'redis' (the round's own Redis) or an amqp:// URL")
    parser.add_argument("--tight", action="store_true",
                        help="a binding 60 RPM, the default window, kills at random moments")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    broker = None if args.broker == "redis" else args.broker
    if args.tight:
        tight_main(broker, "redis" if broker is None else "rabbitmq", args.n, args.kills,
                   args.seed)
        return

    for overload in (0.0, 0.3):
        counts = one_round(broker, args.n, overload, kill=False)
        extra = {k: v for k, v in counts["counts"].items() if k in LIVENESS_KINDS}
        total = sum(counts["counts"].values())
        print(f"no kill, {overload:.0%} 529s: {total / args.n:.1f} Redis commands per "
              f"sub-agent in all; liveness and claims add {round_trips(extra) / args.n:.2f} "
              f"round trips per sub-agent (receipts {extra.get('EVALSHA receive', 0)}, "
              f"releases after a retry {extra.get('EVALSHA release', 0)}, heartbeats and "
              f"sweeps the rest): {extra}")

    times = []
    for i in range(args.kills):
        out = one_round(broker, args.n, 0.3, kill=True)
        times.append(out["recover_s"])
        print(f"kill {i + 1}: {out['held']} sub-agents held by the victim, all resumed "
              f"elsewhere after {out['recover_s']:.1f} s (simulator duplicates {out['dup']})")
    print(f"time to recover after kill -9 ({args.broker}): median {statistics.median(times):.1f} s"
          f" over {len(times)} kills (min {min(times):.1f}, max {max(times):.1f})")


if __name__ == "__main__":
    main()
