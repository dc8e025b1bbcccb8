"""(a) `asyncio.gather` over every sub-agent, no limits: the first thing everyone writes.

`return_exceptions=True` is the kind version (here `gather_capped`: the same plus a time
cap): without it the first exception would discard every result that came back. The SDK
retries each call twice (its default), honouring the 429's `retry-after`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import anthropic

from bench.contenders.common import (
    Outcome,
    RunContext,
    error_name,
    gather_capped,
    subagent_async,
)


async def _main(ctx: RunContext) -> Outcome:
    client = anthropic.AsyncAnthropic(base_url=ctx.sim_url, api_key=ctx.api_key)
    started = time.monotonic()
    results = await gather_capped(
        [subagent_async(client.messages.create, task) for task in ctx.workload.tasks],
        ctx.time_cap_s)
    makespan = time.monotonic() - started
    await client.close()
    lost = [r for r in results if isinstance(r, BaseException)]
    return Outcome(completed=len(results) - len(lost), lost=len(lost), makespan_s=makespan,
                   errors=dict(Counter(error_name(e) for e in lost)), started_at=started,
                   finished_at=started + makespan)


def run(ctx: RunContext) -> Outcome:
    return asyncio.run(_main(ctx))
