"""``drover gateway``: the provider's own HTTP API, in front of the fleet's global limits.

Any SDK or HTTP client reaches the provider through it by changing only its base URL and its
key (a gateway key of ``DROVER_GATEWAY_KEYS``). Each request:

1. is refused with the provider's 401 when it carries no gateway key of ours (nothing is
   forwarded, nothing reserved);
2. waits for a place of its tenant's in the fleet's fair share (``_line.GatewayLine``: the
   window the fleet's jobs share by tenant weight), then takes its share of the limits and
   is sent with the provider's real key (``_forward.Forwarder``: the one call path),
   waiting in line while the bucket is empty;
3. comes back as the provider answered: a stream event by event as it arrives, an error in
   the provider's own shape, with any provider key scrubbed from it.

The server runs on the runtime's event loop (``workers.agent.runtime``), where the call
path's Redis client and limiter live, so a request never hops between loops. A caller that
disconnects cancels its handler (aiohttp's handler cancellation): a call waiting in line
leaves the line with its reservation refunded, a stream is closed at the provider and
settled at what it had generated (its lease released). When Redis does not answer, the
limits cannot be kept: the gateway answers 503 saying so instead of forwarding unlimited.

Request bodies, prompts and keys are never logged: a request's log line names its tenant,
path, status and timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import httpx2
import redis
from aiohttp import web

from drover.config.providers import about
from drover.errors import CallFailed, Cancelled, NeverFits
from drover.orchestrator.gateway._callers import Callers
from drover.orchestrator.gateway._forward import Forwarder
from drover.orchestrator.gateway._line import GatewayLine
from drover.orchestrator.gateway._watch import RedisWatch
from drover.workers.agent.runtime import Runtime
from drover.workers.providers import json_body, provider
from drover.workers.telemetry import get_recorder

__all__ = ["make_app"]

log = logging.getLogger("drover.gateway")
# Not handed back: what belongs to the provider's hop, and lengths the stream re-frames.
_HOP = frozenset({"content-length", "transfer-encoding", "content-encoding", "connection",
                  "keep-alive", "date", "server"})
_JSON = {"content-type": "application/json"}


def make_app(rt: Runtime, callers: Callers, providers: list[str], watch: RedisWatch,
             line: GatewayLine) -> web.Application:
    """The gateway's aiohttp application on ``rt``, serving ``providers``' endpoints while
    ``watch`` says Redis answers, each call in its tenant's place of ``line``."""
    app = web.Application(client_max_size=64 * 1024 * 1024)  # a prompt with images is large
    forwarders = {name: Forwarder(rt, name) for name in providers}
    for name, forwarder in forwarders.items():
        for path in about(name).gateway_routes:
            app.router.add_post(path, _handler(forwarder, callers, watch, line))
    app.router.add_get("/health", _health(watch))
    app.router.add_route("*", "/{tail:.*}", _not_found(providers[0]))

    async def start(_app: web.Application) -> None:
        watch.start()
        line.start()

    async def close(_app: web.Application) -> None:
        await watch.stop()
        await line.stop()
        for forwarder in forwarders.values():
            await forwarder.aclose()

    app.on_startup.append(start)
    app.on_cleanup.append(close)
    return app


def _handler(fwd: Forwarder, callers: Callers, watch: RedisWatch,  # noqa: ANN202
             line: GatewayLine):
    name = fwd.provider_name
    counted = fwd.provider.counted_path

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        caller = callers.find(request.headers)
        if caller is None:
            _count("unknown", "refused")
            log.info("gateway refused %s: no valid gateway key", request.path)
            return _error(name, 401, "drover gateway: send a key of DROVER_GATEWAY_KEYS as "
                          "x-api-key or Authorization: Bearer (this one is missing or not "
                          "known); the request was not forwarded")
        tenant = caller.tenant
        if not watch.up:
            return _no_redis(name, tenant)
        body = await request.read()
        cancel = asyncio.Event()
        upstream = fwd.request(request.path, request.query_string, request.headers, body)
        async with contextlib.AsyncExitStack() as held:
            try:
                if counted(request.path):  # count_tokens has limits of its own
                    await held.enter_async_context(line.place(tenant, _model(body)))
                answer = await fwd.send(upstream, caller, cancel)
            except asyncio.CancelledError:  # the caller left while its call waited in line
                cancel.set()
                _count(tenant, "disconnected")
                raise
            except redis.RedisError as error:
                log.warning("gateway: the limiter's Redis failed (%s: %s)",
                            type(error).__name__, str(error)[:200])
                return _no_redis(name, tenant)
            except NeverFits as refused:
                _count(tenant, "4xx")
                return _error(name, 413, f"drover gateway: {refused.decision.message}")
            except (CallFailed, Cancelled) as failed:
                _count(tenant, "5xx")
                message = (failed.decision.message if isinstance(failed, CallFailed)
                           else "cancelled")
                return _error(name, 503, f"drover gateway: {message}")
            except httpx2.TimeoutException as error:
                _count(tenant, "5xx")
                return _error(name, 504, "drover gateway: the provider did not answer in "
                              f"time ({type(error).__name__}); the call was counted as sent")
            except httpx2.TransportError as error:
                _count(tenant, "5xx")
                said = fwd.scrub(str(error).encode()).decode()
                return _error(name, 502, f"drover gateway: no connection to the provider "
                              f"({type(error).__name__}: {said})")
            try:
                return await _relay(request, answer, fwd, tenant, started)
            finally:
                await answer.aclose()  # a stream settles here, also when the caller left

    return handle


async def _relay(request: web.Request, answer: httpx2.Response, fwd: Forwarder, tenant: str,
                 started: float) -> web.StreamResponse:
    """The provider's answer to the caller: a stream event by event, anything else whole."""
    headers = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in _HOP]
    streamed = answer.headers.get("content-type", "").startswith("text/event-stream")
    outcome = _outcome(answer.status_code)
    if not streamed:
        content = fwd.scrub(await answer.aread())
        if answer.status_code in (401, 403):  # the gateway's provider key, not the caller's
            content = fwd.provider.error_body(answer.status_code, _refused_key(
                fwd.provider_name, answer.status_code, content))
        _count(tenant, outcome)
        _log(tenant, request.path, answer.status_code, False, started)
        whole = web.Response(status=answer.status_code, body=content)
        for k, v in headers:
            whole.headers.add(k, v)
        return whole
    response = web.StreamResponse(status=answer.status_code)
    for k, v in headers:
        response.headers.add(k, v)
    await response.prepare(request)
    try:
        async for chunk in answer.aiter_raw():
            await response.write(chunk)
    except (ConnectionError, asyncio.CancelledError):
        _count(tenant, "disconnected")
        _log(tenant, request.path, answer.status_code, True, started, "disconnected")
        raise
    # Settled (its usage counted, its lease released) before the caller's stream ends: a
    # caller that reads the limits or the stats right after sees its call in them.
    await answer.aclose()
    _count(tenant, outcome)
    _log(tenant, request.path, answer.status_code, True, started)
    await response.write_eof()
    return response


def _model(body: bytes) -> str | None:
    """The model a request names (its class sizes the line), None when it names none."""
    parsed = json_body(body)
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None


def _refused_key(provider_name: str, status: int, content: bytes) -> str:
    body = json_body(content)
    inner = body.get("error") if isinstance(body, dict) else None
    kind = (inner or {}).get("type") if isinstance(inner, dict) else None
    var = about(provider_name).api_key_env
    return (f"drover gateway: the provider refused the gateway's own provider key ({status} "
            f"{kind or ''}; its operator must check {var} or DROVER_KEYS); your gateway key "
            "is fine")


def _no_redis(provider_name: str, tenant: str) -> web.Response:
    _count(tenant, "unavailable")
    log.warning("gateway answered 503 to tenant=%s: Redis does not answer", tenant)
    return _error(provider_name, 503, "drover gateway: the fleet's limits live in Redis "
                  "(DROVER_REDIS_URL), which does not answer; the request was not forwarded, "
                  "since it would go out unlimited. Retry in a few seconds", retry_after=5)


def _health(watch: RedisWatch):  # noqa: ANN202
    async def health(_request: web.Request) -> web.Response:
        """200 while Redis (the limits) answers, else 503: for a load balancer's check."""
        if not watch.up:
            return web.json_response({"ok": False, "redis": "does not answer"}, status=503)
        return web.json_response({"ok": True})

    return health


def _not_found(provider_name: str):  # noqa: ANN202
    async def not_found(request: web.Request) -> web.Response:
        served = ", ".join(f"POST {p}" for p in about(provider_name).gateway_routes)
        return _error(provider_name, 404, f"drover gateway serves {served} (not "
                      f"{request.method} {request.path})")

    return not_found


def _error(provider_name: str, status: int, message: str, retry_after: int | None = None
           ) -> web.Response:
    headers: Mapping[str, str] = _JSON if retry_after is None else {
        **_JSON, "retry-after": str(retry_after)}
    return web.Response(status=status, body=provider(provider_name).error_body(status, message),
                        headers=headers)


def _outcome(status: int) -> str:
    if status < 400:
        return "ok"
    return "429" if status == 429 else "4xx" if status < 500 else "5xx"


def _count(tenant: str, outcome: str) -> None:
    get_recorder().inc("drover_gateway_requests", (tenant, outcome))


def _log(tenant: str, path: str, status: int, streamed: bool, started: float,
         outcome: str = "") -> None:
    log.info("gateway tenant=%s path=%s status=%d stream=%s s=%.3f%s", tenant, path, status,
             "yes" if streamed else "no", time.monotonic() - started,
             f" outcome={outcome}" if outcome else "")
