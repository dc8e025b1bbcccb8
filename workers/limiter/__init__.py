"""The global rate limiter: one set of buckets per scope in Redis, shared by every worker on
every host. Depends on redis only.

A *scope* is what the provider limits together: ``llm:{key alias}:{model}``, or
``tool:{name}`` for a service a tool calls. Each has up to three buckets (requests, input
tokens and output tokens per minute, each holding ``burst_s`` of refill), in-flight leases,
a cooldown, limits learned from response headers, per-second usage counters and what it
learned of its share of the key, all under the scope's own hash tag (``LimiterCore.keys``)
and changed only by the Lua scripts in ``lua/``, one script call per operation, each taking
one JSON argument of named fields (a scope is listed by `scopes()` while its bucket or
counters live)::

    grant = limiter.acquire(scope, limits, input_tokens=est_in, output_tokens=est_out)
    if not grant.granted:          # reason: horizon | cooldown | in_flight; nothing debited
        come back after grant.retry_after_s
    sleep(grant.wait_s)            # the reservation is made: send at the planned instant
    if grant.wait_s and limiter.hold_back(grant, scope):  # a 429 came meanwhile: the
        acquire again                                     # grant is spent, not sent
    response = call the API        # on a 429: limiter.cooldown(scope, limits, retry_after)
    limiter.settle(scope, limits, grant, input_tokens=used_in, output_tokens=used_out,
                   readings=provider.read_limits(response.headers))  # or release if unsent

**State: GCRA, one number per dimension.** A bucket is kept as its theoretical arrival time
(``tat``, microseconds of Redis ``TIME``): the instant at which it is full again with every
reservation made so far paid for. Its level at ``t`` is ``capacity - (tat - t) x rate``,
full once ``tat <= t``. We chose this over a hash of levels and an update time because
reservations are about the future: a request queued behind others is planned at
``s = tat + cost/rate - burst`` and debited with ``tat = max(tat, s) + cost/rate``, with no
refill to compute, no separate clock field and no special case for levels that lie ahead of
now (a cooldown, a queue). Every other operation is one line on ``tat`` too: a cooldown
until ``c`` is ``tat >= c + burst`` (empty at its end), a ``-remaining`` header ``r`` is
``tat >= now + (capacity - r)/rate`` (it only lowers a level), a refund ``tat -= credit/rate``.
The scope's bucket is one Redis hash (``r``, ``i``, ``o`` plus the limits of the last write,
so ``release`` and ``state`` need none, the cooldown and the last lease's expiry), the leases
a sorted set (lease id -> expiry, so a dead worker's slot frees itself), learned limits,
counters and the learned share hashes of their own (``lua/_lib.lua`` lists every field).

Decisions worth knowing:

- Time is Redis ``TIME`` inside the scripts, never a worker's clock. Tests inject a clock
  through the constructor (``clock=``); the scripts then read it from their last argument,
  after the JSON one.
- A request is judged against the horizon with its cost capped at the bucket's capacity (so
  an oversized request is not refused for ever), and waits for all of it. A dimension with a
  cost of 0 does not wait. A refusal (horizon, cooldown, in-flight cap) debits nothing.
- Refunds (``settle`` below the reservation, ``release``) are credited in full, capped: a
  level never rises above capacity, nor above empty at the end of a cooldown. Extra use is
  debited at settle. Worst case (``tests/helpers/limiter_model.py``, checked by the hypothesis state
  machine): the sends in a window [a, b] may exceed ``capacity + rate x (b - a)`` by the
  refunds of earlier sends credited while that window's sends were being planned, because a
  refund cannot know whether the provider's bucket, full in the meantime, lost it anyway.
  With reservations that are estimates a few percent off, that is a few hundred tokens
  against a capacity of ~20k; against the provider's minute-long bucket it is nothing, and
  the simulator with buckets equal to ours sees no 429 (``bench/RESULTS.md``).
- ``-limit`` headers are stored raw (24 h) for dimensions the ``ScopeLimits`` leaves None,
  then used times ``learned_utilization``; a configured limit always wins.
- ``learn_share`` (LLM scopes): the key may be used by other software too. Over windows of
  a few seconds, the change of a ``-remaining`` header plus what our calls sent in the window
  used is what the provider's bucket refilled for us: that over the key's limit is the share
  left for us, which multiplies the limits; a 429 cuts it by a tenth. Its own state (the
  scope's share hash) and code, with the reasoning: ``lua/_share.lua``.
- ``hold_back`` (right before a granted call that waited goes out): a cooldown that began
  while it waited holds it back; its lease goes and its reservation stays debited (a refund
  would let it, planned again, take the place of a call already granted for after the
  cooldown: two sends for one place).
- Counters (``STAT_FIELDS``): requests at the planned send second, tokens and the answer's
  cache figures at the settle second, waits at the acquire second (all written by
  ``settle``), others via ``record``. Calls by outcome (429s, 529s, ...) are telemetry's
  ``drover_llm_calls``, not the limiter's.
"""

from drover.workers.limiter._limiter import AsyncLimiter, Limiter
from drover.workers.limiter._scripts import Readings
from drover.workers.limiter._scopes import (
    ORG,
    POOL_TAG,
    STAT_FIELDS,
    Grant,
    ScopeLimits,
    llm_scope,
    org_scope,
    pool_scope,
    split_llm_scope,
    tool_scope,
)

__all__ = ["ORG", "POOL_TAG", "STAT_FIELDS", "AsyncLimiter", "Grant", "Limiter", "ScopeLimits",
           "Readings", "llm_scope", "org_scope", "pool_scope", "split_llm_scope",
           "tool_scope"]
