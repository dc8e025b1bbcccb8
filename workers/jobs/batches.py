"""Batch delivery's state in Redis: pending requests, open batches, results, parked sub-agents.

A batch sub-agent's turn is a request waiting here instead of an HTTP call. Its life:

1. ``enqueue``: the request (a ``messages.create`` body) joins its scope's pending set; the
   sub-agent parks (``park`` keeps the Celery signature that resumes it) and its task ends.
2. ``take`` + ``intend`` + ``opened``: the batcher records the batch it is about to create
   (its requests' custom_ids, under the job) before the create call, then moves the pending
   requests into the Message Batch it created; an intent left behind by a batcher that died
   in between is resolved by the next one (``intents``: adopted from the provider's list of
   batches, or dropped, so the requests still pending go out once).
3. ``store_results``: the batch ended; each sub-agent's result is kept under its job and the
   sub-agent is marked ready.
4. ``ready`` + ``unpark``: the batcher sends the parked signature; the sub-agent resumes from
   its checkpoint and consumes the result (``result``).

``custom_id`` = ``{job id}_{index}_{turn}_{n}``: a result names its sub-agent by itself, and
``n`` (the sub-agent's count of batch requests) keeps a retried turn's id new.

Keys: ``{prefix}:batch:...`` for what spans jobs (pending per scope, open batches, ready),
``{prefix}:job:{id}:b...`` for what belongs to a job (results, parked signatures, counters),
which expires with the job. Knows no Celery and no HTTP; the batcher (workers/agent/batch.py)
drives it, under its own lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import redis

from drover.workers.jobs._decode import members as _members
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.meta import JobMeta

__all__ = ["BatchStore", "Intent", "OpenBatch", "custom_id", "parse_custom_id"]

COUNTERS = ("submitted", "succeeded", "errored", "canceled", "expired", "batches")


def custom_id(job_id: str, index: int, turn: int, n: int) -> str:
    return f"{job_id}_{index}_{turn}_{n}"


def parse_custom_id(value: str) -> tuple[str, int]:
    """(job id, sub-agent index) of a custom_id made by ``custom_id``."""
    job_id, index, _turn, _n = value.rsplit("_", 3)
    return job_id, int(index)


@dataclass
class Intent:
    """A batch the batcher was about to create (recorded before the create call)."""

    id: str
    scope: str
    job_id: str
    custom_ids: list[str]
    leases: list[str] = field(default_factory=list)
    at: float = 0.0  # on Redis's clock, just before the create call

    def dump(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def load(cls, raw: bytes | str) -> Intent:
        return cls(**json.loads(raw))


@dataclass
class OpenBatch:
    """A Message Batch drover created and has not collected yet."""

    id: str
    scope: str
    job_id: str
    custom_ids: list[str]
    leases: list[str] = field(default_factory=list)  # queue-capacity leases, released at the end
    created: float = 0.0
    polled: float = 0.0
    cancel_sent: bool = False
    ended: bool = False  # seen ended: the next poll goes straight to its results
    results_url: str | None = None

    def dump(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def load(cls, raw: bytes | str) -> OpenBatch:
        return cls(**json.loads(raw))


class BatchStore:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int, meta: JobMeta) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.meta = meta  # Redis's clock, which orders the queue
        self.base = keys.batch

    # --- keys ---------------------------------------------------------------------------
    def _pending(self, scope: str) -> str:
        return f"{self.base}:pending:{scope}"

    def _bodies(self, scope: str) -> str:
        return f"{self.base}:body:{scope}"

    @property
    def _scopes(self) -> str:
        return f"{self.base}:scopes"

    @property
    def _open(self) -> str:
        return f"{self.base}:open"

    @property
    def _inflight(self) -> str:  # custom_id -> batch id
        return f"{self.base}:inflight"

    @property
    def _ready(self) -> str:
        return f"{self.base}:ready"

    @property
    def _active_jobs(self) -> str:
        return f"{self.base}:jobs"

    def lock(self, key_alias: str) -> str:
        return f"{self.base}:lock:{key_alias}"

    # --- a sub-agent's side -------------------------------------------------------------
    def enqueue(self, scope: str, job_id: str, cid: str, params: dict[str, Any]) -> None:
        now = self.meta.server_time()
        pipe = self.r.pipeline()
        pipe.hset(self._bodies(scope), cid, json.dumps(params))
        pipe.zadd(self._pending(scope), {cid: now}, nx=True)
        pipe.sadd(self._scopes, scope)
        pipe.sadd(self._active_jobs, job_id)
        pipe.execute()

    def waiting(self, scope: str, cid: str) -> bool:
        """True while ``cid`` is pending or in an open batch (its result is still to come)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.zscore(self._pending(scope), cid)
        pipe.hexists(self._inflight, cid)
        pending, inflight = pipe.execute()
        return pending is not None or bool(inflight)

    def park(self, job_id: str, index: int, signature: str) -> None:
        key = self.keys.job(job_id, "bpark")
        pipe = self.r.pipeline()
        pipe.hset(key, str(index), signature)
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def parked(self, job_id: str) -> set[int]:
        return {int(i) for i in self.r.hkeys(self.keys.job(job_id, "bpark"))}

    def result(self, job_id: str, index: int) -> dict[str, Any] | None:
        raw = self.r.hget(self.keys.job(job_id, "bres"), str(index))
        return json.loads(raw) if raw else None

    def clear_result(self, job_id: str, index: int) -> None:
        self.r.hdel(self.keys.job(job_id, "bres"), str(index))

    def counters(self, job_id: str) -> dict[str, int]:
        raw = self.r.hgetall(self.keys.job(job_id, "batch"))
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}

    # --- the batcher's side -------------------------------------------------------------
    def scopes(self, key_alias: str | None = None) -> list[str]:
        """Scopes with pending requests (of one API key's alias, when given)."""
        mine = f"llm:{key_alias}:" if key_alias is not None else ""
        return sorted(s for s in (_s(x) for x in self.r.smembers(self._scopes))
                      if s.startswith(mine))

    def pending_state(self, scope: str) -> tuple[int, float | None]:
        """(how many wait, when the oldest came in, on Redis's clock)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(self._pending(scope))
        pipe.zrange(self._pending(scope), 0, 0, withscores=True)
        count, oldest = pipe.execute()
        return int(count), (float(oldest[0][1]) if oldest else None)

    def take(self, scope: str, limit: int) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """Up to ``limit`` of the oldest pending requests, grouped by job (still pending)."""
        cids = _members(self.r.zrange(self._pending(scope), 0, limit - 1))
        if not cids:
            return {}
        bodies = self.r.hmget(self._bodies(scope), cids)
        grouped: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for cid, raw in zip(cids, bodies, strict=True):
            if raw is None:  # its body is gone: nothing to send
                self.r.zrem(self._pending(scope), cid)
                continue
            grouped.setdefault(parse_custom_id(cid)[0], []).append((cid, json.loads(raw)))
        return grouped

    def forget_scope_if_empty(self, scope: str) -> None:
        if not self.r.zcard(self._pending(scope)):
            self.r.srem(self._scopes, scope)

    def intend(self, intent: Intent) -> None:
        """Record the batch about to be created, under its job (before the create call)."""
        key = self.keys.job(intent.job_id, "bintent")
        pipe = self.r.pipeline()
        pipe.hset(key, intent.id, intent.dump())
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def intents(self, key_alias: str | None = None) -> list[Intent]:
        """Intents not resolved yet, of the active batch jobs (of one key's alias, if given)."""
        mine = f"llm:{key_alias}:" if key_alias is not None else ""
        jobs = self.active_jobs()
        if not jobs:
            return []
        pipe = self.r.pipeline(transaction=False)
        for job_id in jobs:
            pipe.hvals(self.keys.job(job_id, "bintent"))
        found = [Intent.load(raw) for rows in pipe.execute() for raw in rows]
        return sorted((i for i in found if i.scope.startswith(mine)), key=lambda i: i.at)

    def drop_intent(self, intent: Intent) -> None:
        """No batch was made for ``intent``: forget it (its requests are still pending)."""
        self.r.hdel(self.keys.job(intent.job_id, "bintent"), intent.id)

    def opened(self, batch: OpenBatch, intent: str | None = None) -> None:
        """``batch`` was created at the provider with these pending requests (for the
        recorded ``intent``, which it resolves)."""
        pipe = self.r.pipeline()
        if intent is not None:
            pipe.hdel(self.keys.job(batch.job_id, "bintent"), intent)
        pipe.hset(self._open, batch.id, batch.dump())
        pipe.hset(self._inflight, mapping=dict.fromkeys(batch.custom_ids, batch.id))
        pipe.zrem(self._pending(batch.scope), *batch.custom_ids)
        pipe.hdel(self._bodies(batch.scope), *batch.custom_ids)
        self._count(pipe, batch.job_id, submitted=len(batch.custom_ids), batches=1)
        pipe.sadd(self.keys.job(batch.job_id, "bopen"), batch.id)
        pipe.expire(self.keys.job(batch.job_id, "bopen"), self.ttl_s)
        pipe.execute()

    def open_batches(self, key_alias: str | None = None) -> list[OpenBatch]:
        mine = f"llm:{key_alias}:" if key_alias is not None else ""
        return [b for b in (OpenBatch.load(raw) for raw in self.r.hvals(self._open))
                if b.scope.startswith(mine)]

    def update(self, batch: OpenBatch) -> None:
        self.r.hset(self._open, batch.id, batch.dump())

    def job_open_batches(self, job_id: str) -> list[str]:
        return sorted(_s(x) for x in self.r.smembers(self.keys.job(job_id, "bopen")))

    def store_results(self, batch: OpenBatch, results: dict[str, dict[str, Any]]) -> None:
        """The ended batch's results (custom_id -> result object): keep them, wake the owners.

        A request the results file does not mention gets an ``errored`` result of our own, so
        its sub-agent still resumes (and retries it)."""
        outcomes: dict[str, int] = {}
        pipe = self.r.pipeline()
        for cid in batch.custom_ids:
            result = results.get(cid) or {"type": "errored", "error": {
                "type": "error", "error": {"type": "api_error",
                                           "message": "no result for this request in the "
                                                      "batch's results file"}}}
            self._deliver(pipe, cid, result)
            outcomes[result["type"]] = outcomes.get(result["type"], 0) + 1
        self._count(pipe, batch.job_id, **outcomes)
        pipe.hdel(self._inflight, *batch.custom_ids)
        pipe.hdel(self._open, batch.id)
        pipe.srem(self.keys.job(batch.job_id, "bopen"), batch.id)
        pipe.execute()

    def drop_pending(self, job_id: str, result: dict[str, Any],
                     key_alias: str | None = None) -> int:
        """Take a job's unsent requests out of every scope, giving each owner ``result``."""
        dropped = 0
        for scope in self.scopes(key_alias):
            prefix = f"{job_id}_"
            cids = [c for c in _members(self.r.zrange(self._pending(scope), 0, -1))
                    if c.startswith(prefix)]
            if not cids:
                continue
            pipe = self.r.pipeline()
            pipe.zrem(self._pending(scope), *cids)
            pipe.hdel(self._bodies(scope), *cids)
            for cid in cids:
                self._deliver(pipe, cid, result)
            pipe.execute()
            dropped += len(cids)
        return dropped

    def fail_pending(self, scope: str, cids: list[str], result: dict[str, Any]) -> None:
        """Pending requests the provider refused outright: their owners get ``result``."""
        pipe = self.r.pipeline()
        pipe.zrem(self._pending(scope), *cids)
        pipe.hdel(self._bodies(scope), *cids)
        for cid in cids:
            self._deliver(pipe, cid, result)
        pipe.execute()

    def _deliver(self, pipe: Any, cid: str, result: dict[str, Any]) -> None:
        job_id, index = parse_custom_id(cid)
        key = self.keys.job(job_id, "bres")
        pipe.hset(key, str(index), json.dumps({"custom_id": cid, "result": result}))
        pipe.expire(key, self.ttl_s)
        pipe.sadd(self._ready, f"{job_id}:{index}")

    def _count(self, pipe: Any, job_id: str, **counts: int) -> None:
        key = self.keys.job(job_id, "batch")
        for name, n in counts.items():
            if n:
                pipe.hincrby(key, name, n)
        pipe.expire(key, self.ttl_s)

    def ready(self) -> list[tuple[str, int]]:
        out = []
        for member in self.r.smembers(self._ready):
            job_id, _, index = _s(member).rpartition(":")
            out.append((job_id, int(index)))
        return sorted(out)

    def unpark(self, job_id: str, index: int) -> str | None:
        """The parked signature of a ready sub-agent, taken (None: it has not parked yet).

        It stays ready until ``not_ready``: a resume that could not be sent is tried again."""
        key = self.keys.job(job_id, "bpark")
        pipe = self.r.pipeline()
        pipe.hget(key, str(index))
        pipe.hdel(key, str(index))
        raw, _ = pipe.execute()
        return _s(raw) if raw is not None else None

    def not_ready(self, job_id: str, index: int) -> None:
        self.r.srem(self._ready, f"{job_id}:{index}")

    def active_jobs(self) -> list[str]:
        return sorted(_s(x) for x in self.r.smembers(self._active_jobs))

    def retire_job(self, job_id: str) -> None:
        self.r.srem(self._active_jobs, job_id)
