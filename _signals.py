"""drover's internal control-flow signals: exceptions that never reach a user.

Each one unwinds a call stack several frames deep to the one place that knows what to do
(the Celery task, the join, the CLI's ``main``): that is why they are exceptions and not
return values, which every frame between would have to pass on. Where a task catches more
than one, the order of its ``except`` clauses matters (``Parked`` before ``RetryLater``, of
which it is a kind), and each is caught by name, never by ``Exception``.

None crosses a Celery message (task arguments are ids, results are ``SubagentResult``), so
none needs to survive JSON. The user-facing tree is ``drover.errors``; ``RetryLater`` is an
``AgentError`` there only so telemetry reads its ``call_outcome`` like the others'.
"""

from __future__ import annotations

from typing import Any

from drover.errors import AgentError

__all__ = ["BudgetSpent", "ClaimLost", "FlowerRefused", "HeldBack", "Incomplete",
           "LimiterSaysLater", "OwnFailed", "Parked", "Refused", "RetryLater",
           "RetryableFailure"]


class RetryLater(AgentError):
    """Free the worker slot and come back after ``countdown`` seconds (a Celery retry).

    An exception because the limiter's "later" is found deep in the LLM call and only the
    task can ask Celery for a retry (``plan()``, with no Celery, sleeps instead)."""

    call_outcome = "deferred"  # unless a ``decision`` says the call failed (RetryableFailure)

    def __init__(self, countdown: float, reason: str):
        super().__init__(f"retry in {countdown:.1f} s: {reason}")
        self.countdown = countdown
        self.reason = reason


class LimiterSaysLater(RetryLater):
    """Nothing failed: the limiter (horizon, cooldown) or Redis wants a later start. An
    exception for ``RetryLater``'s reason; a kind of its own because it spends no attempt."""


class RetryableFailure(RetryLater):
    """An attempt failed in a way that may succeed later (529, 5xx, 429, connection); unlike
    ``LimiterSaysLater`` it counts against ``DROVER_MAX_ATTEMPTS``. An exception for
    ``RetryLater``'s reason.

    ``decision`` is the retry policy's ``Decision`` (drover.workers.agent.retry)."""

    def __init__(self, countdown: float, decision: Any, reason: str | None = None):
        super().__init__(countdown, reason or decision.error_type)
        self.decision = decision


class BudgetSpent(AgentError):
    """A sub-agent's turn cap or token budget (``max_turns``, ``subagent_token_budget``,
    ``token_budget``) is spent: its next call is not sent, and it ends ``budget_exceeded``
    with what it had done.

    An exception because the next call is where that is found, deep in drover's loop or in a
    team's own function (through its limited client), and only the sub-agent's run records
    it."""

    call_outcome = "not_sent"


class Parked(LimiterSaysLater):
    """The turn's request waits in a Message Batch: free the worker slot until it is back.

    An exception because the turn is queued inside the sub-agent loop, and the task that
    must save its signature and end is several frames up."""

    def __init__(self, reason: str = "waiting for its Message Batch"):
        super().__init__(0.0, reason)


class Incomplete(Exception):
    """Some sub-agents have no record yet (the join came early); try again shortly.

    An exception because the missing record is found while the join reads them one by one;
    the join task turns it into a Celery retry."""


class ClaimLost(Exception):
    """Another delivery holds this part's claim (or it finished): stop, make no call.

    An exception because the claim is checked inside the store's writes, at any depth of the
    sub-agent loop, and the only right answer is to abandon the whole delivery at once."""


class OwnFailed(Exception):
    """A team's ``@subagent`` function failed: it raised (``error_type`` its exception's type),
    or returned what cannot be a record's output. Its sub-agent ends ``failed`` saying so.

    An exception because the function's failure is found inside ``run_own`` and the record is
    written by the sub-agent's run, which ends every sub-agent the same way."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type
        self.message = message


class HeldBack(Exception):
    """A cooldown began while a granted call waited for its send: plan it again.

    An exception because the wait is a few frames below the loop that plans the call."""


class Refused(Exception):
    """The CLI refuses: ``message`` is what to tell the user, ``code`` the exit status (2,
    usage, by default). An exception because the CLI's ``main`` is the one place that prints
    and exits, whatever command found the problem."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class FlowerRefused(ValueError):
    """What is wrong with ``drover flower``'s options, said so the user knows what to set. An
    exception because it is found while the options are parsed one by one, and ``run_flower``
    is the one place that prints it and exits 2."""
