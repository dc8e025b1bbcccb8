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
from collections.abc import Iterable

from drover.workers.providers.registry import provider
from drover.workers.providers.streams import Seen

log = logging.getLogger(__name__)

_BODY = json.dumps({
    "id": "msg_warmup", "type": "message", "role": "assistant", "model": "warm-up",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
}).encode()
# A streamed Chat Completions answer, as OpenAI sends it with include_usage: a chunk of text,
# the finish, the usage chunk and [DONE].
_CHUNK = {"id": "chatcmpl-warmup", "object": "chat.completion.chunk", "created": 0,
          "model": "warm-up"}
_STREAM = b"".join(b"data: " + json.dumps({**_CHUNK, **part}).encode() + b"\n\n" for part in (
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"},
                  "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
)) + b"data: [DONE]\n\n"


async def _answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       seen: list[str]) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        seen.append(lines[0])
        length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                       if line.lower().startswith("content-length:")), 0)
        await reader.readexactly(length)
        streamed = "chat/completions" in lines[0]
        body, kind = (_STREAM, b"text/event-stream") if streamed else (_BODY, b"application/json")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % (kind, len(body)) + body)
        await writer.drain()
    finally:
        writer.close()


async def warm_up(providers: Iterable[str] = ("anthropic",), timeout_s: float = 10.0
                  ) -> list[str]:
    """One call through each of ``providers``' SDKs (the worker's: Anthropic's Messages,
    OpenAI's streamed Chat Completions, each when the worker calls it) to a local server; the
    request lines it received (one per call, unless something went wrong). Never raises: a
    failed warm-up only leaves the first real call slow."""
    seen: list[str] = []
    wanted = set(providers)
    try:
        server = await asyncio.start_server(
            lambda r, w: _answer_once(r, w, seen), "127.0.0.1", 0)
    except OSError as exc:
        log.debug("sdk warm-up skipped: %s", exc)
        return seen
    port = server.sockets[0].getsockname()[1]
    if "anthropic" in wanted:
        await _warm_anthropic(f"http://127.0.0.1:{port}", timeout_s)
    if "openai" in wanted:
        await _warm_openai(f"http://127.0.0.1:{port}/v1", timeout_s)
    server.close()
    await server.wait_closed()
    return seen


async def _warm_anthropic(base_url: str, timeout_s: float) -> None:
    """One Messages call through the anthropic SDK (imported here: a worker on OpenAI only
    never imports it)."""
    import anthropic

    client = anthropic.AsyncAnthropic(api_key="warm-up", base_url=base_url, max_retries=0,
                                      timeout=timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            raw = await client.messages.with_raw_response.create(
                model="warm-up", max_tokens=1, messages=[{"role": "user", "content": "ok"}])
            await raw.parse()
    except Exception as exc:  # noqa: BLE001 - only the first real call stays slow
        log.debug("sdk warm-up failed: %s", exc)
    finally:
        await client.close()


async def _warm_openai(base_url: str, timeout_s: float) -> None:
    """One streamed answer through drover's OpenAI provider, as a real call makes it."""
    openai = provider("openai")
    client = openai.build_client(api_key="warm-up", base_url=base_url, connect_s=timeout_s,
                                 idle_s=timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            await openai.stream_turn(client, {"model": "warm-up", "max_tokens": 1, "messages": [
                {"role": "user", "content": "ok"}]}, Seen())
    except Exception as exc:  # noqa: BLE001 - only the first real call stays slow
        log.debug("openai sdk warm-up failed: %s", exc)
    finally:
        await client.close()
