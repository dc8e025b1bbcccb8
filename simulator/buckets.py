"""Per-API-key token buckets with continuous refill, the provider's own algorithm.

rate = limit / 60 per second, capacity = rate * burst_s, buckets start full. A requirement
larger than the capacity is capped at the capacity, so an oversized request is admitted
once the bucket is full instead of never (the level may then go negative and the next
requests wait for it to refill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import SimConfig


class TokenBucket:
    __slots__ = ("limit", "rate", "capacity", "level", "ts")

    def __init__(self, per_minute: float, burst_s: float, now: float) -> None:
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.capacity = self.rate * burst_s
        self.level = self.capacity
        self.ts = now

    def refill(self, now: float, keep: float = 1.0) -> None:
        """``keep``: the share of the refill left to us by other users of the key."""
        if now > self.ts:
            self.level = min(self.capacity, self.level + (now - self.ts) * self.rate * keep)
            self.ts = now

    def shortfall_s(self, need: float, strictly_positive: bool = False) -> float:
        """Seconds until `need` is covered (0 if it is now); call refill() first."""
        if strictly_positive:
            # "bucket > 0": only a debt has to be paid back.
            return 0.0 if self.level > 0 else (-self.level) / self.rate + 1e-6
        need = min(need, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def seconds_to_full(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)


@dataclass(slots=True)
class Rejection:
    limit_name: str  # "requests" | "input tokens" | "output tokens"
    limit: float
    retry_after_s: int
    level: str = "key"  # a pool: "key" (the workspace's limit) or "org" (the organisation's)


class KeyBuckets:
    """The requests / input-token / output-token buckets of one API key."""

    __slots__ = ("requests", "input", "output", "reserve_max_tokens", "other_share")

    def __init__(self, config: SimConfig, now: float,
                 limits: tuple[float | None, float | None, float | None] | None = None
                 ) -> None:
        def make(limit: float | None) -> TokenBucket | None:
            return TokenBucket(limit, config.burst_s, now) if limit else None

        rpm, itpm, otpm = limits if limits is not None else (config.rpm, config.itpm,
                                                               config.otpm)
        self.requests = make(rpm)
        self.input = make(itpm)
        self.output = make(otpm)
        self.reserve_max_tokens = config.otpm_mode == "max_tokens"
        self.other_share = config.other_share  # updated in place when the config changes

    def refill(self, now: float) -> None:
        for bucket in (self.requests, self.input, self.output):
            if bucket is not None:
                bucket.refill(now, 1.0 - self.other_share)

    def try_admit(self, input_tokens: int, max_tokens: int, now: float) -> Rejection | None:
        """Debit requests, input (and reserved output) if all have room, else say why not."""
        rejection = self.check(input_tokens, max_tokens, now)
        if rejection is None:
            self.debit(input_tokens, max_tokens)
        return rejection

    def check(self, input_tokens: int, max_tokens: int, now: float) -> Rejection | None:
        """Whether requests, input (and reserved output) all have room; debits nothing."""
        self.refill(now)
        worst: tuple[float, str, float] | None = None
        checks = (
            (self.requests, 1, False, "requests"),
            (self.input, input_tokens, False, "input tokens"),
            (self.output, max_tokens if self.reserve_max_tokens else 0,
             not self.reserve_max_tokens, "output tokens"),
        )
        for bucket, need, positive, name in checks:
            if bucket is None:
                continue
            wait = bucket.shortfall_s(need, positive)
            if wait > 0 and (worst is None or wait > worst[0]):
                worst = (wait, name, bucket.limit)
        if worst is not None:
            wait, name, limit = worst
            return Rejection(name, limit, max(1, math.ceil(wait)))
        return None

    def debit(self, input_tokens: int, max_tokens: int) -> None:
        if self.requests is not None:
            self.requests.level -= 1
        if self.input is not None:
            self.input.level -= input_tokens
        if self.output is not None and self.reserve_max_tokens:
            self.output.level -= max_tokens

    def settle_output(self, output_tokens: int, max_tokens: int, now: float) -> None:
        """Generated mode debits what was generated; max_tokens mode refunds the unused part."""
        if self.output is None:
            return
        self.output.refill(now, 1.0 - self.other_share)
        if self.reserve_max_tokens:
            self.output.level = min(self.output.capacity,
                                    self.output.level + max(0, max_tokens - output_tokens))
        else:
            self.output.level -= output_tokens


class NestedBuckets:
    """A pool's key: its workspace's buckets inside the organisation's (per model class). A
    request must fit every level; each level is debited; the headers show, per dimension,
    the level with the least left (the most restrictive limit in effect)."""

    __slots__ = ("levels",)

    def __init__(self, levels: list[tuple[str, KeyBuckets]]) -> None:
        self.levels = levels

    def refill(self, now: float) -> None:
        for _, buckets in self.levels:
            buckets.refill(now)

    def try_admit(self, input_tokens: int, max_tokens: int, now: float) -> Rejection | None:
        worst: Rejection | None = None
        for name, buckets in self.levels:
            rejection = buckets.check(input_tokens, max_tokens, now)
            if rejection is not None and (worst is None
                                          or rejection.retry_after_s > worst.retry_after_s):
                rejection.level = name
                worst = rejection
        if worst is None:
            for _, buckets in self.levels:
                buckets.debit(input_tokens, max_tokens)
        return worst

    def settle_output(self, output_tokens: int, max_tokens: int, now: float) -> None:
        for _, buckets in self.levels:
            buckets.settle_output(output_tokens, max_tokens, now)

    def tightest(self, dim: str) -> TokenBucket | None:
        """The bucket of ``dim`` ('requests', 'input', 'output') with the least left."""
        found = [b for b in (getattr(k, dim) for _, k in self.levels) if b is not None]
        return min(found, key=lambda b: b.level) if found else None
