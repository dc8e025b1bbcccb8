"""Anthropic's Messages API behind the seam (``_base.Provider``).

Its limits have three dimensions (requests, input tokens, output tokens), told by the
``anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining}`` headers; its
errors come as the SDK's ``APIStatusError`` (a body ``{"error": {"type", "message"}}``, with
``retry-after`` / ``retry-after-ms`` / ``x-should-retry``) or ``APIConnectionError``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import anthropic
import httpx2
from anthropic.types import Message
from anthropic.types.messages import MessageBatchIndividualResponse

from drover.workers.providers._base import (
    Failure,
    LimitReadings,
    Provider,
    json_body,
    read_limit_headers,
    read_retry_after,
)
from drover.workers.providers.answers import Answer, AnswerUsage, BatchSeen
from drover.workers.providers.streams import Seen

__all__ = ["ANTHROPIC", "Anthropic", "ConnectionFailed", "StatusError", "answer_of",
           "batch_results", "batches", "stream_message"]

# The monthly spend limit: no retry-after would help (it lifts at the start of next month).
SPEND_CAP_CODE = "enforced_spend_limit_reached"
# What count_tokens takes of a request (the rest, max_tokens and the like, it refuses).
_COUNTED_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking")
COUNT_TIMEOUT_S = 5.0  # a count that takes longer is not worth the wait: the estimate goes
# drover's dimension -> the header's name for it.
_HEADER_NAMES = {dim: (f"anthropic-ratelimit-{name}-remaining",
                       f"anthropic-ratelimit-{name}-limit")
                 for dim, name in (("requests", "requests"), ("input", "input-tokens"),
                                   ("output", "output-tokens"))}

def answer_of(message: Message) -> Answer:
    """The SDK's Message as drover's Answer (its blocks as the SDK dumps them)."""
    return Answer.from_json(message.model_dump(mode="json", exclude_none=True))


async def batch_results(client: anthropic.AsyncAnthropic, url: str) -> dict[str, dict[str, Any]]:
    """A Message Batch's results at ``url`` by custom_id, each result as its JSON (a
    ``succeeded`` one's ``message`` is what ``Answer.from_json`` reads), in one call:
    ``batches.results(id)`` retrieves the batch first, two calls back to back that a tight
    batches RPM refuses."""
    response = await client.get(url, cast_to=httpx2.Response,
                                options={"headers": {"Accept": "application/binary"}})
    out: dict[str, dict[str, Any]] = {}
    for raw in response.text.splitlines():
        if raw.strip():
            line = MessageBatchIndividualResponse.model_validate_json(raw)
            out[line.custom_id] = line.result.model_dump(mode="json", exclude_none=True)
    return out


# The Messages API's error type of each status (docs: /work/shared/anthropic-api.md).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               502: "api_error", 503: "api_error", 504: "timeout_error"}


class Batches:
    """The Message Batches endpoints, each call's answer as a ``BatchSeen`` (the batcher
    reads no SDK object); the SDK's errors pass through (``StatusError``,
    ``ConnectionFailed``)."""

    async def create(self, client: anthropic.AsyncAnthropic,
                     requests: list[dict[str, Any]]) -> BatchSeen:
        made = await client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        return _seen(made)

    async def retrieve(self, client: anthropic.AsyncAnthropic, batch_id: str) -> BatchSeen:
        return _seen(await client.messages.batches.retrieve(batch_id))

    async def cancel(self, client: anthropic.AsyncAnthropic, batch_id: str) -> BatchSeen:
        return _seen(await client.messages.batches.cancel(batch_id))

    async def created_since(self, client: anthropic.AsyncAnthropic,
                            since: float) -> list[BatchSeen]:
        """The key's batches created after ``since`` (epoch seconds), newest first."""
        found: list[BatchSeen] = []
        async for batch in client.messages.batches.list(limit=100):
            if batch.created_at.timestamp() < since:
                break
            found.append(_seen(batch))
        return found

    async def results(self, client: anthropic.AsyncAnthropic,
                      url: str) -> dict[str, dict[str, Any]]:
        return await batch_results(client, url)


def _seen(batch: Any) -> BatchSeen:
    c = batch.request_counts
    return BatchSeen(id=batch.id, created_at=batch.created_at.timestamp(),
                     requests=c.processing + c.succeeded + c.errored + c.canceled + c.expired,
                     ended=batch.processing_status == "ended", results_url=batch.results_url)


batches = Batches()

# The SDK's error classes, for the few places (the batcher) that tell them apart.
StatusError = anthropic.APIStatusError
ConnectionFailed = anthropic.APIConnectionError


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode())
                    for e in events)


class Anthropic(Provider):
    name = "anthropic"
    # A Messages stream of one text token, as the API sends it.
    warm_up_stream = _sse(
        {"type": "message_start", "message": {
            "id": "msg_warmup", "type": "message", "role": "assistant", "model": "warm-up",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text",
                                                                      "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta",
                                                              "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 1}},
        {"type": "message_stop"})
    dimensions: ClassVar[tuple[str, ...]] = ("requests", "input", "output")
    # Token -remaining values are rounded to the nearest thousand (requests: whole numbers).
    remaining_steps = {"input": 1000.0, "output": 1000.0}
    counts_input = True  # /v1/messages/count_tokens

    def build_client(self, *, api_key: str | None, base_url: str | None, connect_s: float,
                     idle_s: float, keyless: bool = False) -> anthropic.AsyncAnthropic:
        # Every realtime call streams: a connect timeout and the gap between reads (the
        # stream's idle limit), never a total.
        return anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url,
            # No key but a base URL: a proxy that may need none. The SDK would refuse to send
            # without a credential unless the header is omitted on purpose.
            # The SDK removes a header whose value is Omit (build_headers), but types
            # default_headers as str values only.
            default_headers=(
                {"Authorization": anthropic.omit} if keyless else None),  # type: ignore[dict-item]
            max_retries=0,  # retries are ours: Celery retries, global cooldowns, no held slots
            timeout=anthropic.Timeout(idle_s, connect=connect_s, read=idle_s, write=idle_s,
                                      pool=connect_s))

    async def count_input(self, client: Any, params: dict[str, Any]) -> int | None:
        # /v1/messages/count_tokens: free, its own requests a minute (not the messages'). An
        # estimate does without it, so any failure is None.
        body = {k: params[k] for k in _COUNTED_FIELDS if params.get(k) is not None}
        try:
            counted = await client.messages.count_tokens(**body, timeout=COUNT_TIMEOUT_S)
        except Exception:
            return None
        return int(counted.input_tokens)

    async def stream_turn(self, client: Any, params: dict[str, Any], seen: Any) -> Answer:
        return answer_of(await stream_message(client, params, seen))

    def error_body(self, status: int, message: str) -> bytes:
        return json.dumps({"type": "error",
                           "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                     "message": message},
                           "request_id": f"req_gw_{uuid.uuid4().hex[:20]}"}).encode()

    def describe(self, error: BaseException) -> Failure | None:
        if isinstance(error, anthropic.APIStatusError):
            body = error.body if isinstance(error.body, dict) else {}
            kind, message = _error_fields(body, type(error).__name__, str(error))
            code = _error_code(body)
            return Failure(kind, message, error.status_code, code,
                           retry_after_s=read_retry_after(error.response.headers),
                           should_retry=_should_retry_header(error),
                           spend_cap=code == SPEND_CAP_CODE)
        if isinstance(error, anthropic.APIConnectionError):
            timeout = isinstance(error, anthropic.APITimeoutError)
            return Failure("timeout" if timeout else "connection_error", str(error)[:500],
                           timeout=timeout)
        return None

    def read_limits(self, headers: Mapping[str, str | bytes]) -> LimitReadings | None:
        """{remaining: {dim: n}, limit: {dim: n}} from ``anthropic-ratelimit-*``."""
        return read_limit_headers(headers, _HEADER_NAMES)

    def body_failure(self, status: int, body: dict[str, Any]) -> Failure:
        """What a realtime answer of ``status`` with this error body would have said (a
        Message Batch's errored result, judged like a realtime answer): read from the body
        itself, as ``describe`` reads an SDK error's."""
        kind, message = _error_fields(body, "api_error", f"Error code: {status}")
        code = _error_code(body)
        return Failure(kind, message, status, code, spend_cap=code == SPEND_CAP_CODE)

    def counted_path(self, path: str) -> bool:
        # /v1/messages only: count_tokens and the Message Batches endpoints have limits of
        # their own (count_tokens its own requests a minute; nothing of the messages' ones).
        return path.rstrip("/").endswith("/messages")

    def call_params(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "max_tokens": int(body.get("max_tokens") or 1)}

    def answer_usage(self, body: dict[str, Any]) -> AnswerUsage:
        return AnswerUsage.from_json(body.get("usage"))

    def on_stream_event(self, seen: Any, event: dict[str, Any]) -> None:
        seen.on(event)

    def stream_usage(self, seen: Any, input_estimate: int) -> AnswerUsage:
        return AnswerUsage(seen.input_tokens, seen.partial_output(),
                           seen.cache_creation_input_tokens, seen.cache_read_input_tokens)

    def stream_failure(self, event: dict[str, Any]) -> Failure | None:
        # ``event: error`` (overloaded_error mid-answer): the SDK's APIStatusError of the 200.
        return self.body_failure(200, event) if event.get("type") == "error" else None

    def status_failure(self, status: int, headers: Mapping[str, str], content: bytes,
                       url: str) -> Failure:
        body = json_body(content)
        should = headers.get("x-should-retry")
        return replace(self.body_failure(status, body if isinstance(body, dict) else {}),
                       retry_after_s=read_retry_after(headers),
                       should_retry={"true": True, "false": False}.get(should or ""))

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key}

    def sdk_error(self, message: str) -> BaseException:
        return anthropic.AnthropicError(message)


def _should_retry_header(error: anthropic.APIStatusError) -> bool | None:
    value = error.response.headers.get("x-should-retry")
    return {"true": True, "false": False}.get(value) if value is not None else None


def _error_code(body: dict[str, Any]) -> str | None:
    inner = body.get("error", body)
    details = inner.get("details") if isinstance(inner, dict) else None
    code = details.get("error_code") if isinstance(details, dict) else None
    return str(code) if code else None


def _error_fields(body: dict[str, Any], kind_else: str, message_else: str) -> tuple[str, str]:
    """An error body's type and message (``kind_else`` / ``message_else`` where it names
    none), the message with its finer code."""
    inner = body.get("error", body)
    inner = inner if isinstance(inner, dict) else {}
    kind = inner.get("type") or kind_else
    message = inner.get("message") or message_else
    code = _error_code(body)
    if code:
        message = f"{message} ({code})"
    return str(kind), str(message)[:500]


async def stream_message(client: anthropic.AsyncAnthropic, params: dict[str, Any], seen: Seen
                         ) -> Message:
    """Send one turn as a stream and return the final message; raises the SDK's errors
    (APITimeoutError when the connection carried no byte for the client's read timeout,
    ``DROVER_STREAM_IDLE_S``: see the module docstring)."""
    async with client.messages.stream(**params) as stream:
        seen.headers = stream.response.headers
        async for event in stream:
            seen.on(event)
        return await stream.get_final_message()


ANTHROPIC = Anthropic()
