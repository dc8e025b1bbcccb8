"""The limiter over a sync ``redis.Redis`` and over ``redis.asyncio.Redis``. Each operation is
written once: it hands its script call (``_scripts.LimiterCore``) to ``_run``, which the sync
limiter runs and the async one returns as an awaitable (as redis-py shares its commands).
Their return types are the class's type parameters: each operation's result for
``Limiter``, a coroutine of it for ``AsyncLimiter``, so that a caller that forgets an
``await`` (or awaits a sync limiter's result) is a type error."""

from __future__ import annotations

from collections.abc import Collection, Coroutine, Mapping, Sequence
from typing import Any, Generic, TypeVar

from drover.workers.limiter._scopes import Grant, Held, ScopeLimits
from drover.workers.limiter._scripts import Call, LimiterCore, Readings

__all__ = ["AsyncLimiter", "Limiter"]


GrantT = TypeVar("GrantT")  # a Grant
NoneT = TypeVar("NoneT")  # None
FloatT = TypeVar("FloatT")  # a float
BoolT = TypeVar("BoolT")  # a bool
UsageT = TypeVar("UsageT")  # list[dict[str, int]]
StateT = TypeVar("StateT")  # dict[str, Any]
_T = TypeVar("_T")
_Co = Coroutine[Any, Any, _T]  # what an AsyncLimiter's operation returns: awaited, a _T


class _Operations(LimiterCore, Generic[GrantT, NoneT, FloatT, BoolT, UsageT, StateT]):
    def _run(self, call: Any, empty: Any = None) -> Any:
        raise NotImplementedError

    def acquire(self, scope: str, limits: ScopeLimits, *, input_tokens: int = 0,
                output_tokens: int = 0, lease_ttl_s: float = 180.0,
                max_tokens: int = 0) -> GrantT:
        """Reserve one request and its token estimate; see ``Grant``. ``max_tokens``: the
        call's, which a tokens bucket (``tpm``) takes at least at admission with the input."""
        return self._run(self._acquire(scope, limits, int(input_tokens), int(output_tokens),
                                       lease_ttl_s, max_tokens=int(max_tokens)))

    def settle(self, scope: str, limits: ScopeLimits, grant: Grant, *, input_tokens: int,
               output_tokens: int, readings: Readings | None = None,
               counts: Mapping[str, int] | None = None) -> NoneT:
        """True the grant up to what the call used; with the ``readings`` of the response's
        limit headers (read by its provider), also what ``sync_headers`` would do, and with
        ``counts`` (STAT_FIELDS names) what ``record`` would, in the same round trip."""
        return self._run(self._settle(scope, limits, grant, True, input_tokens, output_tokens,
                                      readings, counts))

    def release(self, scope: str, grant: Grant) -> NoneT:
        """The request never went out: refund all of it."""
        return self._run(self._settle(scope, None, grant, False, 0, 0, None))

    def cooldown(self, scope: str, limits: ScopeLimits, retry_after_s: float,
                 learnable: Collection[str] | None = None) -> FloatT:
        """A 429: hold back every host until ``retry_after_s`` from now; seconds left. With
        ``limits.learn_share`` it also cuts the share learnt, in the dimensions ``learnable``
        names (the provider's names: those whose headers can teach it back; None: all)."""
        return self._run(self._cooldown(scope, limits, retry_after_s, learnable))

    def hold_back(self, grant: Grant, *scopes: str, stop: str | None = None,
                  report: bool = False) -> FloatT:
        """Right before a granted call goes out: seconds a cooldown holds on any of
        ``scopes`` (the grant's; its lease is gone, its reservation spent: do not send on
        it); below 0, a bucket of less than one request let its last send go too recently,
        or the sends that just left filled the provider's bucket (a stall sent them
        together): wait that long, ask again; 0.0: send (hold_back.lua). A pool's: one
        call. ``stop``: a key alias (the one key's) whose fleet-wide stop (``disable_key``)
        is read in the same call: inf when it is stopped, nothing changed (``disabled_keys``
        says why). ``report``: the caller will say when the send's response headers come
        back (a stream's come at its admission): a paced send then answers a ``Held`` whose
        ``report`` is True, and its caller calls ``admitted`` when they come."""
        return self._run(self._hold_back(grant, list(scopes), stop, report), Held(0.0))

    def admitted(self, grant: Grant, *scopes: str) -> NoneT:
        """The response headers of a send that ``hold_back`` paced (``Held.report``) came
        back now: the next paced sends of ``scopes`` wait one interval of the provider's
        after this (admitted.lua)."""
        return self._run(self._admitted(grant, list(scopes)))

    def sync_headers(self, scope: str, limits: ScopeLimits, readings: Readings) -> NoneT:
        """Fold in what an answer's limit headers said (``Provider.read_limits``)."""
        return self._run(self._sync(scope, limits, readings))

    def record(self, scope: str, **counts: int) -> NoneT:
        return self._run(self._record(scope, counts))

    def usage(self, scope: str, seconds: int = 60) -> UsageT:
        return self._run(self._usage(scope, seconds))

    def state(self, scope: str, limits: ScopeLimits | None = None) -> StateT:
        """Levels at now (``limits`` None: those of the last write)."""
        return self._run(self._state(scope, limits))

    # --- a pool of keys (see acquire.lua) -------------------------------------------------
    def acquire_pool(self, model_class: str, org_limits: ScopeLimits,
                     keys: Sequence[tuple[str, ScopeLimits]], *, input_tokens: int = 0,
                     output_tokens: int = 0, prefer: str | None = None, sticky_s: float = 0.0,
                     lease_ttl_s: float = 180.0, max_tokens: int = 0) -> GrantT:
        """Reserve in the organisation's buckets (``org_scope(model_class)``) and in those of
        the key, of ``keys`` (alias, its limits), whose grant comes first; ``Grant.key``
        names it. Settle, release and cool down each level as a scope of its own
        (``org_scope``, ``pool_scope``); a key whose limits are ``alone`` (a cloud's entry)
        reserves in its own scope only. Reason ``disabled``: every key is disabled."""
        return self._run(self._acquire(model_class, org_limits, int(input_tokens),
                                       int(output_tokens), lease_ttl_s, list(keys), prefer,
                                       sticky_s, int(max_tokens)))

    def disable_key(self, alias: str, *, for_s: float = 0.0, why: str = "") -> BoolT:
        """Take a pool's key out of every acquire, fleet-wide (``for_s`` 0: until enabled);
        True when this call disabled it (False: it already was)."""
        return self._run(self._disable(alias, for_s, why))

    def _enable_pipe(self, alias: str) -> Any:
        off, why = self._off_keys()
        return self._client.pipeline(transaction=False).hdel(off, alias).hdel(why, alias)

    def _disabled_pipe(self) -> Any:
        off, why = self._off_keys()
        return self._client.pipeline(transaction=False).hgetall(off).hgetall(why).time()


class Limiter(_Operations[Grant, None, float, bool, list[dict[str, int]], dict[str, Any]]):
    """The global limiter over a sync ``redis.Redis``. ``clock`` (tests only): a function
    returning the time in microseconds, which the scripts then use instead of Redis TIME."""

    def _run(self, call: Call | None, empty: Any = None) -> Any:
        if call is None:  # nothing to do (nothing to settle or record)
            return empty
        return call.finish(self._scripts[call.script](keys=call.keys, args=call.args))

    def scopes(self) -> list[str]:
        """The scopes with a bucket or counters in Redis (SCAN: for ``drover stats``)."""
        return self._scope_names(list(self._client.scan_iter(match=self._scan_pattern(),
                                                             count=1000)))

    def enable_key(self, alias: str) -> bool:
        """Let a disabled key rejoin; True when it was disabled."""
        return bool(self._enable_pipe(alias).execute()[0])

    def disabled_keys(self) -> dict[str, dict[str, Any]]:
        """alias -> {since, reason, until (None: until enabled)} of the disabled keys."""
        return self._disabled_from(*self._disabled_pipe().execute())


class AsyncLimiter(_Operations[_Co[Grant], _Co[None], _Co[float], _Co[bool],
                                _Co[list[dict[str, int]]], _Co[dict[str, Any]]]):
    """The same limiter over ``redis.asyncio.Redis``; every method is awaited."""

    async def _run(self, call: Call | None, empty: Any = None) -> Any:
        if call is None:  # nothing to do (nothing to settle or record)
            return empty
        return call.finish(await self._scripts[call.script](keys=call.keys, args=call.args))

    async def scopes(self) -> list[str]:
        match = self._scan_pattern()
        return self._scope_names([k async for k in self._client.scan_iter(match=match,
                                                                           count=1000)])

    async def enable_key(self, alias: str) -> bool:
        return bool((await self._enable_pipe(alias).execute())[0])

    async def disabled_keys(self) -> dict[str, dict[str, Any]]:
        return self._disabled_from(*await self._disabled_pipe().execute())
