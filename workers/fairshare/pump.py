"""The pump: a backstop that keeps the window full. Each worker runs one thread of it; on one
worker of the queue at a time it reconciles the scheduler with the job store (a lost update,
jobs that ended or were cancelled, workers that came or went) and publishes what was granted
to a process that died before publishing it."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from drover.workers.fairshare.scheduler import PUMP_S, Dispatch, FairShare
from drover.workers.jobs.meta import ACTIVE
from drover.workers.jobs.store import JobNotFound, JobStore

__all__ = ["Publish", "pump_once", "start_pump"]

log = logging.getLogger(__name__)

Publish = Callable[[list[Dispatch]], None]


def pump_once(fs: FairShare, store: JobStore, publish: Publish) -> list[Dispatch]:
    """Reconcile the scheduler with the job store and top the window up (under a lock)."""
    if not fs.r.set(f"{fs.base}:pump", "1", nx=True, px=int(PUMP_S * 900)):
        return []
    runs: list[Dispatch] = []
    for lost in fs.lost_grants():
        log.warning("job %s: sub-agents %d..%d were granted to a process that died before "
                    "publishing them; published now", lost.job_id, lost.first,
                    lost.first + lost.count - 1)
        runs.append(lost)
    runs += fs.forget_gone_calls()  # a process's calls (the gateway's): gone with it
    for share in fs.jobs():
        if share.calls:
            continue
        try:
            meta = store.meta.get(share.job_id)
        except JobNotFound:
            runs += fs.remove(share.job_id)
            continue
        if meta.get("status") not in ACTIVE:
            runs += fs.remove(share.job_id)
            continue
        if reason := meta.get("cancelled"):
            # Its sub-agents that never started got their records at the cancel (again here,
            # in case that was cut short): none is left to publish, its places go to others.
            store.cancels.cancel_unstarted(share.job_id, reason)
            runs += fs.remove(share.job_id)
            continue
        runs += fs.finished(share.job_id, store.records.count(share.job_id))
    runs += fs.fill()
    if runs:
        publish(runs)
        fs.published(runs)
    return runs


_started = threading.Lock()
_thread: threading.Thread | None = None


def start_pump(fs: FairShare, store: JobStore, publish: Publish, *, node: str | None = None,
               slots: int = 0, size_line: Callable[[], object] | None = None) -> None:
    """This process's pump thread (once): reports ``slots`` under ``node`` and, on one worker
    of the queue at a time, reconciles the window (a lost update, workers that came or went).
    ``size_line`` computes and reports the line cap (what the limiter serves within its
    horizon), each round."""
    global _thread
    with _started:
        if _thread is not None and _thread.is_alive():
            return
        _thread = threading.Thread(target=_pump_forever,
                                   args=(fs, store, publish, node, slots, size_line),
                                   name="drover-fairshare", daemon=True)
        _thread.start()


def _pump_forever(fs: FairShare, store: JobStore, publish: Publish, node: str | None,
                  slots: int, size_line: Callable[[], object] | None) -> None:
    while True:
        try:
            if node and slots:
                fs.report_slots(node, slots)
            if size_line is not None:
                size_line()
            pump_once(fs, store, publish)
        except Exception as error:  # Redis or the broker away: again next time
            log.warning("fair-share pump failed (%s: %s)", type(error).__name__, error)
        time.sleep(PUMP_S * random.uniform(0.8, 1.2))
