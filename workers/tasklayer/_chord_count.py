"""A chord member's count waits out a Redis that is away, as its result store does.

Celery counts a chord member in the result backend after the task's body has returned
(``on_chord_part_return``: one script call, no retry of its own). A member that finished just
as Redis went away (paused, failing over, silent) raised from there, and Celery printed that
as "Exception raised outside body", a warning with a traceback, once per member in flight
(six in one worker of tests/system/test_redis_away.py, beside a CPU hog). The count is
idempotent per member (the script keeps a set of the members it counted), so it is simply
tried again until Redis answers, for as long as ``result_backend_always_retry`` would wait
for a store; past that the error goes to Celery as before, and the recovery sweep joins the
job whose records are all in."""

from __future__ import annotations

import time
from typing import Any

import redis

from drover.workers.connections.redis_outage import noticed

__all__ = ["count_patiently"]

WAIT_S = 120.0  # about what 20 retries of the backend's store wait before giving up
# redis-py's own (a Sentinel's MasterNotFoundError and a loading replica's BusyLoadingError are
# ConnectionErrors), not the backend's ``connection_errors``: kombu's list holds OSError and
# KeyError too, and a KeyError of Celery's own code must not wait two minutes.
_AWAY = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
_FIRST_PAUSE_S = 0.5
_MAX_PAUSE_S = 5.0


def count_patiently(backend: Any) -> None:
    """Wrap ``backend.on_chord_part_return`` (once) to try again while Redis is away."""
    counted = backend.on_chord_part_return
    if getattr(counted, "patient", False):
        return

    def on_chord_part_return(request: Any, state: str, result: Any, **kwargs: Any) -> Any:
        deadline, pause = time.monotonic() + WAIT_S, _FIRST_PAUSE_S
        while True:
            try:
                return counted(request, state, result, **kwargs)
            except _AWAY as error:
                if time.monotonic() + pause > deadline:
                    raise
                noticed("a chord member's count", error)
                time.sleep(pause)
                pause = min(2 * pause, _MAX_PAUSE_S)

    on_chord_part_return.patient = True  # type: ignore[attr-defined]
    backend.on_chord_part_return = on_chord_part_return
