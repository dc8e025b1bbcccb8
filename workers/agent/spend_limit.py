"""The provider's spend limit, once per key.

A key that reached its organisation's (or workspace's) monthly spend limit (Anthropic: a 429
whose ``error.details.error_code`` is ``enforced_spend_limit_reached``; OpenAI: a 429
``insufficient_quota``) will refuse every request until the limit is raised or the month
turns. The first refusal stops the key for every worker and every client: the limiter's
fleet-wide key flag (the one a pool's 401/403 sets, ``Limiter.disable_key``) until the first
of next month, 00:00 UTC, or until ``drover keys enable ALIAS``. A pool goes on with its other
keys; the one key, or a pool with none left, ends the job's unfinished sub-agents at once
with a message that names the spend limit and how to raise it. No request is sent on a
stopped key: the pool's acquire skips it, and the check right before each send
(``hold_back.lua``, the same trip to Redis) holds back a grant whose key was stopped since.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from drover.config.providers import about
from drover.workers.agent.errors import CallFailed
from drover.workers.agent.retry import Decision
from drover.workers.agent.routes import Route
from drover.workers.agent.runtime import Runtime

__all__ = ["REASON", "is_spend_limit", "key_stopped", "spend_limit_decision",
           "spend_limit_message", "stop_key", "until_month_turns"]

REASON = "spend limit"  # how a stopped key's reason begins (drover keys, drover stats)
ERROR_TYPE = "spend_limit_reached"


def until_month_turns(now: datetime | None = None) -> float:
    """Seconds until the first day of next month, 00:00 UTC (when the provider lifts it)."""
    now = now or datetime.now(UTC)
    first = (datetime(now.year + 1, 1, 1, tzinfo=UTC) if now.month == 12
             else datetime(now.year, now.month + 1, 1, tzinfo=UTC))
    return max(1.0, (first - now).total_seconds())


def is_spend_limit(reason: str | None) -> bool:
    return bool(reason) and str(reason).startswith(REASON)


def spend_limit_message(aliases: list[str], provider: str, pooled: bool) -> str:
    """The one message every unfinished sub-agent ends with: what happened, how to go on."""
    where = about(provider).spend_limit_page
    keys = ", ".join(aliases)
    which = f"every key of the pool ({keys}) has" if pooled else f"the API key {keys} has"
    enable = " ".join(f"`drover keys enable {a}`" for a in aliases)
    return (f"{which} reached the provider's spend limit (no request is sent on it until "
            f"the limit is raised or the month turns). Raise the limit in {where}, then run "
            f"{enable} and `drover retry JOB` to run the sub-agents that did not finish "
            "(those that did are not sent again)")


def spend_limit_decision(decision: Decision, aliases: list[str], provider: str,
                         pooled: bool) -> Decision:
    """``decision`` as the job-wide failure of a job with no key left (the provider's own
    words, when this is the refusal itself, in brackets at the end)."""
    said = f" [the provider said: {decision.message}]" if decision.message else ""
    return replace(decision, error_type=ERROR_TYPE, status_code=decision.status_code or 429,
                   message=spend_limit_message(aliases, provider, pooled) + said,
                   job_wide=True, spend_limit=True)


async def stop_key(rt: Runtime, alias: str, decision: Decision) -> bool:
    """Stop ``alias`` fleet-wide until the month turns (or ``drover keys enable``); True for
    the call that stopped it."""
    what = " ".join(str(p) for p in (decision.status_code, decision.error_type) if p)
    return bool(await rt.limiter.disable_key(alias, for_s=until_month_turns(),
                                             why=f"{REASON} ({what}): {decision.message[:160]}"))


async def key_stopped(rt: Runtime, route: Route, alias: str) -> bool:
    """``alias`` was found stopped right before a send (``Route.hold_back`` answered inf):
    for the one key, CallFailed (job-wide) when it is stopped for its spend limit, else
    False (stopped by ``drover keys disable``: sent); for a pool's, True when it is
    disabled. So no request goes out on a key stopped for its spend limit."""
    disabled: Mapping[str, Mapping[str, Any]] = await rt.limiter.disabled_keys()
    off = disabled.get(alias)
    if route.pooled:
        return off is not None
    if off is not None and is_spend_limit(off.get("reason")):
        raise CallFailed(spend_limit_decision(
            Decision("fail", ERROR_TYPE, "", 429), [alias], route.provider.name,
            pooled=False))
    return False
