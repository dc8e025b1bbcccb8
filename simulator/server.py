"""The aiohttp app and two ways to run it: a background thread (tests, demo) or blocking (CLI)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from . import arrival, clouds
from .batches import Batches
from .config import SimConfig
from .engine import Engine, Pending, Reply, Streamed
from .responses import error_body, json_body, request_id
from .streaming import PING, error_frame

ENGINE_KEY = web.AppKey("engine", Engine)
BATCHES_KEY = web.AppKey("batches", Batches)
T = TypeVar("T")


def _response(reply: Reply) -> web.Response:
    return web.Response(body=reply.body, status=reply.status, headers=reply.headers)


async def _messages(request: web.Request) -> web.StreamResponse:
    return await _serve(request, await request.read())


def _cloud_messages(stream: bool) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Bedrock's invoke routes and Vertex AI's rawPredict routes (simulator/clouds.py): the
    model from the path, the body as the Messages request it stands for."""
    async def handler(request: web.Request) -> web.StreamResponse:
        raw = clouds.messages_body(await request.read(), request.match_info["model"], stream)
        return await _serve(request, raw)
    return handler


async def _serve(request: web.Request, raw: bytes) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    # Judged at the kernel's receive time: a loop starved under load must not turn requests
    # that waited in their sockets into a burst (simulator/arrival.py).
    arrived = arrival.received_at(request.transport)
    engine.enter()
    status = 500
    try:
        outcome = engine.begin_message(request.headers, raw, arrived)
        if isinstance(outcome, Pending) and outcome.stream is not None:
            status = 200
            return await _stream(request, outcome.stream)
        if isinstance(outcome, Pending):
            if outcome.delay > 0:
                await asyncio.sleep(outcome.delay)
            tokens = outcome.output_tokens
            outcome = outcome.finish()
            if request.transport is None or request.transport.is_closing():
                # The client went away (an aborted call): billed, never delivered. 499, as
                # proxies log a request whose client closed it.
                engine.stats.undelivered(tokens)
                status = 499
                return _response(outcome)
        status = outcome.status
        return _response(outcome)
    finally:
        engine.leave(status)


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _sleep_until(request: web.Request, due: float,
                       keepalive: Callable[[], Awaitable[None]] | None = None) -> bool:
    """Sleep until ``due`` (monotonic) in short steps; False as soon as the client is gone
    (aiohttp does not cancel a handler whose client left, so it is looked at). ``keepalive``
    is awaited at each step (a stream's pings)."""
    loop = asyncio.get_running_loop()
    while True:
        if _gone(request):
            return False
        left = due - loop.time()
        if left <= 0:
            return True
        if keepalive is not None:
            await keepalive()
        await asyncio.sleep(min(left, 0.05))


async def _stream(request: web.Request, streamed: Streamed) -> web.StreamResponse:
    """Send a streamed reply's events at their pace: the first token ``first_s`` after
    admission, then ``tokens_per_s``; end it early as its fault says, or when the client
    leaves. Whatever ended it, the tokens generated until then are billed (``close``)."""
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(status=200, headers=streamed.headers)
    sent_tokens, how = 0, "abandoned"
    last_write = [loop.time()]

    async def ping() -> None:
        # The API keeps a stream whose next event is far off alive with pings.
        if streamed.ping_every_s > 0 and loop.time() - last_write[0] >= streamed.ping_every_s:
            await response.write(PING)
            last_write[0] = loop.time()

    try:
        await response.prepare(request)
        start = loop.time()
        first = start + streamed.first_s
        events = streamed.events
        i = 0
        while i < len(events):
            if streamed.cut_after is not None and i >= streamed.cut_after:
                how = "cut"
                if streamed.cut_mode == "error":
                    await response.write(streamed.error_data
                                         or error_frame("overloaded_error", "Overloaded"))
                if request.transport is not None:
                    request.transport.close()  # the connection drops mid-answer
                return response
            event = events[i]
            if i >= 2:  # message_start and its ping go out at once; content from first_s
                due = first + (event.tokens / streamed.tokens_per_s
                               if streamed.tokens_per_s > 0 else 0.0)
                if not await _sleep_until(request, due, ping):
                    return response
            # Events due at once go out in one write (an instant answer is three writes).
            j = i + 1
            limit = len(events) if streamed.cut_after is None else min(len(events),
                                                                        streamed.cut_after)
            if i >= 2:
                while j < limit and (streamed.tokens_per_s <= 0
                                     or events[j].tokens == event.tokens):
                    j += 1
            chunk = [e.data for e in events[i:j]]
            await response.write(b"".join(chunk))
            last_write[0] = loop.time()
            streamed.sent(events[j - 1].tokens - sent_tokens)
            sent_tokens = events[j - 1].tokens
            i = j
        how = "done"
        await response.write_eof()
        return response
    except ConnectionError:  # the client left mid-write
        how = "abandoned"
        return response
    finally:
        streamed.close(sent_tokens, how)


async def _count_tokens(request: web.Request) -> web.Response:
    return _response(request.app[ENGINE_KEY].count_tokens(request.headers, await request.read()))


def _origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def _batch_route(op: str) -> Callable[[web.Request], Any]:
    async def handler(request: web.Request) -> web.Response:
        raw = await request.read() if op == "create" else b""
        batches = request.app[BATCHES_KEY]
        reply = batches.handle(op, request.headers, _origin(request),
                               request.match_info.get("batch_id"), raw, request.query)
        cfg = batches.engine.config
        if op == "create" and reply.status == 200:
            # The batch exists (and bills) from here on; its answer can be held back or lost,
            # so a test can stop the client in between (it never learns the batch's id).
            if cfg.batch_create_delay_s > 0:
                await asyncio.sleep(cfg.batch_create_delay_s)
            if cfg.batch_create_drop and request.transport is not None:
                request.transport.close()
        return _response(reply)
    return handler


def snapshot(engine: Engine, batches: Batches) -> dict[str, Any]:
    """/_sim/stats: the realtime counters, with the batches' under "batches"."""
    snap = engine.snapshot()
    snap["batches"] = batches.snapshot()
    # The whole bill: realtime calls at the prices, batch results at the batch discount.
    bill, batch = snap["billing"], snap["batches"]["billing"]
    snap["billing"] = {"usd": bill["usd"] + batch["usd"], "realtime_usd": bill["usd"],
                       "batch_usd": batch["usd"], "by_model": bill["by_model"],
                       "unpriced_requests": bill["unpriced_requests"]
                       + batch["unpriced_requests"]}
    return snap


async def _stats(request: web.Request) -> web.Response:
    return web.Response(body=json_body(snapshot(request.app[ENGINE_KEY],
                                                request.app[BATCHES_KEY])),
                        content_type="application/json")


async def _reset(request: web.Request) -> web.Response:
    request.app[ENGINE_KEY].reset()
    request.app[BATCHES_KEY].reset()
    return web.Response(body=b'{"ok":true}', content_type="application/json")


async def _config(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        changes = json.loads(await request.read() or b"{}")
        if not isinstance(changes, dict):
            raise ValueError("body must be a JSON object of SimConfig fields")
        config = engine.configure(**changes)
    except ValueError as exc:
        body = error_body("invalid_request_error", str(exc), request_id())
        return web.Response(body=body, status=400, content_type="application/json")
    return web.Response(body=json_body(config.to_dict()), content_type="application/json")


@web.middleware
async def _api_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    # Unknown paths and wrong methods answer in the API's error shape, not aiohttp's text.
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_type = {404: "not_found_error", 405: "invalid_request_error",
                      413: "request_too_large"}.get(exc.status, "api_error")
        req_id = request_id()
        return web.Response(body=error_body(error_type, exc.reason, req_id), status=exc.status,
                            headers={"Content-Type": "application/json", "request-id": req_id})


def make_app(config: SimConfig | None = None, engine: Engine | None = None,
             batches: Batches | None = None) -> web.Application:
    """The simulator as an aiohttp Application (one Engine, i.e. one set of limits and stats)."""
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_api_errors])
    app[ENGINE_KEY] = engine or Engine(config or SimConfig())
    app[BATCHES_KEY] = batches or Batches(app[ENGINE_KEY])
    app.router.add_post("/v1/messages", _messages)
    app.router.add_post("/v1/chat/completions", _messages)  # SimConfig.provider="openai"
    # SimConfig.provider "bedrock" and "vertex" (simulator/clouds.py)
    app.router.add_post("/model/{model}/invoke", _cloud_messages(stream=False))
    app.router.add_post("/model/{model}/invoke-with-response-stream",
                        _cloud_messages(stream=True))
    vertex = "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}"
    app.router.add_post(vertex + ":rawPredict", _cloud_messages(stream=False))
    app.router.add_post(vertex + ":streamRawPredict", _cloud_messages(stream=True))
    app.router.add_post("/v1/messages/count_tokens", _count_tokens)
    app.router.add_post("/v1/messages/batches", _batch_route("create"))
    app.router.add_get("/v1/messages/batches", _batch_route("list"))
    app.router.add_get("/v1/messages/batches/{batch_id}", _batch_route("retrieve"))
    app.router.add_delete("/v1/messages/batches/{batch_id}", _batch_route("delete"))
    app.router.add_get("/v1/messages/batches/{batch_id}/results", _batch_route("results"))
    app.router.add_post("/v1/messages/batches/{batch_id}/cancel", _batch_route("cancel"))
    app.router.add_get("/_sim/stats", _stats)
    app.router.add_post("/_sim/reset", _reset)
    app.router.add_post("/_sim/config", _config)
    return app


async def start_runner(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    # No access log: formatting a line per request costs more than answering it.
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # A socket of our own, whose connections carry the kernel's receive times (arrival.py).
    site = web.SockSite(runner, arrival.listener(host, port, backlog=1024))
    await site.start()
    bound = runner.addresses[0][1]
    return runner, bound


class SimulatorServer:
    """The simulator on its own event loop in a daemon thread; a context manager.

    Control calls (`stats`, `reset`, `configure`) run on the server's loop, so they never
    race a request half-way through.
    """

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.engine = Engine(config or SimConfig())
        self.batches = Batches(self.engine)
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def config(self) -> SimConfig:
        return self.engine.config

    @property
    def url(self) -> str:
        if self._thread is None:
            raise RuntimeError("SimulatorServer is not running: call start() first")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> SimulatorServer:
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._runner, self.port = loop.run_until_complete(
                    start_runner(make_app(engine=self.engine, batches=self.batches), self.host,
                                 self.port))
            except BaseException as exc:  # report to start(), not to a dead thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="drover-simulator", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = self._loop = None
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = self._loop = self._runner = None

    def _on_loop(self, fn: Callable[[], T]) -> T:
        if self._loop is None:
            return fn()

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=30)

    def stats(self) -> dict[str, Any]:
        return self._on_loop(lambda: snapshot(self.engine, self.batches))

    def reset(self) -> None:
        def both() -> None:
            self.engine.reset()
            self.batches.reset()

        self._on_loop(both)

    def arrivals(self) -> list[float]:
        """Wall-clock arrival time of every Messages request since the last reset."""
        return self._on_loop(lambda: list(self.engine.arrivals))

    def configure(self, **changes: Any) -> SimConfig:
        return self._on_loop(lambda: self.engine.configure(**changes))

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
