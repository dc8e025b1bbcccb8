"""The worker's Celery consumer: stock Celery, but task events go out in batches.

Celery's worker buffers its task events (``task-received``, ``task-started``,
``task-succeeded``, ...) and asks its event loop to flush the buffer "soon": in practice one
``task.multi`` publish for every one or two events, each on a Redis client kombu builds for
that one publish. Profiled under ``bench.scale`` (a one-call sub-agent, 64 threads on 4
workers) that was about a sixth of a worker's CPU. Here the first buffered event schedules one
flush ``EVENTS_FLUSH_S`` later, and every event sent until then rides on it: one publish
carries a fifth of a second's events. Flower shows every event as before, at most that much
later; the buffer still flushes at once when it holds Celery's ``buffer_limit`` events, and
whatever is left is flushed when the consumer stops.

Wired in by ``workers/app.py`` (``worker_consumer``); the bench's bare Celery chord runs the
stock consumer.
"""

from __future__ import annotations

import time

from celery.worker.consumer import Consumer as CeleryConsumer

__all__ = ["EVENTS_FLUSH_S", "Consumer"]

EVENTS_FLUSH_S = 0.2


class Consumer(CeleryConsumer):
    # When the scheduled flush was asked for (monotonic), None when none is: an event buffered
    # meanwhile goes with it. One older than a second was lost (the consumer restarted after
    # a broker connection loss, and its timer with it): a new one is scheduled.
    _events_flush_due: float | None = None

    def on_send_event_buffered(self) -> None:
        # Called from any thread (the pool's threads send task-started and task-succeeded)
        # right after the event went into the buffer, so a flush that is due takes it.
        due = self._events_flush_due
        if self.hub is None or (due is not None and time.monotonic() - due < 1.0):
            return
        self._events_flush_due = time.monotonic()
        self.hub.call_soon(self._schedule_events_flush)  # the timer is the hub thread's

    def _schedule_events_flush(self) -> None:
        self.hub.call_later(EVENTS_FLUSH_S, self._flush_due_events)

    def _flush_due_events(self) -> None:
        self._events_flush_due = None  # before the flush: an event buffered during it is taken
        self._flush_events()

    def stop(self) -> None:
        self._flush_events_quietly()
        super().stop()

    def shutdown(self) -> None:
        self._flush_events_quietly()
        super().shutdown()

    def _flush_events_quietly(self) -> None:
        try:
            self._flush_events()
        except Exception:  # the broker is gone: those events are lost, as Celery's would be
            pass

