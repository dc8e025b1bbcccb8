"""A pure-Python reference model of the limiter's Lua scripts, with an explicit clock.

It performs the same floating-point operations in the same order as ``workers/lua/*.lua``,
so with the scripts' ``now_us`` override the two must agree exactly: levels, waits, grants
and reasons. Time is in integer microseconds, like the scripts' ``redis.call('TIME')``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from workers.limiter import ScopeLimits

MIN_RETRY_S = 0.05
MARGIN_S = 5
NW, W_US = 12, 250000   # the send-side peak ring (_lib.lua)
NEG = float("-inf")


@dataclass
class Dim:
    lim: float
    rate: float
    cap: float
    level: float
    S: float | None = None   # send-side bucket right after the latest send q (us)
    q: float | None = None
    n: float | None = None   # latest window of the peak ring, and the ring (NW maxima)
    P: list[float] = field(default_factory=list)


@dataclass
class ModelGrant:
    granted: bool
    wait_s: float
    retry_after_s: float
    reason: str
    lease_id: str | None = None


@dataclass
class ScopeModel:
    """One scope: the bucket hash, the leases and the learned limits."""

    horizon_s: float
    levels: list[float | None] = field(default_factory=lambda: [None, None, None])
    sends_side: list[tuple[float, float] | None] = field(default_factory=lambda: [None] * 3)
    rings: list[tuple[float, list[float]] | None] = field(default_factory=lambda: [None] * 3)
    stored_lims: list[float | None] = field(default_factory=lambda: [None, None, None])
    stored_burst: float | None = None
    t: float | None = None
    cd: float = 0.0
    leases: dict[str, float] = field(default_factory=dict)
    learned: list[float | None] = field(default_factory=lambda: [None, None, None])

    # -- _lib.lua ------------------------------------------------------------------------
    def _load(self, now: int, limits: ScopeLimits | None) -> tuple[float, list[Dim | None], float]:
        if limits is None:  # '*': what the last write stored
            lims = list(self.stored_lims)
            burst = self.stored_burst if self.stored_burst is not None else 1.0
        else:
            burst = limits.burst_s
            lims = []
            for k, conf in enumerate((limits.rpm, limits.itpm, limits.otpm)):
                if conf is not None:
                    lims.append(float(conf))
                elif self.learned[k] is not None:
                    lims.append(self.learned[k] * limits.learned_utilization)
                else:
                    lims.append(None)
        t = self.t if self.t is not None else now
        dims: list[Dim | None] = []
        for k in range(3):
            lim = lims[k]
            if lim is not None and lim > 0:
                rate = lim / 60
                cap = rate * burst
                level = self.levels[k]
                if level is None:
                    level = cap
                elif now > t:
                    level = min(cap, level + rate * ((now - t) / 1e6))
                else:
                    level = min(cap, level)
                side = self.sends_side[k]
                d = Dim(lim, rate, cap, level, *(side if side else (None, None)))
                ring = self.rings[k]
                if ring is not None:
                    d.n, d.P = ring[0], list(ring[1])
                dims.append(d)
            else:
                dims.append(None)
        return max(t, now), dims, burst

    def _save(self, tref: float, dims: list[Dim | None], burst: float) -> None:
        self.t = tref
        self.stored_burst = burst
        for k, d in enumerate(dims):
            self.levels[k] = None if d is None else d.level
            self.sends_side[k] = None if d is None or d.q is None else (d.S, d.q)
            self.rings[k] = None if d is None or d.n is None else (d.n, list(d.P))
            self.stored_lims[k] = None if d is None else d.lim

    @staticmethod
    def _ceiling(t: float, d: Dim) -> float:
        if d.q is None:
            return d.cap
        return min(d.cap, d.S + d.rate * ((t - d.q) / 1e6))

    @staticmethod
    def _peak(d: Dim, s: float, v: float) -> None:
        m = math.floor(s / W_US)
        if d.n is None or m >= d.n + NW:
            d.P = [NEG] * NW
            d.n = m
        elif m > d.n:
            for j in range(int(d.n) + 1, m + 1):
                d.P[j % NW] = NEG
            d.n = m
        else:
            m = d.n
        i = int(m) % NW
        d.P[i] = max(d.P[i], v)

    def _adjust(self, t: float, d: Dim | None, delta: float, s_x: float, reserved: int) -> None:
        if d is None or delta == 0:
            return
        P, n = d.P, d.n
        m = math.floor(s_x / W_US)
        if delta > 0:
            d.level = d.level - delta
            if d.q is not None:
                d.S = d.S - delta
            if n is not None:
                for j in range(max(m + 1, int(n) - NW + 1), int(n) + 1):
                    P[j % NW] = P[j % NW] - delta
            return
        if d.q is not None:
            saved = min(reserved, d.cap) - min(reserved + delta, d.cap)
            credit, frm = saved, None
            if s_x < d.q:
                credit = max(0, saved - d.rate * ((d.q - s_x) / 1e6))
            if n is not None and m > n - NW:
                frm = min(m, int(n))
                top = NEG
                for j in range(frm, int(n) + 1):
                    top = max(top, P[j % NW])
                credit = max(credit, min(saved, max(0, d.cap - top)))
            elif n is not None:
                frm = int(n) - NW + 1
            if frm is not None:
                for j in range(frm, int(n) + 1):
                    P[j % NW] = P[j % NW] + credit
            d.S = min(d.cap, d.S + credit)
        d.level = min(self._ceiling(t, d), d.level - delta)

    @staticmethod
    def _sent(d: Dim, s: float, c: float) -> None:
        c = min(c, d.cap)
        if d.q is None:
            ScopeModel._peak(d, s, d.cap)
            d.S, d.q = d.cap - c, s
        elif s >= d.q:
            pre = min(d.cap, d.S + d.rate * ((s - d.q) / 1e6))
            ScopeModel._peak(d, s, pre)
            d.S, d.q = pre - c, s
        else:
            d.S = d.S - c

    # -- scripts -------------------------------------------------------------------------
    def acquire(self, now: int, limits: ScopeLimits, input_tokens: int, output_tokens: int,
                lease_id: str, lease_ttl_s: float) -> ModelGrant:
        cost = [1, input_tokens, output_tokens]
        tref, dims, burst = self._load(now, limits)
        cd_rem = max(0, (self.cd - now) / 1e6)
        if cd_rem > self.horizon_s:
            return ModelGrant(False, 0.0, max(cd_rem - self.horizon_s, MIN_RETRY_S), "cooldown")
        self.leases = {k: v for k, v in self.leases.items() if v > now}
        if limits.max_in_flight is not None and len(self.leases) >= limits.max_in_flight:
            first = min(self.leases.values())
            poll = max(0.005, min(0.1, (first - now) / 1e6))
            return ModelGrant(False, 0.0, poll, "in_flight")
        base = (tref - now) / 1e6
        need, need_h = 0, 0
        for k, d in enumerate(dims):
            if d is not None and (k == 0 or cost[k] > 0):
                need = max(need, (cost[k] - d.level) / d.rate)
                need_h = max(need_h, (min(cost[k], d.cap) - d.level) / d.rate)
        wait = max(cd_rem, base + need)
        wait_h = max(cd_rem, base + need_h)
        if wait_h > self.horizon_s:
            return ModelGrant(False, 0.0, max(wait_h - self.horizon_s, MIN_RETRY_S), "horizon")
        ahead = wait - base
        for k, d in enumerate(dims):
            if d is not None and (k == 0 or cost[k] > 0):
                d.level = min(d.level, d.cap - d.rate * ahead) - min(cost[k], d.cap)
                self._sent(d, now + wait * 1e6, cost[k])
        self.leases[lease_id] = now + (wait + lease_ttl_s) * 1e6
        self._save(tref, dims, burst)
        return ModelGrant(True, float(wait), 0.0, "ok", lease_id)

    def settle(self, now: int, limits: ScopeLimits | None, lease_id: str, d_in: int, d_out: int,
               d_req: int, send_us: float, res_in: int, res_out: int) -> None:
        tref, dims, burst = self._load(now, limits)
        self.leases.pop(lease_id, None)
        self._adjust(tref, dims[0], d_req, send_us, 1)
        self._adjust(tref, dims[1], d_in, send_us, res_in)
        self._adjust(tref, dims[2], d_out, send_us, res_out)
        self._save(tref, dims, burst)

    def cooldown(self, now: int, limits: ScopeLimits, retry_after_s: float) -> float:
        tref, dims, burst = self._load(now, limits)
        self.cd = max(self.cd, now + retry_after_s * 1e6)
        for d in dims:
            if d is not None:
                d.level = min(d.level, 0)
                if d.q is None or self.cd >= d.q:
                    d.S, d.q = min(self._ceiling(self.cd, d), 0), self.cd
                    self._peak(d, self.cd, d.S)
                else:
                    d.S = min(d.S, d.rate * ((d.q - self.cd) / 1e6))
        tref = max(tref, self.cd)
        self._save(tref, dims, burst)
        return (self.cd - now) / 1e6

    def sync(self, now: int, limits: ScopeLimits, remaining: list[float | None],
             learn: list[float | None]) -> None:
        for k, v in enumerate(learn):
            if v is not None:
                self.learned[k] = v
        tref, dims, burst = self._load(now, limits)
        for k, d in enumerate(dims):
            if d is not None and remaining[k] is not None:
                d.level = min(d.level, remaining[k])
        self._save(tref, dims, burst)

    def state(self, now: int, limits: ScopeLimits | None) -> dict:
        tref, dims, _ = self._load(now, limits)
        return {
            "cooldown_s": max(0, (self.cd - now) / 1e6),
            "leases": sum(1 for v in self.leases.values() if v > now),
            "levels": [None if d is None else d.level for d in dims],
            "caps": [None if d is None else d.cap for d in dims],
        }


def window_violations(sends: list[tuple[float, float]], rate: float, cap: float,
                      eps: float = 1e-6) -> list[tuple[float, float, float, float]]:
    """Windows [s_i, s_j] whose total cost exceeds what a bucket of ``cap`` refilled at ``rate``
    lets through: cap + rate * (s_j - s_i), plus, for each send in the window costlier than
    the capacity, its excess over the capacity (it absorbed the refill while it waited).

    ``sends`` are (send time in seconds, cost). Returns (start, end, total, allowed) per breach.
    """
    items = sorted(sends, key=lambda x: (x[0], -x[1]))
    bad = []
    for i in range(len(items)):
        total = excess = 0.0
        s_i = items[i][0]
        for j in range(i, len(items)):
            s_j, c_j = items[j]
            total += c_j
            excess += max(0.0, c_j - cap)
            allowed = cap + rate * (s_j - s_i) + excess
            if total > allowed + eps * max(1.0, allowed):
                bad.append((s_i, s_j, total, allowed))
    return bad
