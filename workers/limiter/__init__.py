"""The global rate limiter: one set of buckets per scope in Redis, shared by every worker on
every host. Depends on redis only; docs/limiter.md says how it behaves, and each script in
``lua/`` its rule (``lua/_lib.lua`` lists a scope's keys and fields).

A *scope* is what the provider limits together (``llm:{key alias}:{model}``, or
``tool:{name}``): its buckets, leases, cooldown, learned limits and share, and counters live
under its own hash tag, changed only by the scripts, one script call per operation::

    grant = limiter.acquire(scope, limits, input_tokens=est_in, output_tokens=est_out)
    if not grant.granted:          # reason: horizon | cooldown | in_flight; nothing debited
        come back after grant.retry_after_s
    sleep(grant.wait_s)            # the reservation is made: send at the planned instant
    while (held := limiter.hold_back(grant, scope)) < 0: sleep(-held)  # paced (one request)
    if held: acquire again         # a 429 came meanwhile: the grant is spent, not sent
    response = call the API        # on a 429: limiter.cooldown(scope, limits, retry_after)
                                   # (a paced stream, hold_back(..., report=True) answered
                                   # held.report: limiter.admitted(grant, scope) at its headers)
    limiter.settle(scope, limits, grant, input_tokens=used_in, output_tokens=used_out,
                   readings=provider.read_limits(response.headers))  # or release if unsent

**Why GCRA, one number per dimension.** A bucket is kept as its theoretical arrival time
(``tat``, us of Redis ``TIME``): the instant it is full again, every reservation paid for.
Reservations are about the future: a queued request is planned at ``tat + cost/rate - burst``
and debited with ``tat = max(tat, send) + cost/rate``, with no refill to compute and no
special case for levels ahead of now; a cooldown, a header and a refund are one line each.
Tests inject a clock (``clock=``), which the scripts then read from their last argument.
"""

from drover.workers.limiter._limiter import AsyncLimiter, Limiter
from drover.workers.limiter._scopes import (
    ORG,
    POOL_TAG,
    STAT_FIELDS,
    Grant,
    Held,
    ScopeLimits,
    llm_scope,
    org_scope,
    pool_scope,
    split_llm_scope,
    tool_scope,
)
from drover.workers.limiter._scripts import Readings

__all__ = ["ORG", "POOL_TAG", "STAT_FIELDS", "AsyncLimiter", "Grant", "Held", "Limiter",
           "ScopeLimits", "Readings", "llm_scope", "org_scope", "pool_scope", "split_llm_scope",
           "tool_scope"]
