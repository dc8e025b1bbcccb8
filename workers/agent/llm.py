"""drover's own agent loop's LLM call: ``create_message``, one turn sent by the provider's
SDK client on the limited clients' transport (``clients.turn_client``), which takes the one
call path every door takes (``call.Call``: reserve, send, settle); and the job's own calls
(planning, synthesis) counted in the job's usage.

- The call races the job's cancel event and is aborted at the transport when it fires
  (closing the stream is how a cancel stops the bill); the call path settles what it cost.
- A reservation past the horizon, or a failed attempt the policy retries, ends the call with
  ``LimiterSaysLater`` / ``RetryableFailure``: the task turns them into a Celery retry, which
  frees the worker slot meanwhile. The transport decides (``LimitedTransport(decides=True)``)
  and hands the decision over as the SDK's base error whose cause it is: taken off here.
- With a pool of keys, a key refused (401/403) is disabled fleet-wide and the call moves to
  another key; with the one key, the refusal fails the call job-wide.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from drover._signals import ClaimLost
from drover.errors import AgentError
from drover.workers.agent.call import (
    CallContext,
    acquire,
    counted_input,
    learned_limits,
    no_credentials,
    wait_or_cancel,
)
from drover.workers.agent.errors import Cancelled
from drover.workers.agent.retry import missing_credentials
from drover.workers.agent.runtime import Runtime
from drover.workers.jobs.records import Usage
from drover.workers.providers import Answer, AnswerUsage, Seen
from drover.workers.telemetry import llm_call

__all__ = ["CallContext", "acquire", "count_lost_job_call", "counted_input", "create_message",
           "job_answered", "job_call", "job_call_context", "job_unanswered", "learned_limits",
           "race", "wait_or_cancel"]

log = logging.getLogger(__name__)


async def race(coro: Any, cancel: asyncio.Event) -> Any:
    """Await ``coro`` unless ``cancel`` fires first; then the call is cancelled mid-flight."""
    call = asyncio.ensure_future(coro)
    stop = asyncio.ensure_future(cancel.wait())
    try:
        done, _ = await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if call in done:
        return call.result()
    call.cancel()  # closes the HTTP stream: the provider sees the request go away
    try:
        await call
    except (asyncio.CancelledError, Exception):
        pass
    raise Cancelled()


@llm_call
async def create_message(rt: Runtime, params: dict[str, Any], ctx: CallContext, *,
                         client: Any = None) -> Answer:
    """Send one turn inside the limits; raise RetryLater, CallFailed or Cancelled.

    The provider's SDK streams it through the limited transport (reserve, send, settle; the
    job's cancel stops it until its answer is whole, and an answer whole is the loop's); the
    answer is drover's ``Answer``, whichever provider gave it. ``client``: the turn client
    to send with (``clients.turn_client`` for ``ctx`` and the model; None: one made now)."""
    provider = rt.route(params["model"]).provider
    if client is None:
        client = rt.parts.turn_client(rt, ctx, params["model"])
    try:
        # (the transport tells the sub-agent when it is generating, and fills the call's Seen)
        answer: Answer = await provider.stream_turn(client, params, Seen())
        return answer
    except Exception as error:
        signal = error.__cause__
        if isinstance(signal, AgentError | ClaimLost):  # the transport's (or the limiter's) word
            raise signal from None
        if missing_credentials(error):  # the SDK sends nothing without a key: job-wide
            raise no_credentials(rt, ctx, error) from None
        raise


async def job_answered(rt: Runtime, job_id: str, usage: AnswerUsage, *, model: str,
                       batch: bool = False, settles: str | None = None) -> None:
    """Count a job-level call's answer (planning, synthesis) in the job's own usage, priced
    at ``model``'s price (and clear the send mark of ``settles``, the part it answers)."""
    counted = Usage()
    counted.add(usage, batch=batch, price=rt.settings.price_of(model))
    await asyncio.to_thread(rt.store.spending.add_job_usage, job_id, counted, settles=settles)


async def job_unanswered(rt: Runtime, job_id: str, est_in: int, est_out: int, *, model: str,
                         settles: str | None = None) -> None:
    """Count a job-level call that was sent and never answered, at its estimate."""
    counted = Usage()
    counted.add_unanswered(est_in, est_out, rt.settings.price_of(model))
    await asyncio.to_thread(rt.store.spending.add_job_usage, job_id, counted, settles=settles)


def job_call_context(rt: Runtime, job_id: str, part: str, cancel: asyncio.Event,
                     failures: int = 0, *, model: str, max_cost_usd: float | None = None,
                     tenant: str | None = None) -> CallContext:
    """The context of a job's own call (``part``: "plan" or "synthesis") to ``model``: counted
    in the job's usage, and its send marked right before it goes out, so that a delivery which
    finds the mark (its worker died mid-call: ``count_lost_job_call``) counts that call as
    unanswered. The mark goes when the answer is counted, or when the call ends otherwise
    (``job_call``). ``max_cost_usd`` and ``tenant``: the job's cap in dollars and its tenant,
    whose budgets (tokens, and dollars a month) its own calls spend from as its sub-agents'
    do."""
    ctx = CallContext(job_id, -1, cancel, failures, tenant=tenant, max_cost_usd=max_cost_usd)

    async def mark(est_in: int, est_out: int) -> None:
        await asyncio.to_thread(rt.store.spending.mark_job_send, job_id, part, est_in, est_out)

    ctx.check = mark
    ctx.unanswered = partial(job_unanswered, rt, job_id, model=model, settles=part)
    return ctx


async def job_call(rt: Runtime, params: dict[str, Any], ctx: CallContext, part: str
                   ) -> Answer:
    """``create_message`` for a job's own call: whatever ends the call here (an answer, an
    error, a countdown, a cancel) ends its send mark too; only a death mid-call leaves it."""
    try:
        return await create_message(rt, params, ctx)
    except BaseException:
        await asyncio.to_thread(rt.store.spending.clear_job_send, ctx.job_id, part)
        raise


async def count_lost_job_call(rt: Runtime, job_id: str, part: str, *, model: str) -> None:
    """A job's own call to ``model`` sent by a delivery that died before its answer: counted
    once, now."""
    lost = await asyncio.to_thread(rt.store.spending.count_lost_job_send, job_id, part,
                                   rt.settings.price_of(model))
    if lost is not None:
        log.warning("job %s: its %s call was sent by a delivery that was lost before the "
                    "answer; counted as unanswered (about %d input, up to %d output tokens)",
                    job_id, part, lost[0], lost[1])
