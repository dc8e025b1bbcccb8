"""drover's own agent loop, as a sub-agent among the team's: LLM turn -> tool calls ->
checkpoint, until the model ends its turn.

It is registered as the built-in sub-agent ``LOOP`` ("drover.agent"), and ``SubagentRun``
runs it as it runs a team's ``@subagent`` function (``own.run_own``): ``agent_loop(run,
llm)``, where ``llm`` is the turn client (``clients.turn_client``: the limited transport,
deciding each failed attempt, with no journal) and ``run`` the sub-agent's ``LoopRun`` (its
spec, its checkpoint's state, its call context and claim) in place of a JSON input: the
loop's own checkpoints are what a re-run resumes from, so nothing of its calls is journaled,
and each answer is counted here once (usage, turns, the job's token budget), not by the
client.

State is checkpointed twice per turn: right after the model's reply (so a retry never repeats
a completed LLM call) and after the tool results (each tool result is also saved as it
completes, so a crash mid-turn does not run a finished tool again). The reply that ends the
sub-agent is not saved here: the run's record carries it (``SubagentRun._finish``).

The loop returns None when the model ends its turn (the run records it ``ok``, its findings
as the summary), and raises drover's signals for the run to map: ``BudgetSpent`` (a turn cap
or token budget), ``LimiterSaysLater`` (SIGTERM: hand it back; a limiter's "later"; a turn
parked in a Message Batch), ``Cancelled``, ``RetryableFailure``, ``CallFailed``. A cancel
stops a turn's tools, and a turn's stream until its answer is whole (an answer paid for is
kept).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from drover._signals import BudgetSpent
from drover.config.prices import Price
from drover.workers.agent.batch import batch_message, uses_batch
from drover.workers.agent.errors import LimiterSaysLater
from drover.workers.agent.llm import CallContext, create_message, race, wait_or_cancel
from drover.workers.agent.runtime import Runtime
from drover.workers.jobs.records import Checkpoint, budget_tokens
from drover.workers.jobs.spec import JobSpec
from drover.workers.limiter import ScopeLimits, tool_scope
from drover.workers.tools import LOOP, Tool, builtin, get_tools, run_turn

__all__ = ["LOOP", "LoopRun", "agent_loop", "request_params"]

CACHE = {"type": "ephemeral"}


def request_params(spec: JobSpec, model: str, tools: list[Tool],
                   messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The Messages API request of one turn; the shared prefix is marked for prompt caching."""
    params: dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens, "messages": messages}
    if spec.thinking is not None:
        # Its thinking blocks stay in the conversation, passed back unchanged in each tool
        # turn as the API requires; records and logs carry only the text.
        params["thinking"] = {"type": "enabled", "budget_tokens": spec.thinking}
    if spec.system:
        params["system"] = [{"type": "text", "text": spec.system, "cache_control": CACHE}]
    if tools:
        definitions = [t.definition() for t in tools]
        definitions[-1] = {**definitions[-1], "cache_control": CACHE}
        params["tools"] = definitions
    return params


@dataclass
class LoopRun:
    """The sub-agent drover's loop runs, handed to it by its ``SubagentRun``: the job's spec,
    the state resumed from the checkpoint (the loop adds to it), the call context (cancel,
    claim check, send marks) and the claim token its writes go under."""

    rt: Runtime
    job_id: str
    index: int
    token: int
    spec: JobSpec
    state: Checkpoint
    ctx: CallContext
    # What is spent before the next call, given the turn cap (None: nothing is).
    over_budget: Callable[[int | None], Awaitable[str | None]]
    price: Callable[[], Price | None]  # what this sub-agent's model's tokens cost

    async def io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def save(self) -> None:
        """The state, as the checkpoint a re-run resumes from."""
        await self.io(self.rt.store.checkpoints.save, self.job_id, self.index, self.state,
                      self.token)


async def agent_loop(run: LoopRun, llm: Any) -> None:
    """Run the sub-agent's turns until the model ends its turn (from where its checkpoint
    left it); ``llm``: the turn client a realtime turn is sent with."""
    rt, spec, state, ctx = run.rt, run.spec, run.state, run.ctx
    settings = rt.settings
    model = spec.model or settings.model
    tools = get_tools(spec.tools)
    allowed = {t.name: t for t in tools}
    max_turns = spec.max_turns or settings.max_turns
    while True:
        calls = state.pending_tool_calls()
        if calls:
            # A cancel stops a turn's tools too (saved results stay for the record).
            await race(_run_tools(run, calls, allowed), ctx.cancel)
        elif state.turns and state.stop_reason != "tool_use":
            return None
        over = await run.over_budget(max_turns)
        if over:
            raise BudgetSpent(over)
        params = request_params(spec, model, tools, state.messages)
        batched = uses_batch(spec, settings)
        if batched:  # the turn goes into a Message Batch (checks the cancel itself)
            message = await batch_message(rt, params, ctx, state, run.token)
        else:
            if rt.shared.heartbeat().draining:  # SIGTERM: no new call, hand it back
                raise LimiterSaysLater(0.0, "worker shutting down")
            message = await create_message(rt, params, ctx, client=llm)
        state.messages.append({"role": "assistant", "content": message.content_json()})
        state.turns += 1
        state.stop_reason = message.stop_reason
        state.usage.add(message.usage, batch=batched, price=run.price())
        final = not state.pending_tool_calls() and state.stop_reason != "tool_use"
        if not final:
            await run.save()
        if spec.token_budget:
            await run.io(rt.store.spending.spend, run.job_id, budget_tokens(message.usage))
        if final:
            return None


async def _run_tools(run: LoopRun, calls: list[dict[str, Any]], allowed: dict[str, Tool]
                     ) -> None:
    """The turn's tool calls, each result saved as it completes (one saved before is not run
    again), then the turn's results into the state, checkpointed."""
    rt, spec, state = run.rt, run.spec, run.state
    settings = rt.settings
    done = await run.io(rt.store.checkpoints.tool_results, run.job_id, run.index)

    async def save(tool_use_id: str, result: dict[str, Any]) -> None:
        await run.io(rt.store.checkpoints.save_tool_result, run.job_id, run.index,
                     tool_use_id, result, run.token)

    results = await run_turn(
        calls, allowed, done=done,
        max_parallel=min(spec.max_parallel_tools or settings.max_parallel_tools,
                         settings.max_parallel_tools),
        max_calls=settings.max_tool_calls_per_turn, default_timeout=settings.tool_timeout_s,
        save=save, gate=partial(_tool_gate, run), max_result_chars=settings.max_tool_result_chars)
    for call, result in zip(calls, results, strict=True):
        state.tried.append(f"{call['name']}({_short(call.get('input'))})")
        if result["is_error"]:
            state.failed.append(f"{call['name']}: {result['content'][:200]}")
    state.messages.append({"role": "user", "content": results})
    await run.save()


async def _tool_gate(run: LoopRun, tool_: Tool) -> None:
    """A tool with a rate (``rps``) waits for its turn in the fleet's limiter."""
    rt = run.rt
    rps = rt.settings.tool_rps.get(tool_.name, tool_.rps)
    if not rps:
        return
    scope, limits = tool_scope(tool_.name), ScopeLimits.for_tool(rps)
    cancel = rt.cancel_event(run.job_id)
    while True:
        grant = await rt.limiter.acquire(scope, limits, lease_ttl_s=60)
        if grant.granted:
            await rt.limiter.settle(scope, limits, grant, input_tokens=0, output_tokens=0)
            await wait_or_cancel(grant.wait_s, cancel)
            return
        await wait_or_cancel(grant.retry_after_s, cancel)


def _short(value: Any, limit: int = 80) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in (value or {}).items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


builtin(LOOP, agent_loop)
