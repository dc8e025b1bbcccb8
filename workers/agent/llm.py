"""One LLM call through the global limiter: acquire -> wait -> call -> reconcile.

- The input tokens are estimated locally and an output estimate reserved (the running mean
  of the scope's answers, at most a full output bucket); both are trued up from the
  stream's final ``usage``. The output
  estimate is held while the answer generates: the provider debits output as it comes, so
  a limiter that debited it only at the end would run behind the provider by every answer
  in flight.
- A reservation further ahead than the horizon is not waited for in the worker slot: the
  caller gets ``RetryLater`` and turns it into a Celery retry with that countdown.
- The HTTP call races the job's cancel event and is aborted at the transport when it fires;
  the lease is released and the unused reservation refunded on every path out.
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import redis

from drover._signals import HeldBack
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
from drover.workers.jobs.records import Usage
from drover.workers.limiter import Grant, ScopeLimits
from drover.workers.providers import Seen
from drover.workers.telemetry import acquire_wait, llm_call, stream_timing

log = logging.getLogger(__name__)
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
    # input and output estimates (the sub-agent marks the send with them).
    check: Callable[[int, int], Awaitable[None]] | None = None
    # Told of a call that was sent and never answered, with its input and output estimates.
    unanswered: Callable[[int, int], Awaitable[None]] | None = None
    key: str | None = None  # a pool: the key of this sub-agent's last call (sticky routing)
    # Told True when the call's answer starts streaming in (its first token), False when that
    # stream ends, however it ends (``drover watch`` shows sub-agents generating).
    generating: Callable[[bool], Awaitable[None]] | None = None
    max_cost_usd: float | None = None  # the job's cap in dollars (workers/agent/caps.py)


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


async def race(coro: Any, cancel: asyncio.Event) -> Any:
    """Await ``coro`` unless ``cancel`` fires first; then the call is cancelled mid-flight."""
    call = asyncio.ensure_future(coro)
    stop = asyncio.ensure_future(cancel.wait())
    try:
        done, _ = await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if call in done:
        return call.result()
    call.cancel()  # closes the HTTP stream: the provider sees the request go away
    try:
        await call
    except (asyncio.CancelledError, Exception):
        pass
    raise Cancelled()


def counted_input(usage: Any, cache_reads_count: bool) -> int:
    """Input tokens as the provider's ITPM counts them."""
    total = (usage.input_tokens or 0) + (getattr(usage, "cache_creation_input_tokens", 0) or 0)
    if cache_reads_count:
        total += getattr(usage, "cache_read_input_tokens", 0) or 0
    return total


@acquire_wait
async def acquire(rt: Runtime, scope: str, limits: ScopeLimits, ctx: CallContext, *,
                  input_tokens: int, output_tokens: int, route: Route | None = None) -> Grant:
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
                                        prefer=ctx.key)
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


@llm_call
async def create_message(rt: Runtime, params: dict[str, Any], ctx: CallContext) -> Any:
    """Send one ``messages.create`` inside the limits; raise RetryLater, CallFailed or Cancelled.

    With a pool of keys, a key refused (401/403) is disabled fleet-wide and the call moves to
    another key; with the one key, the refusal fails the call job-wide."""
    settings = rt.settings
    model = params["model"]
    route = rt.route(model)
    configured = settings.limits_for(model)
    cache_reads_count = bool(configured and configured.cache_reads_count)
    # With a pool, the cache reads expected are those of the key the sub-agent sticks to.
    home = (ctx.key or "") if route.pooled else ""
    est_in = rt.calibration.input_tokens(route.scope, params, cache_reads_count, home)
    # The limiter reserves more than the estimate until this scope's answers calibrate it
    # (estimate.UNCALIBRATED); the estimate is what an unanswered call counts.
    res_in = rt.calibration.input_reservation(route.scope, est_in)
    # A provider that counts max tokens at admission (OpenAI) is reserved that much.
    est_out = (params["max_tokens"] if route.provider.one_tokens_bucket
               else rt.calibration.output_tokens(route.scope, params["max_tokens"]))
    await refuse_if_never_fits(rt, model, route.scope, ctx, est_in)

    # The caps in dollars: the call's worst case reserved before anything else (caps.py).
    cost = await reserve_cost(rt, ctx.job_id, ctx.tenant, ctx.max_cost_usd, model, res_in,
                              params["max_tokens"])
    answer: Any = None
    lost: tuple[int, int] | None = None
    try:
        budget = await acquire_tenant_budget(rt, ctx, est_in + est_out)
    except BaseException:
        await settle_cost(rt, cost)
        raise
    budget_wait = max((g.wait_s for _, _, g in budget), default=0.0)
    spent: list[int | None] = [None]  # the tenant's budget settles with it (None: not sent)
    try:
        while True:
            answer = await _send(rt, route, params, ctx, (est_in, res_in), est_out,
                                 cache_reads_count, budget_wait, spent)
            if answer is not None:
                return answer
            # The key was refused (the call moves to another key), or a cooldown began while
            # the call waited (it plans again behind it).
            budget_wait = 0.0
    except BaseException as error:
        lost = getattr(error, "unanswered", None)  # sent, never answered: what it counts
        raise
    finally:
        await release_tenant_budget(rt, budget, spent=spent[0])
        await settle_cost(rt, cost, answer.usage if answer is not None else None, lost)


async def _send(rt: Runtime, route: Route, params: dict[str, Any], ctx: CallContext,
                est: tuple[int, int], est_out: int, cache_reads_count: bool,
                budget_wait: float, spent: list[int | None]) -> Any | None:
    """One try on one key; None when a pool's key was refused and disabled, or a cooldown
    began while the call waited for its send (try again). ``est``: the input estimate and
    what the limiter reserves for it. ``spent[0]``: what the tenant's budget pays for this
    try (None: nothing went out)."""
    settings = rt.settings
    est_in, res_in = est
    # The output estimate is reserved at the start (the module docstring says why; reserving
    # one token instead drew 429s at the limits: docs/limits.md), at most a full output
    # bucket: the limiter debits no more than that anyway, and the provider admits a call
    # while its output bucket has room, so a larger reservation only made the call wait for
    # room no bucket holds (a small key's first calls, before the answers calibrate it).
    # OpenAI charges max_tokens at admission, so that is reserved there (its estimate ran
    # the limiter behind the provider by every call in flight: 429s at a binding TPM).
    grant = await acquire(rt, route.scope, route.limits, ctx, input_tokens=res_in,
                          output_tokens=route.output_reservation(est_out, params["max_tokens"]),
                          route=route)
    key = route.key(grant)
    scope = key.scope
    if route.pooled:
        ctx.key = key.alias
    started = time.monotonic()
    in_flight = False  # the request may be on the wire: only a cancel can tell us it went out
    seen = Seen()  # what the stream delivered (a stream that ends early still costs that)
    message: Any = None
    try:
        waited = max(grant.wait_s, budget_wait)
        await wait_or_cancel(waited, ctx.cancel)
        while (held := await route.hold_back(rt.limiter, grant)) < 0:
            await wait_or_cancel(-held, ctx.cancel)  # a one-request bucket: paced on its last send
        if held > 0:
            raise HeldBack()  # a 429 came while this call waited: the provider's bucket is empty
        if await key_stopped(rt, route, key.alias):  # its spend limit, found meanwhile
            await route.release(rt.limiter, grant)
            ctx.key = None
            return None  # a pool's other keys
        if ctx.check is not None:  # after every wait, right before the send
            await ctx.check(est_in, est_out)
        in_flight = True
        client = key.client if route.pooled else rt.client  # the one key: the runtime's own
        seen.opened = time.monotonic()
        message = await race(route.provider.stream_turn(client, params, seen, ctx.generating),
                             ctx.cancel)
    except route.provider.api_error as error:
        # The request reached the provider (or tried to): it stays counted; its tokens too
        # when it went out and the answer was lost (the provider bills it): a stream that
        # had begun is billed what it had generated.
        lost = seen.headers is not None or route.provider.sent_unanswered(error)
        lost_in, lost_out = _lost_usage(seen, est_in, est_out, cache_reads_count)
        await route.settle(rt.limiter, grant, input_tokens=lost_in if lost else 0,
                           output_tokens=lost_out if lost and seen.started else 0,
                           max_tokens=params["max_tokens"] if lost else 0)
        spent[0] = lost_in + lost_out if lost else 0
        if lost:
            await _unanswered(rt, scope, ctx, error, lost_in, lost_out)
        decision = classify(error, attempt=ctx.failures, base_s=settings.backoff_base_s,
                            cap_s=settings.countdown_cap_s, rng=ctx.rng)
        if decision.spend_limit:  # stopped fleet-wide; a pool goes on with its other keys
            if await _spend_limited(rt, route, key.alias, decision, ctx, grant.wait_s,
                                    started):
                return None
            decision = spend_limit_decision(decision, [key.alias], route.provider.name,
                                            pooled=False)
        elif key_refused(decision):
            if route.pooled:
                await _disable_key(rt, route, key.alias, decision, ctx, grant.wait_s, started)
                return None
            decision = _only_key_refused(settings, decision)
        # The caller records the sub-agent failed once this attempt is its last: say so.
        attempt = ctx.failures + 1
        last = decision.action == "fail" or attempt >= settings.max_attempts
        headers = getattr(getattr(error, "response", None), "headers", None) or {}
        await _after_error(rt, route, grant, decision, ctx, started, last, headers)
        failure: Exception
        if decision.action == "retry":
            failure = RetryableFailure(decision.countdown, decision, retry_reason(
                decision, attempt, settings.max_attempts))
        else:
            failure = CallFailed(decision)
        if lost:
            _mark_unanswered(failure, lost_in, lost_out)  # for telemetry
        raise failure from None
    except HeldBack:
        # Planned before the 429 that emptied the provider's bucket: its lease is gone, its
        # reservation stays spent, and the call plans again behind the cooldown and the
        # calls granted before it.
        log.debug("llm call held back scope=%s job=%s sub=%d wait_s=%.3f: a cooldown began "
                  "while it waited", scope, ctx.job_id, ctx.index, grant.wait_s)
        return None
    except BaseException as error:
        # The SDK wraps every transport error in APIError, so anything else came from this
        # process: before the request went out (no credentials, a bad parameter) unless it
        # was a cancel that aborted it in flight (closing its stream), or came after the
        # answer (message is set).
        sent = message is not None or (in_flight and isinstance(
            error, Cancelled | asyncio.CancelledError))
        lost = sent and message is None
        lost_in, lost_out = _lost_usage(seen, est_in, est_out, cache_reads_count)
        if sent:
            # Aborted in flight: the provider has counted the request and its input at
            # admission, and the output it generated until the stream closed; the rest of
            # the output reservation is refunded.
            await asyncio.shield(route.settle(
                rt.limiter, grant, input_tokens=lost_in if lost else est_in,
                output_tokens=lost_out if lost and seen.started else 0,
                max_tokens=params["max_tokens"]))
        else:  # nothing went out: the whole reservation goes back
            await asyncio.shield(route.release(rt.limiter, grant))
        # Sent and never answered: billed, so the tenant's budget pays what it cost (the
        # stream's partial usage, or the estimate) and the caller counts it.
        spent[0] = (lost_in + lost_out if lost else est_in if sent else None)
        if lost:
            await asyncio.shield(_unanswered(rt, scope, ctx, error, lost_in, lost_out))
        if missing_credentials(error):
            decision = classify(error, attempt=ctx.failures, base_s=settings.backoff_base_s,
                                cap_s=settings.countdown_cap_s)
            decision = _only_key_refused(settings, decision)
            _log_failure(scope, decision, ctx, grant.wait_s, started, True)  # nothing to count
            raise CallFailed(decision) from None
        log.info("llm call outcome=%s scope=%s status=none job=%s sub=%d wait_s=%.3f "
                 "call_s=%.3f in=%d out=%d sent=%s",
                 "unanswered" if lost else "cancelled" if isinstance(error, Cancelled)
                 else "aborted", scope, ctx.job_id,
                 ctx.index, grant.wait_s, max(0.0, time.monotonic() - started - grant.wait_s),
                 lost_in if sent else 0, lost_out if lost else 0, "yes" if sent else "no")
        raise
    used_in = counted_input(message.usage, cache_reads_count)
    used_out = message.usage.output_tokens or 0
    await route.settle(rt.limiter, grant, input_tokens=used_in, output_tokens=used_out,
                       max_tokens=params["max_tokens"],
                       headers=seen.headers,  # true-up, header sync and counters in one trip
                       counts=cache_counts(params, message.usage) | seen.counts(used_out))
    spent[0] = used_in + used_out
    rt.calibration.observe(route.scope, params, message.usage, used_in, cache_reads_count,
                           key.alias if route.pooled else "")
    speed = seen.output_per_s(used_out)
    stream_timing(seen.first_token_s, speed)
    log.info("llm call outcome=ok scope=%s status=200 job=%s sub=%d wait_s=%.3f call_s=%.3f "
             "in=%d out=%d cache_read=%d est_in=%d reserved_in=%d reserved_out=%d "
             "ttft_s=%s out_per_s=%s", scope,
             ctx.job_id, ctx.index, grant.wait_s, time.monotonic() - started - grant.wait_s,
             used_in, used_out, message.usage.cache_read_input_tokens or 0, est_in,
             grant.input_tokens, grant.output_tokens,
             "none" if seen.first_token_s is None else f"{seen.first_token_s:.3f}",
             "none" if speed is None else f"{speed:.1f}")
    return message


def _lost_usage(seen: Seen, est_in: int, est_out: int, cache_reads_count: bool
                ) -> tuple[int, int]:
    """What a call that ended without its answer cost: once its stream began, the input it
    said (the estimate where it said none: an OpenAI stream tells its prompt's count only in
    its last chunk, and the prompt is billed at admission) and the output generated until it
    closed; before that, the estimate."""
    if seen.started:
        said_in = seen.partial_input(cache_reads_count) if seen.input_said else est_in
        return said_in, seen.partial_output()
    return est_in, est_out


def _only_key_refused(settings: Any, decision: Decision) -> Decision:
    """The fleet's only key was refused (or there is none): no call of the job can succeed."""
    what = " ".join(str(p) for p in (decision.status_code, decision.error_type) if p)
    openai = settings.provider == "openai"
    var = "OPENAI_API_KEY" if openai else "ANTHROPIC_API_KEY"
    key = settings.openai_api_key if openai else settings.anthropic_api_key
    console = "the provider's console" if openai else "the Anthropic console"
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
    await asyncio.to_thread(rt.store.counters.count_failed_call, ctx.job_id, decision.counter)
    log.warning("llm call outcome=%s scope=%s status=%s type=%s job=%s sub=%d wait_s=%.3f "
                "call_s=%.3f in=0 out=0 next=another_key", decision.counter, scope,
                decision.status_code or "none", decision.error_type, ctx.job_id, ctx.index,
                wait_s, time.monotonic() - started - wait_s)
    ctx.key = None


async def job_answered(rt: Runtime, job_id: str, usage: Any, *, model: str,
                       batch: bool = False, settles: str | None = None) -> None:
    """Count a job-level call's answer (planning, synthesis) in the job's own usage, priced
    at ``model``'s price (and clear the send mark of ``settles``, the part it answers)."""
    counted = Usage()
    counted.add(usage, batch=batch, price=rt.settings.price_of(model))
    await asyncio.to_thread(rt.store.spending.add_job_usage, job_id, counted, settles=settles)


async def job_unanswered(rt: Runtime, job_id: str, est_in: int, est_out: int, *, model: str,
                         settles: str | None = None) -> None:
    """Count a job-level call that was sent and never answered, at its estimate."""
    counted = Usage()
    counted.add_unanswered(est_in, est_out, rt.settings.price_of(model))
    await asyncio.to_thread(rt.store.spending.add_job_usage, job_id, counted, settles=settles)


def job_call_context(rt: Runtime, job_id: str, part: str, cancel: asyncio.Event,
                     failures: int = 0, *, model: str) -> CallContext:
    """The context of a job's own call (``part``: "plan" or "synthesis") to ``model``: counted
    in the job's usage, and its send marked right before it goes out, so that a delivery which
    finds the mark (its worker died mid-call: ``count_lost_job_call``) counts that call as
    unanswered. The mark goes when the answer is counted, or when the call ends otherwise
    (``job_call``)."""
    ctx = CallContext(job_id, -1, cancel, failures)

    async def mark(est_in: int, est_out: int) -> None:
        await asyncio.to_thread(rt.store.spending.mark_job_send, job_id, part, est_in, est_out)

    ctx.check = mark
    ctx.unanswered = partial(job_unanswered, rt, job_id, model=model, settles=part)
    return ctx


async def job_call(rt: Runtime, params: dict[str, Any], ctx: CallContext, part: str) -> Any:
    """``create_message`` for a job's own call: whatever ends the call here (an answer, an
    error, a countdown, a cancel) ends its send mark too; only a death mid-call leaves it."""
    try:
        return await create_message(rt, params, ctx)
    except BaseException:
        await asyncio.to_thread(rt.store.spending.clear_job_send, ctx.job_id, part)
        raise


async def count_lost_job_call(rt: Runtime, job_id: str, part: str, *, model: str) -> None:
    """A job's own call to ``model`` sent by a delivery that died before its answer: counted
    once, now."""
    lost = await asyncio.to_thread(rt.store.spending.count_lost_job_send, job_id, part,
                                   rt.settings.price_of(model))
    if lost is not None:
        log.warning("job %s: its %s call was sent by a delivery that was lost before the "
                    "answer; counted as unanswered (about %d input, up to %d output tokens)",
                    job_id, part, lost[0], lost[1])


def _mark_unanswered(error: BaseException, est_in: int, est_out: int) -> None:
    """What telemetry reads (``getattr(error, "unanswered")``) on whatever exception ended a
    call sent and never answered, the SDK's own among them."""
    with contextlib.suppress(TypeError):  # an exception type without a __dict__
        vars(error)["unanswered"] = (est_in, est_out)


async def _unanswered(rt: Runtime, scope: str, ctx: CallContext, error: BaseException,
                      est_in: int, est_out: int) -> None:
    """Tell the caller of a call sent and never answered, count it for ``drover stats``, and
    mark ``error`` for the metrics."""
    _mark_unanswered(error, est_in, est_out)
    try:
        await asyncio.to_thread(rt.store.counters.count_unanswered, scope, est_in, est_out,
                                rt.settings.stats_window_s)
    except Exception as problem:  # the caller's own count (the record) is what bills
        log.warning("unanswered call of %s not counted for drover stats (%s)", scope,
                    type(problem).__name__)
    if ctx.unanswered is not None:
        await ctx.unanswered(est_in, est_out)


async def _after_error(rt: Runtime, route: Route, grant: Grant, decision: Decision,
                       ctx: CallContext, started: float, last: bool,
                       headers: Any) -> None:
    scope = route.key(grant).scope
    if decision.cooldown_s is not None:
        await route.cooldown(rt.limiter, grant, decision.cooldown_s, headers)
    # Every failed call, by kind, for the job (telemetry's llm_call counts it for the fleet).
    await asyncio.to_thread(rt.store.counters.count_failed_call, ctx.job_id, decision.counter)
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
