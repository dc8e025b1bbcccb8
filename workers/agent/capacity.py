"""How many sub-agents the API key can serve within the limiter's horizon: the fair-share
window's *line cap* (``workers/fairshare/scheduler.py``, "waiting in line").

A sub-agent out (published, running or between calls) has at most one call waiting for the
limiter, and the limiter books waiting calls in the order they ask. With ``k`` of them out,
the last one's call waits about ``k / calls_per_s``; it stays within the horizon while
``k <= calls_per_s x (horizon - cooldown + burst)``. ``calls_per_s`` is the scope's rate in
each limited dimension (with the share of the key the limiter has learned is ours) over the
cost of a mean call in that dimension, the smallest of them: requests cost 1; input and output
tokens the mean per request of the scope's last minute, or, before there are enough calls to
say, the submitter's estimate of a first call (``first_call_hint``, kept per model class).

The scope is the model class's: ``llm:{key}:{class}`` with one key; with a pool of keys
(``DROVER_KEYS``), the organisation's level or the sum of the enabled keys' own limits,
whichever serves fewer calls. A queue whose jobs use several model classes gets the sum of
their caps (``queue_line_cap``), computed by each worker's pump for the classes of the jobs in
its window, and by the submitter for its job's class before the job's first grant.

Beside it, the *lease cap*: the limiter's in-flight leases of those classes' scopes
(``DROVER_MAX_IN_FLIGHT`` each, ``lease_cap``). A call holds its lease from its booking to its
settle, so calls from outside the fleet (the gateway's, ``fairshare/calls.py``) given more
places than there are leases would poll the limiter for one, first come first served, and
the fair share would not hold; the window keeps their places within it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import redis

from drover.config import Settings
from drover.workers.agent.limits import llm_limits, scaled_limits
from drover.workers.fairshare import FairShare
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.store import JobNotFound, JobStore
from drover.workers.limiter import Limiter, llm_scope, org_scope, pool_scope

__all__ = ["MARGIN", "active_models", "calls_per_s", "first_call_hint", "lease_cap",
           "line_cap", "queue_line_cap", "report_line_cap", "save_first_call_hint"]

# Of the horizon. A smaller line costs no throughput while the limiter still has calls
# waiting (the cap is many calls' worth at 15 s), a larger one costs countdowns: estimates of
# a call's tokens are off by 10-20 % until the scope has a minute of calls to average.
MARGIN = 0.8
MIN_CALLS = 5  # requests in the last minute before their mean cost is trusted
# The limiter's first reservation is characters / 4 times its uncalibrated margin (1.25, so
# about / 3.2, workers/agent/estimate.py): / 3 errs above it, towards a shorter line.
CHARS_PER_TOKEN = 3.0
TOOL_TOKENS = 150  # a tool definition, roughly, when the submitter cannot read it


def _hint_key(prefix: str, queue: str) -> str:
    return f"{prefix}:line:{{{queue}}}:first_call"  # one field per model class


def first_call_hint(spec: JobSpec, first_subtask: str) -> tuple[int, int]:
    """(input, output) tokens a first call of the job is likely to reserve: what the limiter
    will book before it has seen an answer (characters / 3, a little above the limiter's
    uncalibrated reservation; the output reservation's start,
    ``min(max_tokens, 512)``)."""
    chars = len(spec.system or "") + len(first_subtask)
    return (max(1, math.ceil(chars / CHARS_PER_TOKEN) + TOOL_TOKENS * len(spec.tools or [])),
            max(1, min(spec.max_tokens, 512)))


def save_first_call_hint(r: redis.Redis, settings: Settings, queue: str, model: str,
                         hint: tuple[int, int]) -> None:
    key = _hint_key(settings.key_prefix, queue)
    pipe = r.pipeline()
    pipe.hset(key, settings.limit_class(model), f"{hint[0]}|{hint[1]}")
    pipe.expire(key, settings.result_ttl_s)
    pipe.execute()


def _saved_hint(r: redis.Redis, settings: Settings, queue: str, model_class: str
                ) -> tuple[float, float] | None:
    raw = r.hget(_hint_key(settings.key_prefix, queue), model_class)
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    first, second = text.split("|")
    return float(first), float(second)


def calls_per_s(state: dict[str, Any], usage: list[dict[str, int]],
                hint: tuple[float, float] | None) -> float | None:
    """Calls a second the scope can take at a mean call's cost (None: nothing limited)."""
    calls = sum(row.get("requests", 0) for row in usage)
    if calls >= MIN_CALLS:
        mean = (sum(row.get("input_tokens", 0) for row in usage) / calls,
                sum(row.get("output_tokens", 0) for row in usage) / calls)
    else:
        mean = hint or (0.0, 0.0)
    rates = []
    if state.get("requests"):
        rates.append(state["requests"]["rate_per_s"])
    for name, cost in (("input_tokens", mean[0]), ("output_tokens", mean[1]),
                       ("tokens", mean[0] + mean[1])):  # OpenAI's one bucket counts both
        if state.get(name) and cost > 0:
            rates.append(state[name]["rate_per_s"] / cost)
    return min(rates) if rates else None


def _pool_calls_per_s(settings: Settings, limiter: Limiter, model: str, org: dict[str, Any],
                      usage: list[dict[str, int]], hint: tuple[float, float] | None
                      ) -> float | None:
    """A pool's calls a second: the organisation's rate, or the sum of its enabled keys'
    rates (each key's own limits) where that is less."""
    cls = settings.limit_class(model)
    rates = [calls_per_s(org, usage, hint)]
    disabled = limiter.disabled_keys()
    keys = []
    for key in settings.keys:
        if key.alias in disabled:
            continue
        own = scaled_limits(settings, settings.key_limits_for(key, model), max_in_flight=None)
        keys.append(calls_per_s(limiter.state(pool_scope(key.alias, cls), own), usage, hint))
    if keys and None not in keys:
        rates.append(sum(k for k in keys if k is not None))
    known = [rate for rate in rates if rate is not None]
    return min(known) if known else None


def line_cap(settings: Settings, limiter: Limiter, r: redis.Redis, queue: str | None = None,
             model: str | None = None) -> int | None:
    """Sub-agents of one model class the key (or pool) serves within the horizon now (None:
    the class has no limit)."""
    model = model or settings.model
    cls = settings.limit_class(model)
    scope = org_scope(cls) if settings.keys else llm_scope(settings.key_alias, cls)
    state = limiter.state(scope, llm_limits(settings, model))
    usage = limiter.usage(scope, 60)
    hint = _saved_hint(r, settings, queue or settings.queue, cls)
    rate = (_pool_calls_per_s(settings, limiter, model, state, usage, hint) if settings.keys
            else calls_per_s(state, usage, hint))
    if rate is None:
        return None
    seconds = max(0.0, settings.horizon_s - state["cooldown_s"]) + state["burst_s"]
    return max(1, int(MARGIN * rate * seconds))


def queue_line_cap(settings: Settings, limiter: Limiter, r: redis.Redis, queue: str,
                   models: Iterable[str]) -> int | None:
    """The queue's line cap: the sum of the caps of the model classes its jobs use (None:
    one of them has no limit, so the line holds nothing back). Jobs of several classes on
    one queue share the one line; see fairshare/scheduler.py on what that costs."""
    caps = {}
    for model in models:
        cls = settings.limit_class(model)
        if cls not in caps:
            caps[cls] = line_cap(settings, limiter, r, queue, model)
    if not caps or None in caps.values():
        return None
    return sum(cap for cap in caps.values() if cap is not None)


def lease_cap(settings: Settings, models: Iterable[str]) -> int | None:
    """The in-flight leases of the scopes of ``models``' classes together (None: no cap)."""
    caps = {settings.limit_class(m): llm_limits(settings, m).max_in_flight for m in models}
    if not caps or None in caps.values():
        return None
    return sum(cap for cap in caps.values() if cap is not None)


def active_models(settings: Settings, fs: FairShare, store: JobStore) -> set[str]:
    """The models of the jobs in the queue's window (none when it holds no job)."""
    models = set()
    for share in fs.jobs():
        if share.calls:  # a process's calls: their models are its own to report
            continue
        try:
            models.add(store.specs.get(share.job_id).model or settings.model)
        except JobNotFound:
            continue
    return models


def report_line_cap(settings: Settings, limiter: Limiter, r: redis.Redis, fs: FairShare,
                    models: Callable[[], Iterable[str]]) -> int | None:
    """Compute the queue's line cap for the classes ``models()`` names and write it for the
    window (or remove it when no limit applies), and the lease cap (``lease_cap``) beside
    it, unless a submitter saved a new first-call estimate meanwhile: a pump that read none,
    writing after the submitter's cap, would open the window to the requests limit alone
    for a whole round. Returns the cap written (None: none).

    ``models()`` is read after the WATCH, and no model means nothing is written: a pump that
    read an empty window before a submitter's add, and wrote the default model's cap after
    it, handed the new job's first places out under another class's limits (seen: cap 1,264
    for a job whose class serves 25 in the horizon, 13 of its 40 sub-agents in countdowns).
    A submitter saves its estimate before it adds its job, so a pump that WATCHed first fails
    and one that WATCHed later reads the job. One gap is left: a job of a second class,
    added between such a pump's read and its write, waits for the next round (``PUMP_S``)
    to count in the cap."""
    with r.pipeline() as pipe:
        try:
            pipe.watch(_hint_key(settings.key_prefix, fs.queue))
            classes = list(models())
            if not classes:
                pipe.reset()
                return None
            cap = queue_line_cap(settings, limiter, pipe, fs.queue,  # type: ignore[arg-type]
                                 classes)
            leases = lease_cap(settings, classes)
            pipe.multi()
            if cap is None:
                pipe.delete(fs.cap_key)
            else:
                fs.report_cap(cap, through=pipe)
            if leases is None:
                pipe.delete(fs.leases_key)
            else:
                fs.report_leases(leases, through=pipe)
            pipe.execute()
            return cap
        except redis.WatchError:
            return None
