"""Recovery of what dead or lost workers held: the sweep (``sweep.py``) sends again the parts
a dead worker held and the messages a broker lost, joins jobs whose last record came in while
nobody was listening, repairs the fair-share window and notes stalled jobs.

Builds on the job store (claims, liveness) and the fair-share window; knows no Celery (it is
handed a function that sends a task) and builds no part of its own (it is handed the job store
and the queues' schedulers by the worker's root)."""

from drover.workers.recovery.sweep import (
    Part,
    Schedulers,
    Send,
    repair_windows,
    stall_after_s,
    stalled_jobs,
    start_sweeper,
    subagent_of,
    subagents_in_broker,
    sweep,
    take_over_dead_workers,
    window_repairs,
)

__all__ = ["Part", "Schedulers", "Send", "repair_windows", "stall_after_s", "stalled_jobs",
           "start_sweeper", "subagent_of", "subagents_in_broker", "sweep",
           "take_over_dead_workers", "window_repairs"]
