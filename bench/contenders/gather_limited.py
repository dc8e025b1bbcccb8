"""(b) `asyncio.gather` with a semaphore and an `aiolimiter` requests/min limiter.

The usual single-process fix: at most as many calls at once as drover has worker slots, and
`AsyncLimiter(rpm, 60)` (the form in aiolimiter's README) in front of every call. It knows
nothing about tokens. The SDK retries each call twice (its default).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import anthropic
from aiolimiter import AsyncLimiter

from bench.contenders.common import (
    Outcome,
    RunContext,
    error_name,
    gather_capped,
    subagent_async,
)


async def _main(ctx: RunContext) -> Outcome:
    client = anthropic.AsyncAnthropic(base_url=ctx.sim_url, api_key=ctx.api_key)
    slots = asyncio.Semaphore(ctx.workers * ctx.concurrency)  # drover's slot count
    rpm = AsyncLimiter(ctx.workload.limits["rpm"], 60)

    async def create(**params: Any) -> Any:
        async with slots, rpm:
            return await client.messages.create(**params)

    started = time.monotonic()
    results = await gather_capped([subagent_async(create, task) for task in ctx.workload.tasks],
                                  ctx.time_cap_s)
    makespan = time.monotonic() - started
    await client.close()
    lost = [r for r in results if isinstance(r, BaseException)]
    return Outcome(completed=len(results) - len(lost), lost=len(lost), makespan_s=makespan,
                   errors=dict(Counter(error_name(e) for e in lost)), started_at=started,
                   finished_at=started + makespan)


def run(ctx: RunContext) -> Outcome:
    return asyncio.run(_main(ctx))
