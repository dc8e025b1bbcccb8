"""Claude on a cloud (Bedrock, Vertex AI): the Anthropic provider's Messages wire through one
of the Anthropic SDK's cloud clients, what the two clouds have in common.

Each is a pool entry under no organisation (``alone``) whose quotas are the entry's own; it
sends none of the ``anthropic-ratelimit-*`` headers (nothing to read, no -remaining steps)
and has no count endpoint drover asks (its sizes borrow a factor); its turn is the Anthropic
API's, on the entry's SDK client with the cloud's model id; and its throttling (a 429 that
names no wait) is a rate limit cooled down on that entry alone for ``throttle_cooldown_s``.

The limited clients' transport (``send_http``) sends the Anthropic API's HTTP request through
the entry's SDK client (its model id, credentials, region and project, Bedrock's event
stream) and answers as the Anthropic API would have: a whole answer as the Message's JSON, a
stream as the Messages API's server-sent events re-encoded from the SDK's raw events as they
arrive (``message_start`` names the caller's model, not the cloud's id), an error in the
API's error shape and status (a throttle: 429 ``rate_limit_error`` with the entry's cooldown
as its retry-after), judged as the loop's call judges the cloud's exception (``describe``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar

import anthropic
import httpx2
from anthropic.types import Message, RawMessageStreamEvent

from drover.workers.providers._anthropic import ERROR_TYPES, Anthropic
from drover.workers.providers._base import Failure, LimitReadings, json_body
from drover.workers.providers.answers import Answer

__all__ = ["Cloud", "CloudEvents"]

# Where a cloud's error answer (``send_http``) carries the Failure the loop's call would have
# met: the transport judges it by that, not by the Anthropic API's shape it was re-said in.
FAILURE = "drover.failure"
# The Anthropic API's error types a cloud's mid-stream error may name as they are.
_API_TYPES = frozenset(ERROR_TYPES.values()) | {"overloaded_error"}
# The caller's headers the cloud's request keeps (Bedrock puts the betas into the body).
_KEPT_HEADERS = ("anthropic-beta",)


class Cloud(Anthropic):
    remaining_steps: ClassVar[dict[str, float]] = {}
    alone = True
    counts_input = False
    # A throttled entry waits this long: the cloud names no wait, its quota refills
    # continuously.
    throttle_cooldown_s: ClassVar[float] = 2.0
    sends_through_client = True  # the limited clients' requests (``send_http``)

    async def stream_turn(self, client: Any, params: dict[str, Any], seen: Any) -> Answer:
        return await super().stream_turn(client.sdk, client.params(params), seen)

    def throttled(self, failure: Failure, kind: str | None, message: str | None,
                  throttling: bool) -> Failure:
        """``failure`` in the cloud's words (its error ``kind`` and ``message``, where it
        gave them), a rate limit of ``throttle_cooldown_s`` when ``throttling``."""
        if kind:
            failure = replace(failure, kind=kind)
        if message:
            failure = replace(failure, message=message[:500])
        if throttling:
            failure = replace(failure, status_code=429, retry_after_s=self.throttle_cooldown_s)
        return failure

    def stream_failure(self, event: dict[str, Any]) -> Failure | None:
        # A throttle mid-answer (re-said as the API's rate_limit_error event by send_http's
        # stream) cools the entry down as a throttle before the answer does: it names no wait.
        failure = super().stream_failure(event)
        if failure is not None and failure.kind == "rate_limit_error":
            return self.throttled(failure, None, None, throttling=True)
        return failure

    def read_limits(self, headers: Mapping[str, str | bytes]) -> LimitReadings | None:
        return None

    async def send_http(self, request: Any, inner: Any, key: Any = None,
                        client: Any = None) -> httpx2.Response:
        """The Anthropic API's request, sent on the entry's SDK client with the caller's
        timeouts (the client itself retries nothing), answered in the API's shape (the
        module docstring); a connection's error is raised as httpx2's own, as the API's
        raw request would have met it."""
        body = json_body(request.content)
        model = str(body["model"])
        stream = bool(body.get("stream"))
        options: dict[str, Any] = {"headers": {name: request.headers[name]
                                               for name in _KEPT_HEADERS
                                               if name in request.headers}}
        timeout = request.extensions.get("timeout")
        read = KEEP_ALIVE_S * 2
        if isinstance(timeout, dict):
            options["timeout"] = httpx2.Timeout(**timeout)
            read = timeout.get("read") or read
        try:
            answer = await client.sdk.post(
                "/v1/messages", cast_to=Message, body=client.params(body), options=options,
                stream=stream, stream_cls=anthropic.AsyncStream[RawMessageStreamEvent])
        except anthropic.APIStatusError as error:
            return self._error_answer(error, request)
        except anthropic.APIConnectionError as error:
            cause = error.__cause__
            raise (cause if isinstance(cause, Exception) else error) from None
        headers = {"content-type": "text/event-stream" if stream else "application/json"}
        if stream:
            return httpx2.Response(200, headers=headers, request=request,
                                   stream=CloudEvents(answer, model,
                                                      min(KEEP_ALIVE_S, read / 2)))
        message = answer.to_dict(mode="json")
        message["model"] = model
        return httpx2.Response(200, headers=headers, content=json.dumps(message).encode(),
                               request=request)

    def response_failure(self, response: Any, content: bytes, url: str) -> Failure:
        failure = response.extensions.get(FAILURE)
        if isinstance(failure, Failure):
            return failure
        return super().response_failure(response, content, url)

    def as_api_error(self, error: anthropic.APIStatusError) -> tuple[int, dict[str, Any],
                                                                    Failure]:
        """The cloud's error as the Anthropic API's: its status, its error body, and the
        Failure the loop's call judges (``describe``: a throttle is a 429)."""
        failure = self.describe(error) or Failure(type(error).__name__, "", error.status_code)
        status = failure.status_code or error.status_code
        kind = "rate_limit_error" if status == 429 else "overloaded_error" if status == 529 \
            else ERROR_TYPES.get(status, "invalid_request_error" if status < 500
                                 else "api_error")
        message = failure.message or f"{self.name}: {failure.kind}"
        return status, {"type": "error", "error": {"type": kind, "message": message}}, failure

    def _error_answer(self, error: anthropic.APIStatusError,
                      request: httpx2.Request) -> httpx2.Response:
        status, body, failure = self.as_api_error(error)
        headers = {"content-type": "application/json"}
        if failure.retry_after_s is not None:
            headers["retry-after"] = f"{failure.retry_after_s:g}"
        if failure.should_retry is not None:
            headers["x-should-retry"] = "true" if failure.should_retry else "false"
        return httpx2.Response(status, headers=headers, content=json.dumps(body).encode(),
                               request=request, extensions={FAILURE: failure})


# A stream whose next event is this long away (at most half the caller's read timeout) says
# ``ping`` meanwhile, as the API does while it reads a long prompt: the SDK drops the cloud's
# own pings before any event, and the caller's read timeout would otherwise fire on a healthy
# stream. A cloud stream that carries no byte at all still ends at the caller's read timeout
# (the cloud's request has it), as the API's would.
KEEP_ALIVE_S = 5.0
_PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def _sse(event: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (str(event.get("type")).encode(),
                                           json.dumps(event).encode())


class CloudEvents(httpx2.AsyncByteStream):
    """A cloud's stream (the SDK's raw events) as the Anthropic API's server-sent events,
    each passed on as it arrives; closed early, it closes the cloud's stream."""

    def __init__(self, events: Any, model: str, keep_alive_s: float = KEEP_ALIVE_S) -> None:
        self.events, self.model = events, model
        self.keep_alive_s = keep_alive_s
        self.next: asyncio.Future[Any] | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        events = self.events.__aiter__()
        try:
            while True:
                if self.next is None:
                    self.next = asyncio.ensure_future(events.__anext__())
                done, _ = await asyncio.wait({self.next}, timeout=self.keep_alive_s)
                if not done:
                    yield _PING
                    continue
                step, self.next = self.next, None
                try:
                    event = step.result()
                except StopAsyncIteration:
                    return
                except anthropic.APIStatusError as error:  # the cloud's error event
                    yield _sse(self._error_event(error))
                    return
                data = event.to_dict(mode="json")
                if data.get("type") == "message_start" and isinstance(data.get("message"),
                                                                       dict):
                    data["message"]["model"] = self.model
                yield _sse(data)
        finally:
            self._stop()

    def _error_event(self, error: anthropic.APIStatusError) -> dict[str, Any]:
        body = error.body if isinstance(error.body, dict) else {}
        said = body.get("error")
        inner: dict[str, Any] = said if isinstance(said, dict) else body
        kind = str(inner.get("type") or "")
        message = str(inner.get("message") or kind or "the cloud's stream failed")[:500]
        if kind not in _API_TYPES:  # Bedrock's exception names (throttlingException, ...)
            said = kind.lower()
            kind = ("rate_limit_error" if "throttl" in said else "overloaded_error"
                    if "unavailable" in said or "overload" in said else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _stop(self) -> None:
        if self.next is not None:
            self.next.cancel()
            self.next = None

    async def aclose(self) -> None:
        self._stop()
        await self.events.close()
