"""The chord body's work: collect every sub-agent's record, synthesise, store the JobResult.

Records are read from Redis, not only from the chord's header results: a header task that was
delivered twice is stored once (first write wins), and the join is idempotent. They are read
a page at a time; a join that synthesises keeps them in compact form (the join of 10,000
sub-agents holds 10,000 small records, not 10,000 full ones), any other keeps only the ones
that did not end ok (their errors, no answer): the answers stay in Redis, and the stored
JobResult reads them from there (Outcomes.get).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from functools import partial

from drover._signals import Incomplete
from drover.workers.agent.batch import SYNTHESIS_PART, Parked, job_batch_message, uses_batch
from drover.workers.agent.errors import CallFailed, Cancelled, CostCapReached, RetryLater
from drover.workers.agent.llm import (
    CallContext,
    count_lost_job_call,
    job_answered,
    job_call,
    job_call_context,
    job_unanswered,
)
from drover.workers.agent.runtime import Runtime
from drover.workers.jobs.records import (
    STATUSES,
    JobResult,
    SubagentResult,
    Usage,
    compact,
    record_chars,
)
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.store import PAGE, JobStore

SYNTHESIS_PROMPT = (
    "You are given the reports of sub-agents that worked on parts of one job. Write one "
    "answer that combines their findings. Say plainly which parts are missing because a "
    "sub-agent failed or was cancelled; do not invent their findings."
)


def synthesis_request(spec: JobSpec, model: str, results: list[SubagentResult],
                      subtasks: list[str]) -> dict:
    lines = [f"Job goal: {spec.goal}" if spec.goal else "Job: the sub-agent tasks below."]
    for record in results:
        task = subtasks[record.index] if record.index < len(subtasks) else "?"
        if record.status == "ok":
            lines.append(f"\n## Sub-agent {record.index} (ok): {task}\n{record.summary}")
        else:
            lines.append(f"\n## Sub-agent {record.index} ({record.status.upper()}, no findings): "
                         f"{task}\nReason: {record.error or record.status}")
    instructions = spec.synthesize if isinstance(spec.synthesize, str) else SYNTHESIS_PROMPT
    params: dict = {"model": model, "max_tokens": spec.max_tokens, "system": instructions,
                    "messages": [{"role": "user", "content": "\n".join(lines)}]}
    if spec.thinking is not None:
        # The job asked its calls to think: the synthesis too (its answer is read from its
        # text blocks only). Planning does not: it forces its tool, which thinking refuses.
        params["thinking"] = {"type": "enabled", "budget_tokens": spec.thinking}
    return params


async def join(rt: Runtime, job_id: str) -> JobResult:
    store = rt.store
    existing = await asyncio.to_thread(store.outcomes.get, job_id)
    if existing is not None:
        return existing
    spec = await asyncio.to_thread(store.specs.get, job_id)
    meta = await asyncio.to_thread(store.meta.get, job_id)
    n = int(meta["n"])
    stored = await asyncio.to_thread(store.records.count, job_id)
    if stored < n:  # the join came early (one read, before walking any page)
        raise Incomplete(f"{n - stored} sub-agents have no record yet")
    tally = await asyncio.to_thread(partial(collect, store, job_id, n,
                                            keep_ok=bool(spec.synthesize)))
    results, counts = tally.results, tally.counts
    cancel_reason = meta.get("cancelled")
    status, reason = "done", None
    if meta.get("failed_all"):  # fail_unfinished: the job's key was refused
        status, reason = "failed", json.loads(meta["failed_all"])["reason"]
    elif spec.mode == "all_or_nothing" and tally.first_failure is not None:
        first = tally.first_failure
        status = "failed"
        reason = f"sub-agent {first.index} failed: {first.error_type}: {first.error}"
    elif cancel_reason:
        status, reason = "cancelled", cancel_reason
    synthesis = None
    # A cancelled job (a cancel, or its deadline) makes no further LLM call, synthesis
    # included: stop means stop. Its records are all there for the caller to combine.
    if spec.synthesize and status == "done" and counts["ok"]:
        synthesis = await _synthesise(rt, job_id, spec, results)
    # The job's own calls (planning, synthesis) count beside its sub-agents'.
    usage = tally.usage
    own = await asyncio.to_thread(store.spending.job_usage, job_id)
    usage.merge(own)
    result = JobResult(job_id=job_id, status=status, reason=reason, results=results,
                       counts=counts, usage=usage,
                       wall_s=round(time.time() - float(meta["created"]), 3),
                       synthesis=synthesis, record_chars=tally.chars)
    await asyncio.to_thread(store.outcomes.save, result)
    rt.forget(job_id)
    return result


@dataclass
class Tally:
    results: list[SubagentResult]  # compact: summaries and errors cut to ``chars``
    counts: dict[str, int]
    usage: Usage
    first_failure: SubagentResult | None
    chars: int


def collect(store: JobStore, job_id: str, n: int, page: int = PAGE, *,
            keep_ok: bool = True) -> Tally:
    """Read the job's records a page at a time and keep only their compact form (with
    ``keep_ok`` false, only those not ok: the answers are counted, not held).

    What the join holds is bounded by n times a compact record (``record_chars``), whatever
    the stored records weigh; raises ``Incomplete`` at the first sub-agent with no record.
    """
    chars = record_chars(n)
    results: list[SubagentResult] = []
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    usage = Usage()
    first_failure = None
    for index, record in store.records.walk(job_id, n, page):
        if record is None:
            raise Incomplete(f"no record yet for sub-agent {index}")
        counts[record.status] += 1
        usage.merge(record.usage)
        record = compact(record, chars)
        if first_failure is None and record.status == "failed":
            first_failure = record
        if keep_ok or record.status != "ok":
            results.append(record)
    return Tally(results, counts, usage, first_failure, chars)


async def _synthesise(rt: Runtime, job_id: str, spec: JobSpec,
                      results: list[SubagentResult]) -> str:
    subtasks = await asyncio.to_thread(rt.store.specs.subtasks, job_id)
    model = spec.model or rt.settings.model
    params = synthesis_request(spec, model, results, subtasks)
    by_batch = uses_batch(spec, rt.settings)  # a batch job's synthesis goes by batch too
    if by_batch:
        ctx = CallContext(job_id, -1, asyncio.Event())  # the synthesis outlives a cancel
        ctx.unanswered = partial(job_unanswered, rt, job_id, model=model)
    else:
        await count_lost_job_call(rt, job_id, "synthesis", model=model)
        ctx = job_call_context(rt, job_id, "synthesis", asyncio.Event(), model=model,
                               max_cost_usd=spec.max_cost_usd, tenant=spec.tenant)
    for _ in range(rt.settings.max_attempts):
        try:
            if by_batch:
                message = await job_batch_message(rt, params, ctx, SYNTHESIS_PART)
                await job_answered(rt, job_id, message.usage, model=model, batch=True)
            else:
                message = await job_call(rt, params, ctx, "synthesis")
                await job_answered(rt, job_id, message.usage, model=model,
                                   settles="synthesis")
        except Parked:  # the join parks until the batch result is in
            raise
        except RetryLater as later:
            ctx.failures += 1
            await asyncio.sleep(min(later.countdown, rt.settings.horizon_s))
            continue
        except (CallFailed, Cancelled) as error:
            return f"(synthesis failed: {error})"
        except CostCapReached as capped:  # not sent: the job's spend is at its cap
            return f"(synthesis not made: {capped})"
        return "\n".join(b.text for b in message.content if b.type == "text")
    return "(synthesis failed: attempts used up)"
