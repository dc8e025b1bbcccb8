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
    limiter.settle(scope, limits, grant, input_tokens=used_in, output_tokens=used_out,
                   headers=response.headers)   # true-up and header sync, one round trip
    # or limiter.release(scope, grant) when the request was never sent

Decisions worth knowing:

- Time is Redis ``TIME`` inside the scripts, never a worker's clock. (The scripts accept a
  ``now_us`` override; it is NaN in production and set only by tests through the private
  ``_now_us`` attribute, so a reference model can be compared exactly.)
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
- ``settle(..., headers=...)`` is exactly ``settle`` followed by ``sync_headers`` at the same
  instant, in one round trip (the agent loop's path).
- Per-second counters (requests at the planned send second, waits/wait_ms at the acquire
  second, tokens at the settle second, n429 from ``cooldown``, anything via ``record``)
  live in one hash per scope, pruned to ``stats_window_s``. A grant's requests, waits and
  wait_ms are written by its ``settle`` (a ``release`` writes its wait only: nothing was
  sent), so a call shows in the counters once it ends; a grant whose worker died before
  settling is never counted there (its debit and lease are unaffected). The scope registry
  for ``scopes()`` is refreshed by at most one extra call per scope per minute (the acquire
  script says when).

Cost (``bench/acquire_cost.py``, ``bench/RESULTS-acquire.md``): ``acquire`` is one EVALSHA
with four Redis commands inside (TIME, GET, ZADD, SET). What keeps it there: the bucket is
one packed string (one GET, one SET) rather than a hash, and the script works on it as a
flat array and defines no function (each would be a new closure on every call); the bucket
keeps an upper bound of the lease count, so the lease set is counted only near
``max_in_flight``; counters are written at ``settle``; TTLs are extended with slack instead
of on every call; numbers travel as one packed argument; EVALSHA is sent straight through
``execute_command`` with pre-encoded arguments (NOSCRIPT -> SCRIPT LOAD and retry), not
through redis-py's ``Script`` object.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import struct
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

if TYPE_CHECKING:  # pragma: no cover
    import config

__all__ = [
    "AsyncLimiter", "Grant", "Limiter", "ScopeLimits", "STAT_FIELDS",
    "llm_scope", "parse_ratelimit_headers", "tool_scope",
]

STAT_FIELDS = ("requests", "input_tokens", "output_tokens", "waits", "wait_ms", "n429", "n529",
               "n5xx", "nconn")
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
            raise ValueError("ScopeLimits.max_in_flight must be >= 1 or None, "
                             f"got {self.max_in_flight!r}")
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
    def for_tool(cls, rps: float, burst_s: float = 1.0,
                 max_in_flight: int | None = None) -> ScopeLimits:
        return cls(rpm=rps * 60, burst_s=burst_s, max_in_flight=max_in_flight)

    @cached_property
    def _head(self) -> bytes:
        """A[1..5] of a scope script: the limits per minute, burst_s, learned utilisation.
        (Kept on the instance: hashing the dataclass for a cache lookup costs more.)"""
        def dim(v: float | None) -> float:
            return _NAN if v is None else float(v)
        return struct.pack("<5d", dim(self.rpm), dim(self.itpm), dim(self.otpm),
                           float(self.burst_s), float(self.learned_utilization))


class Grant(NamedTuple):
    """What ``acquire`` decided. (A named tuple: immutable, and cheaper to make than a frozen
    dataclass on the path before every call.)"""

    granted: bool          # True: the debit was made (and a lease taken); send after wait_s
    wait_s: float          # when granted: seconds to wait before sending (0.0 = now)
    retry_after_s: float   # when not granted: seconds until it is worth coming back
    lease_id: str | None
    reason: str            # "ok" | "horizon" | "cooldown" | "in_flight"
    input_tokens: int      # what was reserved (echo), for settle
    output_tokens: int
    now_us: float = 0.0    # Redis server time (us) of the acquire

    @property
    def send_us(self) -> float:
        """Redis server time (us) of the planned send, exactly as the script has it."""
        return self.now_us + self.wait_s * 1e6

    @property
    def send_at(self) -> float:
        """Redis server time (epoch s) of the planned send (now + wait_s)."""
        return self.now_us / 1e6 + self.wait_s

    @property
    def acquired_s(self) -> int:
        """The Redis second of the acquire (its wait is counted there)."""
        return int(self.now_us // 1e6)


# --- shared logic: keys, arguments, parsing -------------------------------------------------

def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _f(value: Any) -> float | None:
    text = _s(value)
    return float(text) if text != "" else None


# The scope scripts take their numbers as one string of little-endian doubles (ARGV[1]):
# redis-py packs each argument of a command separately (~0.8 us each here), so one packed
# argument instead of a dozen is the cheaper round trip. NaN = "absent", -1 = "stored".
_NAN = float("nan")
_STORED = -1.0
_D = struct.Struct("<d")
_NAN_NOW = _D.pack(_NAN)
_ACQUIRE = struct.Struct("<5d")
_SETTLE = struct.Struct("<11d")
_HEADERS = struct.Struct("<6d")
_ACQUIRE_KEYS = 3  # bucket, leases, learned limits: acquire writes no counters


_STORED_HEAD = struct.pack("<5d", _STORED, _STORED, _STORED, _STORED, 1.0)


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


def _header_args(limits: ScopeLimits, headers: Mapping[str, str]) -> bytes | None:
    """The six header numbers of sync.lua (and settle.lua): -remaining r,i,o, then the
    -limit values to learn (only for dimensions the limits leave unconfigured); None when
    there is nothing to fold in."""
    remaining, limit = parse_ratelimit_headers(headers)
    configured = (limits.rpm, limits.itpm, limits.otpm)
    learn = [lim if conf is None and lim is not None and lim > 0 else None
             for lim, conf in zip(limit, configured, strict=True)]
    if all(v is None for v in (*remaining, *learn)):
        return None
    return _HEADERS.pack(*(_NAN if v is None else v for v in (*remaining, *learn)))


_INCLUDE = re.compile(r"^[ \t]*--#include (_\w+)[ \t]*$", re.MULTILINE)


def _load_sources() -> dict[str, str]:
    lua = resources.files("workers.limiter") / "lua"

    def include(match: re.Match[str]) -> str:
        return (lua / f"{match.group(1)}.lua").read_text()

    def read(*names: str) -> str:
        # A line `--#include _name` stands for the fragment _name.lua: acquire uses the
        # bucket code in place, the other scripts through _lib.lua's functions.
        text = "\n".join((lua / f"{name}.lua").read_text() for name in names)
        return _INCLUDE.sub(include, text)

    sources = {"acquire": read("_head", "acquire")}
    for name in ("settle", "cooldown", "sync"):
        sources[name] = read("_head", "_lib", "_true_up", name)
    for name in ("state", "record"):
        sources[name] = read("_head", "_lib", name)
    for name in ("usage", "scopes"):
        sources[name] = (lua / f"{name}.lua").read_text()
    return sources


_SOURCES = _load_sources()
# EVALSHA arguments pre-encoded: redis-py passes bytes through without encoding them.
_SHAS = {name: hashlib.sha1(src.encode()).hexdigest().encode()
         for name, src in _SOURCES.items()}
_NUMKEYS = (b"0", b"1", b"2", b"3", b"4", b"5")

# Lease ids only need to be unique among a scope's live leases. A private generator (reseeded
# in forked children) is cheaper than uuid4/urandom and immune to someone seeding `random`.
_lease_rng = random.Random()
_lease_bits = _lease_rng.getrandbits
os.register_at_fork(after_in_child=_lease_rng.seed)

# An operation yields (script name, keys, args) and receives the script's reply; the sync and
# async limiters only differ in how they run that exchange.
_Call = tuple[str, list[str], list[Any]]
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
        self._keys: dict[str, list[str]] = {}
        self._keys_b: dict[str, list[bytes]] = {}
        self._acq_keys: dict[str, list[bytes]] = {}
        self._registry = f"{prefix}:scopes"
        self._now_us = None

    # Tests only: a fixed server time in microseconds (the scripts' "now_us override").
    @property
    def _now_us(self) -> int | None:
        return self._now_override

    @_now_us.setter
    def _now_us(self, value: int | None) -> None:
        self._now_override = value
        self._now_b = _NAN_NOW if value is None else _D.pack(float(int(value)))

    def _now(self) -> str:
        return "" if self._now_us is None else str(int(self._now_us))

    # keys and common arguments
    def keys(self, scope: str) -> list[str]:
        """The Redis keys of a scope: bucket, leases, learned limits, stats, stats index."""
        keys = self._keys.get(scope)
        if keys is None:
            if not scope or "{" in scope or "}" in scope:
                raise ValueError(f"a scope must be non-empty and contain no braces: {scope!r}")
            tag = f"{self.prefix}:{{{scope}}}"
            keys = [f"{tag}:bs", f"{tag}:l", f"{tag}:hl", f"{tag}:s", f"{tag}:si"]
            self._keys[scope] = keys
        return keys

    def _bkeys(self, scope: str) -> list[bytes]:
        # Arguments already in bytes skip redis-py's per-argument encoding.
        keys = self._keys_b.get(scope)
        if keys is None:
            keys = self._keys_b[scope] = [k.encode() for k in self.keys(scope)]
        return keys

    # acquire: the hot path, so its two halves are plain functions (no generator) that the
    # sync and async limiters call around their one EVALSHA.
    def _acquire_call(self, scope: str, limits: ScopeLimits, input_tokens: int,
                      output_tokens: int,
                      lease_ttl_s: float) -> tuple[list[bytes], list[bytes | str], str]:
        if input_tokens < 0 or output_tokens < 0:
            raise ValueError("token estimates must be >= 0")
        lease = _lease_bits(96).to_bytes(12, "little").hex()
        mif = limits.max_in_flight
        nums = limits._head + self._now_b + _ACQUIRE.pack(
            input_tokens, output_tokens, self.horizon_s, _NAN if mif is None else mif,
            lease_ttl_s)
        keys = self._acq_keys.get(scope)
        if keys is None:
            keys = self._acq_keys[scope] = self._bkeys(scope)[:_ACQUIRE_KEYS]
        return keys, [nums, lease], lease

    @staticmethod
    def _grant(reply: Any, lease: str, input_tokens: int, output_tokens: int) -> tuple[Grant, bool]:
        reason, value, now_us, register = (
            reply.decode() if type(reply) is bytes else reply).split(" ")
        if reason == "ok":
            return Grant(True, float(value), 0.0, lease, reason, input_tokens, output_tokens,
                         float(now_us)), register == "1"
        return Grant(False, 0.0, float(value), None, reason, input_tokens, output_tokens,
                     float(now_us)), False

    def _register_args(self, scope: str) -> tuple[list[str], list[str]]:
        return [self._registry], [scope, str(self.stats_window_s), self._now()]

    # the other operations
    def _settle(self, scope: str, head: bytes, grant: Grant, d_in: int, d_out: int,
                d_req: int, used_in: int, used_out: int,
                headers: bytes | None = None) -> _Op:
        if not grant.granted or grant.lease_id is None:
            return None
        nums = head + self._now_b + _SETTLE.pack(
            d_in, d_out, d_req, used_in, used_out, self.stats_window_s, grant.acquired_s,
            grant.send_us, grant.input_tokens, grant.output_tokens, grant.wait_s)
        if headers is not None:
            nums += headers
        yield ("settle", self._bkeys(scope), [nums, grant.lease_id.encode()])
        return None

    def _settle_op(self, scope: str, limits: ScopeLimits, grant: Grant, input_tokens: int,
                   output_tokens: int, headers: Mapping[str, str] | None = None) -> _Op:
        if input_tokens < 0 or output_tokens < 0:
            raise ValueError("token counts must be >= 0")
        return self._settle(scope, limits._head, grant,
                            int(input_tokens) - grant.input_tokens,
                            int(output_tokens) - grant.output_tokens, 0,
                            int(input_tokens), int(output_tokens),
                            None if headers is None else _header_args(limits, headers))

    def _release_op(self, scope: str, grant: Grant) -> _Op:
        return self._settle(scope, _STORED_HEAD, grant, -grant.input_tokens,
                            -grant.output_tokens, -1, 0, 0)

    def _cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float) -> _Op:
        if retry_after_s < 0:
            raise ValueError("retry_after_s must be >= 0")
        nums = limits._head + self._now_b + struct.pack(
            "<2d", float(retry_after_s), self.stats_window_s)
        reply = yield ("cooldown", self.keys(scope), [nums])
        return float(_s(reply))

    def _sync(self, scope: str, limits: ScopeLimits, headers: Mapping[str, str]) -> _Op:
        packed = _header_args(limits, headers)
        if packed is None:
            return None
        yield ("sync", self.keys(scope), [limits._head + self._now_b + packed])
        return None

    def _record(self, scope: str, counts: Mapping[str, int]) -> _Op:
        args: list[Any] = [_STORED_HEAD + self._now_b + _D.pack(self.stats_window_s)]
        for name, n in counts.items():
            if name not in STAT_FIELDS:
                raise ValueError(f"unknown counter {name!r}; expected one of {STAT_FIELDS}")
            if int(n):
                args += [name, str(int(n))]
        if len(args) > 1:
            yield ("record", self.keys(scope), args)
        return None

    def _usage(self, scope: str, seconds: int) -> _Op:
        if seconds < 1:
            raise ValueError("seconds must be >= 1")
        reply = yield ("usage", [self.keys(scope)[3]],
                       [str(int(seconds)), self._now(), *STAT_FIELDS])
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
        head = _STORED_HEAD if limits is None else limits._head
        reply = yield ("state", self.keys(scope), [head + self._now_b])
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
        out["learned"] = dict(zip(("rpm", "itpm", "otpm"), (_f(v) for v in r[14:17]),
                                  strict=True))
        return out


class Limiter(_LimiterBase):
    """The global limiter over a sync ``redis.Redis``."""

    def __init__(self, client: redis.Redis, *, prefix: str = "drover", horizon_s: float = 15.0,
                 stats_window_s: int = 3600) -> None:
        super().__init__(client, prefix=prefix, horizon_s=horizon_s, stats_window_s=stats_window_s)

    def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        # EVALSHA straight through execute_command: redis-py's Script.__call__ costs more.
        try:
            return self._client.execute_command("EVALSHA", _SHAS[name], _NUMKEYS[len(keys)],
                                                *keys, *args)
        except NoScriptError:
            self._client.script_load(_SOURCES[name])
            return self._client.execute_command("EVALSHA", _SHAS[name], _NUMKEYS[len(keys)],
                                                *keys, *args)

    def _run(self, op: _Op) -> Any:
        try:
            name, keys, args = next(op)
            while True:
                name, keys, args = op.send(self._eval(name, keys, args))
        except StopIteration as stop:
            return stop.value

    def acquire(self, scope: str, limits: ScopeLimits, *, input_tokens: int = 0,
                output_tokens: int = 0, lease_ttl_s: float = 180.0) -> Grant:
        input_tokens, output_tokens = int(input_tokens), int(output_tokens)
        keys, args, lease = self._acquire_call(scope, limits, input_tokens, output_tokens,
                                               lease_ttl_s)
        grant, register = self._grant(self._eval("acquire", keys, args), lease, input_tokens,
                                      output_tokens)
        if register:
            self._eval("scopes", *self._register_args(scope))
        return grant

    def settle(self, scope: str, limits: ScopeLimits, grant: Grant, *, input_tokens: int,
               output_tokens: int, headers: Mapping[str, str] | None = None) -> None:
        """True the grant up to what the call really used; ``headers`` (the response's)
        also folds in what ``sync_headers`` would, in the same round trip."""
        self._run(self._settle_op(scope, limits, grant, input_tokens, output_tokens, headers))

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

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._client.execute_command("EVALSHA", _SHAS[name],
                                                      _NUMKEYS[len(keys)], *keys, *args)
        except NoScriptError:
            await self._client.script_load(_SOURCES[name])
            return await self._client.execute_command("EVALSHA", _SHAS[name],
                                                      _NUMKEYS[len(keys)], *keys, *args)

    async def _run(self, op: _Op) -> Any:
        try:
            name, keys, args = next(op)
            while True:
                name, keys, args = op.send(await self._eval(name, keys, args))
        except StopIteration as stop:
            return stop.value

    async def acquire(self, scope: str, limits: ScopeLimits, *, input_tokens: int = 0,
                      output_tokens: int = 0, lease_ttl_s: float = 180.0) -> Grant:
        input_tokens, output_tokens = int(input_tokens), int(output_tokens)
        keys, args, lease = self._acquire_call(scope, limits, input_tokens, output_tokens,
                                               lease_ttl_s)
        grant, register = self._grant(await self._eval("acquire", keys, args), lease,
                                      input_tokens, output_tokens)
        if register:
            await self._eval("scopes", *self._register_args(scope))
        return grant

    async def settle(self, scope: str, limits: ScopeLimits, grant: Grant, *, input_tokens: int,
                     output_tokens: int, headers: Mapping[str, str] | None = None) -> None:
        """True the grant up to what the call really used; ``headers`` (the response's)
        also folds in what ``sync_headers`` would, in the same round trip."""
        await self._run(self._settle_op(scope, limits, grant, input_tokens, output_tokens,
                                        headers))

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
