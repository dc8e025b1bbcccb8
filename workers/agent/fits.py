"""Requests the provider's limits can never admit, found before anything waits for them.

A limit is per minute and its bucket holds at most a minute. A request whose input tokens
are more than a whole minute of the input-token limit (ITPM) is refused by the provider every
time ("This request would exceed the rate limit ... of N input tokens per minute"), and the
limiter would hold it for ever too (it caps a cost at its bucket's capacity and waits for all
of it, and each retry waits again). Such a call fails at once instead, with the sizes, the
limit and what to change.

``max_tokens`` is not judged against the output-token limit (OTPM): the provider counts the
output tokens a request generates, not its ``max_tokens`` (``shared/anthropic-api.md``; older
docs reserved ``max_tokens`` at admission), and drover's limiter reserves the start of an
answer and settles with what it was. A ``max_tokens`` above a minute of OTPM is a cap most
answers never reach: refusing it would refuse requests the provider admits.

The limits are the configured ones (``DROVER_ITPM``, ``DROVER_LIMITS``, a pool key's own),
else the one learned from the provider's ``-limit`` header (the limiter keeps it per scope for
24 h: ``Limiter.state(scope)["learned"]``). With a pool a request must fit the organisation's
limit and the limit of at least one key.

Light on purpose (no SDK): ``submit`` refuses a spec that shows it on its own here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from drover.config import ModelLimits, PoolKey, Settings
from drover.config.providers import about
from drover.workers.limiter import llm_scope, org_scope, pool_scope

__all__ = ["Level", "levels", "never_fits", "spec_never_fits", "unconfigured_scopes"]

Learned = Mapping[str, Mapping[str, float | None]]  # scope -> {"itpm": ...}


def _tokens(settings: Settings, model: str) -> tuple[str, str, str]:
    """The limit a call's input must fit in a minute of, on ``model``'s provider: the
    ModelLimits attribute, the header that teaches it, and the noun in messages (OpenAI's
    counts input and output)."""
    limit = about(settings.provider_of(model)).tokens_limit
    return limit.setting, limit.header, limit.word


@dataclass(frozen=True)
class Level:
    """One set of limits a call must fit: the one key, a pool's organisation, or a pool key."""

    scope: str
    configured: ModelLimits | None
    key: PoolKey | None = None  # a pool's key (None: the one key, or the organisation)
    pool_key: bool = False


def levels(settings: Settings, model: str) -> list[Level]:
    """The one key's level, or a pool's organisation followed by each of its keys."""
    cls = settings.limit_class(model)
    if not settings.pooled:
        return [Level(llm_scope(settings.key_alias, cls), settings.limits_for(model))]
    return [Level(org_scope(cls), settings.limits_for(model)), *(
        Level(pool_scope(k.alias, cls), settings.key_limits_for(k, model), k, True)
        for k in settings.keys)]


def unconfigured_scopes(settings: Settings, model: str) -> list[str]:
    """The scopes whose input-token limit only the provider's headers can tell."""
    return [lv.scope for lv in levels(settings, model)
            if getattr(lv.configured, _tokens(settings, model)[0], None) is None]


def _setting(settings: Settings, model: str, attr: str, key: PoolKey | None) -> str:
    """The name of the setting a configured limit comes from."""
    names = (settings.limit_class(model), model)
    if key is not None:
        entry = next((n for n in names if n in key.limits), None)
        return (f"DROVER_KEYS[{key.alias}].limits[{entry!r}].{attr}" if entry
                else f"DROVER_KEYS[{key.alias}].{attr}")
    entry = next((n for n in names if n in settings.limits), None)
    return f"DROVER_LIMITS[{entry!r}].{attr}" if entry else f"DROVER_{attr.upper()}"


def _limit(settings: Settings, model: str, level: Level, attr: str,
           learned: Learned) -> tuple[float, str, bool] | None:
    """(per-minute limit, where it comes from, configured) of one dimension; None: unknown."""
    value = getattr(level.configured, attr, None)
    if value is not None:
        return float(value), _setting(settings, model, attr, level.key), True
    seen = (learned.get(level.scope) or {}).get(attr)
    if seen:
        return float(seen), (f"learned from the provider's "
                             f"{_tokens(settings, model)[1]} header"), False
    return None


def _binding(settings: Settings, model: str, attr: str, need: int,
             learned: Learned) -> tuple[float, str, bool, str] | None:
    """The limit ``need`` exceeds a whole minute of (with where it comes from, whether it is
    configured, and what it limits: the model, or each key of a pool); None if it may fit."""
    found = levels(settings, model)
    head, keys = found[0], found[1:]
    limit = _limit(settings, model, head, attr, learned)
    if limit is not None and need > limit[0]:
        return (*limit, f"{model}'s")
    if keys:  # a pool: it fits if one key can take it (a key with no limit of its own can)
        each = [_limit(settings, model, lv, attr, learned) for lv in keys]
        if all(e is not None and need > e[0] for e in each):
            largest = max((e for e in each if e is not None), key=lambda e: e[0])
            return (*largest, f"the largest pool key's {model}")
    return None


def never_fits(settings: Settings, model: str, *, input_tokens: int,
               learned: Learned | None = None) -> str | None:
    """Why a call of ``input_tokens`` (estimated, as ITPM counts them) could never be sent, in
    a sentence that says what to change; None when it may fit."""
    learned = learned or {}
    attr, _, noun = _tokens(settings, model)
    over = _binding(settings, model, attr, input_tokens, learned)
    if over is not None:
        limit, source, configured, whose = over
        fix = ("Shorten the subtask, the system prompt or the tool results, or raise the limit "
               "if your key has more" if configured else
               "Shorten the subtask, the system prompt or the tool results (the limit is the "
               "one the provider reports for your key; set it in DROVER_LIMITS once it is "
               "raised)")
        return (f"this call needs about {input_tokens:,} input tokens (estimated), more than a "
                f"whole minute of {whose} {noun} limit, {limit:,.0f} ({source}): it could "
                f"never be sent. {fix}")
    return None


def spec_never_fits(settings: Settings, model: str, prefix_tokens: int) -> str | None:
    """What a job spec shows on its own (before anything is enqueued): a shared prefix (system
    prompt and tool definitions, about ``prefix_tokens``) over a whole minute of the
    configured input-token limit. Every sub-agent's call would fail then; None when the
    workers may send them."""
    attr, _, noun = _tokens(settings, model)
    over = _binding(settings, model, attr, prefix_tokens, {})
    if over is not None:
        limit, source, _, whose = over
        return (f"the system prompt and tool definitions alone are about {prefix_tokens:,} "
                f"tokens, more than a whole minute of {whose} {noun} limit, "
                f"{limit:,.0f} ({source}): every sub-agent's call would be refused. Shorten "
                "the system prompt or use fewer tools, or raise the limit if your key has more")
    return None
