"""``drover demo``: the whole product on one machine, with nothing running beforehand.

It finds or starts a Redis (see ``services.ensure_redis``), starts the simulator with tight
limits and an in-process worker pool, then runs a job that plans 40 sub-agents from a goal,
lets them call offline tools and synthesises their findings, all under one global limit.
Everything it started is stopped when it ends, also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from orchestrator.services import ensure_redis

GOAL = ("Assess whether a mid-sized logistics company should build its own fleet-routing "
        "software or buy it, covering costs, vendors, risks, staffing and timelines")

# Long enough to be cached (the simulator, like the API, caches prompts of >= 1024 tokens):
# every sub-agent shares it, so from the second one on it is a cache read.
SYSTEM = " ".join([
    "You are one sub-agent of a research team. Work only on your own subtask.",
    "Use lookup_fact for facts, calculator for arithmetic and save_note for anything the",
    "final report must keep. Be brief: three findings at most, each with its source.",
] + [f"Guideline {i}: cite the knowledge-base entry for every claim, prefer recent data, "
     f"state uncertainty explicitly and never speculate about vendors' private figures."
     for i in range(1, 61)])


@dataclass(frozen=True)
class DemoConfig:
    subagents: int = 40
    concurrency: int = 16
    rpm: int = 300
    itpm: int = 1_000_000
    otpm: int = 100_000
    seed: int = 7
    plot: Path | None = Path("drover-demo-usage.png")


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_demo(config: DemoConfig = DemoConfig(), console: Console | None = None) -> int:
    console = console or Console()
    from simulator import SimConfig, SimulatorServer

    with contextlib.ExitStack() as stack:
        redis = ensure_redis(os.environ.get("DROVER_REDIS_URL", "redis://127.0.0.1:6379/0"))
        stack.callback(redis.close)
        # Celery's AsyncResult objects unsubscribe from their result channel when collected;
        # collect them while the Redis they talk to is still up.
        stack.callback(gc.collect)
        where = {"existing": f"the Redis at {redis.url}",
                 "redis-server": f"a private redis-server at {redis.url}",
                 "fakeredis": f"fakeredis at {redis.url} (no redis-server installed; "
                              "fine for the demo, not for production)"}[redis.kind]
        console.print(f"[bold]drover demo[/]: using {where}")

        sim = stack.enter_context(SimulatorServer(SimConfig(
            rpm=config.rpm, itpm=config.itpm, otpm=config.otpm, burst_s=10,
            latency_mean_s=0.4, latency_p95_s=1.0, output_tokens_mean=120, tool_turns=1,
            tools_per_turn=2, plan_items=config.subagents + 5, seed=config.seed)))
        console.print(f"simulator at {sim.url}: limits {config.rpm} requests/min, "
                      f"{config.itpm:,} input and {config.otpm:,} output tokens/min")
        run_id = uuid.uuid4().hex[:8]
        stack.enter_context(_environment({
            "DROVER_REDIS_URL": redis.url, "DROVER_ANTHROPIC_BASE_URL": sim.url,
            "ANTHROPIC_API_KEY": "sk-drover-demo", "DROVER_RPM": str(config.rpm),
            "DROVER_ITPM": str(config.itpm), "DROVER_OTPM": str(config.otpm),
            "DROVER_KEY_PREFIX": f"drover-demo-{run_id}", "DROVER_QUEUE": f"demo-{run_id}",
            "DROVER_KEY_ALIAS": "demo",
        }))
        from config import get_settings
        from workers.agent.runtime import reset_runtime

        get_settings.cache_clear()
        stack.callback(get_settings.cache_clear)
        stack.callback(reset_runtime)
        settings = get_settings()

        from celery.contrib.testing.worker import start_worker

        from orchestrator.jobs import submit
        from workers.app import app

        app.conf.update(broker_url=settings.broker, result_backend=settings.backend,
                        task_default_queue=settings.queue)
        stack.enter_context(start_worker(app, pool="threads", concurrency=config.concurrency,
                                         perform_ping_check=False, loglevel="WARNING",
                                         queues=[settings.queue], shutdown_timeout=30))
        console.print(f"in-process worker pool: {config.concurrency} threads\n")
        started = time.monotonic()
        result = _follow_or_cancel(submit(demo_spec(config), settings=settings), console)
        wall = time.monotonic() - started
        stats = sim.stats()
        console.print(_table(result, stats, wall))
        if result.synthesis:
            console.print("\n[bold]Synthesis[/] (first lines):")
            console.print("\n".join(result.synthesis.splitlines()[:4]))
        _usage(settings, config.plot, console, keeps=redis.kind == "existing")
        return 0 if result.counts.get("ok") == len(result.results) else 1


def _follow_or_cancel(handle: Any, console: Console) -> Any:
    """Follow the job to its result; on Ctrl-C cancel it on every worker first."""
    from orchestrator.watch import follow

    try:
        return follow(handle, console)
    except KeyboardInterrupt:
        console.print("\n[yellow]Ctrl-C: cancelling the job[/]")
        handle.cancel("interrupted")
        raise


def demo_spec(config: DemoConfig) -> Any:
    from workers.jobs.spec import JobSpec

    return JobSpec(goal=GOAL, max_subtasks=config.subagents, system=SYSTEM,
                   tools=["lookup_fact", "calculator", "save_note"], max_tokens=256,
                   synthesize=True)


def run_demo_on_services(config: DemoConfig = DemoConfig(),
                         console: Console | None = None) -> int:
    """The demo's job against services that already run, starting nothing.

    The Redis at DROVER_REDIS_URL, workers consuming DROVER_QUEUE, and the API (or the
    simulator) at DROVER_ANTHROPIC_BASE_URL: what docker-compose's one-shot ``orchestrator``
    service uses. The limits are the workers' (DROVER_RPM/ITPM/OTPM), not ``config``'s.
    """
    console = console or Console()
    from config import get_settings
    from orchestrator.jobs import submit
    from orchestrator.stats import safe_url

    settings = get_settings()
    console.print(f"[bold]drover demo[/] on running services: Redis at "
                  f"{safe_url(settings.redis_url)}, queue {settings.queue!r}, API at "
                  f"{settings.anthropic_base_url or 'the Anthropic API'}")
    started = time.monotonic()
    result = _follow_or_cancel(submit(demo_spec(config), settings=settings), console)
    console.print(_table(result, _simulator_stats(settings.anthropic_base_url),
                         time.monotonic() - started))
    _usage(settings, config.plot, console, keeps=True)
    return 0 if result.counts.get("ok") == len(result.results) else 1


def _simulator_stats(base_url: str | None) -> dict[str, Any] | None:
    """The simulator's counters, when the API is drover's simulator; None for a real API."""
    import json
    import urllib.request

    if not base_url:
        return None
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/_sim/stats", timeout=5) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def _table(result: Any, stats: dict[str, Any] | None, wall: float) -> Table:
    table = Table(title=f"job {result.job_id}: {result.status}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for status, count in result.counts.items():
        table.add_row(f"sub-agents {status}", str(count))
    usage = result.usage
    table.add_row("LLM calls (sub-agents)", str(usage.calls))
    if stats is not None:
        table.add_row("LLM calls seen by the provider", str(stats["accepted"]))
    table.add_row("input tokens", f"{usage.input_tokens:,}")
    table.add_row("output tokens", f"{usage.output_tokens:,}")
    table.add_row("cache writes (tokens)", f"{usage.cache_creation_input_tokens:,}")
    table.add_row("cache reads (tokens)", f"{usage.cache_read_input_tokens:,}")
    if stats is not None:  # only the simulator can tell what the provider saw
        table.add_row("429s seen by the provider", str(stats["rejected_429"]))
        table.add_row("529s seen by the provider", str(stats["overloaded_529"]))
        peak = stats["max_60s"]
        limits = stats.get("limits", {})
        table.add_row("peak requests in any 60 s",
                      f"{peak['requests']} (limit {limits.get('rpm')})")
    table.add_row("wall time", f"{wall:.1f} s")
    return table


def _usage(settings: Any, plot: Path | None, console: Console, *, keeps: bool) -> None:
    """The limiter's own view of the run (``drover stats``), and the plot when asked for."""
    from orchestrator.stats import print_stats, safe_url, stats_window_s

    console.print()
    print_stats(console, plot=plot, settings=settings)
    if keeps:  # a Redis the demo started is gone when it ends, and its counters with it
        console.print(f"see them again (within {stats_window_s(settings) // 60} min): "
                      f"DROVER_REDIS_URL={safe_url(settings.redis_url)} "
                      f"DROVER_KEY_PREFIX={settings.key_prefix} DROVER_RPM={settings.rpm:.0f} "
                      f"DROVER_ITPM={settings.itpm:.0f} DROVER_OTPM={settings.otpm:.0f} "
                      "drover stats", soft_wrap=True)
