"""A reference model of the limiter's algorithm, in exact arithmetic, and the bound it keeps.

The Lua scripts keep one time per dimension (GCRA); this model keeps what a reader pictures:
a token level per dimension, refilled continuously at ``rate`` up to ``capacity``, as seen
at the latest operation. Reservations already made for later instants are in that level,
so it may be negative (callers are queued). Numbers are Fractions of microseconds and
tokens, so with inputs that are whole microseconds the Lua's float results and the
model's agree exactly on every decision; levels agree to rounding.

What the algorithm promises, in these terms:

- acquire plans the send at the earliest s >= max(now, cooldown end) at which the level,
  refilled to s, covers the cost in every limited dimension with a cost; the horizon test
  uses the cost capped at the capacity. The level at s then drops by the (capped) cost.
- settle debits extra use now and credits unused reservation in full, but never above the
  capacity nor above what refilled since a cooldown's end (``rate x (now - cd)``).
- a cooldown to cd leaves every level at cd at most 0; a ``-remaining`` r caps a level at r.
- a change of a dimension's limit keeps the time until its bucket is full again.

``window_violations`` is the bound the hypothesis state machine checks (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction as F

from drover.workers.limiter import ScopeLimits

MIN_RETRY_S = F(5, 100)
T0 = 1_700_000_000_000_000  # us: where the tests' clocks start


class Clock:
    """A clock to inject into a Limiter (``clock=``): the time its scripts see, in us."""

    def __init__(self, us: int = T0) -> None:
        self.us = us

    def __call__(self) -> int:
        return self.us


@dataclass
class Dim:
    rate: F        # tokens per microsecond
    cap: F         # tokens
    level: F       # tokens, at the model's time t


@dataclass
class ModelGrant:
    granted: bool
    wait_s: float
    retry_after_s: float
    reason: str


@dataclass
class ScopeModel:
    horizon_s: float
    t: F = F(0)
    dims: list[Dim | None] = field(default_factory=lambda: [None, None, None])
    lims: list[F | None] = field(default_factory=lambda: [None, None, None])  # last written
    burst: F = F(1)
    cd: F = F(0)
    leases: dict[str, F] = field(default_factory=dict)
    learned: list[F | None] = field(default_factory=lambda: [None, None, None])
    lu: F = F(1)  # learned_utilization of the last write
    _lu_seen: F = F(1)  # of the last _at, written by the next _write

    def _limits(self, limits: ScopeLimits | None) -> tuple[list[F | None], F]:
        if limits is None:  # what the last write stored
            return list(self.lims), self.burst
        lims: list[F | None] = []
        for k, conf in enumerate((limits.rpm, limits.itpm, limits.otpm)):
            if conf is not None:
                lims.append(F(conf))
            elif self.learned[k] is not None:
                lims.append(self.learned[k] * F(limits.learned_utilization))
            else:
                lims.append(None)
        return lims, F(limits.burst_s)

    def _at(self, now: int, limits: ScopeLimits | None) -> tuple[list[Dim | None], list, F]:
        """The dimensions seen at ``now`` under ``limits`` (nothing is written)."""
        lims, burst = self._limits(limits)
        lu = self.lu if limits is None else F(limits.learned_utilization)
        self._lu_seen = lu
        dims: list[Dim | None] = []
        for k, lim in enumerate(lims):
            if lim is None:
                dims.append(None)
                continue
            # A bucket of less than one request is planned at the provider's full rate
            full = lim / lu if k == 0 and lim * burst < 60 else lim
            rate, cap = full / 60_000_000, full / 60 * burst
            old = self.dims[k]
            if old is None:
                dims.append(Dim(rate, cap, cap))
                continue
            to_full = max(F(0), (old.cap - old.level) / old.rate - (now - self.t))
            dims.append(Dim(rate, cap, cap - rate * to_full))
        return dims, lims, burst

    def _write(self, now: int, dims: list[Dim | None], lims: list, burst: F) -> None:
        self.t, self.dims, self.lims, self.burst = F(now), dims, lims, burst
        self.lu = self._lu_seen

    def acquire(self, now: int, limits: ScopeLimits, input_tokens: int, output_tokens: int,
                lease_id: str, lease_ttl_s: float) -> ModelGrant:
        dims, lims, burst = self._at(now, limits)
        horizon = F(self.horizon_s) * 1_000_000
        if self.cd - now > horizon:
            return ModelGrant(False, 0.0, float(max((self.cd - now - horizon) / 10**6,
                                                    MIN_RETRY_S)), "cooldown")
        self.leases = {k: v for k, v in self.leases.items() if v > now}
        if limits.max_in_flight is not None and len(self.leases) >= limits.max_in_flight:
            first = min(self.leases.values())
            poll = max(F(5, 1000), min(F(1, 10), (first - now) / 10**6))
            return ModelGrant(False, 0.0, float(poll), "in_flight")
        costs = (1, input_tokens, output_tokens)
        charged = [(d, F(c)) for k, (d, c) in enumerate(zip(dims, costs, strict=True))
                   if d is not None and (k == 0 or c > 0)]
        start = max(F(now), self.cd)
        send = max([start] + [now + (c - d.level) / d.rate for d, c in charged])
        judged = max([start] + [now + (min(c, d.cap) - d.level) / d.rate for d, c in charged])
        if judged - now > horizon:
            return ModelGrant(False, 0.0, float(max((judged - now - horizon) / 10**6,
                                                    MIN_RETRY_S)), "horizon")
        for d, c in charged:
            d.level = min(d.level, d.cap - d.rate * (send - now)) - min(c, d.cap)
        # as the script computes it (a double: tonumber(ttl) * 1e6), not Fraction(0.2), which
        # is a little more than 0.2 and would outlive the script's lease by a hair
        self.leases[lease_id] = send + F(float(lease_ttl_s) * 1_000_000)
        self._write(now, dims, lims, burst)
        return ModelGrant(True, float((send - now) / 10**6), 0.0, "ok")

    def settle(self, now: int, limits: ScopeLimits | None, lease_id: str, sent: bool,
               reserved: tuple[int, int], used: tuple[int, int]) -> None:
        dims, lims, burst = self._at(now, limits)
        self.leases.pop(lease_id, None)
        for d, res, use in zip(dims, (1, *reserved), (int(sent), *used), strict=True):
            if d is None:
                continue
            if use > res:
                d.level -= use - res
            elif use < res:
                credit = min(F(res), d.cap) - min(F(use), d.cap)
                d.level = max(d.level, min(d.level + credit, d.cap, d.rate * (now - self.cd)))
        self._write(now, dims, lims, burst)

    def cooldown(self, now: int, limits: ScopeLimits, retry_after_s: float) -> float:
        dims, lims, burst = self._at(now, limits)
        self.cd = max(self.cd, now + F(retry_after_s) * 1_000_000)
        for d in dims:
            if d is not None:
                d.level = min(d.level, -d.rate * (self.cd - now))
        self._write(now, dims, lims, burst)
        return float((self.cd - now) / 10**6)

    def sync(self, now: int, limits: ScopeLimits, remaining: list[float | None],
             learn: list[float | None]) -> None:
        for k, v in enumerate(learn):
            if v is not None:
                self.learned[k] = F(v)
        dims, lims, burst = self._at(now, limits)
        for d, rem in zip(dims, remaining, strict=True):
            if d is not None and rem is not None:
                d.level = min(d.level, F(rem))
        self._write(now, dims, lims, burst)

    def state(self, now: int, limits: ScopeLimits | None) -> dict:
        dims, _, _ = self._at(now, limits)
        return {"cooldown_s": float(max(F(0), self.cd - now) / 10**6),
                "leases": sum(1 for v in self.leases.values() if v > now),
                "levels": [None if d is None else d.level for d in dims],
                "caps": [None if d is None else d.cap for d in dims]}


@dataclass
class Send:
    """One granted request as the window bound sees it, in one dimension."""

    at_s: float          # planned send time (s)
    planned: int         # step at which it was acquired
    cost: float          # what it finally cost: min(reserved, used); 0 if released
    credits: list[tuple[int, float]] = field(default_factory=list)  # (step, at most credited)


def window_violations(sends: list[Send], rate: float, cap: float, eps: float = 1e-6
                      ) -> list[tuple[float, float, float, float]]:
    """Windows [a, b] of send times whose sends cost more than the algorithm allows:

        capacity + rate x (b - a) + the excess over the capacity of each send in it (an
        oversized request absorbed the refill while it waited) + what refunds of sends
        outside the window credited while the window's sends were being planned (between the
        first and the last acquire of them).

    That last term is the worst case of crediting refunds in full: the provider's bucket may
    have been full meanwhile and lost the refund, while ours hands it out again. It is 0
    when nothing is refunded, and then this is the plain token-bucket bound.
    Returns (a, b, total, allowed) per breach.
    """
    items = sorted(sends, key=lambda x: x.at_s)
    credits = [(k, step, c) for k, y in enumerate(items) for step, c in y.credits]
    bad = []
    for i in range(len(items)):
        total = excess = 0.0
        first = last = items[i].planned
        for j in range(i, len(items)):
            x = items[j]
            total += x.cost
            excess += max(0.0, x.cost - cap)
            first, last = min(first, x.planned), max(last, x.planned)
            a, b = items[i].at_s, x.at_s
            credited = sum(c for k, step, c in credits
                           if not i <= k <= j and first < step < last)
            allowed = cap + rate * (b - a) + excess + credited
            if total > allowed + eps * max(1.0, allowed):
                bad.append((a, b, total, allowed))
    return bad
