"""(a) `asyncio.gather` over every sub-agent, no limits: the first thing everyone writes.

`return_exceptions=True` is the kind version (here `gather_capped`: the same plus a time
cap): without it the first exception would discard every result that came back. The SDK
retries each call twice (its default), honouring the 429's `retry-after`.
"""

from __future__ import annotations

import asyncio

import anthropic

from bench.contenders.common import Outcome, RunContext, gather_outcome


async def _main(ctx: RunContext) -> Outcome:
    client = anthropic.AsyncAnthropic(base_url=ctx.sim_url, api_key=ctx.api_key)
    try:
        return await gather_outcome(ctx, client.messages.create)
    finally:
        await client.close()


def run(ctx: RunContext) -> Outcome:
    return asyncio.run(_main(ctx))
