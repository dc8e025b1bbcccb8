"""A worker process's life: at start, its tools, its heartbeat, the recovery sweep, the
fair-share pump and the batcher; a receipt for every message it takes off the broker; on
SIGTERM a warm shutdown; at the end, its heartbeat gone at once (``workers/jobs/liveness.py``,
``claims.py``, ``recovery.py``). The Celery app includes this module with the tasks."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

from celery.signals import (
    task_received,
    worker_process_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from drover.config import get_settings
from drover.config.providers import about
from drover.workers.agent import Batcher, get_runtime
from drover.workers.agent.capacity import active_models, report_line_cap
from drover.workers.agent.runtime import Runtime
from drover.workers.connections import preflight
from drover.workers.fairshare import start_pump
from drover.workers.jobs import TOKEN_HEADER
from drover.workers.providers.warmup import warm_up
from drover.workers.recovery import start_sweeper
from drover.workers.services import stop_worker
from drover.workers.tasklayer._window import dispatch
from drover.workers.tasklayer.app import app
from drover.workers.tasklayer.startup import check_results_store, log_start
from drover.workers.tasklayer.tasks import resume_parked, send_again
from drover.workers.telemetry import worker_started

__all__ = ["import_tool_modules", "start_batcher", "stop_batcher"]

log = logging.getLogger(__name__)


def import_tool_modules() -> None:
    """Import the modules named in DROVER_TOOL_MODULES so their @tool functions register."""
    preflight.import_tool_modules(get_runtime(app.drover).settings)


@worker_ready.connect
@worker_process_init.connect
def _on_worker_start(sender: Any = None, **_: Any) -> None:
    import_tool_modules()
    # The SDK's first call in a process is slow (lazy imports): made here, to a local one-shot
    # server, so a job's first granted sends are not late (providers/warmup.py); through each
    # provider's SDK the worker calls.
    settings = get_settings()
    get_runtime(app.drover).run(warm_up({settings.provider, *settings.model_providers.values(),
                                         *(settings.key_provider(k) for k in settings.keys)}))
    worker_started(sender)  # traces when asked for; the heartbeat that counts it alive
    shared = app.drover  # the worker's root: built here, at its start, for the process
    shared.heartbeat()  # liveness for recovery, before the first message
    # Re-sends what dead workers held (recovery/sweep.py), through the root's scheduler.
    start_sweeper(send_again, shared.store, shared.fairshare, settings)
    # The worker's slots size the fair-share window; worker_ready's sender is the consumer
    # of the node (a prefork child has none: the node's main process reports for it).
    controller = getattr(sender, "controller", None)
    slots = int(getattr(controller, "concurrency", 0) or 0)
    node = getattr(sender, "hostname", None) or f"{socket.gethostname()}"
    fs = shared.fairshare(settings.queue)
    size_line = ((lambda: report_line_cap(settings, shared.limiter, shared.redis, fs,
                                          lambda: active_models(settings, fs, shared.store)))
                 if settings.wait_in_line else None)
    start_pump(fs, shared.store, lambda runs: dispatch(runs, settings.queue), node=node,
               slots=slots, size_line=size_line)


PARTS: dict[str, int | str] = {"drover.run_subagent": 1, "drover.join_results": "join",
                               "drover.plan_job": "plan"}


@task_received.connect
def _on_task_received(request: Any = None, **_: Any) -> None:
    """A message was taken off the broker (to run now, or held: prefetched, a countdown):
    this worker becomes its holder, so the sweep re-sends it should the worker die."""
    part = PARTS.get(str(getattr(request, "task_name", None) or getattr(request, "name", "")))
    if part is None:
        return
    try:
        job_id, part = _job_part(request.args, request.kwargs, part)
        token = int((request.request_dict or {}).get(TOKEN_HEADER) or 0)
        rt = get_runtime(app.drover)
        rt.store.claims.receive(job_id, part, token, rt.shared.heartbeat().id)
    except Exception as error:  # never lose the message over it: the broker still has it
        log.warning("could not record the receipt of a %s message (%s: %s)", request.task_name,
                    type(error).__name__, error)


def _job_part(args: Any, kwargs: Any, part: int | str) -> tuple[str, int | str]:
    args, kwargs = list(args or ()), dict(kwargs or {})
    if part == 1:  # run_subagent(job_id, index)
        job_id = kwargs.get("job_id", args[0] if args else None)
        return str(job_id), int(kwargs.get("index", args[1] if len(args) > 1 else 0))
    # join_results(job_id) (older messages: (results, job_id)), plan_job(job_id)
    return str(kwargs.get("job_id", args[-1] if args else None)), part


@worker_shutting_down.connect
def _on_warm_shutdown(**_: Any) -> None:
    """SIGTERM: no new LLM call starts; calls in flight get DROVER_SHUTDOWN_GRACE_S, then they
    are aborted; every sub-agent is checkpointed and handed back to the broker (a retry with
    no countdown), so another worker resumes it at once.

    Celery sends this from its SIGTERM handler, on the main thread, which may be inside
    ``get_runtime()`` or ``services()`` with their lock held (a SIGTERM during start-up):
    taking the lock there would wait for ever, so a thread does it once the main thread lets
    go. Draining itself does not block (it sets a flag and a timer)."""
    def drain() -> None:
        rt = get_runtime(app.drover)
        rt.shared.heartbeat().drain(rt.settings.shutdown_grace_s, rt.interrupt_all)

    threading.Thread(target=drain, name="drover-drain", daemon=True).start()


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    # The heartbeat goes at once, so the sweep re-sends what this worker still held
    # (prefetched messages, retries waiting out a countdown) without waiting for its TTL.
    stop_worker()


_batcher: tuple[Runtime, Any] | None = None


def start_batcher() -> None:
    """This worker process's batcher (Message Batches: submit, poll, resume), on its own loop.

    Every worker runs one; a Redis lock lets one at a time do a pass, so a fleet submits
    and polls as one. Its runtime is its own: it outlives no worker and shares no state
    with the sub-agents' runtime."""
    global _batcher
    settings = get_settings()
    # Message Batches are Anthropic's only (``has_batches``; a batch job on OpenAI is refused
    # at submit): a worker on another provider has no batches to poll, and its client has no
    # ``messages`` (every tick would fail and log it, once a second).
    if _batcher is not None or not about(settings.provider).has_batches:
        return
    rt = Runtime(app.drover)

    async def start() -> asyncio.Task[None]:
        return asyncio.create_task(Batcher(rt, resume_parked).run_forever(), name="batcher")

    _batcher = (rt, rt.submit(start()).result(timeout=30))


@worker_shutdown.connect
def stop_batcher(**_: Any) -> None:
    global _batcher
    if _batcher is None:
        return
    rt, running = _batcher
    _batcher = None

    async def stop() -> None:
        # Cancelled and awaited on its loop before the loop stops: a task left pending there
        # is logged as an ERROR ("Task was destroyed but it is pending!") at exit.
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    try:
        rt.submit(stop()).result(timeout=10)
        rt.close()
    except Exception:  # Redis gone at shutdown: nothing left to tidy
        pass


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    start_batcher()
    # After Celery's banner: what this worker loaded and where it sends (startup.py).
    settings = get_settings()
    log_start(settings, app.drover.limiter)
    check_results_store(app.drover.results)
