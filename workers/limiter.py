"""The global rate limiter: one Redis token bucket per scope, shared by every worker on every host.

A *scope* is what the provider limits together: ``llm:{key alias}:{model}`` for a model class,
``tool:{name}`` for a rate-limited service a tool calls. Each scope has up to three buckets
(requests, input tokens and output tokens per minute), in-flight leases, a cooldown, limits
learned from response headers and per-second usage counters. All of it lives in Redis under
``{prefix}:{<scope>}:...`` (one hash tag per scope, so it works on Redis Cluster) and is
changed only by the Lua scripts in ``workers/lua/``: one atomic call per operation, one round
trip per ``acquire``.

How a call uses it::

    grant = limiter.acquire(scope, limits, input_tokens=est_in, output_tokens=est_out)
    if not grant.granted:           # reason: horizon | cooldown | in_flight
        retry later, after grant.retry_after_s (a Celery retry frees the worker slot)
    sleep(grant.wait_s)             # the reservation is made; wait until it is covered
    response = call the API        # on 429: limiter.cooldown(scope, limits, retry_after)
    limiter.sync_headers(scope, limits, response.headers)
    limiter.settle(scope, limits, grant, input_tokens=used_in, output_tokens=used_out)
    # or limiter.release(scope, grant) when the request was never sent

Decisions worth knowing:

- Time is Redis ``TIME`` inside the scripts, never a worker's clock. (The scripts accept a
  ``now_us`` override in ARGV[6]; it is empty in production and set only by tests through
  the private ``_now_us`` attribute, so a reference model can be compared exactly.)
- Reservation: ``acquire`` debits first (levels may go negative: that is the queue) and
  returns how long to wait until the debit is covered, unless that is further ahead than
  ``horizon_s``; then it debits nothing. A request costlier than a bucket's capacity is
  admitted to the horizon test with its cost capped at the capacity, so it is not refused
  for ever; it still waits for its full cost (under saturation smaller requests may keep
  overtaking it: there is no ticket queue).
- A dimension with a cost of 0 (e.g. no output estimate) does not wait for that bucket.
- ``settle`` keeps the request counted and trues up both token dimensions; ``release``
  (request never sent) refunds everything, the request included. Refunds never lift a level
  above capacity.
- ``cooldown`` empties every bucket (levels above 0 drop to 0) and freezes refill until
  ``cooldown_until``: after it, traffic resumes at the refill rate, not in a burst.
- Header sync: ``-remaining`` can only lower a level (``level = min(level, remaining)``;
  since our capacity is ``burst_s`` of refill while the provider's bucket holds a minute,
  this bites only when the provider's bucket is nearly empty). ``-limit`` is stored *raw*
  for dimensions the ScopeLimits leaves None, for 24 h; acquires then use
  ``raw x limits.learned_utilization`` (``from_settings`` sets that to the target
  utilisation). A configured limit always wins over a learned one.
- ``release`` and ``state`` need no limits: the scripts store the effective limits of the
  last write in the bucket.
- Per-second counters (requests at the planned send second, waits/wait_ms at the acquire
  second, tokens at the settle second, n429 from ``cooldown``, anything via ``record``)
  live in one hash per scope, pruned to ``stats_window_s``. The scope registry for
  ``scopes()`` is refreshed by at most one extra call per scope per minute (the acquire
  script says when).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

if TYPE_CHECKING:  # pragma: no cover
    import config

__all__ = [
    "AsyncLimiter", "Grant", "Limiter", "ScopeLimits", "STAT_FIELDS",
    "llm_scope", "parse_ratelimit_headers", "tool_scope",
]

STAT_FIELDS = ("requests", "input_tokens", "output_tokens", "waits", "wait_ms", "n429", "n529")
_HEADER_DIMS = ("requests", "input-tokens", "output-tokens")


# --- scopes and limits ---------------------------------------------------------------------

def llm_scope(key_alias: str, model: str) -> str:
    return f"llm:{key_alias}:{model}"


def tool_scope(tool_name: str) -> str:
    return f"tool:{tool_name}"


@dataclass(frozen=True)
class ScopeLimits:
    """Effective limits of one scope (already scaled by the target utilisation).

    ``None`` leaves a dimension unlimited unless a ``-limit`` header taught one (then the raw
    learned limit times ``learned_utilization`` is used). Capacity = ``limit/60 * burst_s``.
    """

    rpm: float | None = None
    itpm: float | None = None
    otpm: float | None = None
    burst_s: float = 1.0
    max_in_flight: int | None = None
    learned_utilization: float = 1.0

    def __post_init__(self) -> None:
        for name in ("rpm", "itpm", "otpm"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ScopeLimits.{name} must be > 0 or None, got {value!r}")
        if not self.burst_s > 0:
            raise ValueError(f"ScopeLimits.burst_s must be > 0, got {self.burst_s!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"ScopeLimits.max_in_flight must be >= 1 or None, got {self.max_in_flight!r}")
        if not 0 < self.learned_utilization <= 1:
            raise ValueError("ScopeLimits.learned_utilization must be in (0, 1]")

    @classmethod
    def from_settings(cls, settings: config.Settings, model: str) -> ScopeLimits:
        u = settings.target_utilization
        ml = settings.limits_for(model)

        def scaled(value: float | None) -> float | None:
            return None if value is None else value * u

        return cls(
            rpm=scaled(ml.rpm if ml else None),
            itpm=scaled(ml.itpm if ml else None),
            otpm=scaled(ml.otpm if ml else None),
            burst_s=settings.burst_seconds,
            max_in_flight=settings.max_in_flight,
            learned_utilization=u,
        )

    @classmethod
    def for_tool(cls, rps: float, burst_s: float = 1.0, max_in_flight: int | None = None) -> ScopeLimits:
        return cls(rpm=rps * 60, burst_s=burst_s, max_in_flight=max_in_flight)


@dataclass(frozen=True)
class Grant:
    granted: bool          # True: the debit was made (and a lease taken); send after wait_s
    wait_s: float          # when granted: seconds to wait before sending (0.0 = now)
    retry_after_s: float   # when not granted: seconds until it is worth coming back
    lease_id: str | None
    reason: str            # "ok" | "horizon" | "cooldown" | "in_flight"
    input_tokens: int      # what was reserved (echo), for settle
    output_tokens: int
    send_at: float = 0.0   # Redis server time (epoch s) of the planned send (now + wait_s)
    send_us: float = field(default=0.0, repr=False)  # the same in us, exactly as the script has it


# --- shared logic: keys, arguments, parsing -------------------------------------------------

def _num(x: float | int) -> str:
    return repr(float(x)) if isinstance(x, float) else str(int(x))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _f(value: Any) -> float | None:
    text = _s(value)
    return float(text) if text != "" else None


@lru_cache(maxsize=1024)
def _limit_args(limits: ScopeLimits) -> tuple[str, ...]:
    def dim(v: float | None) -> str:
        return "" if v is None else _num(v)
    return (dim(limits.rpm), dim(limits.itpm), dim(limits.otpm), _num(limits.burst_s),
            _num(limits.learned_utilization))


_STORED_LIMITS = ("*", "*", "*", "*", "1")


def parse_ratelimit_headers(
    headers: Mapping[str, str],
) -> tuple[tuple[float | None, ...], tuple[float | None, ...]]:
    """(remaining, limit) for requests, input tokens, output tokens; None when absent or bad."""
    lower = {str(k).lower(): v for k, v in headers.items()}

    def get(name: str) -> float | None:
        raw = lower.get(name)
        if raw is None:
            return None
        try:
            value = float(_s(raw).strip())
        except ValueError:
            return None
        return value if math.isfinite(value) and value >= 0 else None

    remaining = tuple(get(f"anthropic-ratelimit-{d}-remaining") for d in _HEADER_DIMS)
    limit = tuple(get(f"anthropic-ratelimit-{d}-limit") for d in _HEADER_DIMS)
    return remaining, limit


def _load_sources() -> dict[str, str]:
    lua = resources.files("workers") / "lua"
    lib = (lua / "_lib.lua").read_text()
    scoped = ("acquire", "settle", "cooldown", "sync", "state", "record")
    sources = {name: lib + "\n" + (lua / f"{name}.lua").read_text() for name in scoped}
    for name in ("usage", "scopes"):
        sources[name] = (lua / f"{name}.lua").read_text()
    return sources


_SOURCES = _load_sources()

# An operation yields (script name, keys, args) and receives the script's reply; the sync and
# async limiters only differ in how they run that exchange.
_Call = tuple[str, list[str], list[str]]
_Op = Generator[_Call, Any, Any]


class _LimiterBase:
    def __init__(self, client: Any, *, prefix: str = "drover", horizon_s: float = 15.0,
                 stats_window_s: int = 3600) -> None:
        if horizon_s <= 0:
            raise ValueError("horizon_s must be > 0")
        if stats_window_s < 1:
            raise ValueError("stats_window_s must be >= 1")
        self._client = client
        self.prefix = prefix
        self.horizon_s = float(horizon_s)
        self.stats_window_s = int(stats_window_s)
        self._scripts = {name: client.register_script(src) for name, src in _SOURCES.items()}
        self._keys: dict[str, list[str]] = {}
        self._registry = f"{prefix}:scopes"
        # Tests only: a fixed server time in microseconds (ARGV "now_us override").
        self._now_us: int | None = None

    # keys and common arguments
    def keys(self, scope: str) -> list[str]:
        """The Redis keys of a scope: bucket, leases, learned limits, stats, stats index."""
        keys = self._keys.get(scope)
        if keys is None:
            if not scope or "{" in scope or "}" in scope:
                raise ValueError(f"a scope must be non-empty and contain no braces: {scope!r}")
            tag = f"{self.prefix}:{{{scope}}}"
            keys = [f"{tag}:b", f"{tag}:l", f"{tag}:hl", f"{tag}:s", f"{tag}:si"]
            self._keys[scope] = keys
        return keys

    def _now(self) -> str:
        return "" if self._now_us is None else str(int(self._now_us))

    # operations
    def _acquire(self, scope: str, limits: ScopeLimits, input_tokens: int, output_tokens: int,
                 lease_ttl_s: float) -> _Op:
        if input_tokens < 0 or output_tokens < 0:
            raise ValueError("token estimates must be >= 0")
        lease = uuid.uuid4().hex
        mif = "" if limits.max_in_flight is None else str(limits.max_in_flight)
        reply = yield ("acquire", self.keys(scope), [
            *_limit_args(limits), self._now(), str(int(input_tokens)), str(int(output_tokens)),
            _num(self.horizon_s), mif, lease, _num(float(lease_ttl_s)), str(self.stats_window_s),
        ])
        granted, wait, retry, reason, now_us, register = (_s(x) for x in reply)
        ok = granted == "1"
        if register == "1":
            yield ("scopes", [self._registry], [scope, str(self.stats_window_s), self._now()])
        return Grant(
            granted=ok, wait_s=float(wait), retry_after_s=float(retry),
            lease_id=lease if ok else None, reason=reason,
            input_tokens=int(input_tokens), output_tokens=int(output_tokens),
            send_at=float(now_us) / 1e6 + float(wait),
            send_us=float(now_us) + float(wait) * 1e6,
        )

    def _settle(self, scope: str, limits_args: tuple[str, ...], grant: Grant, d_in: int,
                d_out: int, d_req: int, used_in: int, used_out: int, req_sec: str) -> _Op:
        if not grant.granted or grant.lease_id is None:
            return None
        yield ("settle", self.keys(scope), [
            *limits_args, self._now(), grant.lease_id, str(d_in), str(d_out), str(d_req),
            str(used_in), str(used_out), str(self.stats_window_s), req_sec,
            _num(float(grant.send_us)), str(grant.input_tokens), str(grant.output_tokens),
        ])
        return None

    def _settle_op(self, scope: str, limits: ScopeLimits, grant: Grant, input_tokens: int,
                   output_tokens: int) -> _Op:
        if input_tokens < 0 or output_tokens < 0:
            raise ValueError("token counts must be >= 0")
        return self._settle(scope, _limit_args(limits), grant,
                            int(input_tokens) - grant.input_tokens,
                            int(output_tokens) - grant.output_tokens, 0,
                            int(input_tokens), int(output_tokens), "")

    def _release_op(self, scope: str, grant: Grant) -> _Op:
        return self._settle(scope, _STORED_LIMITS, grant, -grant.input_tokens,
                            -grant.output_tokens, -1, 0, 0, str(math.floor(grant.send_at)))

    def _cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float) -> _Op:
        if retry_after_s < 0:
            raise ValueError("retry_after_s must be >= 0")
        reply = yield ("cooldown", self.keys(scope), [
            *_limit_args(limits), self._now(), _num(float(retry_after_s)),
            str(self.stats_window_s),
        ])
        return float(_s(reply))

    def _sync(self, scope: str, limits: ScopeLimits, headers: Mapping[str, str]) -> _Op:
        remaining, limit = parse_ratelimit_headers(headers)
        configured = (limits.rpm, limits.itpm, limits.otpm)
        learn = [lim if conf is None else None for lim, conf in zip(limit, configured)]
        learn = [v if v is not None and v > 0 else None for v in learn]
        if all(v is None for v in (*remaining, *learn)):
            return None
        yield ("sync", self.keys(scope), [
            *_limit_args(limits), self._now(),
            *("" if v is None else _num(v) for v in remaining),
            *("" if v is None else _num(v) for v in learn),
        ])
        return None

    def _record(self, scope: str, counts: Mapping[str, int]) -> _Op:
        args = [""] * 5 + [self._now(), str(self.stats_window_s)]
        for name, n in counts.items():
            if name not in STAT_FIELDS:
                raise ValueError(f"unknown counter {name!r}; expected one of {STAT_FIELDS}")
            if int(n):
                args += [name, str(int(n))]
        if len(args) > 7:
            yield ("record", self.keys(scope), args)
        return None

    def _usage(self, scope: str, seconds: int) -> _Op:
        if seconds < 1:
            raise ValueError("seconds must be >= 1")
        reply = yield ("usage", [self.keys(scope)[3]], [str(int(seconds)), self._now(), *STAT_FIELDS])
        first = int(_s(reply[0]))
        values = [_s(v) for v in reply[1:]]
        n = len(STAT_FIELDS)
        rows = []
        for i in range(len(values) // n):
            row: dict[str, int] = {"t": first + i}
            for j, name in enumerate(STAT_FIELDS):
                v = values[i * n + j]
                row[name] = int(v) if v else 0
            rows.append(row)
        return rows

    def _scopes(self) -> _Op:
        reply = yield ("scopes", [self._registry], ["", str(self.stats_window_s), self._now()])
        return sorted(_s(x) for x in reply)

    def _state(self, scope: str, limits: ScopeLimits | None) -> _Op:
        args = _STORED_LIMITS if limits is None else _limit_args(limits)
        reply = yield ("state", self.keys(scope), [*args, self._now()])
        r = [_s(x) for x in reply]
        out: dict[str, Any] = {
            "now": float(r[0]) / 1e6, "cooldown_s": float(r[1]), "leases": int(r[2]),
            "refill_from": float(r[3]) / 1e6, "burst_s": float(r[4]),
        }
        for k, name in enumerate(("requests", "input_tokens", "output_tokens")):
            lim, cap, level = (_f(v) for v in r[5 + 3 * k: 8 + 3 * k])
            out[name] = None if lim is None else {
                "limit_per_min": lim, "rate_per_s": lim / 60, "capacity": cap, "level": level,
            }
        out["learned"] = dict(zip(("rpm", "itpm", "otpm"), (_f(v) for v in r[14:17])))
        return out


class Limiter(_LimiterBase):
    """The global limiter over a sync ``redis.Redis``."""

    def __init__(self, client: redis.Redis, *, prefix: str = "drover", horizon_s: float = 15.0,
                 stats_window_s: int = 3600) -> None:
        super().__init__(client, prefix=prefix, horizon_s=horizon_s, stats_window_s=stats_window_s)

    def _run(self, op: _Op) -> Any:
        try:
            name, keys, args = next(op)
            while True:
                name, keys, args = op.send(self._scripts[name](keys=keys, args=args))
        except StopIteration as stop:
            return stop.value

    def acquire(self, scope: str, limits: ScopeLimits, *, input_tokens: int = 0,
                output_tokens: int = 0, lease_ttl_s: float = 180.0) -> Grant:
        return self._run(self._acquire(scope, limits, input_tokens, output_tokens, lease_ttl_s))

    def settle(self, scope: str, limits: ScopeLimits, grant: Grant, *, input_tokens: int,
               output_tokens: int) -> None:
        self._run(self._settle_op(scope, limits, grant, input_tokens, output_tokens))

    def release(self, scope: str, grant: Grant) -> None:
        self._run(self._release_op(scope, grant))

    def cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float) -> float:
        return self._run(self._cooldown(scope, limits, retry_after_s))

    def sync_headers(self, scope: str, limits: ScopeLimits, headers: Mapping[str, str]) -> None:
        self._run(self._sync(scope, limits, headers))

    def record(self, scope: str, **counts: int) -> None:
        self._run(self._record(scope, counts))

    def usage(self, scope: str, seconds: int = 60) -> list[dict]:
        return self._run(self._usage(scope, seconds))

    def scopes(self) -> list[str]:
        return self._run(self._scopes())

    def state(self, scope: str, limits: ScopeLimits | None = None) -> dict:
        return self._run(self._state(scope, limits))


class AsyncLimiter(_LimiterBase):
    """The same limiter over ``redis.asyncio.Redis``; every method is a coroutine."""

    def __init__(self, client: redis.asyncio.Redis, *, prefix: str = "drover",
                 horizon_s: float = 15.0, stats_window_s: int = 3600) -> None:
        super().__init__(client, prefix=prefix, horizon_s=horizon_s, stats_window_s=stats_window_s)

    async def _run(self, op: _Op) -> Any:
        try:
            name, keys, args = next(op)
            while True:
                name, keys, args = op.send(await self._scripts[name](keys=keys, args=args))
        except StopIteration as stop:
            return stop.value

    async def acquire(self, scope: str, limits: ScopeLimits, *, input_tokens: int = 0,
                      output_tokens: int = 0, lease_ttl_s: float = 180.0) -> Grant:
        return await self._run(
            self._acquire(scope, limits, input_tokens, output_tokens, lease_ttl_s))

    async def settle(self, scope: str, limits: ScopeLimits, grant: Grant, *, input_tokens: int,
                     output_tokens: int) -> None:
        await self._run(self._settle_op(scope, limits, grant, input_tokens, output_tokens))

    async def release(self, scope: str, grant: Grant) -> None:
        await self._run(self._release_op(scope, grant))

    async def cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float) -> float:
        return await self._run(self._cooldown(scope, limits, retry_after_s))

    async def sync_headers(self, scope: str, limits: ScopeLimits,
                           headers: Mapping[str, str]) -> None:
        await self._run(self._sync(scope, limits, headers))

    async def record(self, scope: str, **counts: int) -> None:
        await self._run(self._record(scope, counts))

    async def usage(self, scope: str, seconds: int = 60) -> list[dict]:
        return await self._run(self._usage(scope, seconds))

    async def scopes(self) -> list[str]:
        return await self._run(self._scopes())

    async def state(self, scope: str, limits: ScopeLimits | None = None) -> dict:
        return await self._run(self._state(scope, limits))
