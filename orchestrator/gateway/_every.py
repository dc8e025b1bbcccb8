"""A step the gateway repeats in the background while it serves: its Redis watch's ping
(``_watch``) and its line's upkeep (``_line``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

__all__ = ["Every"]


class Every:
    """``step()`` every ``seconds`` on the running loop, from ``start`` to ``stop`` (the first
    at once). ``step`` handles its own errors: one that escapes ends the repeats."""

    def __init__(self, seconds: float, step: Callable[[], Awaitable[None]]) -> None:
        self.seconds, self.step = seconds, step
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._repeat())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _repeat(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.seconds)
