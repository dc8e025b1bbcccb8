"""``drover demo``: the whole product on one machine, with nothing running beforehand.

It finds or starts a Redis (see ``services.ensure_redis``), starts the simulator with tight
limits and an in-process worker pool, then runs a job that plans 40 sub-agents from a goal,
lets them call offline tools and synthesises their findings, all under one global limit.
Everything it started is stopped when it ends, also on Ctrl-C.

In a Redis it did not start, the demo leaves nothing behind: its keys (job records, the
limiter's counters, Celery's queues, results and kombu's ``_kombu.binding.*`` routing tables,
all under one prefix of the run's own) are deleted when it ends. ``--keep`` keeps them for
``KEEP_S`` instead (to look at them with ``drover stats``): every key under the prefix then
expires within the hour, the ones that Celery and kombu write without a TTL included. Kombu
gives its binding tables no TTL on purpose (so a ``volatile-*`` eviction policy cannot drop a
live consumer's routing) and sweeps them only from a running consumer; a demo's consumer is
gone when it ends, so the demo deletes or expires them itself.
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

from drover.orchestrator.cli.watch import dollars
from drover.orchestrator.ops.services import FIRST_CONTACT_TIMEOUT_S, ensure_redis, redis_problem

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# How long --keep keeps the demo's keys; also the records' TTL while it runs.
KEEP_S = 3600

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
    keep: bool = False  # keep the keys in a Redis the demo did not start (for KEEP_S)
    batch: bool = False  # every sub-agent turn through the Message Batches API


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
    from drover.simulator import SimConfig, SimulatorServer
    from drover.workers.services import stop_process

    with contextlib.ExitStack() as stack:
        redis = _find_or_start_redis(console)
        stack.callback(redis.close)
        # Runs just before: the worker heartbeat and the metrics recorder write to this Redis.
        stack.callback(stop_process)
        run_id = uuid.uuid4().hex[:8]
        prefix = f"drover-demo-{run_id}"
        if redis.kind == "existing":  # runs last: after the worker and its clients are gone
            stack.callback(_clean_up, redis.url, prefix, config.keep, console)
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
            tools_per_turn=2, plan_items=config.subagents + 5, seed=config.seed,
            batch_processing_s=3.0, prices=_list_prices())))
        console.print(f"simulator at {sim.url}: limits {config.rpm} requests/min, "
                      f"{config.itpm:,} input and {config.otpm:,} output tokens/min")
        stack.enter_context(_environment({
            "DROVER_REDIS_URL": redis.url, "DROVER_ANTHROPIC_BASE_URL": sim.url,
            "ANTHROPIC_API_KEY": "sk-drover-demo", "DROVER_RPM": str(config.rpm),
            "DROVER_ITPM": str(config.itpm), "DROVER_OTPM": str(config.otpm),
            "DROVER_KEY_PREFIX": prefix, "DROVER_QUEUE": f"demo-{run_id}",
            "DROVER_KEY_ALIAS": "demo", "DROVER_RESULT_TTL_S": str(KEEP_S),
            "DROVER_STATS_WINDOW_S": str(KEEP_S),
            # --batch: short rounds, so the demo shows several of them in seconds.
            "DROVER_BATCH_LINGER_S": "1", "DROVER_BATCH_POLL_S": "1",
        }))
        from drover.config import get_settings
        from drover.workers.agent.runtime import reset_runtime

        get_settings.cache_clear()
        stack.callback(get_settings.cache_clear)
        stack.callback(reset_runtime)
        settings = get_settings()

        from celery.contrib.testing.worker import start_worker

        from drover.orchestrator.client.jobs import submit
        from drover.workers.app import app

        app.conf.update(broker_url=settings.broker, result_backend=settings.backend,
                        task_default_queue=settings.queue)
        stack.enter_context(start_worker(app, pool="threads", concurrency=config.concurrency,
                                         perform_ping_check=False, loglevel="WARNING",
                                         queues=[settings.queue], shutdown_timeout=30))
        console.print(f"in-process worker pool: {config.concurrency} threads\n")
        if config.batch:  # an in-process worker sends no worker_ready: start it here
            from drover.workers.tasklayer.lifecycle import start_batcher, stop_batcher

            start_batcher()
            stack.callback(stop_batcher)
            console.print("delivery=batch: every sub-agent turn goes into a Message Batch "
                          "(the simulator ends each within 3 s; the provider within 24 h)\n")
        started = time.monotonic()
        handle = submit(demo_spec(config), settings=settings)
        result = _follow_or_cancel(handle, console)
        wall = time.monotonic() - started
        stats = sim.stats()
        console.print(_table(result, stats, wall, _counted(handle.shared)))
        if result.synthesis:
            console.print("\n[bold]Synthesis[/] (first lines; simulated: the simulator's "
                          "made-up text, not a model's answer):")
            console.print("\n".join(result.synthesis.splitlines()[:4]))
        _usage(handle.shared, config.plot, console, keeps=redis.kind == "existing" and config.keep)
        return 0 if result.counts.get("ok") == len(result.results) else 1


def _find_or_start_redis(console: Console) -> Any:
    """The configured Redis if it answers; else say so, then start one of the demo's own."""
    configured = os.environ.get("DROVER_REDIS_URL")
    url = configured or DEFAULT_REDIS_URL
    problem = redis_problem(url, FIRST_CONTACT_TIMEOUT_S)
    if problem is None:
        return ensure_redis(url)
    from drover.config.settings import mask_url

    named = ("DROVER_REDIS_URL" if configured else
             "the default; DROVER_REDIS_URL is not set")
    console.print(f"[yellow]no Redis answers at {mask_url(url)}[/] ({named}): {problem}. "
                  "The demo starts one of its own for this run.", soft_wrap=True)
    return ensure_redis(url, known_down=True)


def _clean_up(url: str, prefix: str, keep: bool, console: Console) -> None:
    """Delete the run's keys (or, with keep, make each expire within KEEP_S)."""
    import redis as redis_py

    from drover.workers.connections.redis_clients import sync_redis

    client = sync_redis(url, retries=False, socket_connect_timeout=FIRST_CONTACT_TIMEOUT_S,
                        socket_timeout=10)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if not keep:
            for start in range(0, len(keys), 500):
                client.delete(*keys[start:start + 500])
            console.print(f"[dim]deleted the demo's {len(keys)} keys (prefix {prefix}); "
                          "--keep keeps them for an hour[/]")
            return
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.ttl(key)
        for key, ttl in zip(keys, pipe.execute(), strict=True):
            if ttl < 0 or ttl > KEEP_S:
                client.expire(key, KEEP_S)
    except redis_py.RedisError as error:
        console.print(f"[yellow]could not clean up the demo's keys under {prefix}: {error}[/]")
    finally:
        client.close()


def _counted(shared: Any) -> dict[str, int]:
    """The limiter's totals over every LLM call of the run: what `drover stats` counts
    (``shared``: the parts the submitter's root built, which the job's handle carries)."""
    from drover.orchestrator.ops.stats import collect

    totals = {"requests": 0, "input_tokens": 0, "output_tokens": 0}
    for usage in collect(shared):
        if usage.scope.startswith("llm:"):
            whole = usage.last(len(usage.series))
            for name in totals:
                totals[name] += whole.get(name, 0)
    return totals


def _follow_or_cancel(handle: Any, console: Console) -> Any:
    """Follow the job to its result; on Ctrl-C cancel it on every worker first."""
    from drover.orchestrator.cli.watch import follow

    try:
        return follow(handle, console)
    except KeyboardInterrupt:
        console.print("\n[yellow]Ctrl-C: cancelling the job[/]")
        handle.cancel("interrupted")
        raise


def demo_spec(config: DemoConfig) -> Any:
    from drover.workers.jobs.spec import JobSpec

    return JobSpec(goal=GOAL, max_subtasks=config.subagents, system=SYSTEM,
                   tools=["lookup_fact", "calculator", "save_note"], max_tokens=256,
                   synthesize=True, delivery="batch" if config.batch else "realtime")


def run_demo_on_services(config: DemoConfig = DemoConfig(),
                         console: Console | None = None) -> int:
    """The demo's job against services that already run, starting nothing.

    The Redis at DROVER_REDIS_URL, workers consuming DROVER_QUEUE, and the API (or the
    simulator) at DROVER_ANTHROPIC_BASE_URL: what docker-compose's one-shot ``orchestrator``
    service uses. The limits are the workers' (DROVER_RPM/ITPM/OTPM), not ``config``'s.
    """
    console = console or Console()
    from drover.config import get_settings
    from drover.orchestrator.client.jobs import submit
    from drover.orchestrator.ops.stats import safe_url

    settings = get_settings()
    console.print(f"[bold]drover demo[/] on running services: Redis at "
                  f"{safe_url(settings.redis_url)}, queue {settings.queue!r}, API at "
                  f"{settings.anthropic_base_url or 'the Anthropic API'}")
    started = time.monotonic()
    handle = submit(demo_spec(config), settings=settings)
    result = _follow_or_cancel(handle, console)
    console.print(_table(result, _simulator_stats(settings.anthropic_base_url),
                         time.monotonic() - started, _counted(handle.shared)))
    _usage(handle.shared, config.plot, console, keeps=True)
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


def _list_prices() -> dict[str, dict[str, float]]:
    """The bundled list prices, for the simulator to bill the demo's calls at (what drover
    counts them at too, unless DROVER_PRICES says otherwise)."""
    from drover.config.prices import bundled_table

    return {model: {"input": p.input, "output": p.output, "cache_write": p.cache_write,
                    "cache_read": p.cache_read} for model, p in bundled_table().prices.items()}


def _table(result: Any, stats: dict[str, Any] | None, wall: float,
           counted: dict[str, int] | None = None) -> Table:
    """The run in numbers; each row says what it counts (the caption says how they relate)."""
    table = Table(title=f"job {result.job_id}: {result.status}",
                  caption="\"the job's\" rows are its usage report (its records, planning and "
                          "synthesis); \"all calls\" rows are "
                          "the limiter's counters over every call (planning, sub-agents, "
                          "synthesis), the figures drover stats shows: input as the limit "
                          "counts it, uncached input + cache writes (cache reads do not count "
                          "on this model)")
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for status, count in result.counts.items():
        table.add_row(f"sub-agents {status}", str(count))
    usage = result.usage
    table.add_row("LLM calls answered (the job's)", str(usage.calls))
    if usage.unanswered_calls:
        table.add_row("LLM calls sent, never answered (the job's)", str(usage.unanswered_calls))
    if counted is not None:
        table.add_row("LLM calls (all calls)", f"{counted['requests']:,}")
    if stats is not None:
        table.add_row("LLM calls seen by the provider", str(stats["accepted"]))
    table.add_row("input tokens, uncached (the job's)", f"{usage.input_tokens:,}")
    table.add_row("cache writes (tokens)", f"{usage.cache_creation_input_tokens:,}")
    table.add_row("cache reads (tokens)", f"{usage.cache_read_input_tokens:,}")
    if counted is not None:
        table.add_row("input tokens against the limit (all calls)",
                      f"{counted['input_tokens']:,}")
    table.add_row("output tokens (the job's)", f"{usage.output_tokens:,}")
    if counted is not None:
        table.add_row("output tokens (all calls)", f"{counted['output_tokens']:,}")
    if usage.batch_calls:
        table.add_row("LLM calls by Message Batch (the job's)", str(usage.batch_calls))
        table.add_row("tokens billed at the batch rate, 50% (the job's)",
                      f"{usage.batch_tokens:,}")
        if stats is not None and "batches" in stats:
            table.add_row("batch requests seen by the provider",
                          str(stats["batches"]["requests"]))
    table.add_row("cost at list prices (the job's)", dollars(usage))
    billing = (stats or {}).get("billing") or {}
    if billing.get("usd") and not billing.get("unpriced_requests"):  # at the same list prices
        table.add_row("the provider's bill (the simulator's)",
                      f"${billing['usd']:,.4f}")
    if stats is not None:  # only the simulator can tell what the provider saw
        table.add_row("429s seen by the provider", str(stats["rejected_429"]))
        table.add_row("529s seen by the provider", str(stats["overloaded_529"]))
        peak = stats["max_60s"]
        limits = stats.get("limits", {})
        table.add_row("peak requests in any 60 s",
                      f"{peak['requests']} (limit {limits.get('rpm')})")
    table.add_row("wall time", f"{wall:.1f} s")
    return table


def _usage(shared: Any, plot: Path | None, console: Console, *, keeps: bool) -> None:
    """The limiter's own view of the run (``drover stats``), and the plot when asked for."""
    from drover.orchestrator.ops.stats import print_stats, safe_url, stats_window_s

    settings = shared.settings
    console.print()
    print_stats(console, shared, plot=plot)
    if keeps:  # a Redis the demo started is gone when it ends, and its counters with it
        console.print(f"see them again (within {stats_window_s(settings) // 60} min): "
                      f"DROVER_REDIS_URL={safe_url(settings.redis_url)} "
                      f"DROVER_KEY_PREFIX={settings.key_prefix} DROVER_RPM={settings.rpm:.0f} "
                      f"DROVER_ITPM={settings.itpm:.0f} DROVER_OTPM={settings.otpm:.0f} "
                      "drover stats", soft_wrap=True)
