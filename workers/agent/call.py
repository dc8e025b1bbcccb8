"""One LLM call through the global limits, read top to bottom: reserve, send, settle.

Every door to the provider takes this path (DESIGN.md, "Three doors, one call path"), with one
sender: the limited clients' HTTP transport (``drover.workers.clients``), which sends the SDK's
own request, whether the SDK is a team's (``drover.AsyncAnthropic`` and kin, the gateway) or
drover's own loop's (``llm.create_message``, on ``clients.turn_client``). A ``Call`` holds
one call's estimate and reservation from the first grant to the last settle; its sender does
only the sending:

    call = Call(rt, params, ctx)
    await call.open()                      # never-fits check, the tenant's budget
    try:
        while not await call.reserve():    # the grant, its wait, hold_back, the send check
            pass                           # (held back by a cooldown: plan again)
        ... send ...                       # then exactly one of:
        await call.answered(usage)         #   the answer, with its real usage
        await call.failed(failure, lost)   #   the provider's error (or a lost connection)
        await call.ended(error, sent)      #   a cancel, a deadline, anything else
    finally:
        await call.close()                 # the tenant's budget settles with what was spent

- The input tokens are estimated locally and an output estimate reserved (the running mean
  of the scope's answers, at most a full output bucket); both are trued up from the
  answer's ``usage``. The output estimate is held while the answer generates: the provider
  debits output as it comes, so a limiter that debited it only at the end would run behind
  the provider by every answer in flight.
- A reservation further ahead than the horizon is not waited for in the worker slot: the
  caller gets ``LimiterSaysLater`` and turns it into a Celery retry with that countdown (the
  limited clients wait it out instead: they hold no worker slot).
- The lease is released and the unused reservation refunded on every path out.
- A call that went out and got no answer (aborted by a cancel or deadline, timed out, the
  connection cut after the send) is still billed by the provider: it is reported to the
  caller (``CallContext.unanswered``) at what it cost (once its stream began: the input it
  said and the output received; before: the input estimate and the scope's mean answer),
  spends that from the tenant's budget, and counts as outcome ``unanswered``.
- Errors are classified by ``drover.workers.agent.retry``; a 429 with retry-after also starts
  a cooldown of the whole scope, so every worker on every host backs off, not only this one.
  That includes the calls already granted and waiting for their planned send: a call that
  waited asks, right before it goes out, whether a cooldown began meanwhile, and if so plans
  again behind the calls granted before it (its reservation is not refunded: see
  ``limiter/lua/hold_back.lua``). Sent at their planned times, the queued calls of a 429 were
  most of a shared key's 429s in a job's first seconds (bench/RESULTS.md). The same question,
  asked of every call right before it goes out, paces the sends of a scope whose request
  bucket holds less than one request (60 RPM in 1 s bursts) on when the last one left:
  planned times alone drew a 429 whenever one send left a little late (bench/RESULTS-small.md).

The call's log lines keep the logger ``drover.workers.agent.llm`` (operators' filters and the
worker's log set-up name it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import redis

from drover._signals import HeldBack
from drover.config.providers import about
from drover.workers.agent.caching import cache_counts
from drover.workers.agent.caps import reserve_cost, settle_cost
from drover.workers.agent.errors import (
    CallFailed,
    Cancelled,
    LimiterSaysLater,
    NeverFits,
    RetryableFailure,
)
from drover.workers.agent.fits import never_fits, unconfigured_scopes
from drover.workers.agent.retry import (
    AUTHENTICATION_ERROR,
    Decision,
    classify,
    key_refused,
    limiter_countdown,
    missing_credentials,
    poll_wait,
    retry_reason,
)
from drover.workers.agent.routes import Route, all_disabled_message
from drover.workers.agent.runtime import Runtime
from drover.workers.agent.spend_limit import (
    is_spend_limit,
    key_stopped,
    spend_limit_decision,
    stop_key,
)
from drover.workers.fairshare import tenant_budget_scopes
from drover.workers.limiter import Grant, ScopeLimits
from drover.workers.providers import AnswerUsage, Failure, Seen
from drover.workers.telemetry import (
    acquire_wait,
    call_cost,
    held_back,
    stream_timing,
    unanswered_try,
)

__all__ = ["Call", "CallContext", "acquire", "acquire_own_limits", "counted_input",
           "learned_limits", "mark_unanswered", "no_credentials", "settle_own_limits",
           "wait_or_cancel"]

log = logging.getLogger("drover.workers.agent.llm")
POLL_S = 0.05
LEARNED_TTL_S = 10.0  # how long a process trusts the learned limits it read (learned_limits)


@dataclass
class CallContext:
    """Who is calling: for the limiter scope, cancellation and the log line."""

    job_id: str
    index: int
    cancel: asyncio.Event
    failures: int = 0  # failed attempts so far, for the backoff exponent
    tenant: str | None = None  # whose token budget (DROVER_TENANT_BUDGETS) the call spends
    rng: random.Random | None = None  # every jitter of this call draws from it (None: global)
    # Raises ClaimLost or Cancelled when the call must not go out (another delivery holds the
    # sub-agent now, or its job was cancelled); run right before each send, with the call's
    # input estimate and its output's bound, its max_tokens (the sub-agent marks the send
    # with them: a send lost with its worker is counted at these, so its output at the most
    # the provider can have billed for it). What it returns names the send to ``settled``.
    check: Callable[[int, int], Awaitable[Any]] | None = None
    # Told (with what ``check`` returned) once a send has its outcome: answered, refused by
    # the provider, or ended unanswered and counted; a sub-agent keeps its sends in flight.
    settled: Callable[[Any], Awaitable[None]] | None = None
    # Told of a call that was sent and never answered, with its input and output estimates.
    # (Both are also told the call's ``model=``, which prices it: an @subagent's calls may
    # name any model.)
    unanswered: Callable[..., Awaitable[None]] | None = None
    key: str | None = None  # a pool: the key of this sub-agent's last call (sticky routing)
    # Told True when the call's answer starts streaming in (its first token), False when that
    # stream ends, however it ends (``drover watch`` shows sub-agents generating).
    generating: Callable[[bool], Awaitable[None]] | None = None
    max_cost_usd: float | None = None  # the job's cap in dollars (workers/agent/caps.py)
    # Told each answer's usage (the SDK's, or ``AnswerUsage`` off the wire) once it is
    # settled: a sub-agent's calls through a limited client count in its usage this way
    # (drover's own loop counts the message it is handed instead, and leaves this None).
    answered: Callable[..., Awaitable[None]] | None = None
    # The caller's own limits (a gateway key's, DROVER_GATEWAY_KEYS): scopes reserved beside
    # the model's with the call's estimates, waited for like it, settled with what it spent.
    own_limits: tuple[tuple[str, ScopeLimits], ...] = ()


async def wait_or_cancel(seconds: float, cancel: asyncio.Event) -> None:
    if seconds <= 0:
        if cancel.is_set():
            raise Cancelled()
        return
    try:
        await asyncio.wait_for(cancel.wait(), seconds)
    except TimeoutError:
        return
    raise Cancelled()


def counted_input(usage: AnswerUsage, cache_reads_count: bool) -> int:
    """Input tokens as the provider's ITPM counts them."""
    total = (usage.input_tokens or 0) + (getattr(usage, "cache_creation_input_tokens", 0) or 0)
    if cache_reads_count:
        total += getattr(usage, "cache_read_input_tokens", 0) or 0
    return total


@acquire_wait
async def acquire(rt: Runtime, scope: str, limits: ScopeLimits, ctx: CallContext, *,
                  input_tokens: int, output_tokens: int, route: Route | None = None,
                  max_tokens: int = 0) -> Grant:
    """A grant from the limiter (through ``route``: the one key or a pool), polling briefly
    for in-flight slots.

    Raises LimiterSaysLater when the wait is past the horizon (or a cooldown is that long),
    CallFailed (job-wide) when every key of the pool is disabled."""
    # Held while the stream is open however long the answer takes (a stream cannot outlive
    # its task run); a dead worker's lease lapses after that.
    lease_ttl = rt.settings.task_time_limit_s + rt.settings.horizon_s + 30
    while True:
        if route is None:
            grant = await rt.limiter.acquire(scope, limits, input_tokens=input_tokens,
                                             output_tokens=output_tokens, lease_ttl_s=lease_ttl)
        else:
            grant = await route.acquire(rt.limiter, input_tokens=input_tokens,
                                        output_tokens=output_tokens, lease_ttl_s=lease_ttl,
                                        prefer=ctx.key, max_tokens=max_tokens)
        if grant.granted:
            return grant
        if grant.reason == "disabled":
            raise CallFailed(await _no_key_left(rt, route))
        if grant.reason in ("horizon", "cooldown") and grant.retry_after_s > POLL_S * 4:
            # Waiting this out would hold the worker slot: free it (a Celery retry) instead.
            raise LimiterSaysLater(
                limiter_countdown(grant.retry_after_s, rt.settings.countdown_cap_s, ctx.rng),
                _limiter_reason(grant.reason, grant.retry_after_s, rt.settings.horizon_s))
        await wait_or_cancel(poll_wait(grant.retry_after_s, ctx.rng), ctx.cancel)


async def _no_key_left(rt: Runtime, route: Route | None) -> Decision:
    disabled = await rt.limiter.disabled_keys()
    aliases = [k.alias for k in route.keys] if route is not None and route.pooled else [
        k.alias for k in rt.settings.keys]
    if all(is_spend_limit(disabled.get(a, {}).get("reason")) for a in aliases):
        provider = route.provider.name if route is not None else rt.settings.provider
        return spend_limit_decision(Decision("fail", "", "", 429), aliases, provider,
                                    pooled=True)
    return Decision("fail", AUTHENTICATION_ERROR,
                    all_disabled_message(aliases, disabled, pooled=True), 401, job_wide=True)


def _limiter_reason(reason: str, retry_after_s: float, horizon_s: float) -> str:
    """Why the slot is freed, in a sentence. The limiter's ``retry_after_s`` is how long until
    the wait would be within the horizon; the wait itself is that plus the horizon."""
    away = retry_after_s + horizon_s
    if reason == "cooldown":
        return (f"limiter cooldown: a 429's retry-after holds every worker for {away:.1f} s "
                f"more, longer than a worker waits in its slot (DROVER_HORIZON_S={horizon_s:g} "
                "s), so the slot is freed meanwhile")
    return (f"limiter horizon: the capacity for this call is {away:.1f} s away (other calls "
            f"are queued before it), longer than a worker waits in its slot "
            f"(DROVER_HORIZON_S={horizon_s:g} s), so the slot is freed meanwhile")


async def learned_limits(rt: Runtime, model: str) -> dict[str, dict[str, float | None]]:
    """The limits the provider's ``-limit`` headers taught, of the scopes of ``model`` that
    configure no input- or output-token limit (none read when every one is configured).

    Once a scope has learned a limit, it is read again only every LEARNED_TTL_S per process:
    a learned limit changes when the key's tier does, not from one call to the next. Until
    then every call reads it (one script call), so the first response's headers count."""
    out: dict[str, dict[str, float | None]] = {}
    now = time.monotonic()
    for scope in unconfigured_scopes(rt.settings, model):
        seen = rt.learned.get(scope)
        if seen is None or now - seen[0] > LEARNED_TTL_S:
            try:
                state = await rt.limiter.state(scope)
            except redis.RedisError:  # the acquire that follows meets it and says so
                return out
            seen = (now, {k: v for k, v in (state.get("learned") or {}).items() if v})
            if seen[1]:
                rt.learned[scope] = seen
        out[scope] = seen[1]
    return out


async def refuse_if_never_fits(rt: Runtime, model: str, scope: str, ctx: CallContext,
                               input_tokens: int) -> None:
    """Raise NeverFits, logged and sent nowhere, for a call no limit could ever admit."""
    why = never_fits(rt.settings, model, input_tokens=input_tokens,
                     learned=await learned_limits(rt, model))
    if why is not None:
        decision = Decision("fail", "request_too_large", why)
        _log_failure(scope, decision, ctx, 0.0, time.monotonic(), True)  # nothing sent
        raise NeverFits(decision)


Held = list[tuple[str, ScopeLimits, Grant]]


async def acquire_tenant_budget(rt: Runtime, ctx: CallContext, tokens: int) -> Held:
    """Reserve ``tokens`` from the tenant's own budget scopes (none when it has no budget).

    The tenant's budget is a limiter scope beside the model's, counting input + output tokens
    in its one token dimension; a wait past the horizon becomes a Celery retry like any
    other, its countdown capped (a spent day budget refills slowly)."""
    budget = rt.settings.tenant_budgets.get(ctx.tenant or "")
    if budget is None:
        return []
    held: Held = []
    try:
        for scope, per_minute, burst_s in tenant_budget_scopes(
                ctx.tenant or "", budget.per_minute, budget.per_day):
            limits = ScopeLimits(tpm=per_minute, burst_s=burst_s)
            held.append((scope, limits, await acquire(rt, scope, limits, ctx,
                                                      input_tokens=tokens, output_tokens=0)))
    except LimiterSaysLater as later:
        await release_tenant_budget(rt, held)
        raise LimiterSaysLater(min(later.countdown, rt.settings.countdown_cap_s),
                               f"the token budget of tenant {ctx.tenant} "
                               "(DROVER_TENANT_BUDGETS) has no room for this call yet, so the "
                               "slot is freed meanwhile") from None
    except BaseException:
        await release_tenant_budget(rt, held)
        raise
    return held


async def release_tenant_budget(rt: Runtime, held: Held, spent: int | None = None) -> None:
    """Settle the tenant's reservations with what the call spent (None: nothing was sent)."""
    for scope, limits, grant in held:
        if spent is None:
            await asyncio.shield(rt.limiter.release(scope, grant))
        else:
            await asyncio.shield(rt.limiter.settle(scope, limits, grant, input_tokens=spent,
                                                   output_tokens=0))


async def acquire_own_limits(rt: Runtime, ctx: CallContext, input_tokens: int,
                             output_tokens: int) -> Held:
    """Reserve the call's estimates from the caller's own limits (``ctx.own_limits``: a
    gateway key's), all or none; a wait past the horizon raises LimiterSaysLater."""
    held: Held = []
    try:
        for scope, limits in ctx.own_limits:
            held.append((scope, limits, await acquire(rt, scope, limits, ctx,
                                                      input_tokens=input_tokens,
                                                      output_tokens=output_tokens)))
    except BaseException:
        await release_tenant_budget(rt, held)
        raise
    return held


async def settle_own_limits(rt: Runtime, held: Held, spent: tuple[int, int] | None) -> None:
    """Settle the caller's own limits with what the call spent, (input, output) tokens as
    the provider counts them (None: nothing was sent, everything goes back)."""
    for scope, limits, grant in held:
        if spent is None:
            await asyncio.shield(rt.limiter.release(scope, grant))
        else:
            await asyncio.shield(rt.limiter.settle(scope, limits, grant, input_tokens=spent[0],
                                                   output_tokens=spent[1]))


class Call:
    """One call's estimate and reservation, from its first grant to its last settle (the
    module docstring shows the order). ``params``: drover's (Messages-shaped) request."""

    def __init__(self, rt: Runtime, params: dict[str, Any], ctx: CallContext, *,
                 streams: bool = False) -> None:
        self.rt, self.params, self.ctx = rt, params, ctx
        # A stream's response headers come at its admission: the sender tells ``admitted``
        # when they come, and a paced send is paced on that too (hold_back.lua).
        self.streams = streams
        self.report = False  # this try's send was paced: report its headers (``admitted``)
        settings = rt.settings
        self.model = model = params["model"]
        self.max_tokens = int(params["max_tokens"])
        self.route = route = rt.route(model)
        self.provider = route.provider
        configured = settings.limits_for(model)
        self.cache_reads_count = bool(configured and configured.cache_reads_count)
        # With a pool, the cache reads expected are those of the key the sub-agent sticks to.
        home = (ctx.key or "") if route.pooled else ""
        self.est_in = rt.calibration.input_tokens(route.scope, params, self.cache_reads_count,
                                                  home)
        # The limiter reserves more than the estimate until this scope's answers calibrate it
        # (estimate.UNCALIBRATED); the estimate is what an unanswered call counts.
        self.res_in = rt.calibration.input_reservation(route.scope, self.est_in)
        # A provider that counts max tokens at admission (OpenAI) is reserved that much.
        self.est_out = (self.max_tokens if route.provider.one_tokens_bucket
                        else rt.calibration.output_tokens(route.scope, self.max_tokens))
        self.budget: Held = []
        self.own: Held = []  # the caller's own limits' reservations (ctx.own_limits)
        self.budget_wait = 0.0
        self.spent: int | None = None  # what the tenant's budget pays (None: nothing sent)
        self.cost: Any = None  # the caps' reservation (caps.reserve_cost)
        self.answer_usage: AnswerUsage | None = None  # the answer's usage, once answered
        self.lost: tuple[int, int] | None = None  # what the last try cost unanswered
        self.send: Any = None  # what ``ctx.check`` named the try's send (``ctx.settled``)
        # The try under way (``reserve``): its grant, key, start, and what its stream said.
        self.grant: Grant | None = None
        self.key_alias = ""
        self.scope = route.scope
        self.client: Any = rt.client
        self.started = time.monotonic()
        self.seen = Seen()

    # --- reserve -------------------------------------------------------------------------
    async def count_new_size(self) -> None:
        """A request of a size its scope has not calibrated (``Calibration.new_size``): the
        provider's own count sets that size's factor before it is reserved."""
        rt, route = self.rt, self.route
        home = (self.ctx.key or "") if route.pooled else ""
        if not self.provider.counts_input or not rt.calibration.new_size(
                route.scope, self.params, self.cache_reads_count, home):
            return
        client = route.keys[0].client if route.pooled and route.keys else rt.client
        tokens = await self.provider.count_input(client, self.params)
        rt.calibration.counted(route.scope, self.params, tokens, self.cache_reads_count, home)
        self.est_in = rt.calibration.input_tokens(route.scope, self.params,
                                                  self.cache_reads_count, home)
        self.res_in = rt.calibration.input_reservation(route.scope, self.est_in)

    async def open(self) -> None:
        """Refuse a call no limit could ever admit (NeverFits); reserve its worst case from
        the caps in dollars (caps.py), then from the tenant's token budget."""
        rt, ctx = self.rt, self.ctx
        await refuse_if_never_fits(rt, self.model, self.route.scope, ctx, self.est_in)
        self.cost = await reserve_cost(rt, ctx.job_id, ctx.tenant, ctx.max_cost_usd,
                                       self.model, self.res_in, self.max_tokens)
        try:
            self.budget = await acquire_tenant_budget(rt, ctx, self.est_in + self.est_out)
            self.own = await acquire_own_limits(rt, ctx, self.res_in, self.est_out)
        except BaseException:
            await release_tenant_budget(rt, self.budget)
            self.budget = []
            await settle_cost(rt, self.cost)
            raise
        self.budget_wait = max((g.wait_s for _, _, g in self.budget + self.own), default=0.0)

    async def reserve(self) -> bool:
        """A grant, waited for until its send (a cancel ends the wait): True when the call
        may go now; False when a cooldown began while it waited (the grant is spent: plan
        again). Raises LimiterSaysLater past the horizon, and what ``ctx.check`` raises."""
        rt, ctx, route = self.rt, self.ctx, self.route
        # The output estimate is reserved at the start (the module docstring says why;
        # reserving one token instead drew 429s at the limits: docs/limits.md), at most a full
        # output bucket: the limiter debits no more than that anyway, and the provider admits
        # a call while its output bucket has room, so a larger reservation only made the call
        # wait for room no bucket holds (a small key's first calls, before the answers
        # calibrate it). OpenAI charges max_tokens at admission, so that is reserved there
        # (its estimate ran the limiter behind the provider by every call in flight: 429s at
        # a binding TPM).
        grant = await acquire(rt, route.scope, route.limits, ctx, input_tokens=self.res_in,
                              output_tokens=route.output_reservation(self.est_out,
                                                                     self.max_tokens),
                              route=route, max_tokens=self.max_tokens)
        key = route.key(grant)
        self.grant, self.scope, self.key_alias = grant, key.scope, key.alias
        self.client = key.client if route.pooled else rt.client  # the one key: the runtime's
        self.provider = key.provider if route.pooled else route.provider  # a cloud's entry
        if route.pooled:
            ctx.key = key.alias
        self.started = time.monotonic()
        self.seen = Seen()  # what the stream delivered (a stream that ends early costs that)
        self.send = None
        try:
            waited, self.budget_wait = max(grant.wait_s, self.budget_wait), 0.0
            await wait_or_cancel(waited, ctx.cancel)
            # One trip to Redis: the cooldowns, the paced sends, and a key stopped (a pool's
            # key disabled: held back a day; the one key: inf) since the grant.
            while (held := await route.hold_back(rt.limiter, grant, self.streams)) < 0:
                await wait_or_cancel(-held, ctx.cancel)  # a one-request bucket: paced sends
            self.report = held.report
            if held == math.inf:  # the one key, stopped: CallFailed if for its spend limit
                await key_stopped(rt, route, key.alias)
            elif held > 0:
                raise HeldBack()  # a 429 came while this call waited, or a pool's key was
                #                   disabled (the call moves to another key)
            if ctx.check is not None:  # after every wait, right before the send
                self.send = await ctx.check(self.est_in, self.max_tokens)
        except HeldBack:
            # Planned before the 429 that emptied the provider's bucket: its lease is gone,
            # its reservation stays spent, and the call plans again behind the cooldown and
            # the calls granted before it.
            log.debug("llm call held back scope=%s job=%s sub=%d wait_s=%.3f: a cooldown began "
                      "while it waited", self.scope, ctx.job_id, ctx.index, grant.wait_s)
            held_back(route.scope)
            return False
        except BaseException as error:
            await self.ended(error, sent=False)
            raise
        self.seen.opened = time.monotonic()
        return True

    async def admitted(self) -> None:
        """The stream's response headers came back (it was admitted): a paced send's next
        ones wait one interval of the provider's after now (admitted.lua). Nothing for a
        send that was not paced. Redis failing here costs the next send that bound only
        (it is paced on when this one left, as before), never this answer."""
        if self.report:
            self.report = False
            try:
                await self.route.admitted(self.rt.limiter, self._grant())
            except redis.RedisError as error:
                log.warning("llm call admission of %s not recorded (%s): the next paced send "
                            "is paced on when this one left only", self.scope,
                            type(error).__name__)

    # --- settle: exactly one of answered, failed, ended per reserved try ----------------
    async def answered(self, usage: AnswerUsage, headers: Any = None) -> None:
        """The answer came whole: settle with its real usage (``headers``: its limit headers,
        synced in the same trip), learn from it, count it and tell the caller."""
        rt, ctx, grant, seen = self.rt, self.ctx, self._grant(), self.seen
        used_in = counted_input(usage, self.cache_reads_count)
        used_out = usage.output_tokens or 0
        await asyncio.shield(self.route.settle(
            rt.limiter, grant, input_tokens=used_in, output_tokens=used_out,
            max_tokens=self.max_tokens, headers=headers,
            counts=cache_counts(self.params, usage) | seen.counts(used_out)))
        self.spent = used_in + used_out
        self.answer_usage = usage
        call_cost(rt.settings, self.model, ctx.tenant, usage)  # drover_cost_usd, every door
        rt.calibration.observe(self.route.scope, self.params, usage, used_in,
                               self.cache_reads_count, self.key_alias if self.route.pooled
                               else "")
        rt.calibration.observe_output_chars(self.route.scope, seen.chars, used_out)
        speed = seen.output_per_s(used_out)
        stream_timing(seen.first_token_s, speed)
        log.info("llm call outcome=ok scope=%s status=200 job=%s sub=%d wait_s=%.3f "
                 "call_s=%.3f in=%d out=%d cache_read=%d est_in=%d reserved_in=%d "
                 "reserved_out=%d ttft_s=%s out_per_s=%s", self.scope,
                 ctx.job_id, ctx.index, grant.wait_s,
                 time.monotonic() - self.started - grant.wait_s, used_in, used_out,
                 getattr(usage, "cache_read_input_tokens", 0) or 0, self.est_in,
                 grant.input_tokens, grant.output_tokens,
                 "none" if seen.first_token_s is None else f"{seen.first_token_s:.3f}",
                 "none" if speed is None else f"{speed:.1f}")
        await self._send_settled()
        if ctx.answered is not None:
            await ctx.answered(usage, model=self.model)

    async def failed(self, failure: Failure | None, *, lost: bool, headers: Mapping[str, str],
                     error: BaseException | None = None) -> Decision | None:
        """The provider answered with an error, or the connection failed (``lost``: after the
        request went out, so the provider bills it). Settles, cools the scope down on a 429
        with retry-after, counts it; returns what the retry policy decides, or None when a
        pool's key was refused and disabled (the call moves to another key)."""
        rt, ctx, grant, settings = self.rt, self.ctx, self._grant(), self.rt.settings
        # The request reached the provider (or tried to): it stays counted; its tokens too
        # when it went out and the answer was lost (the provider bills it): a stream that
        # had begun is billed what it had generated.
        lost_in, lost_out = self._lost_usage()
        await asyncio.shield(self.route.settle(
            rt.limiter, grant, input_tokens=lost_in if lost else 0,
            output_tokens=self._settled_output() if lost and self.seen.started else 0,
            max_tokens=self.max_tokens if lost else 0))
        self.spent = lost_in + lost_out if lost else 0
        if lost:
            self.lost = (lost_in, lost_out)
            call_cost(rt.settings, self.model, ctx.tenant, None, self.lost)
            await _unanswered(rt, self.scope, ctx, error, lost_in, lost_out, self.model)
        await self._send_settled()
        # An SDK error its provider does not describe (a response it could not read) is
        # judged as the exception it is.
        decision = classify(failure if failure is not None else error or RuntimeError(
            "no answer"), attempt=ctx.failures, base_s=settings.backoff_base_s,
            cap_s=settings.countdown_cap_s, rng=ctx.rng)
        if decision.spend_limit:  # stopped fleet-wide; a pool goes on with its other keys
            if await _spend_limited(rt, self.route, self.key_alias, decision, ctx,
                                    grant.wait_s, self.started):
                return None
            decision = spend_limit_decision(decision, [self.key_alias],
                                            self.provider.name, pooled=False)
        elif key_refused(decision):
            if self.route.pooled:
                await _disable_key(rt, self.route, self.key_alias, decision, ctx, grant.wait_s,
                                   self.started)
                return None
            decision = _only_key_refused(settings, decision)
        # The caller records the sub-agent failed once this attempt is its last: say so.
        last = decision.action == "fail" or ctx.failures + 1 >= settings.max_attempts
        await _after_error(rt, self.route, grant, decision, ctx, self.started, last, headers)
        return decision

    async def ended(self, error: BaseException | None, *, sent: bool) -> None:
        """The try ended without an answer or an error from the provider: a cancel, a
        deadline, a stream its reader closed early (``error`` None), or an error of this
        process. ``sent``: the request may have gone out (a cancel that aborted it in flight,
        a stream cut short): the provider bills it, so it is settled at what it cost and
        counted unanswered; else the whole reservation goes back."""
        rt, ctx, grant = self.rt, self.ctx, self._grant()
        lost_in, lost_out = self._lost_usage()
        if sent:
            # Aborted in flight: the provider has counted the request and its input at
            # admission, and the output it generated until the stream closed; the rest of
            # the output reservation is refunded.
            await asyncio.shield(self.route.settle(
                rt.limiter, grant, input_tokens=lost_in,
                output_tokens=self._settled_output() if self.seen.started else 0,
                max_tokens=self.max_tokens))
            # Billed, so the tenant's budget pays what it cost and the caller counts it.
            self.spent, self.lost = lost_in + lost_out, (lost_in, lost_out)
            call_cost(rt.settings, self.model, ctx.tenant, None, self.lost)
            await asyncio.shield(_unanswered(rt, self.scope, ctx, error, lost_in, lost_out,
                                             self.model))
            await asyncio.shield(self._send_settled())
        else:  # nothing went out: the whole reservation goes back
            await asyncio.shield(self.route.release(rt.limiter, grant))
        if error is not None and missing_credentials(error):
            settings = rt.settings
            decision = classify(error, attempt=ctx.failures, base_s=settings.backoff_base_s,
                                cap_s=settings.countdown_cap_s)
            decision = _only_key_refused(settings, decision)
            _log_failure(self.scope, decision, ctx, grant.wait_s, self.started, True)
            raise CallFailed(decision) from None
        log.info("llm call outcome=%s scope=%s status=none job=%s sub=%d wait_s=%.3f "
                 "call_s=%.3f in=%d out=%d sent=%s",
                 "unanswered" if sent else "cancelled" if isinstance(error, Cancelled)
                 else "aborted", self.scope, ctx.job_id, ctx.index, grant.wait_s,
                 max(0.0, time.monotonic() - self.started - grant.wait_s),
                 lost_in if sent else 0, lost_out if sent else 0, "yes" if sent else "no")

    async def close(self) -> None:
        """Settle the tenant's budget and the caps in dollars with what the call spent
        (after its last try): its answer's usage, or what it cost unanswered."""
        await release_tenant_budget(self.rt, self.budget, spent=self.spent)
        await settle_own_limits(self.rt, self.own, None if self.spent is None else (
            (counted_input(self.answer_usage, self.cache_reads_count),
             self.answer_usage.output_tokens or 0) if self.answer_usage is not None
            else self.lost or (0, 0)))
        await settle_cost(self.rt, self.cost, self.answer_usage, self.lost)

    async def _send_settled(self) -> None:
        """The try's send has its outcome: tell the caller (``ctx.settled``), once."""
        send, self.send = self.send, None
        if send is not None and self.ctx.settled is not None:
            await self.ctx.settled(send)

    def failure(self, decision: Decision, *, lost: bool) -> Exception:
        """The exception a failed attempt ends the call with, as the retry policy decided: a
        ``RetryableFailure`` with its countdown (the task retries it through Celery) or a
        ``CallFailed``; ``lost``: the request went out unanswered (telemetry counts it)."""
        failure: Exception
        if decision.action == "retry":
            failure = RetryableFailure(decision.countdown, decision, retry_reason(
                decision, self.ctx.failures + 1, self.rt.settings.max_attempts))
        else:
            failure = CallFailed(decision)
        if lost:
            mark_unanswered(failure, *self._lost_usage())
        return failure

    def unanswered_usage(self) -> tuple[int, int]:
        """What the try cost if it ends now without its answer (``_lost_usage``)."""
        return self._lost_usage()

    def _grant(self) -> Grant:
        assert self.grant is not None, "settled before a grant"
        return self.grant

    def _settled_output(self) -> int:
        """The output the limiter settles a stream that closed early at: not below what the
        provider billed (``Seen.partial_output_at_most``), where the usage counts its
        estimate (``_lost_usage``)."""
        return self.seen.partial_output_at_most(
            self.max_tokens, self.rt.calibration.output_chars_per_token(self.route.scope))

    def _lost_usage(self) -> tuple[int, int]:
        """What a call that ended without its answer cost: once its stream began, the input it
        said (the estimate where it said none: an OpenAI stream tells its prompt's count only
        in its last chunk, and the prompt is billed at admission) and the output generated
        until it closed; before that, the estimate."""
        seen = self.seen
        if seen.started:
            said_in = seen.partial_input(self.cache_reads_count) if seen.input_said \
                else self.est_in
            return said_in, seen.partial_output()
        return self.est_in, self.est_out


def no_credentials(rt: Runtime, ctx: CallContext, error: BaseException) -> CallFailed:
    """The SDK refused to send without any API key (``retry.missing_credentials``): the
    job's every call would, so it fails job-wide, saying which variable to set."""
    settings = rt.settings
    decision = _only_key_refused(settings, classify(
        error, attempt=ctx.failures, base_s=settings.backoff_base_s,
        cap_s=settings.countdown_cap_s))
    _log_failure(rt.settings.key_alias, decision, ctx, 0.0, time.monotonic(), True)
    return CallFailed(decision)


def _only_key_refused(settings: Any, decision: Decision) -> Decision:
    """The fleet's only key was refused (or there is none): no call of the job can succeed."""
    what = " ".join(str(p) for p in (decision.status_code, decision.error_type) if p)
    facts = about(settings.provider)
    var, key, console = facts.api_key_env, facts.api_key(settings), facts.console
    message = (f"the API key DROVER_KEY_ALIAS={settings.key_alias} was refused ({what}: "
               f"{decision.message}). Check the key in {console}, set "
               f"{var} to a valid key on every worker's host and restart the "
               f"workers (a simulator takes any non-empty key: {var}=sk-sim)")
    if decision.status_code is None or key is None:  # no key at all
        said = f" ({what}: {decision.message})" if decision.status_code else ""
        message = (f"no API key (DROVER_KEY_ALIAS={settings.key_alias}){said}: set "
                   f"{var} on every worker's host and restart the workers (a "
                   f"simulator takes any non-empty key: {var}=sk-sim)")
    if decision.message.count(f"{var}=sk-sim"):  # the simulator's 401 said it
        message = message.replace(" (a simulator takes any non-empty key: "
                                  f"{var}=sk-sim)", "")
    return replace(decision, message=message, job_wide=True)


async def _spend_limited(rt: Runtime, route: Route, alias: str, decision: Decision,
                         ctx: CallContext, wait_s: float, started: float) -> bool:
    """The key reached the provider's spend limit: stop it on every worker and client. True
    when the call moves to a pool's other keys; False for the one key (the job ends)."""
    if await stop_key(rt, alias, decision):  # logged once, by the call that found it out
        log.error("key %s reached the provider's spend limit: stopped fleet-wide until it is "
                  "raised (`drover keys enable %s`) or the month turns%s", alias, alias,
                  "; its calls move to the pool's other keys" if route.pooled else "")
    if not route.pooled:
        return False
    await asyncio.to_thread(rt.store.counters.count_failed_call, ctx.job_id, decision.counter)
    log.warning("llm call outcome=%s scope=%s status=429 type=spend_limit job=%s sub=%d "
                "wait_s=%.3f call_s=%.3f in=0 out=0 next=another_key", decision.counter,
                route.key_scope(alias), ctx.job_id, ctx.index, wait_s,
                time.monotonic() - started - wait_s)
    ctx.key = None
    return True


async def _disable_key(rt: Runtime, route: Route, alias: str, decision: Decision,
                       ctx: CallContext, wait_s: float, started: float) -> None:
    """A pool's key was refused: take it out of every worker's acquire, fleet-wide."""
    what = " ".join(str(p) for p in (decision.status_code, decision.error_type) if p)
    first = await rt.limiter.disable_key(alias, for_s=rt.settings.key_reenable_s,
                                         why=f"{what}: {decision.message[:200]}")
    scope = route.key_scope(alias)
    if first:  # logged once, by the worker whose call found it out
        again = (f"for {rt.settings.key_reenable_s:g} s" if rt.settings.key_reenable_s
                 else "until `drover keys enable " + alias + "`")
        log.error("pool key %s disabled fleet-wide %s: %s; its calls move to the other keys",
                  alias, again, what)
    if ctx.job_id:  # a job's call (a limited client's own calls belong to none)
        await asyncio.to_thread(rt.store.counters.count_failed_call, ctx.job_id,
                                decision.counter)
    log.warning("llm call outcome=%s scope=%s status=%s type=%s job=%s sub=%d wait_s=%.3f "
                "call_s=%.3f in=0 out=0 next=another_key", decision.counter, scope,
                decision.status_code or "none", decision.error_type, ctx.job_id, ctx.index,
                wait_s, time.monotonic() - started - wait_s)
    ctx.key = None


def mark_unanswered(error: BaseException, est_in: int, est_out: int) -> None:
    """What telemetry reads (``getattr(error, "unanswered")``) on whatever exception ended a
    call sent and never answered, the SDK's own among them."""
    with contextlib.suppress(TypeError):  # an exception type without a __dict__
        vars(error)["unanswered"] = (est_in, est_out)


async def _unanswered(rt: Runtime, scope: str, ctx: CallContext,
                      error: BaseException | None, est_in: int, est_out: int,
                      model: str) -> None:
    """Tell the caller of a call sent and never answered, count it for ``drover stats``, and
    mark ``error`` for the metrics."""
    if error is not None:
        mark_unanswered(error, est_in, est_out)
    unanswered_try(est_in, est_out)
    try:
        await asyncio.to_thread(rt.store.counters.count_unanswered, scope, est_in, est_out,
                                rt.settings.stats_window_s)
    except Exception as problem:  # the caller's own count (the record) is what bills
        log.warning("unanswered call of %s not counted for drover stats (%s)", scope,
                    type(problem).__name__)
    if ctx.unanswered is not None:
        await ctx.unanswered(est_in, est_out, model=model)


async def _after_error(rt: Runtime, route: Route, grant: Grant, decision: Decision,
                       ctx: CallContext, started: float, last: bool,
                       headers: Any) -> None:
    scope = route.key(grant).scope
    if decision.cooldown_s is not None:
        await route.cooldown(rt.limiter, grant, decision.cooldown_s, headers)
    # Every failed call, by kind, for the job (telemetry's llm_call counts it for the fleet).
    if ctx.job_id:  # a job's call (a limited client's own calls belong to none)
        await asyncio.to_thread(rt.store.counters.count_failed_call, ctx.job_id,
                                decision.counter)
    _log_failure(scope, decision, ctx, grant.wait_s, started, last)


def _log_failure(scope: str, decision: Decision, ctx: CallContext, wait_s: float,
                 started: float, last: bool = True) -> None:
    """The failed call's line; ``next=failed`` when no retry follows (not retried, or the
    attempt that used up DROVER_MAX_ATTEMPTS: written after that count is checked)."""
    log.warning("llm call outcome=%s scope=%s status=%s type=%s job=%s sub=%d wait_s=%.3f "
                "call_s=%.3f in=0 out=0 next=%s countdown=%.1f", decision.counter, scope,
                decision.status_code or "none", decision.error_type, ctx.job_id, ctx.index, wait_s,
                time.monotonic() - started - wait_s, "failed" if last else "retry",
                0.0 if last else decision.countdown)
