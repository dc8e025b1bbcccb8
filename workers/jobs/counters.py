"""Counters a job keeps beside its records, for ``drover watch``, ``drover stats`` and the
sweep: re-sends per sub-agent, failed LLM calls by kind, answers streaming in now, and the
calls sent and never answered per limiter scope."""

from __future__ import annotations

import time

import redis

from drover.workers.jobs._decode import text as _s
from drover.workers.jobs.keys import JobKeys

__all__ = ["Counters"]


class Counters:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s

    def add_resend(self, job_id: str, index: int) -> int:
        """Count one re-send of a sub-agent's lost task; returns the count so far."""
        return self._add(self.keys.job(job_id, "resent"), index)

    def add_death(self, job_id: str, index: int) -> int:
        """Count one worker that died while it ran the sub-agent; returns the count so far
        (the sweep's budget: a task that kills every worker it lands on)."""
        return self._add(self.keys.job(job_id, "deaths"), index)

    def _add(self, key: str, index: int) -> int:
        pipe = self.r.pipeline()
        pipe.hincrby(key, str(index), 1)
        pipe.expire(key, self.ttl_s)
        return int(pipe.execute()[0])

    def count_failed_call(self, job_id: str, kind: str) -> None:
        """Count one failed LLM call of the job by kind (n429, n529, n5xx, n4xx, nconn)."""
        key = self.keys.job(job_id, "failed_calls")
        pipe = self.r.pipeline()
        pipe.hincrby(key, kind, 1)
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def failed_calls(self, job_id: str) -> dict[str, int]:
        raw = self.r.hgetall(self.keys.job(job_id, "failed_calls"))
        return {_s(k): int(v) for k, v in raw.items()}

    def generating(self, job_id: str, index: int, on: bool) -> None:
        """Sub-agent ``index``'s answer is streaming in (its first token came), or no longer;
        ``drover watch`` shows how many are (``generating_count``)."""
        key = self.keys.job(job_id, "generating")
        if not on:
            self.r.hdel(key, str(index))
            return
        pipe = self.r.pipeline()
        pipe.hset(key, str(index), "1")
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def generating_count(self, job_id: str) -> int:
        return int(self.r.hlen(self.keys.job(job_id, "generating")))

    # --- calls sent and never answered, per limiter scope (for `drover stats`) -----------
    def count_unanswered(self, scope: str, input_tokens: int, output_tokens: int,
                         keep_s: int) -> None:
        """Count one call of ``scope`` that was sent and never answered (its estimate); the
        counters go once no such call was counted for ``keep_s`` seconds."""
        key = self.keys.unanswered(scope)
        pipe = self.r.pipeline()
        pipe.hincrby(key, "calls", 1)
        pipe.hincrby(key, "input_tokens", input_tokens)
        pipe.hincrby(key, "output_tokens", output_tokens)
        pipe.hsetnx(key, "since", time.time())
        pipe.expire(key, keep_s)
        pipe.execute()

    def unanswered(self) -> dict[str, dict[str, float]]:
        """Scope -> its unanswered counters (calls, input_tokens, output_tokens, since)."""
        found = {}
        for key in self.r.scan_iter(match=self.keys.unanswered(), count=500):
            scope = _s(key).removeprefix(self.keys.unanswered(""))
            found[scope] = {_s(k): float(v) for k, v in self.r.hgetall(key).items()}
        return found
