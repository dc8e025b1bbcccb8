"""The first ``submit`` of a fresh process (issue 52, item 1): 300 sub-agents sent to a real
Redis (its own key prefix and queue, deleted after; no worker needed), each run a new
``python`` process. Prints, per run, the time of ``import drover`` and of the first
``submit(...)``, and, in the same process afterwards, the time of importing the worker's call
path (the task module, the agent loop, the provider SDKs) that a submit no longer pays: the
ratio of the two is what the numbers mean on a box as busy as this one.

    python -m bench.first_submit [--runs 5] [--n 300] [--redis redis://127.0.0.1:6379/0]
    python -m bench.first_submit --profile   # one run under cProfile: the top 15 by cumtime
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid

import redis

_RUN = """
import json, sys, time
t0 = time.perf_counter()
from drover import JobSpec, submit
t1 = time.perf_counter()
submit(JobSpec(subtasks=[f"item {{i}}" for i in range({n})], max_tokens=50))
t2 = time.perf_counter()
loaded = sorted(m for m in ("anthropic", "openai", "drover.workers.tasklayer.tasks")
                if m in sys.modules)
import drover.workers.tasklayer.tasks  # what a first submit used to import
t3 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "submit": t2 - t1, "call_path": t3 - t2,
                  "loaded": loaded}}))
"""

_PROFILE = """
import cProfile, pstats
from drover import JobSpec, submit
spec = JobSpec(subtasks=[f"item {{i}}" for i in range({n})], max_tokens=50)
cProfile.run("submit(spec)", "/tmp/first_submit.prof")
pstats.Stats("/tmp/first_submit.prof").sort_stats("cumtime").print_stats(15)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    prefix = f"bench-first-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "DROVER_REDIS_URL": args.redis, "DROVER_KEY_PREFIX": prefix,
           "DROVER_QUEUE": f"q-{prefix}"}
    env.pop("DROVER_BROKER_URL", None)
    r = redis.Redis.from_url(args.redis)
    try:
        if args.profile:
            subprocess.run([sys.executable, "-c", _PROFILE.format(n=args.n)], env=env,
                           check=True)
            return
        rows = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", _RUN.format(n=args.n)], env=env,
                                 check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.splitlines()[-1]))
            row = rows[-1]
            print(f"import drover {row['import']:.3f} s, first submit of {args.n} "
                  f"{row['submit']:.3f} s (loaded: {row['loaded'] or 'no SDK'}); "
                  f"the call path's imports after it {row['call_path']:.3f} s")
        submit_s = statistics.median(row["submit"] for row in rows)
        path_s = statistics.median(row["call_path"] for row in rows)
        print(f"median of {args.runs}: first submit {submit_s:.3f} s, import drover "
              f"{statistics.median(row['import'] for row in rows):.3f} s; the call path's "
              f"imports {path_s:.3f} s ({path_s / submit_s:.1f} x the submit)")
    finally:
        for key in r.scan_iter(f"{prefix}:*", count=1000):
            r.delete(key)


if __name__ == "__main__":
    main()
