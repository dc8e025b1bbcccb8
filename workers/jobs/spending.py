"""What a job has spent: the tokens its sub-agents share (the job's budget), the usage of its
own calls (planning, synthesis) and the send marks of those calls until they are counted."""

from __future__ import annotations

import json
import math
from typing import Any

import redis

from drover.config.prices import Price
from drover.workers.jobs._decode import text as _s
from drover.workers.jobs.claims import LUA
from drover.workers.jobs.keys import JobKeys
from drover.workers.jobs.records import Usage

__all__ = ["Spending"]


NANO = 1_000_000_000  # dollars are kept as integer nano-dollars (HINCRBY is exact)


class Spending:
    def __init__(self, client: redis.Redis, keys: JobKeys, ttl_s: int) -> None:
        self.r = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._reserve_usd = client.register_script((LUA / "reserve_usd.lua").read_text())

    def reserve_usd(self, key: str, cap_usd: float, worst_usd: float, ttl_s: int,
                    why: str = "") -> tuple[bool, float, str]:
        """Reserve ``worst_usd`` under ``cap_usd`` in ``key`` (lua/reserve_usd.lua): (True,
        the total now, "") or (False, the total, the reason it is capped). ``why``: kept as
        the reason on a refusal, so every later reservation is refused too."""
        reply = self._reserve_usd(keys=[key], args=[round(cap_usd * NANO),
                                                    math.ceil(worst_usd * NANO), ttl_s, why])
        total = float(reply[1]) / NANO
        return bool(int(reply[0])), total, _s(reply[2]) if len(reply) > 2 else ""

    def settle_usd(self, holds: list[tuple[str, float]], paid_usd: float) -> None:
        """Replace each (key, reserved) reservation by what the call cost, ``paid_usd``."""
        pipe = self.r.pipeline(transaction=False)
        for key, reserved in holds:
            pipe.hincrby(key, "usd", round(paid_usd * NANO) - math.ceil(reserved * NANO))
        if holds:
            pipe.execute()

    def spend(self, job_id: str, tokens: int) -> int:
        """Add to the job's shared token spend (atomic) and return the new total."""
        key = self.keys.job(job_id, "spent")
        pipe = self.r.pipeline()
        pipe.incrby(key, tokens)
        pipe.expire(key, self.ttl_s)
        return int(pipe.execute()[0])

    def spent(self, job_id: str) -> int:
        return int(self.r.get(self.keys.job(job_id, "spent")) or 0)

    def mark_job_send(self, job_id: str, part: str, est_in: int, est_out: int) -> None:
        """Right before a job-level call goes out: its mark, with its estimates, until its
        answer is counted (``add_job_usage(settles=part)``) or it is known unsent
        (``clear_job_send``). A delivery that finds it (its worker died mid-call) counts that
        call as unanswered: ``count_lost_job_send``."""
        pipe = self.r.pipeline()
        pipe.hset(self.keys.job(job_id, "sent"), part,
                  json.dumps({"in": est_in, "out": est_out}))
        pipe.expire(self.keys.job(job_id, "sent"), self.ttl_s)
        pipe.execute()

    def clear_job_send(self, job_id: str, part: str) -> None:
        self.r.hdel(self.keys.job(job_id, "sent"), part)

    def count_lost_job_send(self, job_id: str, part: str, price: Price | None = None
                            ) -> tuple[int, int] | None:
        """A send mark of ``part`` left by a delivery that died mid-call: counted now as the
        job's unanswered call, once (the count and the mark's removal are one transaction;
        a second delivery finds no mark). Returns its (input, output) estimate."""
        key = self.keys.job(job_id, "sent")
        with self.r.pipeline() as pipe:
            try:
                pipe.watch(key)
                raw = pipe.hget(key, part)
                if raw is None:
                    return None
                mark = json.loads(raw)
                lost = Usage()
                lost.add_unanswered(int(mark.get("in", 0)), int(mark.get("out", 0)), price)
                pipe.multi()
                pipe.hdel(key, part)
                self._count_job_usage(pipe, job_id, lost)
                pipe.execute()
            except redis.WatchError:
                return None
        return lost.unanswered_input_tokens, lost.unanswered_output_tokens

    def add_job_usage(self, job_id: str, usage: Usage, *, settles: str | None = None) -> None:
        """Add the usage of a job-level call (its planning, its synthesis) to the job's own
        counters, which the join adds to the sub-agents' (``job_usage``); ``settles``: the
        part ("plan", "synthesis") whose send mark this call's count clears, in the same
        transaction (so the call is counted once whoever dies when)."""
        pipe = self.r.pipeline()
        self._count_job_usage(pipe, job_id, usage)
        if settles:
            pipe.hdel(self.keys.job(job_id, "sent"), settles)
        if len(pipe):
            pipe.execute()

    def job_usage(self, job_id: str) -> Usage:
        raw = self.r.hgetall(self.keys.job(job_id, "usage"))
        known = set(Usage.model_fields)
        counts = {_s(k): v for k, v in raw.items() if _s(k) in known}
        usage = Usage(**{k: float(v) if k == "cost_usd" else int(v) for k, v in counts.items()})
        usage.merge(Usage())  # no calls priced: cost_usd None, never $0
        return usage

    def _count_job_usage(self, pipe: Any, job_id: str, usage: Usage) -> None:
        key = self.keys.job(job_id, "usage")
        fields = {name: n for name, n in usage.model_dump().items() if n}
        for name, n in fields.items():
            if isinstance(n, float):  # dollars
                pipe.hincrbyfloat(key, name, n)
            else:
                pipe.hincrby(key, name, n)
        if fields:
            pipe.expire(key, self.ttl_s)
