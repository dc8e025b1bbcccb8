"""One worker process's word on Redis being away: once when it goes, once when it is back.

While Redis does not answer (a restart, a pause, the network to it gone, a failover's few
seconds), every running sub-agent meets the error, keeps its checkpoint and retries later,
and the heartbeat fails every beat. Each of those used to log a warning of its own; a worker
with 16 slots said the same thing dozens of times a minute. Now the first error of an outage
is logged once, as a warning that says what happens meanwhile; the next ones go to DEBUG;
the first heartbeat that gets through logs once that Redis is back and after how long.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["answered", "noticed"]

log = logging.getLogger(__name__)
_lock = threading.Lock()
_since: float | None = None


def noticed(what: str, error: BaseException) -> bool:
    """A Redis call of ``what`` failed: True (and one warning) when this starts an outage."""
    global _since
    with _lock:
        first = _since is None
        if first:
            _since = time.monotonic()
    if first:
        log.warning("Redis does not answer (%s, in %s: %s): running sub-agents keep their "
                    "checkpoints and retry, the heartbeat keeps trying; a line follows when "
                    "it is back", type(error).__name__, what, error)
    else:
        log.debug("Redis still away (%s: %s: %s)", what, type(error).__name__, error)
    return first


def answered() -> bool:
    """A Redis call got through: ends the outage (one line, and True) if there was one."""
    global _since
    if _since is None:  # the usual case: no lock taken
        return False
    with _lock:
        since, _since = _since, None
    if since is None:
        return False
    log.warning("Redis answers again after %.0f s: sub-agents resume from their "
                "checkpoints", time.monotonic() - since)
    return True
