"""8 processes x 16 threads share one scope: the sends, timed by Redis' clock, never exceed the
bucket in any window of any dimension, and every thread gets all its grants. (Output
reservations are refunded in full here; the refunds are small against the capacity, so the
plain token-bucket bound holds, without the allowance the algorithm's worst case needs.)"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time

import redis

from drover.workers.limiter import Limiter, ScopeLimits
from tests.helpers.limiter_model import Send, window_violations

PROCS, THREADS, GRANTS_PER_THREAD = 8, 16, 6
# 100 requests/s (capacity 100), 8000 input tokens/s (capacity 8000), 4000 output tokens/s
LIMITS = ScopeLimits(rpm=6000, itpm=480_000, otpm=240_000, burst_s=1.0, max_in_flight=64)
SCOPE = "llm:conc:model"


def _thread(url: str, prefix: str, seed: int, out: list, errors: list) -> None:
    rng = random.Random(seed)
    client = redis.Redis.from_url(url)
    lim = Limiter(client, prefix=prefix, horizon_s=2.0)
    deadline = time.monotonic() + 30
    try:
        got = 0
        while got < GRANTS_PER_THREAD:
            if time.monotonic() > deadline:
                raise RuntimeError(f"thread {seed} got only {got} grants")
            est_in = rng.randint(20, 140)
            g = lim.acquire(SCOPE, LIMITS, input_tokens=est_in, output_tokens=40)
            if not g.granted:
                time.sleep(g.retry_after_s * rng.uniform(0.5, 1.0))
                continue
            time.sleep(g.wait_s)
            time.sleep(rng.uniform(0, 0.05))  # the "call"
            actual_out = rng.randint(0, 80)
            lim.settle(SCOPE, LIMITS, g, input_tokens=est_in, output_tokens=actual_out)
            out.append((g.send_at, est_in, min(40, actual_out)))
            got += 1
    except Exception as exc:  # reported to the parent
        errors.append(repr(exc))
    finally:
        client.close()


def _process(url: str, prefix: str, index: int, queue) -> None:
    out: list = []
    errors: list = []
    threads = [threading.Thread(target=_thread, args=(url, prefix, index * 100 + i, out, errors))
               for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put((out, errors))


def test_many_hosts_never_exceed_the_bucket(redis_url, key_prefix):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process, args=(redis_url, key_prefix, i, queue))
             for i in range(PROCS)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    sends = [s for out, _ in results for s in out]
    errors = [e for _, errs in results for e in errs]
    assert not errors, errors[:5]
    assert len(sends) == PROCS * THREADS * GRANTS_PER_THREAD

    span = max(s[0] for s in sends) - min(s[0] for s in sends)
    assert span > 3  # the limit, not the callers, paced the run
    for k, (name, per_min) in enumerate([("requests", LIMITS.rpm), ("input", LIMITS.itpm),
                                         ("output", LIMITS.otpm)]):
        rate = per_min / 60
        cap = rate * LIMITS.burst_s
        series = [Send(s[0], 0, 1 if k == 0 else s[k]) for s in sends]
        bad = window_violations(series, rate, cap)
        assert not bad, f"{name}: {len(bad)} windows over the bucket, e.g. {bad[:3]}"
