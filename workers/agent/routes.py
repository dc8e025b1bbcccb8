"""Where one LLM call's reservation lives: the one key, or a key of a pool.

With one key (no ``DROVER_KEYS``) a call reserves in the scope ``llm:{DROVER_KEY_ALIAS}:{model
class}``, exactly as before pools existed. With a pool, one script reserves in the
organisation's buckets of the model class and in those of the key whose grant comes first
(``acquire.lua``); a sub-agent's later turns prefer the key of its earlier ones (its
prompt cache lives in that key's workspace) while that key's grant comes at most
``DROVER_KEY_STICKY_S`` later. Each level is then a scope of its own: settled, released and
cooled down on its own.

A pool may also hold Claude on Amazon Bedrock and Google Vertex AI (``"provider": "bedrock"`` /
``"vertex"`` entries): they serve the Anthropic API's models beside its keys, each with its
own provider (its SDK client, its errors, its way of counting) and its own buckets, under no
organisation: DROVER_RPM/ITPM/OTPM are the Anthropic organisation's and hold its keys only,
and a cloud's throttling cools down that entry alone. Every sender reaches the clouds' entries
(the limited clients' transport sends a cloud's grant through that entry's SDK client:
``providers/_cloud.py``).

The provider's headers show, per dimension, the most restrictive limit in effect: a header
whose ``-limit`` is the key's (workspace's) limit describes the key's bucket, one whose
``-limit`` is the organisation's describes the organisation's, so each level folds in only the
headers that are about it, and a 429 cools down the level whose limit it hit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from drover.config import ModelLimits, Settings
from drover.workers.agent.limits import llm_limits, scaled_limits
from drover.workers.limiter import (
    Grant,
    Held,
    ScopeLimits,
    llm_scope,
    org_scope,
    pool_scope,
)
from drover.workers.providers import (
    LimitReadings,
    Pool,
    Provider,
    coarse_readings_dropped,
    fine_dimensions,
)
from drover.workers.providers import provider as _provider

__all__ = ["KeyRoute", "Route", "all_disabled_message", "levels_of_readings"]

log = logging.getLogger(__name__)
# A dimension of the limits -> the limit setting that configures it.
_SETTING = {"requests": "rpm", "input": "itpm", "output": "otpm", "tokens": "tpm"}


@dataclass
class KeyRoute:
    """The key a granted call goes out on: its alias, its client and its scope; its provider
    (a pool's Bedrock or Vertex AI entry serves the Anthropic API's models)."""

    alias: str
    scope: str
    limits: ScopeLimits  # ``alone``: under no organisation (a cloud's entry)
    raw: ModelLimits | None  # the key's own configured limits, before the utilisation
    client: Any
    provider: Provider


class Route:
    """One call's limits: the one key's scope, or a pool's organisation and keys."""

    def __init__(self, settings: Settings, model: str, client: Any,
                 pool: Pool | None = None, provider: Provider | None = None) -> None:
        self.settings = settings
        self.model = model
        # None: Anthropic's, imported only when asked for (an OpenAI fleet never imports it)
        self.provider = provider or _provider("anthropic")
        self.model_class = settings.limit_class(model)
        self.limits = llm_limits(settings, model)
        self.org_raw = settings.limits_for(model)
        self.pool = pool
        if pool is None:
            self.scope = llm_scope(settings.key_alias, self.model_class)
            self.one = KeyRoute(settings.key_alias, self.scope, self.limits, self.org_raw,
                                client, self.provider)
        else:
            self.scope = org_scope(self.model_class)
            # Only the keys of the model's provider can serve it (Claude: the Anthropic API's
            # and the clouds' entries).
            self.keys = [self._key_route(k, pool) for k in pool.keys
                         if settings.key_serves(k) == self.provider.name]

    def _key_route(self, key: Any, pool: Pool) -> KeyRoute:
        settings, model = self.settings, self.model
        of = _provider(settings.key_provider(key))
        raw = settings.key_limits_for(key, model)
        limits = scaled_limits(settings, raw, max_in_flight=None)
        if of.alone:  # its own buckets, counted its way; no headers teach a share
            limits = replace(limits, output_weight=of.output_weight(key), alone=True,
                             learn_share=False)
        return KeyRoute(key.alias, pool_scope(key.alias, self.model_class), limits, raw,
                        pool.clients[key.alias], of)

    @property
    def pooled(self) -> bool:
        return self.pool is not None

    def key_scope(self, alias: str) -> str:
        """The scope of a key's own level (the one key's scope without a pool)."""
        return self.scope if self.pool is None else pool_scope(alias, self.model_class)

    def key(self, grant: Grant) -> KeyRoute:
        if self.pool is None:
            return self.one
        return next(k for k in self.keys if k.alias == grant.key)

    def output_reservation(self, estimate: int, max_tokens: int | None = None) -> int:
        """What a call reserves for an output ``estimate``: at most the smallest output bucket
        of the levels it reserves in (the limiter debits no more than a bucket, and a call
        planned to wait for more waited for room no bucket holds). A provider of one tokens
        bucket (OpenAI) charges ``max_tokens`` at admission: that is what is reserved."""
        if self.provider.one_tokens_bucket:
            return estimate if max_tokens is None else max_tokens
        keys = [k.limits for k in self.keys] if self.pool else []
        # The organisation's buckets count unless every entry is a cloud's.
        levels = keys if keys and all(k.alone for k in keys) else [self.limits, *keys]
        buckets = [lim.otpm / 60 * lim.burst_s for lim in levels if lim.otpm]
        if not buckets:
            return estimate
        return max(1, min(estimate, int(min(buckets))))

    async def acquire(self, limiter: Any, *, input_tokens: int, output_tokens: int,
                      lease_ttl_s: float, prefer: str | None, max_tokens: int = 0) -> Grant:
        """``max_tokens``: the call's, which a tokens quota (Bedrock's) takes at admission."""
        if self.pool is None:
            return await limiter.acquire(self.scope, self.limits, input_tokens=input_tokens,
                                         output_tokens=output_tokens, lease_ttl_s=lease_ttl_s,
                                         max_tokens=max_tokens)
        return await limiter.acquire_pool(
            self.model_class, self.limits, [(k.alias, k.limits) for k in self.keys],
            input_tokens=input_tokens, output_tokens=output_tokens, prefer=prefer,
            sticky_s=self.settings.key_sticky_s, lease_ttl_s=lease_ttl_s,
            max_tokens=max_tokens)

    async def settle(self, limiter: Any, grant: Grant, *, input_tokens: int,
                     output_tokens: int, headers: Mapping[str, str] | None = None,
                     counts: Mapping[str, int] | None = None, max_tokens: int = 0) -> None:
        """True up each level; ``counts`` (the answer's cache figures) go to each level's
        counters, as its tokens do. ``max_tokens``: the call's, when the provider admitted
        it. A provider of one tokens bucket (OpenAI) charged input + max tokens at admission
        and gives none of it back when the answer is shorter, so its bucket is settled to
        that: settled to the answer's output, the limiter credited the unused max tokens
        and ran ahead of the provider (3 429s in 12 calls at a binding TPM with
        DROVER_BURST_SECONDS=10 matching the provider's bucket; 0 with this)."""
        key = self.key(grant)
        if self.provider.one_tokens_bucket:
            output_tokens = max(output_tokens, max_tokens)
        # A -remaining rounded too coarsely for its bucket reads 0 full or empty: not a
        # level to sync to, nor a share of the key to learn from.
        readings = None if headers is None else coarse_readings_dropped(
            key.provider.read_limits(headers), key.provider.remaining_steps,
            self.limits.burst_s)
        if self.pool is None:
            await limiter.settle(self.scope, self.limits, grant, input_tokens=input_tokens,
                                 output_tokens=output_tokens, readings=readings,
                                 counts=counts)
            return
        org_h, key_h = (None, None) if readings is None else split_readings(
            readings, self.org_raw, key.raw)
        if not key.limits.alone:
            await limiter.settle(self.scope, self.limits, grant, input_tokens=input_tokens,
                                 output_tokens=output_tokens, readings=org_h, counts=counts)
        await limiter.settle(key.scope, key.limits, grant, input_tokens=input_tokens,
                             output_tokens=output_tokens, readings=key_h, counts=counts)

    async def hold_back(self, limiter: Any, grant: Grant, report: bool = False) -> Held:
        """Seconds a cooldown still holds on a level the grant reserved in (0.0: none, send
        it); when one does, the grant is spent and the call plans again. Below 0: the wait
        before a paced send may go (``Limiter.hold_back``); inf: the one key is stopped
        fleet-wide (read in the same trip; ``spend_limit.key_stopped`` says whether for its
        spend limit). A pool's key disabled meanwhile holds its grant back a day.
        ``report``: a stream, whose headers' arrival the caller tells ``admitted`` when the
        answer's ``Held.report`` asks it to (a paced send)."""
        if self.pool is None:
            return await limiter.hold_back(  # type: ignore[no-any-return]
                grant, self.scope, stop=self.one.alias, report=report)
        return await limiter.hold_back(  # type: ignore[no-any-return]
            grant, *self._levels(grant), report=report)

    async def admitted(self, limiter: Any, grant: Grant) -> None:
        """A paced send's response headers came back (``Limiter.admitted``)."""
        if self.pool is None:
            await limiter.admitted(grant, self.scope)
        else:
            await limiter.admitted(grant, *self._levels(grant))

    def _levels(self, grant: Grant) -> list[str]:
        """A pool's scopes the grant reserved in: its key's, and the organisation's unless
        the key is ``alone``."""
        key = self.key(grant)
        return [key.scope] if key.limits.alone else [self.scope, key.scope]

    async def release(self, limiter: Any, grant: Grant) -> None:
        if self.pool is None or not self.key(grant).limits.alone:
            await limiter.release(self.scope, grant)
        if self.pool is not None:
            await limiter.release(self.key(grant).scope, grant)

    async def cooldown(self, limiter: Any, grant: Grant, retry_after_s: float,
                       headers: Mapping[str, str]) -> None:
        """A 429: cool down the level whose limit it hit (both when the headers cannot
        tell)."""
        if self.pool is None:
            await limiter.cooldown(self.scope, self.limits, retry_after_s,
                                   self.learnable(self.limits))
            return
        key = self.key(grant)
        if key.limits.alone:  # a cloud's throttling: that entry alone
            await limiter.cooldown(key.scope, key.limits, retry_after_s, [])
            return
        for level in levels_of_429(key.provider.read_limits(headers), self.org_raw, key.raw):
            scope, limits = (self.scope, self.limits) if level == "org" else (key.scope,
                                                                              key.limits)
            await limiter.cooldown(scope, limits, retry_after_s, self.learnable(limits))

    def learnable(self, limits: ScopeLimits) -> list[str]:
        """The dimensions whose share of the key a 429 may cut: those whose -remaining
        headers are read (not rounded too coarsely for the bucket), the only ones that can
        teach a cut share back."""
        return fine_dimensions({dim: getattr(limits, attr) for dim, attr in _SETTING.items()},
                               self.provider.remaining_steps, limits.burst_s)


def _matches(value: float | None, limit: float | None) -> bool:
    return value is not None and limit is not None and abs(value - limit) <= 0.01 * limit


def levels_of_readings(readings: LimitReadings | None, org: ModelLimits | None,
                       key: ModelLimits | None) -> dict[str, str]:
    """Per dimension ('requests', ...) the level its headers describe: 'key' when the
    ``-limit`` is the key's own limit, 'org' when it is the organisation's, else the level
    that configures no limit of that dimension ('key' if neither does: a learned limit)."""
    limit = (readings or {}).get("limit") or {}
    out: dict[str, str] = {}
    for dim, attr in _SETTING.items():
        seen = limit.get(dim)
        k = getattr(key, attr) if key is not None else None
        o = getattr(org, attr) if org is not None else None
        if _matches(seen, k) and not _matches(seen, o):
            out[dim] = "key"
        elif _matches(seen, o):
            out[dim] = "org" if not _matches(seen, k) else "both"
        elif k is None and o is not None:
            out[dim] = "key"  # the key's limit is not configured: the headers teach it
        elif o is None and k is not None:
            out[dim] = "org"
        else:
            out[dim] = "key"
    return out


def split_readings(readings: LimitReadings, org: ModelLimits | None, key: ModelLimits | None
                   ) -> tuple[LimitReadings, LimitReadings]:
    """What each level folds in of the headers' readings (see levels_of_readings)."""
    levels = levels_of_readings(readings, org, key)
    org_r: LimitReadings = {"remaining": {}, "limit": {}}
    key_r: LimitReadings = {"remaining": {}, "limit": {}}
    for part in ("remaining", "limit"):
        for dim, value in (readings.get(part) or {}).items():
            level = levels.get(dim, "key")
            if level in ("org", "both"):
                org_r[part][dim] = value
            if level in ("key", "both"):
                key_r[part][dim] = value
    return org_r, key_r


def levels_of_429(readings: LimitReadings | None, org: ModelLimits | None,
                  key: ModelLimits | None) -> list[str]:
    """The level(s) a 429 hit: those described by the dimensions whose ``-remaining`` is
    lowest relative to their limit (an exhausted bucket); both when the headers say nothing."""
    remaining = (readings or {}).get("remaining") or {}
    limit = (readings or {}).get("limit") or {}
    levels = levels_of_readings(readings, org, key)
    fractions = [(r / limit[dim], dim) for dim, r in remaining.items() if limit.get(dim)]
    if not fractions:
        return ["key", "org"]
    low = min(f for f, _ in fractions)
    hit = {levels.get(dim, "key") for f, dim in fractions if f <= low + 1e-9}
    out = sorted({"org", "key"} if "both" in hit else hit)
    return out or ["key", "org"]


def all_disabled_message(aliases: list[str], disabled: Mapping[str, Mapping[str, Any]],
                         pooled: bool) -> str:
    """The one message every unfinished sub-agent of a job ends with when no key is left."""
    why = "; ".join(f"{a}: {disabled.get(a, {}).get('reason') or 'refused'}" for a in aliases)
    if pooled:
        return (f"every key of the pool is disabled ({why}). Check these keys in the "
                "Anthropic console (revoked, disabled, or without access to this model), fix "
                "or replace them in DROVER_KEYS, then run `drover keys enable ALIAS` (or set "
                "DROVER_KEY_REENABLE_S to let keys rejoin by themselves)")
    return (f"the API key '{why}' was refused. Check it in the Anthropic console, then set "
            "ANTHROPIC_API_KEY on every worker's host to a valid key and restart the workers "
            "(with a simulator, any non-empty key works: ANTHROPIC_API_KEY=sk-sim)")
