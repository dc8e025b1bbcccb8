"""The limiter over a sync ``redis.Redis`` and over ``redis.asyncio.Redis``: the same
operations (``_scripts.LimiterCore``), one script call each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drover.workers.limiter._scopes import Grant, ScopeLimits
from drover.workers.limiter._scripts import LimiterCore, Readings, _Call

__all__ = ["AsyncLimiter", "Limiter"]


class Limiter(LimiterCore):
    """The global limiter over a sync ``redis.Redis``. ``clock`` (tests only): a function
    returning the time in microseconds, which the scripts then use instead of Redis TIME."""

    def _run(self, call: _Call | None) -> Any:
        if call is None:
            return None
        return call.finish(self._scripts[call.script](keys=call.keys, args=call.args))

    def acquire(self, scope: str, limits: ScopeLimits, *, input_tokens: int = 0,
                output_tokens: int = 0, lease_ttl_s: float = 180.0) -> Grant:
        """Reserve one request and its token estimate; see ``Grant``."""
        return self._run(self._acquire(scope, limits, int(input_tokens), int(output_tokens),
                                       lease_ttl_s))

    def settle(self, scope: str, limits: ScopeLimits, grant: Grant, *, input_tokens: int,
               output_tokens: int, readings: Readings | None = None,
               counts: Mapping[str, int] | None = None) -> None:
        """True the grant up to what the call used; with the ``readings`` of the response's
        limit headers (read by its provider), also
        what ``sync_headers`` would do, and with ``counts`` (STAT_FIELDS names) what
        ``record`` would, in the same round trip."""
        self._run(self._settle(scope, limits, grant, True, input_tokens, output_tokens, readings,
                               counts))

    def release(self, scope: str, grant: Grant) -> None:
        """The request never went out: refund all of it."""
        self._run(self._settle(scope, None, grant, False, 0, 0, None))

    def cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float) -> float:
        """A 429: hold back every host until ``retry_after_s`` from now; seconds left."""
        return self._run(self._cooldown(scope, limits, retry_after_s))

    def hold_back(self, grant: Grant, *scopes: str) -> float:
        """Right before a granted call that waited goes out: seconds a cooldown still holds
        on any of ``scopes`` (those the grant reserved in), 0.0 when none does. When one
        does, the grant's lease is gone and its reservation stays debited: do not send on it
        (see hold_back.lua). A pool's scopes share a hash tag: one call asks both levels."""
        return self._run(self._hold_back(grant, list(scopes))) or 0.0

    def sync_headers(self, scope: str, limits: ScopeLimits, readings: Readings) -> None:
        """Fold in what an answer's limit headers said (``Provider.read_limits``)."""
        self._run(self._sync(scope, limits, readings))

    def record(self, scope: str, **counts: int) -> None:
        self._run(self._record(scope, counts))

    def usage(self, scope: str, seconds: int = 60) -> list[dict[str, int]]:
        return self._run(self._usage(scope, seconds))

    def scopes(self) -> list[str]:
        """The scopes with a bucket or counters in Redis (SCAN: for ``drover stats``)."""
        return self._scope_names(list(self._client.scan_iter(match=self._scan_pattern(),
                                                             count=1000)))

    def state(self, scope: str, limits: ScopeLimits | None = None) -> dict[str, Any]:
        """Levels at now (``limits`` None: those of the last write)."""
        return self._run(self._state(scope, limits))

    # --- a pool of keys (see acquire.lua) ------------------------------------------------
    def acquire_pool(self, model_class: str, org_limits: ScopeLimits,
                     keys: Sequence[tuple[str, ScopeLimits]], *, input_tokens: int = 0,
                     output_tokens: int = 0, prefer: str | None = None, sticky_s: float = 0.0,
                     lease_ttl_s: float = 180.0) -> Grant:
        """Reserve in the organisation's buckets (``org_scope(model_class)``) and in those of
        the key, of ``keys`` (alias, its limits), whose grant comes first; ``Grant.key``
        names it. Settle, release and cool down each level as a scope of its own
        (``org_scope``, ``pool_scope``). Reason ``disabled``: every key is disabled."""
        return self._run(self._acquire(model_class, org_limits, int(input_tokens),
                                       int(output_tokens), lease_ttl_s, list(keys), prefer,
                                       sticky_s))

    def disable_key(self, alias: str, *, for_s: float = 0.0, why: str = "") -> bool:
        """Take a pool's key out of every acquire, fleet-wide (``for_s`` 0: until enabled);
        True when this call disabled it (False: it already was)."""
        return self._run(self._disable(alias, for_s, why))

    def enable_key(self, alias: str) -> bool:
        """Let a disabled key rejoin; True when it was disabled."""
        off, why = self._off_keys()
        pipe = self._client.pipeline(transaction=False)
        pipe.hdel(off, alias)
        pipe.hdel(why, alias)
        return bool(pipe.execute()[0])

    def disabled_keys(self) -> dict[str, dict[str, Any]]:
        """alias -> {since, reason, until (None: until enabled)} of the disabled keys."""
        off, why = self._off_keys()
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(off)
        pipe.hgetall(why)
        pipe.time()
        until, reasons, (sec, usec) = pipe.execute()
        return self._disabled_from(until, reasons, sec + usec / 1e6)

class AsyncLimiter(LimiterCore):
    """The same limiter over ``redis.asyncio.Redis``; every method is a coroutine."""

    async def _run(self, call: _Call | None) -> Any:
        if call is None:
            return None
        return call.finish(await self._scripts[call.script](keys=call.keys, args=call.args))

    async def acquire(self, scope: str, limits: ScopeLimits, *, input_tokens: int = 0,
                      output_tokens: int = 0, lease_ttl_s: float = 180.0) -> Grant:
        return await self._run(self._acquire(scope, limits, int(input_tokens),
                                             int(output_tokens), lease_ttl_s))

    async def settle(self, scope: str, limits: ScopeLimits, grant: Grant, *, input_tokens: int,
                     output_tokens: int, readings: Readings | None = None,
                     counts: Mapping[str, int] | None = None) -> None:
        await self._run(self._settle(scope, limits, grant, True, input_tokens, output_tokens,
                                     readings, counts))

    async def release(self, scope: str, grant: Grant) -> None:
        await self._run(self._settle(scope, None, grant, False, 0, 0, None))

    async def cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float) -> float:
        return await self._run(self._cooldown(scope, limits, retry_after_s))

    async def hold_back(self, grant: Grant, *scopes: str) -> float:
        return await self._run(self._hold_back(grant, list(scopes))) or 0.0

    async def sync_headers(self, scope: str, limits: ScopeLimits, readings: Readings) -> None:
        await self._run(self._sync(scope, limits, readings))

    async def record(self, scope: str, **counts: int) -> None:
        await self._run(self._record(scope, counts))

    async def usage(self, scope: str, seconds: int = 60) -> list[dict[str, int]]:
        return await self._run(self._usage(scope, seconds))

    async def scopes(self) -> list[str]:
        match = self._scan_pattern()
        return self._scope_names([k async for k in self._client.scan_iter(match=match,
                                                                           count=1000)])

    async def state(self, scope: str, limits: ScopeLimits | None = None) -> dict[str, Any]:
        return await self._run(self._state(scope, limits))

    async def acquire_pool(self, model_class: str, org_limits: ScopeLimits,
                           keys: Sequence[tuple[str, ScopeLimits]], *, input_tokens: int = 0,
                           output_tokens: int = 0, prefer: str | None = None,
                           sticky_s: float = 0.0, lease_ttl_s: float = 180.0) -> Grant:
        return await self._run(self._acquire(model_class, org_limits, int(input_tokens),
                                             int(output_tokens), lease_ttl_s, list(keys),
                                             prefer, sticky_s))

    async def disable_key(self, alias: str, *, for_s: float = 0.0, why: str = "") -> bool:
        return await self._run(self._disable(alias, for_s, why))

    async def disabled_keys(self) -> dict[str, dict[str, Any]]:
        off, why = self._off_keys()
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(off)
        pipe.hgetall(why)
        pipe.time()
        until, reasons, (sec, usec) = await pipe.execute()
        return self._disabled_from(until, reasons, sec + usec / 1e6)
