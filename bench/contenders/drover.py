"""(d) drover: 4 worker processes share one Redis limiter sized to the key's limits.

The same workload as a `JobSpec` (same system prompt, tool and max_tokens); the limits are the
simulator's own (`DROVER_RPM/ITPM/OTPM`), everything else drover's defaults
(`DROVER_TARGET_UTILIZATION` 0.95, `DROVER_BURST_SECONDS` 1). Makespan runs from `submit()`
until the joined `JobResult` is stored.

drover's Celery app reads its settings once per process, so the harness sets one key prefix
for all its drover runs (``use_prefix``) and each run gets its own queue and key alias (so
its own limiter scope), like the tests do.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from bench.contenders.common import (
    Outcome,
    RunContext,
    celery_workers,
    cpu_seconds,
    peak_rss_kb,
)
from bench.workload import MAX_TOKENS, MODEL, SYSTEM, TOOL_NAMES

if TYPE_CHECKING:
    from drover.config import Settings


def use_prefix(redis_url: str, prefix: str) -> None:
    """Point this process's drover (settings, Celery app) at ``prefix``; call it before
    anything imports ``drover.workers.app``."""
    os.environ.update({"DROVER_REDIS_URL": redis_url, "DROVER_KEY_PREFIX": prefix})
    from drover.config import get_settings

    get_settings.cache_clear()


def worker_env(ctx: RunContext, queue: str, alias: str) -> dict[str, str]:
    limits = ctx.workload.limits
    return {"DROVER_REDIS_URL": ctx.redis_url, "DROVER_KEY_PREFIX": ctx.prefix,
            "DROVER_QUEUE": queue, "DROVER_KEY_ALIAS": alias,
            "DROVER_ANTHROPIC_BASE_URL": ctx.sim_url, "ANTHROPIC_API_KEY": ctx.api_key,
            "DROVER_MODEL": MODEL, "DROVER_RPM": f"{limits['rpm']:g}",
            "DROVER_ITPM": f"{limits['itpm']:g}", "DROVER_OTPM": f"{limits['otpm']:g}"}


def run(ctx: RunContext, subtasks: list[str] | None = None, max_turns: int = 10,
        probe: Callable[[Settings], AbstractContextManager[Any]] | None = None,
        env: dict[str, str] | None = None) -> Outcome:
    """Run the workload (or ``subtasks``) as one drover job; ``probe(settings)`` is entered
    from just before ``submit`` until the result is in (e.g. a limiter sampler); ``env``
    adds DROVER_* settings for the workers."""
    from drover import JobSpec, submit
    from drover.config import load_settings
    from drover.workers.app import app

    run_id = uuid.uuid4().hex[:8]
    queue, alias = f"bench-{run_id}", f"bench-{run_id}"
    env = {**worker_env(ctx, queue, alias), **(env or {})}
    settings = load_settings(queue=queue, key_alias=alias)
    if settings.key_prefix != ctx.prefix:
        raise RuntimeError("call use_prefix(ctx.redis_url, ctx.prefix) before running drover")
    tasks = subtasks if subtasks is not None else ctx.workload.tasks
    spec = JobSpec(subtasks=tasks, system=SYSTEM, tools=TOOL_NAMES, max_tokens=MAX_TOKENS,
                   model=MODEL, max_turns=max_turns)
    with celery_workers("drover.workers.app", env, queue, ctx.workers, ctx.concurrency,
                        app) as procs:
        with probe(settings) if probe else contextlib.nullcontext():
            cpu_before = sum(cpu_seconds(p.pid) for p in procs)
            started = time.monotonic()
            handle = submit(spec, settings=settings)
            try:
                handle.wait(timeout=ctx.time_cap_s, poll_s=0.05)
            except TimeoutError:
                pass  # unfinished sub-agents count as lost
            makespan = time.monotonic() - started
            cpu_s = sum(cpu_seconds(p.pid) for p in procs) - cpu_before
        rss_kb = max(peak_rss_kb(p.pid) for p in procs)
    records = list(handle.store.records.all(handle.id).values())
    errors = Counter(f"{r.status}: {r.error_type}" for r in records if r.status != "ok")
    if len(records) < len(tasks):
        errors["TimeoutError (unfinished at the time cap)"] = len(tasks) - len(records)
    lost = sum(errors.values())
    return Outcome(completed=len(tasks) - lost, lost=lost, makespan_s=makespan,
                   errors=dict(errors),
                   extra={"attempts": sum(r.attempts for r in records),
                          "worker_peak_rss_mb": round(rss_kb / 1024, 1),
                          "worker_cpu_s": round(cpu_s, 2)},
                   started_at=started, finished_at=started + makespan)
