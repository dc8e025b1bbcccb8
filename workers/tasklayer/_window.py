"""A job's place in its queue's fair-share window, as the tasks see it: launching a job
publishes the first sub-agents its share allows, and each one that ends, waits out a
countdown or comes back from one hands places on (``workers/fairshare/scheduler.py`` keeps the
window; this publishes what it grants)."""

from __future__ import annotations

import logging
from functools import lru_cache

from drover.config import get_settings
from drover.workers.agent.capacity import (
    active_models,
    first_call_hint,
    report_line_cap,
    save_first_call_hint,
)
from drover.workers.agent.delivery import uses_batch
from drover.workers.fairshare import Dispatch, FairShare
from drover.workers.services import Services
from drover.workers.tasklayer.app import app
from drover.workers.tasklayer.dispatch import dispatch as publish_subagents
from drover.workers.tasklayer.dispatch import open_fanout, send_join

__all__ = ["dispatch", "job_size", "launch", "refill", "window_op"]

log = logging.getLogger(__name__)


def launch(job_id: str, n: int, queue: str, *, shared: Services, tenant: str = "default",
           priority: str = "normal") -> None:
    """Start the chord: one sub-agent task per subtask, joined by ``join_results``.

    The chord is Celery's own (group id = job id, the header's size in the result backend,
    each member carrying the body), but its members are published as the job's fair share
    of the queue's window allows (``workers/fairshare/scheduler.py``): the first ones now, the
    rest each time one of the queue's sub-agents finishes. Results go to the job's records
    in Redis, not to Celery's result backend (``ignore_result``); the chord still counts its
    members, which the backend does whether results are kept or not.
    """
    settings = shared.settings  # ``shared``: the caller's root's (the submitter's, a worker's)
    open_fanout(job_id, n)
    store = shared.store
    if uses_batch(store.specs.get(job_id), settings):
        # A batch sub-agent holds a worker slot only for the moments between its batch
        # rounds, so a window of slots is no measure of it: every turn of every sub-agent
        # should make the next batch. All of them go out now.
        dispatch([Dispatch(job_id, 0, n)], queue)
        return
    fs = shared.fairshare(queue)
    if settings.wait_in_line:
        _size_the_line(fs, shared, queue, job_id)
    granted = fs.add(job_id, n=n, tenant=tenant, weight=settings.tenant_weight(tenant),
                     priority=priority)
    publish_granted(fs, granted)


def _size_the_line(fs: FairShare, shared: Services, queue: str, job_id: str) -> None:
    """Before the job's first grant: the line cap, so that the first window is no more than
    the limiter serves within its horizon. The estimate of a first call stands in for the
    scope's mean until it has a minute of calls (``workers/agent/capacity.py``)."""
    try:
        settings, store = shared.settings, shared.store
        subtask = store.r.lindex(store.keys.job(job_id, "tasks"), 0) or b""
        text = subtask.decode() if isinstance(subtask, bytes) else str(subtask)
        spec = store.specs.get(job_id)
        model = spec.model or settings.model
        save_first_call_hint(shared.redis, settings, queue, model, first_call_hint(spec, text))
        # Again now, not only when none is fresh: a pump's cap from before any call and any
        # hint knows only the requests limit, and none knows this job's model yet.
        report_line_cap(settings, shared.limiter, shared.redis, fs,
                        lambda: active_models(settings, fs, store) | {model})
    except Exception as error:  # the workers' pumps size it within seconds anyway
        log.warning("job %s: could not size the limiter's line (%s: %s)", job_id,
                    type(error).__name__, error)


def dispatch(runs: list[Dispatch], queue: str) -> None:
    """Publish the chord members the fair-share scheduler handed out, pipelined
    (``dispatch.py``: one Redis round trip per batch, task-sent events included)."""
    for run in runs:
        publish_subagents(run.job_id, run.indices(), queue, n=job_size(run.job_id))


def publish_granted(fs: FairShare, runs: list[Dispatch]) -> None:
    """Publish what the scheduler granted, then tell it so (until then the grants are listed
    with this process as their holder: should it die in between, the pump publishes them)."""
    if runs:
        dispatch(runs, fs.queue)
        fs.published(runs)


def job_size(job_id: str) -> int | str:
    """The job's sub-agent count, for Flower's args (``sub=<i>/<n> job=<id>``)."""
    settings = get_settings()
    try:
        return _known_size(settings.redis_url, settings.key_prefix, job_id)
    except (LookupError, ValueError):
        return "?"


@lru_cache(maxsize=1024)
def _known_size(redis_url: str, prefix: str, job_id: str) -> int:
    # Read once per process: a job's size is fixed before its first sub-agent is published
    # (a planned job's subtasks are stored before it launches); an unknown one is not kept.
    n = int(app.drover.meta.get(job_id)["n"])  # the process's root (tasklayer/app.py)
    if n <= 0:
        raise ValueError("no sub-agents yet")
    return n


def refill(shared: Services, job_id: str, *, cancelled: bool, done: int | None = None
           ) -> None:
    """A sub-agent has its record: its place in the window goes to the next sub-agents.

    ``done``: the job's record count as the record's own write returned it (None: read it)."""
    settings, store = shared.settings, shared.store
    fs = shared.fairshare(settings.queue)
    try:
        if cancelled:
            # The cancel gave every sub-agent that had not started its record (in bulk), so
            # nothing of this job is left to publish: its places go to the other jobs, and
            # the join goes out once the last running one is in (the chord, short of the
            # members never published, would not count to its size).
            runs = fs.remove(job_id)
            if store.records.count(job_id) >= int(store.meta.get(job_id).get("n", 0)):
                send_join(job_id, settings.queue)
        else:
            runs = fs.finished(job_id, done if done is not None else store.records.count(job_id))
        publish_granted(fs, runs)
    except Exception as error:  # the record is safe; the pump tops the window up later
        log.warning("job %s: could not hand on its place in the window (%s: %s)", job_id,
                    type(error).__name__, error)


def window_op(shared: Services, job_id: str, op: str, index: int) -> None:
    fs = shared.fairshare(shared.settings.queue)
    try:
        publish_granted(fs, getattr(fs, op)(job_id, index))
    except Exception as error:  # the pump reconciles; the sub-agent itself goes on
        log.warning("job %s: fair-share %s failed (%s: %s)", job_id, op,
                    type(error).__name__, error)
