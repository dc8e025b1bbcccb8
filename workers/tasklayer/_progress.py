"""The Celery consumer's pulse: liveness means progress (workers/jobs/liveness.py).

A consumer bootstep that, while the consumer is connected, has the consumer's own timer (its
event loop, the thread that takes messages off the broker and acks them) tell the worker's
heartbeat every ``DROVER_HEARTBEAT_S`` that it moves. A consumer stuck on a connection that
went silent stops pulsing, and after ``DROVER_PROGRESS_STALE_S`` the heartbeat stops: the
sweep sends the worker's sub-agents again elsewhere, without counting that as a death
against their budget (the consumer is the worker's broker connection: its fault is the
broker's, not a task's). While the consumer reconnects (its
blueprint stopped: the broker is down or its connection was dropped) it is not watched: a
broker outage the worker waits out is not a death.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

__all__ = ["CONSUMER_PART", "ConsumerPulse"]

CONSUMER_PART = "the Celery consumer"


class ConsumerPulse(bootsteps.StartStopStep):
    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any):
        super().__init__(parent, **kwargs)
        self.tref: Any = None

    def start(self, c: Any) -> None:
        heartbeat = c.app.drover.heartbeat()  # the worker's root (tasklayer/app.py)
        heartbeat.pulse(CONSUMER_PART, broker=True)
        timer = getattr(c, "timer", None)
        if timer is None:  # no timer to pulse from: not watched
            heartbeat.unwatch(CONSUMER_PART)
            return
        self.tref = timer.call_repeatedly(c.app.drover.settings.heartbeat_s, heartbeat.pulse,
                                          (CONSUMER_PART, True))

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        heartbeat = c.app.drover.worker_heartbeat
        if heartbeat is not None:
            heartbeat.unwatch(CONSUMER_PART)

    shutdown = stop
