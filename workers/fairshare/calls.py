"""Calls from outside the fleet in the queue's fair share: each call of ``drover gateway``
waits for a place in the window by its caller's tenant, as a fleet job's sub-agent does.

Why in the window, not first come first served at the limiter: the limiter books waiting
calls in the order they ask, so one caller that sends 300 calls at once would have every one
of them booked before a second caller's first. The window already is the line that shares
the key between tenants by weight (``scheduler.py``), so a process's calls of one tenant are
a job of that tenant there (a *calls job*, ``calls:<process>:<tenant>``): each call enters it,
waits here (in the process, not in a broker) until the job's places reach its turn, then
reserves, sends and settles through the one call path, and leaves, handing its place on by
the same rule. A call holds no worker slot, so it counts against the line cap only (what the
limiter serves within its horizon); with no cap (the key is not the bottleneck) it goes at
once, one script call later.

One script call per enter and per leave; places granted to the job by other processes (a
sub-agent's record, another call's leave) are seen by polling the job's counter while calls
wait. Places are interchangeable, so the waiting calls take them in their order of arrival
here, whichever call's leave freed them. A process marks itself alive (``keep_alive``, every
``PUMP_S``); the pump forgets the calls jobs of a process whose mark is gone (killed), and
with them the places it held. Places the process's ops hand to the fleet's jobs are
published by ``publish`` (off the event loop), as a submitter publishes its own grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from drover.config import Settings
from drover.workers.fairshare.scheduler import CALLS_PREFIX, PUMP_S, Dispatch, calls_job_id
from drover.workers.jobs import reply_text as _s
from drover.workers.jobs.spec import PRIORITIES

__all__ = ["CallPlaces"]

log = logging.getLogger(__name__)
POLL_S = 0.02  # how often a process with calls waiting reads its jobs' places
ALIVE_S = PUMP_S * 5  # a process's mark outlives a few missed refreshes
# The window's one script (scheduler.py's), run here on the async client.
_SCRIPT = resources.files("drover.workers.fairshare").joinpath("lua/fairshare.lua").read_text()


@dataclass
class _Line:
    """One tenant's calls job as this process sees it."""

    job_id: str
    tenant: str
    seen: int = 0      # the job's `next` (places granted, ever) as last read
    credit: int = 0    # places granted and not yet taken by a waiting call
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    poller: asyncio.Task[None] | None = None


class CallPlaces:
    """A process's calls in the fair-share window of ``queue`` (on the event loop of
    ``aredis``, an async Redis client). ``publish``: puts grants of the fleet's jobs on the
    broker (blocking; run in a thread)."""

    def __init__(self, aredis: Any, settings: Settings, publish: Callable[[list[Dispatch]],
                 None], *, queue: str | None = None, priority: str = "normal") -> None:
        self.r, self.settings, self.publish = aredis, settings, publish
        self.queue = queue or settings.queue
        self.base = f"{settings.key_prefix}:fs:{{{self.queue}}}"
        self.process = uuid.uuid4().hex[:16]
        self.rank = PRIORITIES.index(priority)
        self._script = aredis.register_script(_SCRIPT)
        self._lines: dict[str, _Line] = {}
        self._window, self._window_at = settings.dispatch_window_fallback, -1e9
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextlib.asynccontextmanager
    async def place(self, tenant: str) -> AsyncIterator[None]:
        """Hold a place of ``tenant``'s in the window for the body (waits for it first)."""
        await self.enter(tenant)
        try:
            yield
        finally:
            try:
                await asyncio.shield(self.leave(tenant))
            except Exception as error:  # its place stays taken until this process is gone
                log.warning("a call of tenant %s could not give its place in the window back "
                            "(%s: %s)", tenant, type(error).__name__, str(error)[:200])

    async def enter(self, tenant: str) -> None:
        """Wait for a place in the line (cancelled: the call leaves the line)."""
        line = self._line(tenant)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.waiting.append(turn)
        try:
            await self._op("enter", line, tenant, self.settings.tenant_weight(tenant),
                           self.rank, 1)
            if not turn.done():
                self._poll(line)
            await turn
        except BaseException:
            if not turn.done() or turn.cancelled():
                with contextlib.suppress(ValueError):
                    line.waiting.remove(turn)
                await asyncio.shield(self._op("withdraw", line))
            else:  # its place came as it was cancelled
                await asyncio.shield(self._op("leave", line))
            raise

    async def leave(self, tenant: str) -> None:
        """The call ended (settled): its place goes to the next by the fair-share rule."""
        await self._op("leave", self._line(tenant))

    async def keep_alive(self) -> None:
        """Mark this process alive (call every ``PUMP_S``)."""
        await self.r.set(f"{self.base}:alive:{self.process}", "1", px=int(ALIVE_S * 1000))

    async def aclose(self) -> None:
        """Leave the window (the process stops): its calls jobs and their places go."""
        for line in self._lines.values():
            if line.poller is not None:
                line.poller.cancel()
            await self._op("remove", line)
        await self.r.delete(f"{self.base}:alive:{self.process}")
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- inside --------------------------------------------------------------------------
    def _line(self, tenant: str) -> _Line:
        line = self._lines.get(tenant)
        if line is None:
            line = self._lines[tenant] = _Line(calls_job_id(self.process, tenant), tenant)
        return line

    async def _op(self, op: str, line: _Line, *args: str | int | float) -> None:
        settings = self.settings
        reply = await self._script(
            keys=[f"{self.base}:jobs", f"{self.base}:seq", f"{self.base}:tenants",
                  f"{self.base}:granted", f"{self.base}:deferred:{line.job_id}",
                  f"{self.base}:cap", f"{self.base}:leases"],
            args=[op, await self._current_window(), settings.priority_floor,
                  settings.result_ttl_s, 5.0, "", line.job_id, *args])
        if op in ("enter", "leave", "withdraw"):
            if op == "withdraw" and int(reply[1]):
                line.credit -= 1  # its place had been granted: the script freed it again
            self._saw(line, int(reply[0]))
            reply = reply[2:]
        fleet = [Dispatch(_s(reply[i]), int(reply[i + 1]), int(reply[i + 2]))
                 for i in range(0, len(reply), 3)
                 if not _s(reply[i]).startswith(CALLS_PREFIX)]
        if fleet:
            task = asyncio.ensure_future(self._publish(fleet))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _saw(self, line: _Line, granted: int) -> None:
        """The job has had ``granted`` places: the waiting calls take the new ones in order."""
        if granted > line.seen:
            line.credit += granted - line.seen
            line.seen = granted
        while line.credit > 0 and line.waiting:
            turn = line.waiting.popleft()
            if turn.done():  # cancelled: its call withdraws itself
                continue
            turn.set_result(None)
            line.credit -= 1

    def _poll(self, line: _Line) -> None:
        if line.poller is None or line.poller.done():
            line.poller = asyncio.ensure_future(self._watch(line))

    async def _watch(self, line: _Line) -> None:
        """Read the job's places while calls wait (others' ops grant them too)."""
        jobs = f"{self.base}:jobs"
        while line.waiting:
            await asyncio.sleep(POLL_S)
            try:
                raw = await self.r.hget(jobs, line.job_id)
            except Exception as error:  # the calls wait on; the next read may answer
                log.warning("calls waiting for a place could not read the window (%s); "
                            "again in a second", type(error).__name__)
                await asyncio.sleep(1.0)
                continue
            if raw is None and line.waiting:
                # Forgotten (this process's mark lapsed, say Redis was away): join again.
                log.warning("the window forgot this process's calls of tenant %s: they join "
                            "its line again", line.tenant)
                line.seen = line.credit = 0
                await self._op("enter", line, line.tenant,
                               self.settings.tenant_weight(line.tenant), self.rank,
                               len(line.waiting))
                continue
            if raw is not None:
                self._saw(line, int(json.loads(_s(raw))["next"]))

    async def _publish(self, runs: list[Dispatch]) -> None:
        try:
            await asyncio.to_thread(self.publish, runs)
        except Exception as error:  # listed as granted: a pump publishes them later
            log.warning("could not publish sub-agents the window granted (%s: %s)",
                        type(error).__name__, error)

    async def _current_window(self) -> int:
        """The window as the workers size it (the setting, else their live slots), read at
        most once a second."""
        if self.settings.dispatch_window:
            return self.settings.dispatch_window
        loop = asyncio.get_running_loop()
        if loop.time() - self._window_at > 1.0:
            now = await self.r.time()
            clock = now[0] + now[1] / 1e6
            total = 0
            for value in (await self.r.hgetall(f"{self.base}:slots")).values():
                slots, until = _s(value).split(":")
                if float(until) >= clock:
                    total += int(slots)
            self._window = total or self.settings.dispatch_window_fallback
            self._window_at = loop.time()
        return self._window
