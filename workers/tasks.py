"""The Celery tasks. They carry ids only: prompts and state live in Redis (see store.py)."""

from __future__ import annotations

import importlib
import json
import logging
import math
import socket
from functools import lru_cache
from typing import Any

from celery import Task, signature
from celery.exceptions import Ignore
from celery.signals import (
    task_received,
    worker_process_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from config import Settings, get_settings
from workers.agent import (
    Batcher,
    CallFailed,
    Cancelled,
    Incomplete,
    LimiterSaysLater,
    Parked,
    RetryableFailure,
    RetryLater,
    SubagentRun,
    get_runtime,
    join,
    plan_job_goal,
    uses_batch,
)
from workers.agent.runtime import Runtime
from workers.app import app
from workers.dispatch import dispatch as publish_subagents
from workers.dispatch import join_argsrepr, open_fanout, send_join, subagent_argsrepr
from workers.jobs import (
    TOKEN_HEADER,
    ClaimLost,
    SubagentResult,
    local_worker,
    start_sweeper,
    stop_local_worker,
    sync_redis,
)
from workers.jobs.batches import BatchStore
from workers.jobs.fairshare import Dispatch, FairShare, start_pump
from workers.jobs.liveness import local_worker_id
from workers.jobs.store import JobStore
from workers.telemetry import worker_started

__all__ = ["dispatch", "import_tool_modules", "join_argsrepr", "join_results", "launch",
           "plan_job", "resume_parked", "run_subagent", "send_again", "start_batcher",
           "stop_batcher", "subagent_argsrepr", "subagent_task_result"]

log = logging.getLogger("drover.recovery")


def import_tool_modules() -> None:
    """Import the modules named in DROVER_TOOL_MODULES so their @tool functions register."""
    for name in get_runtime().settings.tool_modules:
        importlib.import_module(name)


@worker_ready.connect
@worker_process_init.connect
def _on_worker_start(sender: Any = None, **_: Any) -> None:
    import_tool_modules()
    worker_started(sender)  # traces when asked for; the heartbeat that counts it alive
    local_worker(get_runtime().settings)  # liveness for recovery, before the first message
    start_sweeper(send_again)  # re-sends what dead workers held (see workers/jobs/recovery.py)
    # The worker's slots size the fair-share window; worker_ready's sender is the consumer
    # of the node (a prefork child has none: the node's main process reports for it).
    controller = getattr(sender, "controller", None)
    slots = int(getattr(controller, "concurrency", 0) or 0)
    node = getattr(sender, "hostname", None) or f"{socket.gethostname()}"
    settings = get_settings()
    store = JobStore(sync_redis(settings.redis_url), prefix=settings.key_prefix,
                     ttl_s=settings.result_ttl_s)
    start_pump(_fairshare(settings, settings.queue), store,
               lambda runs: dispatch(runs, settings.queue), node=node, slots=slots)


ERROR_CHARS = 160  # of a failed sub-agent's error in its task result (Flower's Result column)
FAILED_SHOWN = 20  # failed indexes a join's task result names


def _retry(task: Task, later: RetryLater, claim: tuple[str, int | str, int] | None = None
           ) -> Exception:
    """A Celery retry that says why, in Flower and in the task's retry exception.

    Every countdown drover schedules goes through here and is capped at
    ``DROVER_COUNTDOWN_CAP_S``, the one the settings check holds below the broker's
    visibility timeout. The argsrepr is handed on (Celery's retry would recompute it).
    With ``claim`` (job id, part, token), the new message carries the part's claim token and
    the claim then says it is on the broker (workers/jobs/claims.py)."""
    settings = get_runtime().settings
    countdown = min(later.countdown, settings.countdown_cap_s)
    if countdown > 0 and settings.broker_is_rabbitmq:
        countdown = float(math.ceil(countdown))  # whole seconds there (see config/celery.py)
    options: dict[str, Any] = {}
    if claim is not None:
        options["headers"] = _with_token(task, claim[2])
    retry = task.retry(exc=later, countdown=countdown, max_retries=None, throw=False,
                       argsrepr=getattr(task.request, "argsrepr", None) or None, **options)
    if claim is not None:
        _release(*claim)
    return retry


# --- the worker's life: claims on receipt, warm shutdown (workers/jobs/liveness.py,
# claims.py, recovery.py) -------------------------------------------------------------------

PARTS = {"drover.run_subagent": 1, "drover.join_results": "join", "drover.plan_job": "plan"}


@task_received.connect
def _on_task_received(request: Any = None, **_: Any) -> None:
    """A message was taken off the broker (to run now, or held: prefetched, a countdown):
    this worker becomes its holder, so the sweep re-sends it should the worker die."""
    part = PARTS.get(getattr(request, "task_name", None) or getattr(request, "name", ""))
    if part is None:
        return
    try:
        job_id, part = _job_part(request.args, request.kwargs, part)
        token = int((request.request_dict or {}).get(TOKEN_HEADER) or 0)
        rt = get_runtime()
        rt.store.claims.receive(job_id, part, token, local_worker(rt.settings).id)
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
    no countdown), so another worker resumes it at once."""
    rt = get_runtime()
    local_worker(rt.settings).drain(rt.settings.shutdown_grace_s, rt.interrupt_all)


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    # The heartbeat goes at once, so the sweep re-sends what this worker still held
    # (prefetched messages, retries waiting out a countdown) without waiting for its TTL.
    stop_local_worker()


def _token(task: Task) -> int:
    """The claim token the message of this delivery carries (0: not re-sent or retried yet)."""
    headers = task.request.headers or {}
    return int(headers.get(TOKEN_HEADER) or getattr(task.request, TOKEN_HEADER, 0) or 0)


def _with_token(task: Task, token: int) -> dict[str, Any]:
    return {**(task.request.headers or {}), TOKEN_HEADER: token}


def _release(job_id: str, part: int | str, token: int) -> None:
    if token:
        rt = get_runtime()
        rt.store.claims.release(job_id, part, token, local_worker(rt.settings).id)


def _claim_part(task: Task, job_id: str, part: str) -> int | None:
    """Take the claim of a job-level part (join, plan); None when another delivery holds it."""
    rt = get_runtime()
    token = int(rt.store.claims.start(job_id, part, _token(task),
                                      local_worker(rt.settings).id))
    return token if token > 0 else None


def _drop_claim(job_id: str, part: str) -> None:
    rt = get_runtime()
    rt.store.claims.drop(job_id, part, local_worker(rt.settings).id)


def subagent_task_result(outcome: SubagentResult) -> dict[str, Any]:
    """The task's return value: status first, so Flower's Result column starts with it.

    Celery allows no task state but SUCCESS for a chord member whose chord must still run
    its body (FAILURE makes the Redis backend fail the chord; a custom state needs
    ``Ignore``, which never counts the chord part), so a ``failed`` sub-agent is a SUCCESS
    task whose result reads ``{'status': 'failed', 'error': ...}``. Ids, status and the
    error in words only: no model text (the records in the job store have the rest)."""
    out: dict[str, Any] = {"status": outcome.status}
    if outcome.status != "ok":
        what = " ".join(str(p) for p in (outcome.status_code, outcome.error_type) if p)
        error = f"{what}: {outcome.error or outcome.status}" if what else (outcome.error or "")
        out["error"] = error[:ERROR_CHARS]
    out.update(job_id=outcome.job_id, index=outcome.index, attempts=outcome.attempts,
               calls=outcome.usage.calls)
    return out


@app.task(name="drover.run_subagent", bind=True, max_retries=None)
def run_subagent(self: Task, job_id: str, index: int) -> dict[str, Any]:
    rt = get_runtime()
    if self.request.retries:  # back from a countdown (or re-sent, maybe from one): on a slot
        _window_op(job_id, "resume", index)
    run = SubagentRun(rt, job_id, index, token=_token(self))
    run.begin()  # in this thread: it only waits while the sub-agent runs on the loop
    try:
        outcome = rt.run(run.run())
    except ClaimLost:  # a late copy: another delivery runs (or ran) this sub-agent
        log.warning("sub-agent %s/%d: a late copy of its task (another delivery holds its "
                    "claim or it has finished); this one stops without a call", job_id, index)
        return {"status": "superseded", "job_id": job_id, "index": index}
    except Parked:
        # Its request waits in a Message Batch: keep what resumes this very task (same id,
        # same chord, its claim token) and end without counting towards the chord; the
        # batcher sends it again when the result is in (workers/agent/batch.py).
        BatchStore(rt.store).park(job_id, index, json.dumps(self.signature_from_request(
            argsrepr=getattr(self.request, "argsrepr", None) or None,  # Flower's args
            headers=_with_token(self, run.token))))
        _release(job_id, index, run.token)
        raise Ignore() from None
    except RetryLater as later:
        _window_op(job_id, "defer", index)  # its slot is free while it waits
        raise _retry(self, later, (job_id, index, run.token)) from None
    _refill(rt.store, job_id, cancelled=outcome.status == "cancelled", done=run.records_in)
    return subagent_task_result(outcome)


@app.task(name="drover.join_results", bind=True, max_retries=None)
def join_results(self: Task, *args: Any) -> dict[str, Any]:
    """The chord body, an immutable signature: ``(job_id,)``.

    (A message sent before the join was immutable has the header results first: the job id
    is the last argument either way. The join reads the records from the job store.)"""
    job_id = args[-1]
    rt = get_runtime()
    token = _claim_part(self, job_id, "join")
    if token is None:  # a late copy: another join of this job holds the claim
        return {"status": "superseded", "job_id": job_id}
    try:
        result = rt.run(join(rt, job_id))
    except Incomplete as early:
        raise _retry(self, LimiterSaysLater(1.0, f"join: {early}"), (job_id, "join", token)
                     ) from None
    _drop_claim(job_id, "join")
    failed = [r.index for r in result.results if r.status == "failed"]
    out: dict[str, Any] = {"status": result.status, "failed_indexes": failed[:FAILED_SHOWN]}
    if len(failed) > FAILED_SHOWN:
        out["failed_more"] = len(failed) - FAILED_SHOWN
    out.update(counts=result.counts, job_id=job_id)
    return out


def launch(job_id: str, n: int, queue: str, *, tenant: str = "default",
           priority: str = "normal", settings: Settings | None = None) -> None:
    """Start the chord: one sub-agent task per subtask, joined by ``join_results``.

    The chord is Celery's own (group id = job id, the header's size in the result backend,
    each member carrying the body), but its members are published as the job's fair share
    of the queue's window allows (``workers/jobs/fairshare.py``): the first ones now, the
    rest each time one of the queue's sub-agents finishes. Results go to the job's records
    in Redis, not to Celery's result backend (``ignore_result``); the chord still counts its
    members, which the backend does whether results are kept or not.
    """
    settings = settings or get_settings()
    open_fanout(job_id, n)
    store = JobStore(sync_redis(settings.redis_url), prefix=settings.key_prefix,
                     ttl_s=settings.result_ttl_s)
    if uses_batch(store.spec(job_id), settings):
        # A batch sub-agent holds a worker slot only for the moments between its batch
        # rounds, so a window of slots is no measure of it: every turn of every sub-agent
        # should make the next batch. All of them go out now.
        dispatch([Dispatch(job_id, 0, n)], queue)
        return
    fs = _fairshare(settings, queue)
    _publish(fs, fs.add(job_id, n=n, tenant=tenant, weight=settings.tenant_weight(tenant),
                        priority=priority))


def dispatch(runs: list[Dispatch], queue: str) -> None:
    """Publish the chord members the fair-share scheduler handed out, pipelined
    (``workers/dispatch.py``: one Redis round trip per batch, task-sent events included)."""
    for run in runs:
        publish_subagents(run.job_id, run.indices(), queue, n=_job_size(run.job_id))


def _publish(fs: FairShare, runs: list[Dispatch]) -> None:
    """Publish what the scheduler granted, then tell it so (until then the grants are listed
    with this process as their holder: should it die in between, the pump publishes them)."""
    if runs:
        dispatch(runs, fs.queue)
        fs.published(runs)


def _job_size(job_id: str) -> int | str:
    """The job's sub-agent count, for Flower's args (``job=<id> sub=<i>/<n>``)."""
    settings = get_settings()
    try:
        return _known_size(settings.redis_url, settings.key_prefix, settings.result_ttl_s,
                           job_id)
    except (LookupError, ValueError):
        return "?"


@lru_cache(maxsize=1024)
def _known_size(redis_url: str, prefix: str, ttl_s: int, job_id: str) -> int:
    # Read once per process: a job's size is fixed before its first sub-agent is published
    # (a planned job's subtasks are stored before it launches); an unknown one is not kept.
    n = int(_store_for(redis_url, prefix, ttl_s).meta(job_id)["n"])
    if n <= 0:
        raise ValueError("no sub-agents yet")
    return n


@lru_cache(maxsize=4)
def _store_for(redis_url: str, prefix: str, ttl_s: int) -> JobStore:
    return JobStore(sync_redis(redis_url), prefix=prefix, ttl_s=ttl_s)


def _refill(store: JobStore, job_id: str, *, cancelled: bool, done: int | None = None
            ) -> None:
    """A sub-agent has its record: its place in the window goes to the next sub-agents.

    ``done``: the job's record count as the record's own write returned it (None: read it)."""
    settings = get_settings()
    fs = _fairshare(settings, settings.queue)
    try:
        if cancelled:
            # The cancel gave every sub-agent that had not started its record (in bulk), so
            # nothing of this job is left to publish: its places go to the other jobs, and
            # the join goes out once the last running one is in (the chord, short of the
            # members never published, would not count to its size).
            runs = fs.remove(job_id)
            if store.record_count(job_id) >= int(store.meta(job_id).get("n", 0)):
                send_join(job_id, settings.queue)
        else:
            runs = fs.finished(job_id, done if done is not None else store.record_count(job_id))
        _publish(fs, runs)
    except Exception as error:  # the record is safe; the pump tops the window up later
        log.warning("job %s: could not hand on its place in the window (%s: %s)", job_id,
                    type(error).__name__, error)


def _window_op(job_id: str, op: str, index: int) -> None:
    settings = get_settings()
    fs = _fairshare(settings, settings.queue)
    try:
        _publish(fs, getattr(fs, op)(job_id, index))
    except Exception as error:  # the pump reconciles; the sub-agent itself goes on
        log.warning("job %s: fair-share %s failed (%s: %s)", job_id, op,
                    type(error).__name__, error)


@lru_cache(maxsize=16)
def _fairshare_for(redis_url: str, prefix: str, queue: str, window: int, fallback: int,
                   floor: float, ttl_s: int, holder: str) -> FairShare:
    return FairShare(sync_redis(redis_url), prefix=prefix, queue=queue, window=window,
                     fallback_window=fallback, floor=floor, ttl_s=ttl_s, holder=holder)


def _fairshare(settings: Settings, queue: str) -> FairShare:
    return _fairshare_for(settings.redis_url, settings.key_prefix, queue,
                          settings.dispatch_window, settings.dispatch_window_fallback,
                          settings.priority_floor, settings.result_ttl_s, local_worker_id())


@app.task(name="drover.plan_job", bind=True, max_retries=None)
def plan_job(self: Task, job_id: str) -> dict[str, Any]:
    """Plan a job that was submitted with a goal, then fan it out."""
    rt = get_runtime()
    spec = rt.store.spec(job_id)
    if rt.store.meta(job_id).get("status") != "planning":  # delivered twice: launched once
        return {"status": "launched", "job_id": job_id}
    failures = self.request.retries or 0  # earlier deliveries of this plan were retries
    token = _claim_part(self, job_id, "plan")
    if token is None:  # a late copy: another delivery plans this job
        return {"status": "superseded", "job_id": job_id}
    try:
        subtasks = rt.run(plan_job_goal(rt, job_id, spec, failures=failures))
    except RetryableFailure as failure:
        if failures + 1 >= rt.settings.max_attempts:
            rt.store.fail_job(job_id, f"planning failed: gave up after {failures + 1} attempts; "
                                      f"last error: {failure.decision.message}")
            return {"status": "failed", "job_id": job_id}
        raise _retry(self, failure, (job_id, "plan", token)) from None
    except RetryLater as later:
        raise _retry(self, later, (job_id, "plan", token)) from None
    except Cancelled:  # cancelled (or out of time) before it fanned out: nothing to join
        rt.store.fail_job(job_id, rt.store.cancelled(job_id) or "cancelled", status="cancelled")
        return {"status": "cancelled", "job_id": job_id}
    except (CallFailed, ValueError) as error:
        rt.store.fail_job(job_id, f"planning failed: {error}")
        return {"status": "failed", "job_id": job_id}
    if reason := rt.store.cancelled(job_id):  # the cancel came just as the plan did
        rt.store.fail_job(job_id, reason, status="cancelled")
        return {"status": "cancelled", "job_id": job_id}
    rt.store.set_subtasks(job_id, subtasks)
    if rt.store.claim_launch(job_id):
        launch(job_id, len(subtasks), rt.settings.queue, tenant=spec.tenant or "default",
               priority=spec.priority or "normal")
    _drop_claim(job_id, "plan")
    return {"status": "launched", "job_id": job_id, "subtasks": len(subtasks)}


def send_again(queue: str, job_id: str, part: int | str, token: int) -> None:
    """Put a part of a job (a sub-agent's index, "join" or "plan") on the broker again, its
    message carrying the claim ``token`` the recovery sweep took for it (its worker died, or
    the broker lost its message)."""
    options = {"queue": queue, "ignore_result": True, "headers": {TOKEN_HEADER: token}}
    if part == "join":
        join_results.si(job_id).set(argsrepr=join_argsrepr(job_id, _job_size(job_id))
                                    + " resent", **options).apply_async()
    elif part == "plan":
        plan_job.s(job_id).set(**options).apply_async()
    else:
        # A new task (the lost one cannot be retried): its args say why it exists. It counts
        # as a retry, so it "resumes" in the fair-share window: the lost copy may have been
        # waiting out a countdown there (a resume of one that was not changes nothing).
        run_subagent.s(job_id, int(part)).set(argsrepr=subagent_argsrepr(
            job_id, int(part), _job_size(job_id), "resent: its worker or message was lost"),
            retries=1, **options).apply_async()


def resume_parked(raw: str) -> None:
    """Send a parked sub-agent's saved signature again (its batch result is in)."""
    signature(json.loads(raw), app=app).apply_async()


_batcher: tuple[Runtime, Any] | None = None


def start_batcher() -> None:
    """This worker process's batcher (Message Batches: submit, poll, resume), on its own loop.

    Every worker runs one; a Redis lock lets one at a time do a pass, so a fleet submits
    and polls as one. Its runtime is its own: it outlives no worker and shares no state
    with the sub-agents' runtime."""
    global _batcher
    if _batcher is not None:
        return
    from config import get_settings

    rt = Runtime(get_settings())
    _batcher = (rt, rt.submit(Batcher(rt, resume_parked).run_forever()))


@worker_shutdown.connect
def stop_batcher(**_: Any) -> None:
    global _batcher
    if _batcher is None:
        return
    rt, running = _batcher
    _batcher = None
    rt.loop.call_soon_threadsafe(running.cancel)
    try:
        rt.close()
    except Exception:  # Redis gone at shutdown: nothing left to tidy
        pass


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    start_batcher()
