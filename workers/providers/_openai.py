"""OpenAI's Chat Completions behind the seam (also Azure OpenAI and OpenAI-compatible servers:
vLLM, Ollama, LM Studio). ../shared/openai-api.md has the shapes.

Its limits have two dimensions: requests and one tokens bucket (input and output together),
which counts a call's input estimate plus its max tokens at admission. The limiter keeps that
bucket as a dimension of its own (``tokens``, ``ScopeLimits.tpm``: a call's input and output
together) and reserves a call's input + max tokens there.

drover's conversation is the Messages shape; ``to_wire`` turns it into Chat Completions
(``tool_use`` blocks -> the assistant's ``tool_calls``, each ``tool_result`` -> a ``tool``
message, so every call is answered before the next turn; an error result is sent as
``error: ...``), and the streamed answer is gathered into drover's ``Answer`` (its blocks in
the Messages shape, its finish reason as a Messages stop reason), with no other SDK.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import httpx2
import openai

from drover.workers.providers._base import (
    Failure,
    LimitReadings,
    Provider,
    json_body,
    read_limit_headers,
    read_retry_after,
)
from drover.workers.providers.answers import Answer, AnswerUsage, Block

__all__ = ["OPENAI", "OpenAI"]

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "function_call": "tool_use",
         "length": "max_tokens", "content_filter": "refusal"}
QUOTA_CODE = "insufficient_quota"  # a 429 that is no rate limit: no credit left


_CHUNK = {"id": "chatcmpl-warmup", "object": "chat.completion.chunk", "created": 0,
          "model": "warm-up"}


# Chat Completions' code of the statuses the gateway says itself.
ERROR_CODES = {401: "invalid_api_key", 404: "not_found", 413: "context_length_exceeded"}


class OpenAI(Provider):
    name = "openai"
    # A streamed Chat Completions answer, as OpenAI sends it with include_usage: a chunk of
    # text, the finish, the usage chunk and [DONE].
    warm_up_stream = b"".join(b"data: " + json.dumps({**_CHUNK, **part}).encode() + b"\n\n"
                              for part in (
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"},
                      "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                  "total_tokens": 2}})) + b"data: [DONE]\n\n"
    warm_up_path = "/v1"
    dimensions = ("requests", "tokens")
    one_tokens_bucket = True  # input and output share one bucket, charged at admission

    def build_client(self, *, api_key: str | None, base_url: str | None, connect_s: float,
                     idle_s: float, keyless: bool = False) -> openai.AsyncOpenAI:
        # Without a key the SDK refuses to build a client: send an empty bearer (a server
        # that needs a key answers 401 and the call fails saying to set OPENAI_API_KEY).
        return openai.AsyncOpenAI(
            api_key=api_key or "", base_url=base_url, max_retries=0,
            timeout=openai.Timeout(idle_s, connect=connect_s, read=idle_s, write=idle_s,
                                   pool=connect_s))

    async def stream_turn(self, client: Any, params: dict[str, Any], seen: Any) -> Answer:
        wire = self.to_wire(params)
        stream = await client.chat.completions.create(
            **wire, stream=True, stream_options={"include_usage": True})
        seen.headers = stream.response.headers
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        usage: Any = None
        try:
            # The client's read timeout (the stream's idle limit) bounds each gap between
            # bytes; the SDK raises it as an APITimeoutError.
            async for chunk in stream:
                now = time.monotonic() - seen.opened
                seen.last_event_s = now
                seen.started = True
                if chunk.usage is not None:
                    usage = chunk.usage
                    seen.input_said = True
                for choice in chunk.choices:
                    delta = choice.delta
                    piece = delta.content or ""
                    for call in delta.tool_calls or []:
                        entry = calls.setdefault(call.index, {"id": None, "name": "",
                                                              "arguments": ""})
                        if call.id:
                            entry["id"] = call.id
                        if call.function is not None:
                            entry["name"] += call.function.name or ""
                            piece += call.function.arguments or ""
                            entry["arguments"] += call.function.arguments or ""
                    text.append(delta.content or "")
                    if piece and seen.first_token_s is None:
                        seen.first_token_s = now
                    seen.chars += len(piece)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        finally:
            await stream.close()
        cached = _cached(usage)
        prompt = (usage.prompt_tokens or 0) if usage is not None else 0
        completion = (usage.completion_tokens or 0) if usage is not None else 0
        seen.input_tokens, seen.cache_read_input_tokens = prompt - cached, cached
        seen.output_tokens = completion
        content: list[Block] = []
        if "".join(text):
            content.append(Block({"type": "text", "text": "".join(text)}))
        for index in sorted(calls):
            call = calls[index]
            content.append(Block({"type": "tool_use", "id": call["id"] or f"call_{index}",
                                  "name": call["name"], "input": _arguments(call["arguments"])}))
        return Answer(tuple(content), _STOP.get(finish or "stop", "end_turn"), wire["model"],
                      AnswerUsage(prompt - cached, completion, 0, cached), id="openai")

    def error_body(self, status: int, message: str) -> bytes:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                     "code": ERROR_CODES.get(status)}}).encode()

    def describe(self, error: BaseException) -> Failure | None:
        if isinstance(error, openai.APIStatusError):
            body = error.body if isinstance(error.body, dict) else {}
            inner = body.get("error", body) if isinstance(body.get("error"), dict) else body
            code = inner.get("code")
            kind = str(inner.get("type") or type(error).__name__)
            message = str(inner.get("message") or error.message)[:500]
            return Failure(kind, message, error.status_code, str(code) if code else None,
                           retry_after_s=read_retry_after(error.response.headers),
                           spend_cap=code == QUOTA_CODE)
        if isinstance(error, openai.APIConnectionError):
            timeout = isinstance(error, openai.APITimeoutError)
            return Failure("timeout" if timeout else "connection_error", str(error)[:500],
                           timeout=timeout)
        if isinstance(error, openai.APIError):  # an error sent inside a stream that began
            return Failure("api_error", str(error)[:500], 500)
        return None

    def read_limits(self, headers: Mapping[str, str | bytes]) -> LimitReadings | None:
        """x-ratelimit-{remaining,limit}-{requests,tokens}."""
        return read_limit_headers(headers, {dim: (f"x-ratelimit-remaining-{dim}",
                                                  f"x-ratelimit-limit-{dim}")
                                            for dim in self.dimensions})

    def to_wire(self, params: dict[str, Any]) -> dict[str, Any]:
        """drover's (Messages-shaped) request as a Chat Completions request."""
        messages: list[dict[str, Any]] = []
        system = params.get("system")
        if system:
            messages.append({"role": "system", "content": _text(system)})
        for message in params["messages"]:
            content = message["content"]
            if isinstance(content, str):
                messages.append({"role": message["role"], "content": content})
                continue
            blocks = [b if isinstance(b, dict) else b.model_dump() for b in content]
            if message["role"] == "assistant":
                calls = [{"id": b["id"], "type": "function", "function": {
                    "name": b["name"], "arguments": json.dumps(b.get("input") or {})}}
                    for b in blocks if b.get("type") == "tool_use"]
                said = _text([b for b in blocks if b.get("type") == "text"])
                out: dict[str, Any] = {"role": "assistant", "content": said or None}
                if calls:
                    out["tool_calls"] = calls
                messages.append(out)
                continue
            for b in blocks:  # every tool call answered first, then what the user says
                if b.get("type") == "tool_result":
                    result = _text(b.get("content") or "")
                    messages.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                                     "content": f"error: {result}" if b.get("is_error")
                                     else result or " "})
            said = _text([b for b in blocks if b.get("type") == "text"])
            if said:
                messages.append({"role": "user", "content": said})
        wire: dict[str, Any] = {"model": params["model"], "messages": messages,
                                "max_completion_tokens": params["max_tokens"]}
        tools = params.get("tools")
        if tools:
            wire["tools"] = [{"type": "function", "function": {
                "name": t["name"], "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}}
                for t in tools]
            choice = params.get("tool_choice") or {}
            kind = choice.get("type")
            if kind == "tool":
                wire["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
            elif kind == "any":
                wire["tool_choice"] = "required"
            elif kind == "none":
                wire["tool_choice"] = "none"
            if choice.get("disable_parallel_tool_use"):
                wire["parallel_tool_calls"] = False
        return wire

    # --- the limited clients' transport (``Provider``'s second part) --------------------
    def counted_path(self, path: str) -> bool:
        return path.rstrip("/").endswith("/chat/completions")

    def call_params(self, body: dict[str, Any]) -> dict[str, Any]:
        """A Chat Completions body as far as the estimate reads it: each message's text (a
        tool call's arguments too), the tools' definitions, the max tokens (a request that
        names none is reserved DEFAULT_MAX_TOKENS: the provider charges its own guess)."""
        system: list[str] = []
        messages: list[dict[str, Any]] = []
        for message in body.get("messages") or []:
            said = _text(message.get("content") or "")
            for call in message.get("tool_calls") or []:
                said += str((call.get("function") or {}).get("arguments") or "")
            if message.get("role") in ("system", "developer"):
                system.append(said)
            else:
                messages.append({"role": "user", "content": said})
        tools = [{"name": str(f.get("name") or ""), "description": str(f.get("description") or ""),
                  "input_schema": f.get("parameters") or {}}
                 for f in ((t.get("function") or {}) for t in body.get("tools") or [])]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        return {"model": body.get("model") or "", "system": "\n".join(system),
                "messages": messages, "tools": tools,
                "max_tokens": int(max_tokens or DEFAULT_MAX_TOKENS)}

    def answer_usage(self, body: dict[str, Any]) -> AnswerUsage:
        return _wire_usage(body.get("usage") or {})

    def on_stream_event(self, seen: Any, event: dict[str, Any]) -> None:
        now = time.monotonic() - seen.opened
        seen.last_event_s = now
        if event.get("type") == "[DONE]":
            seen.finished = True
            return
        seen.started = True
        if event.get("usage"):
            said = _wire_usage(event["usage"])
            seen.input_tokens, seen.output_tokens = said.input_tokens, said.output_tokens
            seen.cache_read_input_tokens = said.cache_read_input_tokens
            seen.input_said = True
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            piece = delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                piece += (call.get("function") or {}).get("arguments") or ""
            if piece and seen.first_token_s is None:
                seen.first_token_s = now
            seen.chars += len(piece)

    def stream_usage(self, seen: Any, input_estimate: int) -> AnswerUsage:
        if seen.input_said:
            return AnswerUsage(seen.input_tokens, seen.output_tokens, 0,
                               seen.cache_read_input_tokens)
        # No usage chunk (the caller did not ask for stream_options.include_usage): what
        # streamed, at characters / 4, and the input at its estimate.
        return AnswerUsage(input_estimate, seen.partial_output())

    def stream_failure(self, event: dict[str, Any]) -> Failure | None:
        # A chunk that is an error (the SDK's APIError, judged like a 500: ``describe``).
        error = event.get("error")
        if not error:
            return None
        message = error.get("message") if isinstance(error, dict) else str(error)
        return Failure("api_error", str(message or "An error occurred during streaming")[:500],
                       500)

    def status_failure(self, status: int, headers: Mapping[str, str], content: bytes,
                       url: str) -> Failure:
        response = httpx2.Response(status, headers=headers, content=content,
                                   request=httpx2.Request("POST", url))
        body = json_body(content)
        inner = body.get("error") if isinstance(body, dict) else None
        message = inner.get("message") if isinstance(inner, dict) else None
        error = openai.APIStatusError(str(message or f"HTTP {status}"), response=response,
                                      body=body)
        failure = self.describe(error)
        assert failure is not None
        return failure

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"}

    def sdk_error(self, message: str) -> BaseException:
        return openai.OpenAIError(message)



DEFAULT_MAX_TOKENS = 4096


def _wire_usage(usage: dict[str, Any]) -> AnswerUsage:
    """Chat Completions' usage in the Messages API's names (cached prompt tokens are reads)."""
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    return AnswerUsage(int(usage.get("prompt_tokens") or 0) - cached,
                       int(usage.get("completion_tokens") or 0), 0, cached)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        block = block if isinstance(block, dict) else block.model_dump()
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def _arguments(raw: str) -> dict[str, Any]:
    """A call's arguments; a model can emit invalid JSON there: the tool then gets none and
    its answer says so (an error result, not a protocol error)."""
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"_invalid_arguments": raw[:2000]}
    return value if isinstance(value, dict) else {"_invalid_arguments": raw[:2000]}


def _cached(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    return int(getattr(details, "cached_tokens", 0) or 0)


OPENAI = OpenAI()
