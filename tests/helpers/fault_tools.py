"""Tools that misbehave, for the fault tests. Workers import this module when
DROVER_TOOL_MODULES names ``tests.fault_tools`` (they run with the repository root as cwd)."""

from __future__ import annotations

import asyncio
import os
import time

from drover import tool

HANG_TIMEOUT_S = 0.5


@tool(kind="read")
def fault_raises(topic: str = "") -> str:
    """Look something up (always fails, for tests)."""
    raise RuntimeError(f"the backend of fault_raises is down (topic {topic!r})")


@tool(kind="read", timeout_s=HANG_TIMEOUT_S)
async def fault_hangs(topic: str = "") -> str:
    """Look something up (never answers, for tests)."""
    await asyncio.sleep(3600)
    return "unreachable"


@tool(kind="read", timeout_s=HANG_TIMEOUT_S)
def fault_hangs_in_a_thread(topic: str = "") -> str:
    """Look something up (a blocking call that never answers in time, for tests)."""
    time.sleep(3.0)  # a thread cannot be killed: it is abandoned and ends by itself
    return "too late"


@tool(kind="read")
async def fault_blocks_the_loop(topic: str = "") -> str:
    """Look something up (for tests: in a worker started with FAULT_BLOCK_LOOP_S, a blocking
    call inside an async tool holds drover's event loop that long, as a synchronous client
    stuck on a dead connection would)."""
    time.sleep(float(os.environ.get("FAULT_BLOCK_LOOP_S", "0")))
    return f"fact about {topic}: 42"
