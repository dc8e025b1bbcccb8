"""What a worker says once it is ready (after Celery's banner): the tool modules it imported
and their tools and @subagent functions, the limits it holds per scope and where each came
from (a setting, learned from the provider's headers, or drover's default), the key prefix,
the queue and the provider endpoint. Never a key: a pool's keys are named by their aliases."""

from __future__ import annotations

import logging
from typing import Any

from drover.config import ModelLimits, Settings
from drover.config.providers import about
from drover.config.settings import mask_url
from drover.workers.limiter import Limiter, llm_scope, org_scope, pool_scope, split_llm_scope
from drover.workers.tools import REGISTRY, SUBAGENTS

__all__ = ["start_lines"]

log = logging.getLogger(__name__)
_DIMS = ("rpm", "itpm", "otpm", "tpm")


def _tools_lines(settings: Settings) -> list[str]:
    lines = []
    for module in settings.tool_modules:
        names = sorted(n for n, t in REGISTRY.items() if t.fn.__module__ == module)
        own = sorted(n + (" (cannot run: see submit)" if s.problem else "")
                     for n, s in SUBAGENTS.items() if s.fn.__module__ == module)
        lines.append(f"tool module {module}: {', '.join(names) or 'no @tool functions'}"
                     + (f"; @subagent: {', '.join(own)}" if own else ""))
    others = sorted(n for n, t in REGISTRY.items() if t.fn.__module__ not in settings.tool_modules)
    if others:
        lines.append(f"tools registered elsewhere: {', '.join(others)}")
    return lines


def _learned(limiter: Limiter, scope: str) -> dict[str, float]:
    try:
        learned = limiter.state(scope).get("learned") or {}
    except Exception:  # a Redis that does not answer is said elsewhere; this is a nicety
        return {}
    return {dim: value for dim, value in learned.items() if value}


def _scope_line(scope: str, configured: ModelLimits | None, setting: dict[str, str],
                learned: dict[str, float], provider: str) -> str:
    parts = []
    for dim in about(provider).limit_settings:
        value = getattr(configured, dim) if configured is not None else None
        if value is not None:
            parts.append(f"{dim} {value:,.0f} ({setting.get(dim, 'drover default')})")
        elif dim in learned:
            parts.append(f"{dim} {learned[dim]:,.0f} (learned from headers)")
        else:
            parts.append(f"{dim} unknown until a response's -limit headers")
    return f"limits of {scope}: {', '.join(parts)}"


def _no_default_model(settings: Settings) -> bool:
    """drover's default model is Anthropic's: a worker on another provider with no
    DROVER_MODEL has no default model of its own, and no limits to show for one."""
    return settings.provider != "anthropic" and "model" not in settings.model_fields_set


def _limit_lines(settings: Settings, limiter: Limiter) -> list[str]:
    own = {dim: f"DROVER_{dim.upper()}" for dim in _DIMS if dim in settings.model_fields_set}
    default_class = settings.limit_class(settings.model)
    classes: dict[str, tuple[ModelLimits | None, dict[str, str]]] = {}
    if not _no_default_model(settings):
        classes[default_class] = (settings.limits_for(settings.model), own)
    for name, ml in settings.limits.items():
        classes[settings.limit_class(name)] = (
            ml, {dim: "DROVER_LIMITS" for dim in _DIMS if getattr(ml, dim) is not None})
    lines = []
    aliases = [k.alias for k in settings.keys] or [settings.key_alias]
    for cls, (configured, setting) in classes.items():
        scope = org_scope(cls) if settings.pooled else llm_scope(settings.key_alias, cls)
        lines.append(_scope_line(scope, configured, setting, _learned(limiter, scope),
                                 settings.provider_of(cls)))
    for key in settings.keys:  # a pool's keys: by alias, never the key itself
        scope = pool_scope(key.alias, default_class)
        key_limits = settings.key_limits_for(key, settings.model)
        lines.append(_scope_line(scope, key_limits, dict.fromkeys(_DIMS, "DROVER_KEYS"),
                                 _learned(limiter, scope), settings.key_provider(key)))
        if key.base_url:
            lines.append(f"pool key {key.alias}: endpoint {mask_url(key.base_url)}")
    try:  # models of no configured class: what earlier calls learned from the headers
        known = set(classes)
        for scope in limiter.scopes():
            split = split_llm_scope(scope)
            if split and split[0] in aliases and split[1] not in known and not split[2]:
                known.add(split[1])
                lines.append(_scope_line(scope, None, {}, _learned(limiter, scope),
                                         settings.provider_of(split[1])))
    except Exception:
        pass
    for name, rps in sorted(settings.tool_rps.items()):
        lines.append(f"limits of tool:{name}: {rps:g} requests/s (DROVER_TOOL_RPS)")
    return lines


def _endpoint(settings: Settings, provider: str) -> str:
    facts = about(provider)
    url = getattr(settings, facts.base_url_setting) if facts.base_url_setting else None
    return (f"{mask_url(url)} ({provider})" if url else
            f"the {facts.display_name} API (the SDK's default; {facts.base_url_env} unset)")


def start_lines(settings: Settings, limiter: Limiter) -> list[str]:
    """The lines a ready worker logs: what it loaded and where it sends."""
    providers = dict.fromkeys([settings.provider, *settings.model_providers.values()])
    endpoint = "; ".join(_endpoint(settings, p) for p in providers)
    default = ([f"default model: none for {settings.provider} (DROVER_MODEL unset, and "
                f"drover's default, {settings.model}, is Anthropic's): jobs must name their "
                "model, or set DROVER_MODEL to one the endpoint serves"]
               if _no_default_model(settings) else [])
    return [*_tools_lines(settings), *default, *_limit_lines(settings, limiter),
            f"target utilization {settings.target_utilization:g}, burst "
            f"{settings.burst_seconds:g} s, at most {settings.max_in_flight} in flight per scope",
            f"key prefix {settings.key_prefix}, queue {settings.queue}, provider endpoint"
            f"{'s' if len(providers) > 1 else ''} {endpoint}"]


def log_start(settings: Settings, limiter: Any) -> None:
    for line in start_lines(settings, limiter):
        log.info("drover: %s", line)


def check_results_store(results: Any) -> None:
    """Say in one line whether the results store (DROVER_RESULTS_URL) answers. The worker
    runs either way: records always land in Redis first, and a job's end copies to the store
    whatever it missed (docs/results-store.md)."""
    if results is None:
        return
    from drover.errors import ResultsStoreError

    try:
        results.check()
    except ResultsStoreError as error:
        log.warning("drover: %s: the worker runs on; records stay in Redis and are copied "
                    "to the results store when their job ends, once it answers", error)
    else:
        log.info("drover: results store %s (schema version %d)", results.where,
                 results.schema_version())
    finally:
        results.close()  # a prefork parent's socket is not for its children; reconnects on use
