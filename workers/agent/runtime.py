"""One event loop per worker process, and what lives on it.

Why a loop and not plain blocking calls in Celery's threads: an LLM call must be abortable
from outside the thread that waits on it (cancel, deadlines). Each Celery task (a thread of
the ``threads`` pool, or a prefork child's main thread) hands its sub-agent to this process's
loop and waits for the outcome. On the loop:

- one provider client (``drover.workers.providers``) per process, so HTTP connections
  are pooled across tasks;
- the ``AsyncLimiter`` over ``redis.asyncio`` (these two the process's root builds, on
  this loop: ``Services.loop_parts``; the runtime takes them);
- a listener on the job-cancel pub/sub channel that sets an ``asyncio.Event`` per job, and
  every HTTP call and limiter wait races against that event, so a cancel aborts the request
  at the transport (the lease is released and the reservation refunded by the caller).

The loop is made lazily and again after a fork, so prefork children each get their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from drover.workers.agent.estimate import Calibration
from drover.workers.agent.routes import Route
from drover.workers.providers import Provider, provider
from drover.workers.telemetry import with_trace_context

if TYPE_CHECKING:  # the root builds the runtime's parts; the agent imports it not
    from drover.workers.services import Services

log = logging.getLogger(__name__)
T = TypeVar("T")
LOOP_PART = "drover's event loop"  # its pulse, for the heartbeat's liveness-means-progress
_POLL_S = 1.0  # how long the cancel listener waits for a message before it looks again


class Runtime:
    def __init__(self, shared: Services):
        # ``shared``: the process's parts its root built (the job store, the heartbeat, the
        # batch queue); what lives on this loop (async Redis, limiter, SDK clients) the root
        # builds on the loop at start (``shared.loop_parts()``).
        self.shared = shared
        self.settings = settings = shared.settings
        self.provider: Provider = provider(settings.provider)  # DROVER_PROVIDER
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        # The job store is sync and reached through asyncio.to_thread: every sub-agent on the
        # loop shares this pool, so it is sized for I/O, not for the CPU count (the default
        # is cores + 4, which queues Redis round trips behind each other on a small host).
        self.loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max_workers=64, thread_name_prefix="drover-io"))
        self._thread = threading.Thread(target=self._run_loop, name="drover-loop", daemon=True)
        self._thread.start()
        self.store = shared.store
        self.calibration = Calibration()
        # scope -> (when read, the limits learned from -limit headers): llm.learned_limits
        self.learned: dict[str, tuple[float, dict[str, float | None]]] = {}
        self._cancel_events: dict[str, asyncio.Event] = {}
        self._active: dict[str, int] = {}  # job id -> sub-agents of it running in this process
        self._deadlines: dict[str, asyncio.TimerHandle] = {}
        # The connection pool under the sub-agents' limited clients on this loop (made on
        # first use: clients.transport.shared_connections).
        self.connections: Any = None
        self._ready = concurrent.futures.Future()  # type: ignore[var-annotated]
        self.submit(self._start())
        self._ready.result(timeout=30)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _start(self) -> None:
        # What lives on this loop is built by the root, here (it binds to the running loop).
        self.parts = parts = await self.shared.loop_parts()
        self.aredis, self.limiter, self.client = parts.redis, parts.limiter, parts.client
        self.batch_client, self.pool = parts.batch_client, parts.pool
        self._routes: dict[str, Route] = {}
        self._closing = False
        self._listener = asyncio.create_task(self._listen_for_cancels())
        self._pulse = asyncio.create_task(self._pulse_forever())
        self._ready.set_result(None)

    def route(self, model: str) -> Route:
        """Where calls to ``model`` reserve: the one key's scope, or the pool's levels."""
        route = self._routes.get(model)
        if route is None:
            # The model's provider (DROVER_MODEL_PROVIDERS): a pool's keys of it serve it.
            route = self._routes[model] = Route(
                self.settings, model, self.client, self.pool,
                provider(self.settings.provider_of(model)))
        return route

    # --- running coroutines from Celery's threads ----------------------------------------
    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(with_trace_context(coro)).result()

    # --- cancellation -------------------------------------------------------------------
    def cancel_event(self, job_id: str) -> asyncio.Event:
        """The event set when ``job_id`` is cancelled (call on the loop)."""
        event = self._cancel_events.get(job_id)
        if event is None:
            event = self._cancel_events[job_id] = asyncio.Event()
        return event

    def interrupt_all(self) -> None:
        """Set every job's cancel event here, so each call in flight ends (a warm shutdown's
        grace is over; the sub-agents see that they were not cancelled and hand back)."""
        def set_all() -> None:
            for event in self._cancel_events.values():
                event.set()

        self.loop.call_soon_threadsafe(set_all)

    def forget(self, job_id: str) -> None:
        self._cancel_events.pop(job_id, None)
        timer = self._deadlines.pop(job_id, None)
        if timer is not None:
            timer.cancel()

    @contextlib.contextmanager
    def job_scope(self, job_id: str, deadline_in_s: float | None = None
                  ) -> Iterator[asyncio.Event]:
        """The job's cancel event while a sub-agent of it runs here (call on the loop).

        A deadline needs a timer: a queued sub-agent sees an expired deadline when it checks
        the store, but one waiting on an HTTP response checks nothing until the response
        comes. The timer sets the event when the deadline passes, which aborts that call the
        same way a cancel message does. The event and the timer go when the last sub-agent
        of the job in this process ends, so a long-lived worker keeps nothing per job.
        """
        event = self.cancel_event(job_id)
        self._active[job_id] = self._active.get(job_id, 0) + 1
        if deadline_in_s is not None and job_id not in self._deadlines:
            self._deadlines[job_id] = self.loop.call_later(max(0.0, deadline_in_s), event.set)
        try:
            yield event
        finally:
            self._active[job_id] -= 1
            if not self._active[job_id]:
                del self._active[job_id]
                self.forget(job_id)

    async def _pulse_forever(self) -> None:
        """In a worker, tell its heartbeat that this loop moves (workers/jobs/liveness.py): a
        loop blocked for DROVER_PROGRESS_STALE_S stops the heartbeat, so the sub-agents it
        runs are sent again elsewhere."""
        heartbeat = None
        part = f"{LOOP_PART} {id(self):x}"  # a process can hold more than one runtime
        try:
            while True:
                heartbeat = self.shared.worker_heartbeat or heartbeat
                if heartbeat is not None:
                    heartbeat.pulse(part)
                await asyncio.sleep(self.settings.heartbeat_s)
        finally:
            if heartbeat is not None:  # closed on purpose: not a lack of progress
                heartbeat.unwatch(part)

    async def _listen_for_cancels(self) -> None:
        channel = self.store.cancels.channel
        while not self._closing:
            pubsub = self.aredis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis went away: listen again once it is back
                log.warning("cancel listener lost Redis (%s: %s); reconnecting",
                            type(error).__name__, error)
                await asyncio.sleep(1.0)
            finally:
                # Bounded: closing a connection that went silent must not hang the listener.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), self.settings.socket_timeout_s)

    async def _listen(self, pubsub: Any) -> None:
        """Set the cancel event of each job named on the channel, until closing.

        Polled rather than ``listen()``: redis-py can swallow a task's cancel in a blocking
        read (redis-py#2028; seen here as a close that waited for ever), so the loop also ends
        by itself within a second of ``close``. A subscribed connection that went silent (no
        FIN, no RST) would otherwise poll for ever and hear no cancel: it is PINGed every
        DROVER_HEALTH_CHECK_S, and one that answers nothing for that plus
        DROVER_SOCKET_TIMEOUT_S is given up and a new one subscribes."""
        every, patience = self.settings.health_check_s, self.settings.socket_timeout_s
        heard = pinged = self.loop.time()
        while not self._closing:
            now = self.loop.time()
            if now - heard > every + patience:
                raise ConnectionError(f"no reply on the subscribed connection for "
                                      f"{now - heard:.0f} s")
            if now - pinged >= every:
                await pubsub.ping()
                pinged = now
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_POLL_S)
            if message is None:
                continue
            heard = self.loop.time()
            if message.get("type") not in ("message", "pmessage"):
                continue  # our PING's pong
            job_id = message["data"]
            job_id = job_id.decode() if isinstance(job_id, bytes) else str(job_id)
            # Only jobs with work here: a sub-agent that starts later reads the cancel from
            # the store before its first call.
            event = self._cancel_events.get(job_id)
            if event is not None:
                event.set()

    def close(self, timeout_s: float = 10.0) -> None:
        async def shutdown() -> None:
            self._closing = True
            self._listener.cancel()
            # Awaited, so the loop does not stop with it pending (an ERROR at exit).
            self._pulse.cancel()
            await asyncio.gather(self._listener, self._pulse, return_exceptions=True)
            if self.connections is not None:
                await self.connections.aclose()
            await self.parts.close()  # the SDK clients, then the async Redis client

        try:
            self.submit(shutdown()).result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            # The loop is busy or blocked: stop it anyway (a process that exits or makes a new
            # runtime must not wait on this one), and say where its thread stood.
            log.warning("drover's event loop did not shut down within %g s; stopping it. "
                        "Its thread was at:\n%s", timeout_s, self.loop_stack())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)

    def loop_stack(self) -> str:
        """Where the loop's thread is now and what its tasks await (for a loop that does not
        answer: blocked in a call, or idle with a task waiting on something that never ends)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        lines = ["".join(traceback.format_stack(frame)) if frame is not None
                 else "(not running)\n"]
        for task in list(asyncio.all_tasks(self.loop)):
            lines.append(f"task {task.get_name()} awaits:\n")
            lines.extend(traceback.format_list(traceback.extract_stack(task.get_stack()[-1]))
                         if task.get_stack() else ["  (no frame)\n"])
        return "".join(lines)


_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime(shared: Services) -> Runtime:
    """This process's runtime, made on first use (and again in a forked child) on ``shared``,
    the parts its root hands it (the worker's ``app.drover``, the submitter's)."""
    global _runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = Runtime(shared)
        return _runtime


def reset_runtime() -> None:
    global _runtime
    with _lock:
        old, _runtime = _runtime, None  # gone even if its close fails
        if old is not None and old.pid == os.getpid():
            old.close()
