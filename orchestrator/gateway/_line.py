"""The gateway's calls in the fleet's fair share: each request waits for a place of its
tenant's in the queue's window (``drover.workers.fairshare.CallPlaces``) before it reserves,
so one caller that floods the gateway cannot push a second caller's calls (or the fleet's
sub-agents) behind its whole backlog: tenants share the key by ``DROVER_TENANT_WEIGHTS`` as
fleet jobs' tenants do.

The window's line cap (what the limiter serves within its horizon) is what bounds calls, and
a gateway with no worker beside it must size it itself: every ``PUMP_S`` for the model
classes of the fleet's jobs and of its own recent calls, and at once before the first call of
a class (as a submitter sizes it before its job's first grant). Grants this process's calls
hand to the fleet's jobs are published here, as a submitter publishes its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from drover.orchestrator.gateway._every import Every
from drover.workers.agent.capacity import active_models, report_line_cap
from drover.workers.fairshare import PUMP_S, CallPlaces, Dispatch

__all__ = ["GatewayLine"]

log = logging.getLogger("drover.gateway")
MODELS_KEPT_S = 600.0  # a model class the gateway's calls used counts in its cap this long


class GatewayLine:
    """The gateway process's place in the window of ``settings.queue``."""

    def __init__(self, shared: Any, aredis: Any) -> None:
        self.shared = shared
        self.settings = settings = shared.settings
        self.places = CallPlaces(aredis, settings, self._publish)
        self.models: dict[str, float] = {}  # model -> when a call last used it
        self._upkeep = Every(PUMP_S, self._keep)

    @contextlib.asynccontextmanager
    async def place(self, tenant: str, model: str | None) -> AsyncIterator[None]:
        """Hold a place of ``tenant``'s for the call (of ``model``, to size the line)."""
        if model:
            known = self.settings.limit_class(model) in self._classes()
            self.models[model] = time.monotonic()
            if not known and self.settings.wait_in_line:
                await asyncio.to_thread(self._size_line)
        async with self.places.place(tenant):
            yield

    def start(self) -> None:
        self._upkeep.start()

    async def stop(self) -> None:
        await self._upkeep.stop()
        with contextlib.suppress(Exception):  # the pump forgets it once its mark is gone
            await self.places.aclose()

    async def _keep(self) -> None:
        try:
            await self.places.keep_alive()
            # A gateway killed mid-call leaves its places: with no worker's pump beside the
            # gateways (no fleet), they free them.
            await asyncio.to_thread(self._forget_gone)
            if self.settings.wait_in_line:
                await asyncio.to_thread(self._size_line)
        except Exception as error:  # Redis away: the watch answers 503 meanwhile
            log.warning("gateway: could not size the limiter's line (%s: %s)",
                        type(error).__name__, str(error)[:200])

    def _classes(self) -> set[str]:
        return {self.settings.limit_class(m) for m in self.models}

    def _size_line(self) -> None:
        settings, shared = self.settings, self.shared
        now = time.monotonic()
        for model, seen in list(self.models.items()):
            if now - seen > MODELS_KEPT_S:
                self.models.pop(model, None)
        fs = shared.fairshare(settings.queue)
        report_line_cap(settings, shared.limiter, shared.redis, fs,
                        lambda: active_models(settings, fs, shared.store) | set(self.models))

    def _forget_gone(self) -> None:
        runs = self.shared.fairshare(self.settings.queue).forget_gone_calls()
        if runs:
            self._publish(runs)

    def _publish(self, runs: list[Dispatch]) -> None:
        from drover.workers.tasklayer.submitting import publish_granted

        publish_granted(self.shared.fairshare(self.settings.queue), runs)
