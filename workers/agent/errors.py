"""What can end an agent step early, as one small hierarchy.

``AgentError`` is the base. ``RetryLater`` means "free the worker slot and come back after
``countdown`` seconds" (a Celery retry); it has two kinds that callers must tell apart:
``LimiterSaysLater`` (nothing failed, the limiter or a cooldown wants a later start) and
``RetryableFailure`` (an attempt failed and counts against ``DROVER_MAX_ATTEMPTS``).
``CallFailed`` will not succeed by retrying; ``Cancelled`` means the job was cancelled or ran
out of time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drover.workers.agent.retry import Decision

__all__ = ["AgentError", "CallFailed", "Cancelled", "LimiterSaysLater", "NeverFits",
           "RetryLater", "RetryableFailure"]


class AgentError(Exception):
    """Base of every exception the agent raises on purpose.

    ``call_outcome`` tells telemetry what the exception means for an LLM call's count
    without telemetry importing the agent: "cancelled", "deferred" (no call was made), or
    None (a ``decision`` of the retry policy says, or it is an error)."""

    call_outcome: str | None = None


class Cancelled(AgentError):
    """The job was cancelled (or its deadline passed) while this step waited or ran."""

    call_outcome = "cancelled"


class RetryLater(AgentError):
    """Free the worker slot and come back after ``countdown`` seconds (a Celery retry)."""

    call_outcome = "deferred"  # unless a ``decision`` says the call failed (RetryableFailure)

    def __init__(self, countdown: float, reason: str):
        super().__init__(f"retry in {countdown:.1f} s: {reason}")
        self.countdown = countdown
        self.reason = reason


class LimiterSaysLater(RetryLater):
    """Nothing failed: the limiter (horizon, cooldown) or Redis wants a later start."""


class RetryableFailure(RetryLater):
    """An attempt failed in a way that may succeed later (529, 5xx, 429, connection)."""

    def __init__(self, countdown: float, decision: Decision, reason: str | None = None):
        super().__init__(countdown, reason or decision.error_type)
        self.decision = decision


class CallFailed(AgentError):
    """A call that will not succeed by retrying (or whose attempts are used up)."""

    def __init__(self, decision: Decision):
        super().__init__(f"{decision.status_code or ''} {decision.error_type}: {decision.message}")
        self.decision = decision


class NeverFits(CallFailed):
    """A request the limits could never admit (more input tokens, or a larger max_tokens,
    than a whole minute of the limit; see ``fits``): failed before sending, since waiting or
    retrying cannot help."""

    call_outcome = "not_sent"
