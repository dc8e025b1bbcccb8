"""Planning: ask the model to split a goal into independent subtasks (structured output).

The model answers through a forced tool call whose input schema is the plan, so the answer
is JSON, not prose to parse. Whatever the model proposes, the plan is cut to
``max_subtasks`` (the hard cap on fan-out): the smallest neighbouring subtasks are merged
until it fits, and empty or duplicate ones are dropped.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from drover.workers.agent.batch import PLAN_PART, job_batch_message, uses_batch
from drover.workers.agent.errors import Cancelled
from drover.workers.agent.llm import (
    CallContext,
    count_lost_job_call,
    create_message,
    job_answered,
    job_call,
    job_call_context,
    job_unanswered,
)
from drover.workers.agent.runtime import Runtime
from drover.workers.jobs.spec import JobSpec

PLAN_TOOL = {
    "name": "submit_plan",
    "description": "Submit the list of independent subtasks, each a self-contained instruction "
                   "for one sub-agent.",
    "input_schema": {
        "type": "object",
        "properties": {"subtasks": {"type": "array", "items": {"type": "string"},
                                    "description": "independent subtasks"}},
        "required": ["subtasks"],
    },
}


def plan_request(goal: str, max_subtasks: int, model: str, system: str | None) -> dict[str, Any]:
    prompt = (f"Split this goal into at most {max_subtasks} independent subtasks that separate "
              f"sub-agents can work on in parallel. Merge pieces that are too small to be worth "
              f"a sub-agent of their own.\n\nGoal: {goal}")
    params: dict[str, Any] = {
        "model": model, "max_tokens": 2048, "tools": [PLAN_TOOL],
        "tool_choice": {"type": "tool", "name": PLAN_TOOL["name"]},
        "messages": [{"role": "user", "content": prompt}],
    }
    if system:
        params["system"] = system
    return params


def fit_plan(subtasks: list[Any], max_subtasks: int) -> list[str]:
    """Clean the proposed subtasks and merge the smallest neighbours until at most N remain."""
    seen: set[str] = set()
    plan: list[str] = []
    for item in subtasks:
        text = str(item).strip()
        if text and text.lower() not in seen:
            seen.add(text.lower())
            plan.append(text)
    while len(plan) > max_subtasks:
        i = min(range(len(plan) - 1), key=lambda k: len(plan[k]) + len(plan[k + 1]))
        plan[i : i + 2] = [f"{plan[i]}; {plan[i + 1]}"]
    return plan


async def plan_goal(rt: Runtime, goal: str, max_subtasks: int, *, model: str | None = None,
                    system: str | None = None, job_id: str = "plan",
                    cancel: asyncio.Event | None = None, failures: int = 0,
                    store_usage: bool = False, by_batch: bool = False,
                    max_cost_usd: float | None = None, tenant: str | None = None
                    ) -> list[str]:
    max_subtasks = min(max_subtasks, rt.settings.max_fanout)
    model = model or rt.settings.model
    params = plan_request(goal, max_subtasks, model, system)
    cancel = cancel if cancel is not None else asyncio.Event()
    if by_batch:  # a batch job's planning goes by Message Batch too (Parked until it is in)
        ctx = CallContext(job_id, -1, cancel, failures)
        ctx.unanswered = partial(job_unanswered, rt, job_id, model=model)
        message = await job_batch_message(rt, params, ctx, PLAN_PART)
        await job_answered(rt, job_id, message.usage, model=model, batch=True)
    elif store_usage:  # the planning call is the job's: counted in its usage like any other
        await count_lost_job_call(rt, job_id, "plan", model=model)
        ctx = job_call_context(rt, job_id, "plan", cancel, failures, model=model,
                               max_cost_usd=max_cost_usd, tenant=tenant)
        message = await job_call(rt, params, ctx, "plan")
        await job_answered(rt, job_id, message.usage, model=model, settles="plan")
    else:
        message = await create_message(rt, params, CallContext(job_id, -1, cancel, failures))
    proposed: list[Any] = []
    for block in message.content:
        if block.type == "tool_use" and block.name == PLAN_TOOL["name"]:
            value = block.input.get("subtasks") if isinstance(block.input, dict) else None
            proposed = value if isinstance(value, list) else []
    plan = fit_plan(proposed, max_subtasks)
    if not plan:
        raise ValueError("the model proposed no usable subtasks for this goal; give subtasks "
                         "explicitly or rephrase the goal")
    return plan


async def plan_job_goal(rt: Runtime, job_id: str, spec: JobSpec, *, failures: int = 0
                        ) -> list[str]:
    """Plan a submitted job's goal; a cancel or the job's deadline aborts the planning call.

    ``failures``: failed attempts so far (the backoff grows with them)."""
    assert spec.goal is not None
    deadline_in = (await asyncio.to_thread(rt.store.meta.deadline_in, job_id)
                   if spec.deadline_s else None)
    with rt.job_scope(job_id, deadline_in) as cancel:
        if await asyncio.to_thread(rt.store.cancels.cancelled, job_id):
            raise Cancelled()
        return await plan_goal(rt, spec.goal, spec.max_subtasks, model=spec.model,
                               system=spec.system, job_id=job_id, cancel=cancel,
                               failures=failures, store_usage=True,
                               by_batch=uses_batch(spec, rt.settings),
                               max_cost_usd=spec.max_cost_usd, tenant=spec.tenant)
