"""What the results store (DROVER_RESULTS_URL) adds to a sub-agent's record write: records
written one at a time through ``Records.put`` (as a worker thread does), Redis only and
Redis + PostgreSQL (copied by the process's writer thread: also the time until all are
there), on a database of its own (``drover_bench_<random>``, dropped after).

    python -m bench.results_store [--n 2000] [--admin postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import time
import uuid

import psycopg
import redis

from drover.workers.jobs.records import SubagentResult
from drover.workers.jobs.results_db import ResultsStore
from drover.workers.jobs.store import JobStore


def run(n: int, admin_url: str, redis_url: str) -> None:
    admin = psycopg.connect(admin_url, autocommit=True)
    db = f"drover_bench_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{db}"')
    r = redis.Redis.from_url(redis_url)
    prefix = f"bench-results-{uuid.uuid4().hex[:6]}"
    try:
        for label, results in (("Redis only", None), ("Redis + PostgreSQL", ResultsStore(
                admin_url.rpartition("/")[0] + "/" + db))):
            store = JobStore(r, prefix=prefix, ttl_s=600, results=results)
            if results is not None:
                results.check()  # the schema, outside the timing
            job = uuid.uuid4().hex
            start = time.perf_counter()
            for i in range(n):
                store.records.put(SubagentResult(job_id=job, index=i, status="ok",
                                                 summary="x" * 300))
            took = time.perf_counter() - start
            line = f"{label}: {n / took:,.0f} records/s, {took / n * 1e3:.2f} ms per record"
            if results is not None:
                # The copies go from the writer thread: the time until all are in PostgreSQL.
                assert store.archive.flush(timeout=300)
                copied = time.perf_counter() - start
                line += (f"; all {results.record_count(job):,} in PostgreSQL after "
                         f"{copied:.2f} s ({n / copied:,.0f} records/s)")
                results.close()
            print(line)
    finally:
        for key in r.scan_iter(f"{prefix}:*"):
            r.delete(key)
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    run(args.n, args.admin, args.redis)


if __name__ == "__main__":
    main()
