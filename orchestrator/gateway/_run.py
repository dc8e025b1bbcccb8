"""Running the gateway: its server on the runtime's event loop, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from aiohttp import web

from drover._signals import Refused
from drover.config.providers import about
from drover.orchestrator.gateway._callers import Callers
from drover.orchestrator.gateway._line import GatewayLine
from drover.orchestrator.gateway._server import make_app
from drover.orchestrator.gateway._watch import RedisWatch
from drover.workers.agent.runtime import get_runtime

__all__ = ["serve"]

log = logging.getLogger("drover.gateway")


def providers_served(settings: Any) -> list[str]:
    """The APIs the gateway speaks: DROVER_PROVIDER's first, then a pool's other one."""
    names = [settings.provider]
    for key in settings.keys:
        if key.cloud:  # Claude on a cloud takes other paths: the gateway forwards raw HTTP
            continue
        name = settings.key_provider(key)
        if name not in names:
            names.append(name)
    return names


def serve(shared: Any, port: int, addr: str) -> int:
    """Serve until stopped; ``shared``: the process's parts (its root, ``services``)."""
    settings = shared.settings
    callers = Callers(settings.gateway_keys)
    if not callers:
        raise Refused("drover gateway needs its callers' keys: set DROVER_GATEWAY_KEYS, e.g. "
                      "'[{\"key\": \"dgw-...\", \"tenant\": \"web\"}]' (docs/gateway.md); "
                      "without it every request would be refused")
    providers = providers_served(settings)
    for name in providers:
        _needs_a_key(settings, name)
    rt = get_runtime(shared)
    app = make_app(rt, callers, providers, RedisWatch(shared.redis_probe),
                   GatewayLine(shared, rt.aredis))

    async def start() -> web.AppRunner:
        # handler_cancellation: a caller that disconnects cancels its handler, so its call
        # leaves the limiter's line, or its stream is closed and settled, at once.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, addr, port, backlog=1024).start()
        return runner

    runner = rt.submit(start()).result()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    endpoints = ", ".join(f"POST {p}" for name in providers for p in about(name).gateway_routes)
    print(f"drover gateway listening on http://{addr}:{port} ({endpoints}; "
          f"{len(callers)} caller keys)", file=sys.stderr, flush=True)
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        rt.submit(runner.cleanup()).result(timeout=30)
    return 0


def _needs_a_key(settings: Any, name: str) -> None:
    """Refuse to start without the provider's key: every call would come back 401 (a
    keyless endpoint, a proxy named by its base URL, needs none)."""
    facts = about(name)
    key, base_url = facts.api_key(settings), facts.base_url(settings)
    pooled = any(settings.key_provider(k) == name for k in settings.keys)
    if key is None and not pooled and not base_url:
        raise Refused(f"drover gateway sends its callers' requests on the provider's key: set "
                      f"{facts.api_key_env} (or a pool, DROVER_KEYS); the callers never see it")
