"""(b) `asyncio.gather` with a semaphore and an `aiolimiter` requests/min limiter.

The usual single-process fix: at most as many calls at once as drover has worker slots, and
`AsyncLimiter(rpm, 60)` (the form in aiolimiter's README) in front of every call. It knows
nothing about tokens. The SDK retries each call twice (its default).
"""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
from aiolimiter import AsyncLimiter

from bench.contenders.common import Outcome, RunContext, gather_outcome


async def _main(ctx: RunContext) -> Outcome:
    client = anthropic.AsyncAnthropic(base_url=ctx.sim_url, api_key=ctx.api_key)
    slots = asyncio.Semaphore(ctx.workers * ctx.concurrency)  # drover's slot count
    rpm = AsyncLimiter(ctx.workload.limits["rpm"], 60)

    async def create(**params: Any) -> Any:
        async with slots, rpm:
            return await client.messages.create(**params)

    try:
        return await gather_outcome(ctx, create)
    finally:
        await client.close()


def run(ctx: RunContext) -> Outcome:
    return asyncio.run(_main(ctx))
