"""A sub-agent's function run to its output: a team's own (an ``@subagent`` function) or
drover's own loop (the built-in ``drover.agent``, ``loop.py``), one path for both.

``SubagentRun`` (``subagent.py``) takes the claim, the checkpoint, the cancel event and the
deadline, then hands a team's function its input and a limited client bound to
this sub-agent (``CallContext``: the claim check and the send mark before each call, each
answer's usage into the sub-agent's checkpoint, the cancel; its answered calls journaled, so
a re-run after a worker died replays them instead of sending them again). The function runs
raced against the job's cancel event, so a cancel or a deadline closes the call it is in, as
it does for drover's loop.

What the function raises is its own failure (that sub-agent ends ``failed`` with the
exception's type and message; the others go on), except drover's signals passing through it:
a cancel, a claim another delivery holds, a wait the limiter hands back to Celery. drover's
loop is handed its run (``loop.LoopRun``) and the turn client instead, and is neither raced
nor judged here (``run_own``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drover._signals import ClaimLost, OwnFailed
from drover.errors import AgentError
from drover.workers.agent.llm import CallContext, race
from drover.workers.jobs.spec import output_json
from drover.workers.tools import Subagent

__all__ = ["OUTPUT_BYTES", "ClientOf", "run_own"]

# The most JSON one sub-agent's output may take: every record is read back whole by the join
# and by JobHandle.wait, so a large result belongs elsewhere, its reference in the output.
OUTPUT_BYTES = 64_000
ERROR_CHARS = 2_000  # of an exception's message kept in the record
# What builds a sub-agent's limited client from the runtime and its CallContext: the task
# layer hands in the clients room's ``subagent_client`` (the agent does not import that room,
# which builds on it).
ClientOf = Callable[[Any, CallContext], Any]


def _drovers(error: BaseException) -> BaseException | None:
    """drover's own signal behind ``error`` (its cause or context, as the SDK wraps what its
    transport raised in a connection error), if any."""
    seen: set[int] = set()
    cause = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, AgentError | ClaimLost):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


async def run_own(own: Subagent, item: Any, llm: Any, ctx: CallContext) -> Any:
    """Run the sub-agent ``own`` on its input with the client ``llm``; its JSON-able output.

    A team's function raises ``OwnFailed`` for its own failure, ``Cancelled`` when the job's
    cancel event fires first, and drover's signals the client raised inside it. drover's own
    (``own.builtin``: its loop) is not raced (it stops at its own points on a cancel, keeping
    an answer it paid for) and what it raises passes as it is: its run maps it."""
    if own.builtin:
        return await own.fn(item, llm)
    name = own.name
    try:
        value = await race(own.fn(item, llm), ctx.cancel)
    except (AgentError, ClaimLost):  # a cancel, a Celery retry, a failed call: drover's
        raise
    except Exception as error:
        signal = _drovers(error)
        if signal is not None:  # wrapped on its way through the SDK or the team's code
            raise signal from None
        text = str(error)[:ERROR_CHARS]
        kind = type(error).__name__
        raise OwnFailed("exception", f"{kind}: {text}" if text else kind) from None
    try:
        text = output_json(value)
    except ValueError as problem:
        raise OwnFailed("output_not_json", f"the @subagent function {name!r} returned "
                        f"{problem}, which is not JSON: return a dict, list, string, number, "
                        "boolean or None") from None
    size = len(text.encode())
    if size > OUTPUT_BYTES:
        raise OwnFailed("output_too_large", f"the @subagent function {name!r} returned "
                        f"{size:,} bytes of JSON, over the {OUTPUT_BYTES:,} a record keeps: "
                        "return less (keep a large result elsewhere and return its reference)")
    return value
