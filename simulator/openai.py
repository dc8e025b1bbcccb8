"""OpenAI's Chat Completions on the simulator (``SimConfig.provider == "openai"``).

The engine models one API; this module translates at its edges (../shared/openai-api.md):

- ``to_messages``: a Chat Completions request as the Messages request the engine judges
  (system messages -> ``system``, an assistant's ``tool_calls`` -> ``tool_use`` blocks, each
  ``tool`` message -> a ``tool_result`` block), with OpenAI's protocol rule checked on the
  way: every ``tool_calls`` entry answered by a ``tool`` message before the next turn;
- ``completion_body`` / ``chunk_events``: the reply as ``chat.completion``, or streamed as
  ``chat.completion.chunk`` frames ending with a usage chunk and ``data: [DONE]``;
- ``error_body``, ``ratelimit_headers`` (``x-ratelimit-{limit,remaining,reset}-{requests,
  tokens}``, a reset as a duration: ``1s``, ``6m0s``, ``120ms``) and ``retry_headers``.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from .buckets import KeyBuckets, NestedBuckets, TokenBucket
from .streaming import Event
from .validation import InvalidRequest

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length",
           "stop_sequence": "stop"}
# Anthropic's error types (what the engine raises) -> OpenAI's status, type and code.
_ERRORS = {"invalid_request_error": (400, "invalid_request_error", None),
           "authentication_error": (401, "invalid_request_error", "invalid_api_key"),
           "permission_error": (403, "invalid_request_error", None),
           "not_found_error": (404, "invalid_request_error", "model_not_found"),
           "api_error": (500, "server_error", None),
           "overloaded_error": (503, "server_error", None)}


def completion_id() -> str:
    return "chatcmpl-" + os.urandom(12).hex()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def to_messages(body: Any) -> dict[str, Any]:
    """The Messages request a Chat Completions request stands for; InvalidRequest (a 400)
    for what OpenAI refuses, among it a tool call not answered before the next turn."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: Field required")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or 4096
    system: list[str] = []
    out: list[dict[str, Any]] = []
    waiting: list[str] = []  # tool call ids of the last assistant turn not answered yet

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}]: Input should be an object")
        role = message.get("role")
        if role != "tool" and waiting:
            raise InvalidRequest(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(waiting)}")
        if role in ("system", "developer"):
            system.append(_text(message.get("content")))
        elif role == "user":
            add("user", [{"type": "text", "text": _text(message.get("content")) or " "}])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if _text(message.get("content")):
                blocks.append({"type": "text", "text": _text(message.get("content"))})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                blocks.append({"type": "tool_use", "id": call.get("id"),
                               "name": function.get("name"),
                               "input": arguments if isinstance(arguments, dict) else {}})
                waiting.append(str(call.get("id")))
            add("assistant", blocks or [{"type": "text", "text": " "}])
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in waiting:
                raise InvalidRequest(
                    f"messages[{i}]: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'")
            waiting.remove(call_id)
            add("user", [{"type": "tool_result", "tool_use_id": call_id,
                          "content": _text(message.get("content")) or " "}])
        else:
            raise InvalidRequest(f"messages[{i}].role: Input should be 'system', 'developer', "
                                 "'user', 'assistant' or 'tool'")
    if waiting:
        raise InvalidRequest("An assistant message with 'tool_calls' must be followed by tool "
                             "messages responding to each 'tool_call_id'. The following "
                             f"tool_call_ids did not have response messages: {', '.join(waiting)}")
    converted: dict[str, Any] = {"model": body.get("model"), "max_tokens": max_tokens,
                                 "messages": out, "stream": body.get("stream") is True}
    if system:
        converted["system"] = "\n\n".join(system)
    tools = body.get("tools")
    if tools:
        converted["tools"] = [{"name": (t.get("function") or {}).get("name"),
                               "description": (t.get("function") or {}).get("description", ""),
                               "input_schema": (t.get("function") or {}).get("parameters")
                               or {"type": "object", "properties": {}}} for t in tools]
        choice = body.get("tool_choice")
        if choice == "none":
            converted["tool_choice"] = {"type": "none"}
        elif choice == "required":
            converted["tool_choice"] = {"type": "any"}
        elif isinstance(choice, dict):
            converted["tool_choice"] = {"type": "tool",
                                        "name": (choice.get("function") or {}).get("name")}
        if body.get("parallel_tool_calls") is False:
            converted.setdefault("tool_choice", {"type": "auto"})
            converted["tool_choice"]["disable_parallel_tool_use"] = True
    return converted


def _usage(usage: dict[str, int]) -> dict[str, Any]:
    cached = int(usage.get("cache_read_input_tokens", 0))
    prompt = int(usage["input_tokens"]) + cached + int(usage.get("cache_creation_input_tokens", 0))
    completion = int(usage["output_tokens"])
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _message(content: list[dict[str, Any]]) -> dict[str, Any]:
    text = "".join(b["text"] for b in content if b["type"] == "text")
    calls = [{"id": b["id"], "type": "function",
              "function": {"name": b["name"], "arguments": _dumps(b.get("input") or {})}}
             for b in content if b["type"] == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def completion_body(model: str, content: list[dict[str, Any]], stop_reason: str,
                    usage: dict[str, int]) -> bytes:
    return _dumps({"id": completion_id(), "object": "chat.completion", "created": int(time.time()),
                   "model": model, "choices": [{"index": 0, "message": _message(content),
                                                "finish_reason": _FINISH.get(stop_reason, "stop")}],
                   "usage": _usage(usage)}).encode()


def _frame(data: dict[str, Any]) -> bytes:
    return b"data: " + _dumps(data).encode() + b"\n\n"


def chunk_events(model: str, content: list[dict[str, Any]], stop_reason: str,
                 usage: dict[str, int], chunk_tokens: int) -> list[Event]:
    """Every frame of one streamed reply (``stream_options.include_usage``: its last chunk
    has empty ``choices`` and the usage), paced by the output tokens each carries."""
    ident, created = completion_id(), int(time.time())
    total = int(usage["output_tokens"])
    pieces: list[tuple[str, dict[str, Any]]] = []  # (text it carries, delta)
    size = max(4, 4 * chunk_tokens)
    call = 0
    for block in content:
        if block["type"] == "text":
            text = block["text"]
            for i in range(0, len(text), size):
                pieces.append((text[i:i + size], {"content": text[i:i + size]}))
        elif block["type"] == "tool_use":
            arguments = _dumps(block.get("input") or {})
            pieces.append(("", {"tool_calls": [{"index": call, "id": block["id"],
                                                "type": "function", "function": {
                                                    "name": block["name"], "arguments": ""}}]}))
            for i in range(0, len(arguments), size):
                pieces.append((arguments[i:i + size], {"tool_calls": [{
                    "index": call, "function": {"arguments": arguments[i:i + size]}}]}))
            call += 1
    chars = sum(len(t) for t, _ in pieces) or 1

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _frame({"id": ident, "object": "chat.completion.chunk", "created": created,
                       "model": model, "choices": [{"index": 0, "delta": delta,
                                                    "finish_reason": finish}], "usage": None})

    # Two frames at once (the server paces content from the third on, as after Messages'
    # message_start and ping): the role, then an empty piece.
    out = [Event(0, chunk({"role": "assistant", "content": ""})), Event(0, chunk({"content": ""}))]
    seen = 0
    for text, delta in pieces:
        seen += len(text)
        out.append(Event(round(total * seen / chars), chunk(delta)))
    out.append(Event(total, chunk({}, _FINISH.get(stop_reason, "stop"))))
    out.append(Event(total, _frame({"id": ident, "object": "chat.completion.chunk",
                                    "created": created, "model": model, "choices": [],
                                    "usage": _usage(usage)})))
    out.append(Event(total, b"data: [DONE]\n\n"))
    return out


def error_frame(message: str) -> bytes:
    """An error mid-stream (the SDK raises it as an APIError)."""
    return _frame({"error": {"message": message, "type": "server_error", "param": None,
                             "code": None}})


def error_reply(status: int, error_type: str, message: str,
                details: dict[str, Any] | None, limit_name: str | None) -> tuple[int, bytes]:
    """(status, body) of the engine's error (Anthropic's type) in OpenAI's words."""
    code: str | None
    if status == 429:
        if details:  # the spend cap: no credit left, retrying does not help
            kind, code = "insufficient_quota", "insufficient_quota"
            message = ("You exceeded your current quota, please check your plan and billing "
                       "details.")
        else:
            kind, code = ("requests" if limit_name == "requests" else "tokens"), \
                "rate_limit_exceeded"
    else:
        status, kind, code = _ERRORS.get(error_type, (status, "server_error", None))
    return status, _dumps({"error": {"message": message, "type": kind, "param": None,
                                     "code": code}}).encode()


def duration(seconds: float) -> str:
    """A reset as OpenAI writes it: ``120ms``, ``1s``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


def retry_headers(mode: str, seconds: float) -> dict[str, str]:
    headers: dict[str, str] = {}
    if mode in ("seconds", "both"):
        headers["retry-after"] = str(math.ceil(seconds))
    if mode in ("ms", "both"):
        headers["retry-after-ms"] = str(math.ceil(seconds * 1000))
    return headers


def _set(headers: dict[str, str], name: str, bucket: TokenBucket) -> None:
    headers[f"x-ratelimit-limit-{name}"] = str(int(bucket.limit))
    headers[f"x-ratelimit-remaining-{name}"] = str(int(max(0.0, bucket.level)))
    headers[f"x-ratelimit-reset-{name}"] = duration(bucket.seconds_to_full())


def ratelimit_headers(buckets: KeyBuckets | NestedBuckets, now: float) -> dict[str, str]:
    """x-ratelimit-* of the requests and the tokens bucket, as they are now."""
    buckets.refill(now)
    if isinstance(buckets, NestedBuckets):
        requests, tokens = buckets.tightest("requests"), buckets.tightest("input")
    else:
        requests, tokens = buckets.requests, buckets.input
    headers: dict[str, str] = {}
    if requests is not None:
        _set(headers, "requests", requests)
    if tokens is not None:
        _set(headers, "tokens", tokens)
    return headers
