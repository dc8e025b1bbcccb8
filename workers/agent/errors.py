"""What can end an agent step early, as one small hierarchy (re-exported here for the agent).

``AgentError`` is the base. ``RetryLater`` means "free the worker slot and come back after
``countdown`` seconds" (a Celery retry); it has two kinds that callers must tell apart:
``LimiterSaysLater`` (nothing failed, the limiter or a cooldown wants a later start) and
``RetryableFailure`` (an attempt failed and counts against ``DROVER_MAX_ATTEMPTS``).
``CallFailed`` will not succeed by retrying; ``Cancelled`` means the job was cancelled or ran
out of time. The ones a user can meet are defined in ``drover.errors`` (under
``DroverError``), the control-flow signals in ``drover._signals``.
"""

from __future__ import annotations

from drover._signals import LimiterSaysLater, RetryableFailure, RetryLater
from drover.errors import AgentError, CallFailed, Cancelled, CostCapReached, NeverFits

__all__ = ["AgentError", "CallFailed", "Cancelled", "CostCapReached", "LimiterSaysLater",
           "NeverFits", "RetryLater", "RetryableFailure"]
