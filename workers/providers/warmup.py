"""A worker's SDK warmed up before its first real call, against a one-shot local server.

The first call a process makes through the anthropic SDK is slow: the SDK imports and
builds its request and response types lazily (pydantic models, the httpx transport), which
under CPU load takes 0.1-0.2 s. A call the limiter granted for instant s then leaves at
s + 0.2, bunched with the calls granted after it: a job's first burst, from every worker at
once, is exactly the calls whose lateness the provider's bucket has least room for. So the
runtime makes one call at start, with a client of the SDK's class of its own, to a server
in this process that answers once and closes. Never the provider: nothing is billed, no
limit is spent, and the configured base URL and key are not used.
"""

from __future__ import annotations

import asyncio
import json
import logging

import anthropic

log = logging.getLogger(__name__)

_BODY = json.dumps({
    "id": "msg_warmup", "type": "message", "role": "assistant", "model": "warm-up",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
}).encode()


async def _answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       seen: list[str]) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        seen.append(lines[0])
        length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                       if line.lower().startswith("content-length:")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_BODY) + _BODY)
        await writer.drain()
    finally:
        writer.close()


async def warm_up(timeout_s: float = 10.0) -> list[str]:
    """One Messages call through the SDK to a local one-shot server; the request lines it
    received (one, unless something went wrong). Never raises: a failed warm-up only leaves
    the first real call slow."""
    seen: list[str] = []
    try:
        server = await asyncio.start_server(
            lambda r, w: _answer_once(r, w, seen), "127.0.0.1", 0)
    except OSError as exc:
        log.debug("sdk warm-up skipped: %s", exc)
        return seen
    port = server.sockets[0].getsockname()[1]
    client = anthropic.AsyncAnthropic(api_key="warm-up", base_url=f"http://127.0.0.1:{port}",
                                      max_retries=0, timeout=timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            raw = await client.messages.with_raw_response.create(
                model="warm-up", max_tokens=1, messages=[{"role": "user", "content": "ok"}])
            await raw.parse()
    except Exception as exc:  # noqa: BLE001 - only the first real call stays slow
        log.debug("sdk warm-up failed: %s", exc)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    return seen
