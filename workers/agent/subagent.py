"""One sub-agent's run, from its claim to its record: drover's own loop (``loop.py``) or a
team's ``@subagent`` function (``own.py``), one path for both.

``SubagentRun`` takes the sub-agent's claim, resumes its state from the checkpoint, holds the
job's cancel event and deadline, and runs the job's sub-agent through ``own.run_own``: the
function the job names (``JobSpec.subagent``), or the built-in ``LOOP`` ("drover.agent")
for a job of subtasks, handed its ``LoopRun`` and the turn client. Whatever it raises is
mapped here to the sub-agent's record or to a Celery retry.

State is checkpointed in Redis (the loop: per turn and per tool result; a function: per
answered call, its answers journaled) and a retry or a redelivered task resumes from the
checkpoint. The state that ends the sub-agent is checkpointed with its record, in the
record's one script (the record is what a redelivery finds; the final checkpoint is only the
transcript, ``JobHandle.transcript``).

Never twice at once: the start takes the sub-agent's claim (workers/jobs/claims.py) in the same
round trip that reads its state, every checkpoint, tool result and the record is written only
under that claim, and the check before each LLM call reads it too; a delivery that finds a
newer claim stops with ``ClaimLost`` before any call. That check runs after the limiter's
wait, right before the send (``CallContext.check``), so a worker paused while it waited sends
nothing once it wakes. A worker that is shutting down hands its sub-agents back to the broker
(checkpointed) instead of starting another call.

A run never raises for an expected failure: it ends with a ``SubagentResult``
(``ok | failed | cancelled | budget_exceeded``), or raises ``RetryLater`` for a Celery retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from functools import partial
from typing import Any

import redis

from drover._signals import BudgetSpent, OwnFailed
from drover.config.prices import Price
from drover.workers.agent.errors import (
    CallFailed,
    Cancelled,
    CostCapReached,
    LimiterSaysLater,
    RetryableFailure,
)
from drover.workers.agent.llm import CallContext
from drover.workers.agent.loop import LOOP, LoopRun
from drover.workers.agent.own import ClientOf, run_own
from drover.workers.agent.retry import Decision
from drover.workers.agent.runtime import Runtime
from drover.workers.connections import redis_outage
from drover.workers.jobs.claims import ClaimLost
from drover.workers.jobs.records import (
    SUMMARY_CHARS,
    Checkpoint,
    SubagentResult,
    budget_tokens,
)
from drover.workers.jobs.spec import JobSpec
from drover.workers.telemetry import subagent_finished, subagent_run
from drover.workers.tools import get_subagent

REDIS_DOWN_RETRY_S = 10.0  # Redis stayed away longer than the clients retry: come back later
SENDS_END_S = 5.0  # the most a cancelled function's record waits for its sends to settle
log = logging.getLogger(__name__)


class SubagentRun:
    """One delivery of ``run_subagent``: resumes from the checkpoint, ends with a record."""

    def __init__(self, rt: Runtime, job_id: str, index: int, *, token: int = 0,
                 worker: str | None = None, own_client: ClientOf | None = None):
        self.rt = rt
        # An @subagent job's client for its function (the task layer's subagent_client).
        self.own_client = own_client
        self._saving = asyncio.Lock()  # an @subagent's checkpoints, one at a time
        self._marking = asyncio.Lock()  # its send marks, one at a time
        self._no_sends = asyncio.Event()  # set while no send of it is in flight
        self._no_sends.set()
        self.spent: str | None = None  # an @subagent's call refused for a spent budget: why
        self.job_id = job_id
        self.index = index
        self.store = rt.store
        self.message_token = token  # the claim token its message carries
        self.worker = worker
        self.token = 0  # the claim this delivery took at its start
        self.records_in: int | None = None  # the job's record count once this one's was stored

    async def _io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    @subagent_run
    async def run(self) -> SubagentResult:
        """Run (or resume) the sub-agent to its record; raises ``RetryLater`` for a Celery retry."""
        worker = self.worker or self.rt.shared.heartbeat().id
        start = await self._io(partial(self.store.checkpoints.start, self.job_id, self.index,
                                       worker=worker, token=self.message_token))
        if start.record is not None:  # delivered twice: counted once
            return start.record
        if start.stale:  # another delivery holds the claim: no call from this one
            raise ClaimLost(f"{self.job_id}/{self.index}: message token {self.message_token} "
                            "is stale")
        self.worker, self.token = worker, start.token
        spec = start.spec
        assert spec is not None
        state = start.checkpoint or Checkpoint.first(start.task or "")
        self.spec, self.state, self.task = spec, state, start.task
        await self._lost_sends(start.sent)
        with self.rt.job_scope(self.job_id, start.deadline_in) as cancel:
            ctx = CallContext(self.job_id, self.index, cancel, failures=state.failures,
                              tenant=spec.tenant, check=self._check, settled=self._settled,
                              unanswered=self._unanswered, generating=self._generating,
                              max_cost_usd=spec.max_cost_usd)
            return await self._run(spec, state, ctx)

    async def _check(self, est_in: int, est_out: int) -> int:
        """Before a send: ClaimLost when another delivery holds the sub-agent, Cancelled
        when its job was cancelled (or its deadline passed); else the send is marked in
        Redis in the same step (its number, and every send in flight with its input estimate
        and output bound), and kept in flight in the state until ``_settled``. Its number."""
        state = self.state
        seq = state.sends = state.sends + 1  # taken at once: a function's calls run together
        state.in_flight.append([seq, est_in, est_out])
        self._no_sends.clear()
        try:
            async with self._marking:  # each mark holds the sends in flight when it is written
                mark = {"seq": seq, "in": est_in, "out": est_out,
                        "open": [list(sent) for sent in state.in_flight]}
                if await self._io(self.store.checkpoints.before_send, self.job_id,
                                  self.index, self.token, mark):
                    raise Cancelled()
        except BaseException:
            await self._settled(seq)  # not sent
            raise
        return seq

    async def _settled(self, seq: int) -> None:
        """Send ``seq`` has its outcome (in this state from now): no longer in flight."""
        self.state.in_flight = [sent for sent in self.state.in_flight if sent[0] != seq]
        if not self.state.in_flight:
            self._no_sends.set()

    async def _generating(self, on: bool) -> None:
        """Its answer is streaming in, or no longer (``drover watch``); a lost write costs
        only the display."""
        try:
            await self._io(self.store.counters.generating, self.job_id, self.index, on)
        except Exception as problem:
            log.debug("generating mark of %s/%d not written (%s)", self.job_id, self.index,
                      type(problem).__name__)

    async def _unanswered(self, est_in: int, est_out: int, *, model: str | None = None
                          ) -> None:
        """A call of this delivery went out and its answer never came: billed, so counted
        (at ``model``'s price: the call's)."""
        self.state.usage.add_unanswered(est_in, est_out, self._price(model))
        if self.spec.token_budget:
            await self._io(self.store.spending.spend, self.job_id, est_in + est_out)

    def _price(self, model: str | None = None) -> Price | None:
        """What ``model``'s tokens cost (default: this sub-agent's; None: unpriced)."""
        return self.rt.settings.price_of(model or self.spec.model or self.rt.settings.model)

    async def _sends_ended(self) -> None:
        """A cancelled function's sends still in flight settle before its record is written,
        so that it counts them: a call read in a task of the function's own, which the
        function's cancel does not reach, is closed by the transport's watch of the same
        cancel and settles at once. Waited for up to ``SENDS_END_S``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_sends.wait(), SENDS_END_S)

    async def _lost_sends(self, mark: dict[str, Any] | None) -> None:
        """Sends a lost delivery (its worker killed) made whose outcome it never saved: those
        in flight in the checkpoint, and those of the last send's mark past it (each send in
        flight then, a function's calls made together among them). Each is counted as
        unanswered, at its input estimate and its output bound (its max_tokens: the most the
        provider can have billed). Counted once: the state that counts them also takes their
        numbers, so a later resume finds nothing to add."""
        state = self.state
        lost = {int(sent[0]): sent for sent in state.in_flight}
        if mark:
            marked = mark.get("open") or [[mark["seq"], mark.get("in", 0), mark.get("out", 0)]]
            lost |= {int(sent[0]): sent for sent in marked if int(sent[0]) > state.sends}
            state.sends = max(state.sends, int(mark["seq"]), *lost)
        state.in_flight = []
        for seq, est_in, est_out in (lost[n] for n in sorted(lost)):
            log.warning("sub-agent %s/%d: call %d was sent by a delivery that was lost before "
                        "its answer was saved; counted as unanswered (about %d input, up to %d "
                        "output tokens)", self.job_id, self.index, seq, est_in, est_out)
            await self._unanswered(int(est_in), int(est_out))

    async def _run(self, spec: JobSpec, state: Checkpoint, ctx: CallContext
                   ) -> SubagentResult:
        try:
            return await self._subagent(spec, state, ctx)
        except ClaimLost:
            raise
        except Cancelled:
            if spec.subagent is not None:
                await self._sends_ended()
            reason = await self._io(self.store.cancels.cancelled, self.job_id)
            if reason is None and self.rt.shared.heartbeat().handing_back:
                # The worker's shutdown grace ran out mid-call: resume elsewhere from here.
                await self._io(self.store.checkpoints.save, self.job_id, self.index, state,
                               self.token)
                raise LimiterSaysLater(0.0, "worker shutting down") from None
            failed = await self._io(self.store.cancels.failed_all, self.job_id)
            if failed is not None:  # the job failed as a whole (its key was refused)
                return await self._finish(state, "failed", error=failed["reason"],
                                          error_type=failed["type"],
                                          status_code=failed["status"])
            reason = reason or "cancelled"
            return await self._finish(state, "cancelled", error=reason, error_type="cancelled")
        except BudgetSpent as spent:  # not sent: its turn cap or a token budget is spent
            return await self._finish(state, "budget_exceeded", error=str(spent),
                                      error_type="budget_exceeded")
        except CostCapReached as capped:  # not sent: the job's (or tenant's) cap in dollars
            return await self._finish(state, "budget_exceeded", error=str(capped),
                                      error_type="budget_exceeded")
        except RetryableFailure as failure:
            return await self._failed_attempt(spec, state, failure)
        except LimiterSaysLater:
            await self._io(self.store.checkpoints.save, self.job_id, self.index, state,
                           self.token)
            raise
        except CallFailed as failure:
            return await self._fail(spec, state, failure.decision)
        except redis.RedisError as error:
            # The checkpoint is in Redis: nothing to record now, resume from it later.
            redis_outage.noticed(f"sub-agent {self.job_id}/{self.index}", error)
            log.debug("sub-agent %s/%d: Redis unavailable (%s: %s); retry in %g s",
                      self.job_id, self.index, type(error).__name__, error, REDIS_DOWN_RETRY_S)
            raise LimiterSaysLater(REDIS_DOWN_RETRY_S, f"redis: {type(error).__name__}"
                                   ) from None
        except Exception as error:
            # A bug or a broken deployment. Raising would fail the chord (the join would never
            # run); a failed record keeps the job going and says what happened.
            log.exception("sub-agent %s/%d crashed", self.job_id, self.index)
            return await self._fail(spec, state, Decision(
                "fail", type(error).__name__, str(error)[:500] or type(error).__name__))

    async def _subagent(self, spec: JobSpec, state: Checkpoint, ctx: CallContext
                   ) -> SubagentResult:
        """The job's sub-agent on this sub-agent's input, to its record: the team's
        ``@subagent`` function on its JSON input, with its limited client (journaled); or
        drover's own loop (``loop.agent_loop``), handed this run's ``LoopRun`` and the turn
        client, whose own checkpoints resume it (no journal)."""
        own = get_subagent(spec.subagent or LOOP)  # JobRefused: the worker's modules lack it
        if own.builtin:
            item: Any = LoopRun(self.rt, self.job_id, self.index, self.token, spec, state, ctx,
                                over_budget=partial(self._over_budget, spec, state),
                                price=self._price)
            llm = self.rt.parts.turn_client(self.rt, ctx, spec.model or self.rt.settings.model)
        else:
            if self.rt.shared.heartbeat().draining:  # SIGTERM: no new start, hand it back
                raise LimiterSaysLater(0.0, "worker shutting down")
            if self.own_client is None:
                raise RuntimeError("an @subagent job's run needs own_client (the task layer's "
                                   "subagent_client)")
            ctx.answered, ctx.check = self._answered, self._check_own
            item, llm = json.loads(self.task or "null"), self.own_client(self.rt, ctx)
        try:
            output = await run_own(own, item, llm, ctx)
        except OwnFailed as failed:
            state.failures += 1
            return await self._finish(state, "failed", error=failed.message,
                                      error_type=failed.error_type)
        if self.spent is not None:  # the function went on without the call it was refused
            raise BudgetSpent(self.spent)
        return await self._finish(state, "ok", output=output)

    async def _check_own(self, est_in: int, est_out: int) -> int:
        """Before each call of an @subagent: SIGTERM hands it back at once (its answered calls
        replay from the journal where it resumes), as drover's loop does between turns; a
        spent turn cap or token budget refuses the call (``BudgetSpent``: the sub-agent ends
        ``budget_exceeded``). Its calls are its turns: ``max_turns`` caps them when the job
        sets it (DROVER_MAX_TURNS counts turns of drover's loop only)."""
        if self.rt.shared.heartbeat().draining:
            raise LimiterSaysLater(0.0, "worker shutting down")
        over = await self._over_budget(self.spec, self.state, self.spec.max_turns)
        if over:
            self.spent = over
            raise BudgetSpent(over)
        return await self._check(est_in, est_out)

    async def _answered(self, usage: Any, *, model: str | None = None) -> None:
        """An @subagent's call was answered (its usage settled): counted in its state (at
        ``model``'s price, the call's) as one of its turns, and in the job's token budget;
        the state is saved at once, so a re-run (its answer replayed from the journal, not
        counted again) starts from a state that has it."""
        self.state.usage.add(usage, price=self._price(model))
        self.state.turns += 1
        if self.spec.token_budget:
            await self._io(self.store.spending.spend, self.job_id, budget_tokens(usage))
        async with self._saving:
            await self._io(self.store.checkpoints.save, self.job_id, self.index, self.state,
                           self.token)

    async def _over_budget(self, spec: JobSpec, state: Checkpoint, max_turns: int | None
                           ) -> str | None:
        """What is spent before the next call (None: nothing): the turn cap, the sub-agent's
        token budget or the job's."""
        if max_turns is not None and state.turns >= max_turns:
            return f"turn cap of {max_turns} reached"
        if spec.subagent_token_budget and state.usage.budget_tokens >= spec.subagent_token_budget:
            return f"sub-agent token budget of {spec.subagent_token_budget} spent"
        if spec.token_budget:
            spent = await self._io(self.store.spending.spent, self.job_id)
            if spent >= spec.token_budget:
                return f"job token budget of {spec.token_budget} spent ({spent} used)"
        return None

    async def _failed_attempt(self, spec: JobSpec, state: Checkpoint,
                              failure: RetryableFailure) -> SubagentResult:
        decision = failure.decision
        state.failures += 1
        state.last_error = {"type": decision.error_type, "status": decision.status_code,
                               "message": decision.message}
        if state.failures >= self.rt.settings.max_attempts:
            return await self._fail(spec, state, decision)
        await self._io(self.store.checkpoints.save, self.job_id, self.index, state, self.token)
        raise failure

    async def _fail(self, spec: JobSpec, state: Checkpoint, decision: Decision
                    ) -> SubagentResult:
        if decision.action == "fail":
            state.failures += 1
        message = decision.message
        if decision.action == "retry":
            message = f"gave up after {state.failures} attempts; last error: {message}"
        result = await self._finish(state, "failed", error=message,
                                    error_type=decision.error_type,
                                    status_code=decision.status_code)
        if decision.job_wide:  # no call of this job can succeed: end the others now
            # The spend limit: the calls in flight were admitted before it and are paid for,
            # so they finish; a 401/403: nothing will answer, they are aborted.
            await self._io(partial(self.store.cancels.fail_unfinished, self.job_id,
                                   decision.message, error_type=decision.error_type,
                                   status_code=decision.status_code,
                                   abort=not decision.spend_limit))
        elif spec.mode == "all_or_nothing" and result.status == "failed":
            await self._io(self.store.cancels.cancel, self.job_id,
                           f"sub-agent {self.index} failed: {decision.error_type}")
        return result

    @subagent_finished
    async def _finish(self, state: Checkpoint, status: str, *, error: str | None = None,
                      error_type: str | None = None, status_code: int | None = None,
                      output: Any = None) -> SubagentResult:
        # An @subagent's output is its answer: the summary shows the start of its JSON.
        findings = state.findings() if output is None else json.dumps(output)
        result = SubagentResult(
            job_id=self.job_id, index=self.index, status=status,  # type: ignore[arg-type]
            summary=findings[:SUMMARY_CHARS], usage=state.usage,
            turns=state.turns,
            attempts=state.failures + (0 if status == "failed" else 1), error_type=error_type,
            status_code=status_code, error=error, finished_at=time.time(), output=output)
        # The report is not stored apart: it is read from the final state (state.report()).
        stored, self.records_in = await self._io(partial(
            self.store.records.put_counted, result, None, token=self.token,
            worker=self.worker or "", checkpoint=state))
        return stored

