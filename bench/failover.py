"""What a Redis failover costs a running job (Sentinel, the master SIGKILLed mid-job).

    python -m bench.failover [--runs 3] [--n 60] [--rpm 600] [--broker redis|amqp://...]

Each run starts a Sentinel set of its own (a master, a replica, three sentinels on free
ports, ``down-after-milliseconds`` 1000: drover.orchestrator.ops.sentinels), the simulator
(enforcing ``--rpm`` with a one-second bucket, so a limiter that lets too much through after
the failover is answered with 429s) and two worker processes (6 threads each), all with
DROVER_REDIS_URL set to the Sentinel list. It submits a job of N sub-agents (one tool turn:
two LLM calls each) and, once 10 records are in, SIGKILLs the master and the first sentinel
listed (a host lost whole). Per run it records:

- failover: from the kill until a sentinel names the promoted replica and it says "master";
- next record: from the kill until the job gains a record it did not have before the kill
  (read through the sentinels, as every client does);
- sub-agents sent again by the recovery sweep (their message or record was lost), and
  records written twice (a record event per write in the job's stream);
- LLM turns asked twice (the simulator's duplicate requests: a call in flight at the kill,
  or one whose checkpoint did not replicate);
- 429s from the simulator, and whether every sub-agent ended ok;
- the job's wall time (submit to the last record).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.recovery import spawn_worker, submit
from drover.orchestrator.ops.sentinels import start_sentinel_set
from drover.simulator import SimConfig, SimulatorServer
from drover.workers.connections.redis_clients import sync_redis

ROOT = Path(__file__).resolve().parent.parent
THREADS = 6
KILL_AFTER = 10


def one_run(n: int, rpm: int, broker: str | None) -> dict[str, Any]:
    cluster = start_sentinel_set()
    sim = SimulatorServer(SimConfig(seed=1, rpm=rpm, burst_s=1, latency_mean_s=0.3,
                                    latency_p95_s=0.6, output_tokens_mean=20, tool_turns=1,
                                    tools_per_turn=1)).start()
    prefix, queue = f"bench-fo-{uuid.uuid4().hex[:6]}", f"bench-fo-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **cluster.env(), "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": queue,
           "DROVER_KEY_ALIAS": queue, "DROVER_ANTHROPIC_BASE_URL": sim.url,
           "ANTHROPIC_API_KEY": "sk-bench", "DROVER_RPM": str(rpm), "DROVER_BURST_SECONDS": "1",
           "DROVER_VISIBILITY_TIMEOUT_S": "15", "DROVER_COUNTDOWN_CAP_S": "3",
           "DROVER_TASK_TIME_LIMIT_S": "10", "DROVER_CALL_TIMEOUT_S": "5",
           "DROVER_RESEND_AFTER_S": "5"}
    if broker:
        env["DROVER_BROKER_URL"] = broker
    workers = [spawn_worker(env, f"fo{i}-{uuid.uuid4().hex[:4]}", THREADS) for i in range(2)]
    client = sync_redis(cluster.url, master=cluster.master_name, decode_responses=True)
    records_key = f"{prefix}:job:{{}}:records"
    try:
        started = time.monotonic()
        job_id = submit(env, n)
        records = records_key.format(job_id)
        while client.hlen(records) < KILL_AFTER:
            if time.monotonic() - started > 300:
                raise TimeoutError("the job did not start")
            time.sleep(0.05)
        before = set(client.hkeys(records))
        killed = time.monotonic()
        old = cluster.kill_master(with_sentinel=True)
        cluster.wait_for_failover(old, timeout=120)
        failover_s = time.monotonic() - killed
        next_record_s = None
        while True:
            now = set(client.hkeys(records))
            if next_record_s is None and now - before:
                next_record_s = time.monotonic() - killed
            if len(now) >= n:
                break
            if time.monotonic() - killed > 300:
                raise TimeoutError(f"the job did not finish: {len(now)}/{n} records")
            time.sleep(0.05)
        wall_s = time.monotonic() - started
        statuses = collections.Counter(json.loads(v)["status"]
                                       for v in client.hvals(records))
        events = client.xrange(f"{prefix}:job:{job_id}:events")
        writes = collections.Counter(json.loads(fields["record"])["index"]
                                     for _id, fields in events if "record" in fields)
        stats = sim.stats()
        return {
            "failover_s": round(failover_s, 2),
            "next_record_s": round(next_record_s or 0.0, 2),
            "resent": client.hlen(f"{prefix}:job:{job_id}:resent"),
            "records_twice": sum(1 for count in writes.values() if count > 1),
            "turns_twice": stats["duplicate_accepted"],
            "n429": stats["rejected_429"],
            "ok": statuses.get("ok", 0),
            "n": n,
            "wall_s": round(wall_s, 1),
        }
    finally:
        for proc in workers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        client.close()
        sim.stop()
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=60, help="sub-agents per job")
    parser.add_argument("--rpm", type=int, default=600,
                        help="the simulator's and drover's RPM (one-second buckets)")
    parser.add_argument("--broker", default="redis",
                        help="'redis' (the Sentinel list) or an amqp:// URL")
    args = parser.parse_args()
    broker = None if args.broker == "redis" else args.broker
    print(f"load before: {os.getloadavg()[0]:.2f}")
    rows = []
    for run in range(args.runs):
        row = one_run(args.n, args.rpm, broker)
        rows.append(row)
        print(f"run {run + 1}: {json.dumps(row)}", flush=True)
    for key in ("failover_s", "next_record_s", "wall_s"):
        values = [row[key] for row in rows]
        print(f"{key}: median {statistics.median(values):g}, max {max(values):g}")
    for key in ("resent", "records_twice", "turns_twice", "n429"):
        print(f"{key}: {[row[key] for row in rows]}")
    print(f"all ok: {all(row['ok'] == row['n'] for row in rows)}; "
          f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
