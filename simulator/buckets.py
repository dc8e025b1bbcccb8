"""Per-API-key token buckets with continuous refill, the provider's own algorithm.

rate = limit / 60 per second, capacity = rate * burst_s, buckets start full. A requirement
larger than the capacity is capped at the capacity, so an oversized request is admitted
once the bucket is full instead of never (the level may then go negative and the next
requests wait for it to refill); with ``refuse_oversized``, one larger than a whole minute
of the limit is refused every time instead, as the provider does.
"""

from __future__ import annotations

import math
import random
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

    __slots__ = ("requests", "input", "output", "reserve_max_tokens", "refuse_oversized",
                 "other_share",
                 "other_model", "other_next", "other_rng", "other_admitted", "other_refused",
                 "other_backlog")

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
        self.refuse_oversized = config.refuse_oversized
        # Updated in place when the config changes (the other user starts or stops).
        self.other_share = config.other_share
        self.other_model = config.other_model
        self.other_rng = random.Random(config.seed * 7919 + 17)
        self.other_next: float | None = None  # the other consumer's next request
        self.other_admitted = 0
        self.other_refused = 0  # its requests refused (each retried until it is admitted)
        self.other_backlog = 0  # its requests waiting for room (it retries them)

    def _keep(self) -> float:
        """The share of the refill that comes to us (all of it when the other draws)."""
        return 1.0 if self.other_model == "draws" else 1.0 - self.other_share

    def _other_rate(self) -> float:
        """The other consumer's requests per second."""
        if self.requests is not None:
            return self.other_share * self.requests.rate
        return self.other_share  # no request limit: one request a second at full share

    def _other_draws(self) -> None:
        """The other consumer's waiting requests, oldest first, each at the limits' mean size
        per request, while every bucket has room (as for ours); a refused one waits and is
        tried again at its next chance, so the other keeps its share of the refill."""
        per = self.requests.limit if self.requests is not None else 60.0
        needs = ((self.requests, 1.0),
                 (self.input, self.input.limit / per if self.input is not None else 0.0),
                 (self.output, self.output.limit / per if self.output is not None else 0.0))
        while self.other_backlog:
            if any(b is not None and b.level < need for b, need in needs):
                self.other_refused += 1
                return
            for bucket, need in needs:
                if bucket is not None:
                    bucket.level -= need
            self.other_admitted += 1
            self.other_backlog -= 1

    def refill(self, now: float) -> None:
        buckets = [b for b in (self.requests, self.input, self.output) if b is not None]
        if self.other_model == "draws" and self.other_share > 0:
            rate = self._other_rate()
            if self.other_next is None:
                self.other_next = now + self.other_rng.expovariate(rate)
            while self.other_next <= now:
                at = self.other_next
                for bucket in buckets:
                    bucket.refill(at)
                # A request of its own; what waits beyond ten seconds' worth is given up.
                self.other_backlog = min(self.other_backlog + 1, max(1, round(rate * 10)))
                self._other_draws()
                self.other_next = at + self.other_rng.expovariate(rate)
        elif self.other_next is not None:
            self.other_next, self.other_backlog = None, 0  # the other stopped
        keep = self._keep()
        for bucket in buckets:
            bucket.refill(now, keep)
        if self.other_backlog:  # its retries come before a request of ours that arrives now
            self._other_draws()

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
            if self.refuse_oversized and need > bucket.limit:
                # More than a whole minute of the limit: no wait would make room for it.
                return Rejection(name, bucket.limit, max(1, math.ceil(bucket.seconds_to_full())))
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

    def generating(self, tokens: int, now: float) -> None:
        """A stream's output as it goes out: generated mode debits it now (the provider counts
        output as it is generated, so an answer in flight draws on the bucket before its end);
        max_tokens mode reserved it at admission."""
        if self.output is None or self.reserve_max_tokens:
            return
        self.refill(now)
        self.output.level -= tokens

    def adjust_tokens(self, tokens: float, now: float) -> None:
        """Give back ``tokens`` to the one tokens bucket (a negative number takes more):
        Bedrock's count of an answer once it is done."""
        if self.input is None:
            return
        self.refill(now)
        self.input.level = min(self.input.capacity, self.input.level + tokens)

    def settle_output(self, output_tokens: int, max_tokens: int, now: float,
                      debited: int = 0) -> None:
        """Generated mode debits what was generated and not yet debited (``debited``: what
        ``generating`` took of it); max_tokens mode refunds the unused part."""
        if self.output is None:
            return
        self.refill(now)
        if self.reserve_max_tokens:
            self.output.level = min(self.output.capacity,
                                    self.output.level + max(0, max_tokens - output_tokens))
        else:
            self.output.level -= output_tokens - debited


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

    def generating(self, tokens: int, now: float) -> None:
        for _, buckets in self.levels:
            buckets.generating(tokens, now)

    def settle_output(self, output_tokens: int, max_tokens: int, now: float,
                      debited: int = 0) -> None:
        for _, buckets in self.levels:
            buckets.settle_output(output_tokens, max_tokens, now, debited)

    def adjust_tokens(self, tokens: float, now: float) -> None:
        for _, buckets in self.levels:
            buckets.adjust_tokens(tokens, now)

    def tightest(self, dim: str) -> TokenBucket | None:
        """The bucket of ``dim`` ('requests', 'input', 'output') with the least left."""
        found = [b for b in (getattr(k, dim) for _, k in self.levels) if b is not None]
        return min(found, key=lambda b: b.level) if found else None
