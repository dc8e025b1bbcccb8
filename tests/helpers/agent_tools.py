"""Tools that measure themselves, for the agent-runtime tests.

Workers import this module through
``DROVER_TOOL_MODULES=drover.workers.tools.demo,tests.helpers.agent_tools`` (in-process
workers and worker subprocesses alike). Each tool writes what it sees to Redis
under the running test's own key (``{key_prefix}:probe:{queue}``), so a test can read how
many calls ran at once, in which order, and how often, whichever process ran them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from functools import lru_cache

import redis
from pydantic import BaseModel, Field

from drover import tool
from drover.config import get_settings

# The sync hung tool waits on this instead of sleeping, so a test can let its abandoned
# thread go at teardown (an interpreter exit joins the tool pool's threads).
RELEASE_HUNG = threading.Event()


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def probe_key(settings: object | None = None) -> str:
    settings = settings or get_settings()
    return f"{settings.key_prefix}:probe:{settings.queue}"  # type: ignore[attr-defined]


def _redis() -> tuple[redis.Redis, str]:
    settings = get_settings()
    return _client(settings.redis_url), probe_key(settings)


def _pause(item: str) -> float:
    # Different calls take different times, so completion order differs from call order.
    return 0.2 + 0.05 * (int(hashlib.sha256(item.encode()).hexdigest(), 16) % 6)


def _log(r: redis.Redis, key: str, **event: object) -> None:
    r.rpush(f"{key}:log", json.dumps({"at": time.time(), **event}))


@tool(kind="read", timeout_s=10)
def probe_read(item: str) -> str:
    """Look something up slowly (records how many tools run at once)."""
    r, key = _redis()
    running = r.incr(f"{key}:running")
    _log(r, key, tool="probe_read", item=item, running=running)
    try:
        time.sleep(_pause(item))
    finally:
        r.decr(f"{key}:running")
    return f"read {item}"


@tool(kind="write", timeout_s=10)
def probe_write(item: str, idempotency_key: str = "") -> str:
    """Write something slowly (records overlapping writes and their order)."""
    r, key = _redis()
    running = r.incr(f"{key}:running")
    writing = r.incr(f"{key}:writing")
    _log(r, key, tool="probe_write", item=item, running=running, writing=writing,
         id=idempotency_key)
    try:
        time.sleep(_pause(item))
    finally:
        r.decr(f"{key}:writing")
        r.decr(f"{key}:running")
    return f"wrote {item}"


@tool(kind="read", timeout_s=0.5)
async def probe_hang(item: str) -> str:
    """A lookup that never answers in time."""
    await asyncio.sleep(60)
    return "never"


@tool(kind="read", timeout_s=0.5)
def probe_hang_sync(item: str) -> str:
    """A blocking lookup that never answers in time."""
    RELEASE_HUNG.wait(30)
    return "never"


@tool(kind="read", rps=4)
def probe_rps(item: str) -> str:
    """A lookup against a service that allows 4 requests per second (all hosts together)."""
    r, key = _redis()
    _log(r, key, tool="probe_rps", item=item)
    return f"rate-limited read {item}"


@tool(kind="read")
def probe_poison(item: str) -> str:
    """A lookup whose first answer (in the whole test) makes the next model call fail."""
    r, key = _redis()
    first = r.incr(f"{key}:poison") == 1
    # A simulator trigger in a tool result: the sub-agent's next calls are 500s (its
    # attempts run out). Not a 400, whose message repeats the trigger (the synthesis prompt
    # quotes the failure), nor the spend cap, which stops the key and ends the whole job.
    return "[[sim:500]]" if first else f"clean {item}"


class Quote(BaseModel):
    symbol: str = Field(description="stock symbol")
    days: int = Field(default=5, ge=1, le=365)


@tool(kind="read")
def probe_quote(query: Quote) -> str:
    """Price history of a stock symbol (input given as one pydantic model)."""
    r, key = _redis()
    _log(r, key, tool="probe_quote", type=type(query).__name__, symbol=query.symbol,
         days=query.days)
    return f"{query.symbol}: flat for {query.days} days"


@tool(kind="read", timeout_s=60)
async def probe_slow(item: str) -> str:
    """A lookup that takes a long time (records whether it was stopped or let finish)."""
    r, key = _redis()
    _log(r, key, tool="probe_slow", item=item, event="started")
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        _log(r, key, tool="probe_slow", item=item, event="stopped")
        raise
    _log(r, key, tool="probe_slow", item=item, event="finished")
    return f"slowly read {item}"


@tool(kind="read")
def probe_huge(item: str) -> str:
    """Return a very long page (for the tool result size cap)."""
    return "x" * 200_000
