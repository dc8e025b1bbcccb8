"""Every exception a user of drover can meet, as one small tree rooted at ``DroverError``.

``except drover.DroverError`` catches all of them. Each also keeps the standard parent it
had before the tree existed, so ``except LookupError`` (an unknown job id) or ``except
TimeoutError`` (``JobHandle.wait``) go on working::

    DroverError
    ├── SettingsError (ValueError)       a DROVER_* setting is not valid
    ├── JobRefused (ValueError)          submit() refused the job; nothing was enqueued
    ├── JobNotFound (LookupError)        no job of that id (or it expired)
    ├── WaitTimeout (TimeoutError)       JobHandle.wait / as_completed ran out of time
    ├── Unreachable (RuntimeError)       Redis or the broker did not answer
    ├── ResultsStoreError (RuntimeError) the results store (PostgreSQL) did not answer
    ├── WorkerCannotStart (RuntimeError) this worker would fail every sub-agent
    ├── PlanningFailed (RuntimeError)    plan() used up its attempts
    └── AgentError                       an agent step ended early
        ├── Cancelled                    the job was cancelled or ran out of time
        ├── CostCapReached               a call would pass a cap in dollars; not sent
        └── CallFailed                   an LLM call that retrying will not fix
            └── NeverFits                a request the limits could never admit

Arguments of the wrong type or value raise Python's own ``TypeError``/``ValueError``, and
``JobSpec(...)`` raises pydantic's ``ValidationError`` (a ``ValueError``), as pydantic models do.

This module imports nothing of drover, so every room can raise these without an import cycle.
The internal control-flow signals (a Celery retry, a parked batch turn, a lost claim) are not
here: they live in ``drover._signals`` and never reach a user.

They cross no Celery message: a task returns a ``SubagentResult`` for every expected failure
(DESIGN.md), so nothing here needs to survive JSON; ``str(error)`` is the whole message.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AgentError", "CallFailed", "Cancelled", "CostCapReached", "DroverError",
           "JobNotFound", "JobRefused", "NeverFits", "PlanningFailed", "ResultsStoreError",
           "SettingsError", "Unreachable", "WaitTimeout", "WorkerCannotStart"]


class DroverError(Exception):
    """The root: every exception drover raises on purpose for a user to see descends from it."""


class SettingsError(DroverError, ValueError):
    """Raised instead of pydantic's ValidationError so the message tells the user what to fix."""


class JobRefused(DroverError, ValueError):
    """``submit`` refused the job before anything was enqueued (an unknown tool, over the
    fan-out or size cap, a request the limits could never admit); the message says what to fix."""


class JobNotFound(DroverError, LookupError):
    """No job of that id in Redis (never submitted under this key prefix, or expired)."""


class WaitTimeout(DroverError, TimeoutError):
    """``JobHandle.wait``/``as_completed`` ran out of time; the job itself runs on."""


class Unreachable(DroverError, RuntimeError):
    """A service drover needs did not answer; the message says what to do."""


class ResultsStoreError(DroverError, RuntimeError):
    """The results store (``DROVER_RESULTS_URL``, PostgreSQL) did not answer or refused a
    statement; the message names the URL with its password masked."""


class WorkerCannotStart(DroverError, RuntimeError):
    """Why this worker would fail every sub-agent; ``exit_code`` 2 (settings) or 3 (services)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class PlanningFailed(DroverError, RuntimeError):
    """``plan()`` was told to come back later more often than ``DROVER_MAX_ATTEMPTS`` allows."""


class AgentError(DroverError):
    """Base of every exception the agent raises on purpose.

    ``call_outcome`` tells telemetry what the exception means for an LLM call's count
    without telemetry importing the agent: "cancelled", "deferred" (no call was made), or
    None (a ``decision`` of the retry policy says, or it is an error)."""

    call_outcome: str | None = None


class Cancelled(AgentError):
    """The job was cancelled (or its deadline passed) while this step waited or ran."""

    call_outcome = "cancelled"


class CostCapReached(AgentError):
    """A call's worst case would pass a cap in dollars (``JobSpec.max_cost_usd``, or the
    tenant's monthly cap): it was not sent. The message names the cap and what was spent."""

    call_outcome = "not_sent"


class CallFailed(AgentError):
    """A call that will not succeed by retrying (or whose attempts are used up).

    ``decision`` is the retry policy's ``Decision`` (drover.workers.agent.retry): status code,
    error type and message of what the provider answered."""

    def __init__(self, decision: Any):
        super().__init__(f"{decision.status_code or ''} {decision.error_type}: {decision.message}")
        self.decision = decision


class NeverFits(CallFailed):
    """A request the limits could never admit (more input tokens, or a larger max_tokens,
    than a whole minute of the limit; see ``fits``): failed before sending, since waiting or
    retrying cannot help."""

    call_outcome = "not_sent"
