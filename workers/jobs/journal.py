"""A sub-agent's journal: the calls its limited client had answered, kept so that a re-run
after its worker died replays them instead of paying for them again (issue 50, item 3).

One Redis hash per sub-agent (``{p}:job:{id}:journal:{i}``), expiring with the job. A call's
field is the hash of its request (endpoint and body) and its place among the identical
requests of the run (the second identical request replays the second answer): a function
that sends its calls concurrently finds its answers whatever order they go out in, and a
function that sends a different request on the re-run (it branched differently) finds
nothing and sends it. Replay saves money only for a function that is deterministic given its
answers: docs/own-code.md says so.

The answer is kept as its bytes (a streamed answer as the stream's bytes, replayed as a
stream) with its status and content type; nothing of it is logged.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Journal", "Kept"]


@dataclass(frozen=True)
class Kept:
    """One answered call as the journal keeps it."""

    status: int
    content_type: str
    content: bytes


class Journal:
    """One sub-agent run's view of its journal (``aredis``: an async Redis client of the
    process's root; ``ttl_s``: the job's)."""

    def __init__(self, aredis: Any, key: str, ttl_s: float) -> None:
        self.redis, self.key, self.ttl_s = aredis, key, int(max(1, ttl_s))
        self._seen: dict[str, int] = {}  # request hash -> how many this run has made

    def field(self, path: str, body: bytes) -> str:
        """The journal's field of the next call of this run with this request."""
        digest = hashlib.sha256(path.encode() + b"\n" + body).hexdigest()[:32]
        nth = self._seen.get(digest, 0)
        self._seen[digest] = nth + 1
        return f"{digest}:{nth}"

    async def answer(self, field: str) -> Kept | None:
        raw = await self.redis.hget(self.key, field)
        if raw is None:
            return None
        kept = json.loads(raw)
        return Kept(int(kept["status"]), str(kept["type"]), base64.b64decode(kept["body"]))

    async def keep(self, field: str, kept: Kept) -> None:
        value = json.dumps({"status": kept.status, "type": kept.content_type,
                            "body": base64.b64encode(kept.content).decode()})
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.key, field, value)
            pipe.expire(self.key, self.ttl_s)
            await pipe.execute()
