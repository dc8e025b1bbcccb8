"""This process's counters and histograms, added to Redis so one exporter sees the fleet.

Each process sums what it counts in memory (a dict under a lock: recording is a dict update,
no I/O on the call path) and a daemon thread adds the sums to one Redis hash every
``DROVER_METRICS_FLUSH_S``, with ``HINCRBYFLOAT``, so the hash holds fleet-wide cumulative
values, whatever the number of hosts and processes. A flush that fails (Redis away) keeps
its sums for the next one; nothing is counted twice or lost while the process lives.

The same thread keeps this process's heartbeat: a hash of its own with a short TTL
(Redis's clock expires it), naming its Celery node once the worker is ready and the
sub-agents running here per job. The exporter counts the live nodes and sums the running
sub-agents from those hashes.

Keys (all under ``{prefix}:telemetry:``): ``counters`` (the hash above; field = JSON
``[name, [label values], part]``, part None for a counter, ``"sum"`` or a bucket's upper
bound for a histogram, buckets stored per bucket, not cumulated), ``procs`` (set of process
ids), ``proc:{id}`` (a process's heartbeat hash) and ``jobs`` (zset of the active jobs by
submit time, member ``{job id}|{tenant}``; the exporter drops a job once it has ended, and
every submit drops entries older than the job records' TTL, so it stays bounded without an
exporter too).
"""

from __future__ import annotations

import atexit
import bisect
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis

from drover.workers.telemetry._metrics import Metric, metric

__all__ = ["Recorder", "field", "get_recorder", "keys", "parse_field", "parse_job",
           "register_job", "use_recorder"]

log = logging.getLogger(__name__)
COUNTERS_TTL_S = 7 * 24 * 3600


def keys(prefix: str) -> dict[str, str]:
    base = f"{prefix}:telemetry"
    return {"counters": f"{base}:counters", "procs": f"{base}:procs", "proc": f"{base}:proc:",
            "jobs": f"{base}:jobs"}


def register_job(client: redis.Redis, prefix: str, job_id: str, tenant: str,
                 keep_s: float) -> None:
    """Count ``job_id`` as active (the exporter reads it and drops it when it ends)."""
    key = keys(prefix)["jobs"]
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.zadd(key, {f"{job_id}|{tenant}": now})
    pipe.zremrangebyscore(key, "-inf", now - keep_s)
    pipe.expire(key, max(1, int(keep_s)))  # no key of ours outlives what it describes
    pipe.execute()


def parse_job(member: str) -> tuple[str, str]:
    """(job id, tenant) of an entry of the active jobs."""
    job_id, _, tenant = member.partition("|")
    return job_id, tenant or "default"


def field(name: str, values: tuple[str, ...], part: str | None = None) -> str:
    return json.dumps([name, list(values), part], separators=(",", ":"))


def parse_field(raw: str) -> tuple[str, tuple[str, ...], str | None]:
    name, values, part = json.loads(raw)
    return name, tuple(values), part


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


class Recorder:
    """Counts of one process for one Redis and key prefix."""

    def __init__(self, client: redis.Redis, prefix: str, flush_s: float,
                 keep_s: int = COUNTERS_TTL_S):
        self.prefix = prefix
        self.keys = keys(prefix)
        self.flush_s = flush_s
        self.keep_s = keep_s  # the counters outlive an idle fleet this long (the records' TTL)
        self.pid = os.getpid()
        self.proc_id = f"{socket.gethostname()}:{self.pid}:{uuid.uuid4().hex[:6]}"
        self.node: str | None = None
        self._client = client  # its own: closed with the recorder
        self._lock = threading.Lock()
        self._pending: dict[str, float] = defaultdict(float)
        self._running: dict[str, int] = defaultdict(int)
        self._beat = False  # a heartbeat is kept once this process runs or is a worker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="drover-metrics", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # --- recording (any thread; no I/O) --------------------------------------------------
    def inc(self, name: str, labels: tuple[str, ...], value: float = 1.0) -> None:
        if value:
            key = field(name, labels)
            with self._lock:
                self._pending[key] += value

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        m: Metric = metric(name)
        i = bisect.bisect_left(m.buckets, value)
        bound = m.buckets[i] if i < len(m.buckets) else float("inf")
        with self._lock:
            self._pending[field(name, labels, _bound(bound))] += 1
            self._pending[field(name, labels, "sum")] += value

    def running(self, job_id: str, delta: int) -> None:
        with self._lock:
            self._running[job_id] += delta
            if self._running[job_id] <= 0:
                del self._running[job_id]
            self._beat = True

    def worker_ready(self, node: str) -> None:
        with self._lock:
            self.node = node
            self._beat = True
        self.flush()

    # --- flushing (the daemon thread) ----------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, defaultdict(float)
            running = dict(self._running)
            beat, node = self._beat, self.node
        pipe = self._client.pipeline(transaction=False)
        for key, value in batch.items():
            pipe.hincrbyfloat(self.keys["counters"], key, value)
        if batch:
            # Counters of a fleet idle for as long as records are kept start again from zero
            # (Prometheus takes a counter reset in its stride); nothing stays in Redis for ever.
            pipe.expire(self.keys["counters"], self.keep_s)
        if beat:
            self._heartbeat(pipe, node, running)
        if not len(pipe):
            return
        try:
            pipe.execute()
        except redis.RedisError as error:
            log.warning("metrics not flushed to Redis (%s); kept for the next flush",
                        type(error).__name__)
            with self._lock:
                for key, value in batch.items():
                    self._pending[key] += value

    def _heartbeat(self, pipe: Any, node: str | None, running: dict[str, int]) -> None:
        key = self.keys["proc"] + self.proc_id
        mapping: dict[str, Any] = {"pid": self.pid,
                                   **{f"running:{job}": n for job, n in running.items()}}
        if node:
            mapping["node"] = node
        pipe.delete(key)
        pipe.hset(key, mapping=mapping)
        # Three missed flushes and this process no longer counts as alive.
        pipe.pexpire(key, int(max(5.0, 3 * self.flush_s) * 1000))
        pipe.sadd(self.keys["procs"], self.proc_id)
        pipe.expire(self.keys["procs"], int(max(60.0, 10 * self.flush_s)))

    def close(self) -> None:
        if self._stop.is_set() or os.getpid() != self.pid:
            return
        self._stop.set()
        with self._lock:
            self._beat = False
        try:
            self.flush()
            self._client.delete(self.keys["proc"] + self.proc_id)
        except Exception:  # at exit Redis may be gone: nothing to report to anyway
            pass
        self._client.close()


# Where the hooks find this process's recorder: the composition root (drover.workers.services)
# says, since it owns the recorder and telemetry must not depend on it.
_source: Callable[[], Recorder] | None = None


def use_recorder(source: Callable[[], Recorder]) -> None:
    """Have the hooks count into ``source()`` (called on every count: it may change)."""
    global _source
    _source = source


def get_recorder() -> Recorder:
    """The recorder the hooks count into (RuntimeError before ``use_recorder``)."""
    if _source is None:
        raise RuntimeError("no recorder: drover.workers.services was not imported")
    return _source()
