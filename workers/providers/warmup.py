"""A worker's SDK warmed up before its first real call, against a one-shot local server.

The first call a process makes through the anthropic SDK is slow: the SDK imports and
builds its request and response types lazily (pydantic models, the httpx transport), which
under CPU load takes 0.1-0.2 s. A call the limiter granted for instant s then leaves at
s + 0.2, bunched with the calls granted after it: a job's first burst, from every worker at
once, is exactly the calls whose lateness the provider's bucket has least room for. So the
runtime makes one call at start through each provider the worker calls, as a real call makes
it (``Provider.stream_turn`` on a client of its own), to a server in this process that
answers once, with the provider's own canned stream (``Provider.warm_up_stream``), and
closes. Never the provider: nothing is billed, no limit is spent, and the configured base URL
and key are not used. A provider's SDK is imported only when the worker calls that provider.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from drover.workers.providers._base import Provider
from drover.workers.providers.registry import provider
from drover.workers.providers.streams import Seen

log = logging.getLogger(__name__)


async def _answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       seen: list[str], stream: bytes) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        seen.append(lines[0])
        length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                       if line.lower().startswith("content-length:")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(stream)
                     + stream)
        await writer.drain()
    finally:
        writer.close()


async def warm_up(providers: Iterable[str] = ("anthropic",), timeout_s: float = 10.0
                  ) -> list[str]:
    """One streamed call through each of ``providers`` (the ones the worker calls), each to a
    local server; the request lines those received (one per call, unless something went
    wrong). Never raises: a failed warm-up only leaves the first real call slow."""
    seen: list[str] = []
    warmed = {_warmed_as(provider(name)) for name in providers}
    for each in sorted((p for p in warmed if p is not None), key=lambda p: p.name):
        await _warm(each, seen, timeout_s)
    return seen


def _warmed_as(each: Provider) -> Provider | None:
    """The provider whose canned stream ``each`` has: itself, or the one it builds on and
    inherits it from (Claude on a cloud is warmed as the Anthropic API: the same SDK's
    stream, without the cloud's route and signing); None when it has none."""
    owner = next(k for k in type(each).__mro__ if "warm_up_stream" in vars(k))
    if owner is Provider:
        return None
    return each if owner is type(each) else provider(str(vars(owner)["name"]))


async def _warm(each: Provider, seen: list[str], timeout_s: float) -> None:
    try:
        server = await asyncio.start_server(
            lambda r, w: _answer_once(r, w, seen, each.warm_up_stream), "127.0.0.1", 0)
    except OSError as exc:
        log.debug("sdk warm-up skipped: %s", exc)
        return
    port = server.sockets[0].getsockname()[1]
    client: Any = None
    try:
        client = each.build_client(api_key="warm-up",
                                   base_url=f"http://127.0.0.1:{port}{each.warm_up_path}",
                                   connect_s=timeout_s, idle_s=timeout_s)
        async with asyncio.timeout(timeout_s):
            await each.stream_turn(client, {"model": "warm-up", "max_tokens": 1, "messages": [
                {"role": "user", "content": "ok"}]}, Seen())
    except Exception as exc:  # noqa: BLE001 - only the first real call stays slow
        log.debug("%s sdk warm-up failed: %s", each.name, exc)
    finally:
        if client is not None:
            await client.close()
        server.close()
        await server.wait_closed()
