"""What drover asks of a provider: the seam between drover and one LLM API.

A provider is a small object (one per API, built once per process) that

- builds its SDK's async client from a key, an endpoint and the stream timeouts;
- sends one turn as a stream (``stream_turn``), filling a ``Seen`` as events arrive;
- describes its SDK's errors as a ``Failure`` (status, type, message, retry-after), which
  ``drover.workers.agent.retry`` turns into drover's outcomes (rate limited with a wait,
  overloaded, server error, key refused, too large, bad request);
- reads its limit headers into drover's dimensions (``read_limits``) and names the dimensions
  its limits have (``dimensions``);
- converts drover's conversation and tool calls to its wire shape (``to_wire``; drover's own
  shape is the Messages API's, so Anthropic's is the identity), and its answers to drover's
  ``Answer`` (``answers``: no SDK object goes past the provider).

Only this room imports a provider SDK (tests/unit/test_architecture.py checks it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

from drover.workers.providers.answers import Answer, AnswerUsage

__all__ = ["NOT_SENT", "AnswerUsage", "CloudClient", "Failure", "LimitReadings", "Provider",
           "coarse_readings_dropped", "fine_dimensions", "json_body", "read_limit_headers",
           "read_retry_after", "went_out"]

# What a response's limit headers said: {"remaining": {dimension: value}, "limit": {...}},
# each without the dimensions it had none of. Dimensions are the provider's ``dimensions``.
LimitReadings = dict[str, dict[str, float]]


# A provider SDK's HTTP client's errors raised before the request could reach the provider
# (by name: each SDK's own httpx fork is not ours to import); any other transport error (a read
# timeout, a dropped connection) came after the send, so the provider may have taken it.
NOT_SENT = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol",
                       "ProxyError"})


def went_out(error: BaseException) -> bool:
    """True when a transport error came after the request could reach the provider (a read
    timeout, a dropped connection), so the provider may have taken and billed it."""
    return not any(kind.__name__ in NOT_SENT for kind in type(error).__mro__)


def read_limit_headers(headers: Mapping[str, str | bytes],
                       names: Mapping[str, tuple[str, str]]) -> LimitReadings | None:
    """Readings from ``headers``: per dimension, ``names[dim]`` = (its -remaining header, its
    -limit header); a bad or negative value is none, and so is a -limit of 0."""
    lower = {str(k).lower(): v for k, v in headers.items()}
    out: LimitReadings = {"remaining": {}, "limit": {}}
    for dim, (remaining_name, limit_name) in names.items():
        remaining, limit = _number(lower.get(remaining_name)), _number(lower.get(limit_name))
        if remaining is not None:
            out["remaining"][dim] = remaining
        if limit:
            out["limit"][dim] = limit
    return out if out["remaining"] or out["limit"] else None


# A -remaining tells a bucket's level only when the bucket holds this many of its rounding
# steps: below that it reads the same full as empty.
STEPS_PER_BUCKET = 4


def fine_dimensions(per_minute: Mapping[str, float | None], steps: Mapping[str, float],
                    burst_s: float) -> list[str]:
    """The dimensions of ``per_minute`` (limits by dimension) whose bucket of ``burst_s``
    holds enough of the -remaining header's rounding ``steps`` for it to say anything."""
    return [dim for dim, limit in per_minute.items()
            if (limit or 0) / 60 * burst_s >= STEPS_PER_BUCKET * steps.get(dim, 1)]


def coarse_readings_dropped(readings: LimitReadings | None, steps: Mapping[str, float],
                            burst_s: float) -> LimitReadings | None:
    """``readings`` without the -remaining values rounded too coarsely for their bucket to
    say anything (``steps``: each dimension's rounding, absent: 1; ``burst_s``: the bucket's
    seconds of refill, each limit by its -limit).

    At a small key the provider's -remaining reads 0 at every answer, full bucket or empty:
    12,000 output tokens a minute in 1 s bursts is a bucket of 200 tokens, which the token
    headers (rounded to the thousand) read as 0; 60 requests a minute is a bucket of one
    request, which is below 1 again when the answer comes. Taken as levels, they said the
    buckets were always empty, so other software had to be using the key: the share learnt
    (_share.lua) fell, and a key all ours ran at 1.8-1.9 x the bound (bench/RESULTS-small.md).
    """
    if readings is None:
        return readings
    fine = fine_dimensions(readings.get("limit", {}), steps, burst_s)
    remaining = {dim: value for dim, value in readings.get("remaining", {}).items()
                 if dim in fine}
    out = {**readings, "remaining": remaining}
    return out if out["remaining"] or out.get("limit") else None


def _number(raw: str | bytes | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.decode() if isinstance(raw, bytes) else raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class Failure:
    """A provider's error, in drover's words (``retry.classify`` decides what to do)."""

    kind: str  # the error type the provider named (or the exception's class name)
    message: str
    status_code: int | None = None  # None: no HTTP answer (connection error, timeout)
    code: str | None = None  # a finer code (e.g. a spend cap), when the body has one
    retry_after_s: float | None = None  # retry-after(-ms), when given
    should_retry: bool | None = None  # the server's explicit word (x-should-retry), if any
    timeout: bool = False  # no answer in time (else: the connection failed)
    spend_cap: bool = False  # a 429 that retrying cannot help (no credit, a spend limit)


def json_body(content: bytes) -> Any:
    """An answer's JSON, or None when it is not JSON (a proxy's HTML error page)."""
    try:
        return json.loads(content) if content else None
    except ValueError:
        return None


@dataclass
class CloudClient:
    """A cloud entry's SDK client and the cloud's ids of drover's model names (a name not
    in ``models`` is sent as it is)."""

    sdk: Any
    models: Mapping[str, str]

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the cloud's id of its model."""
        model = params.get("model")
        return {**params, "model": self.models.get(model, model)} if model else params

    async def close(self) -> None:
        await self.sdk.close()


class Provider:
    """One LLM API behind the seam; see the module docstring."""

    name: ClassVar[str]
    dimensions: ClassVar[tuple[str, ...]]  # what its limits count, e.g. requests, input, output
    # Input and output share one tokens bucket that counts a call's max tokens at admission
    # (OpenAI): the call reserves input + max tokens there and settles input + output.
    one_tokens_bucket: ClassVar[bool] = False
    # How coarsely its -remaining headers are rounded, per dimension (absent: to a whole
    # number). A bucket of a few such steps reads the same full or empty
    # (``coarse_readings_dropped``).
    remaining_steps: ClassVar[Mapping[str, float]] = {}
    # Its entries of a pool are under no organisation (Claude on a cloud): each one's limits
    # are its own buckets, and the Anthropic organisation's (DROVER_RPM/ITPM/OTPM) hold only
    # the Anthropic API's keys.
    alone: ClassVar[bool] = False
    # It counts a request's input tokens on an endpoint of its own (``count_input``).
    counts_input: ClassVar[bool] = False

    def output_weight(self, key: Any) -> float:
        """How many times an output token counts in the tokens limit of pool entry ``key``
        (a ``PoolKey``): Bedrock's output burndown; 1 elsewhere."""
        return 1.0

    def build_key_client(self, key: Any, *, base_url: str | None, connect_s: float,
                         idle_s: float) -> Any:
        """The SDK client of pool entry ``key`` (a ``PoolKey``) on ``base_url``: its API key,
        or a cloud's region, project and credentials."""
        secret = key.api_key.get_secret_value() if key.api_key is not None else None
        return self.build_client(api_key=secret, base_url=base_url, connect_s=connect_s,
                                 idle_s=idle_s)
    # A worker's warm-up (``warmup``): a short streamed answer of its API (the bytes of a
    # ``text/event-stream`` body) that a local server sends to one ``stream_turn``, and what
    # its client's base URL ends in (e.g. "/v1").
    warm_up_stream: ClassVar[bytes] = b""
    warm_up_path: ClassVar[str] = ""

    def build_client(self, *, api_key: str | None, base_url: str | None, connect_s: float,
                     idle_s: float, keyless: bool = False) -> Any:
        raise NotImplementedError

    def error_body(self, status: int, message: str) -> bytes:
        """An error answer of ``status`` saying ``message`` in its API's error shape (what
        ``drover gateway`` answers itself), so a caller's SDK raises the exception it always
        raises for that status (``AuthenticationError`` for a 401, and so on)."""
        raise NotImplementedError

    async def count_input(self, client: Any, params: dict[str, Any]) -> int | None:
        """The provider's own count of a request's input tokens (an endpoint whose limits are
        not the calls'), or None: it has none, or it did not answer."""
        return None

    async def stream_turn(self, client: Any, params: dict[str, Any], seen: Any) -> Answer:
        """One turn as a stream, recording what came in ``seen``, answered as drover's
        ``Answer`` (the provider converts its SDK's answer here, at its edge). drover's loop
        sends it on a client over the limited transport (``clients.turn_client``), which
        reserves, settles and tells the sub-agent it is generating. A stream is abandoned
        when its connection carries no byte for the client's read timeout (the ``idle_s`` it
        was built with), never by the gap between parsed events: a provider's keep-alives
        (Anthropic's pings) are bytes the SDK drops before any event."""
        raise NotImplementedError

    def describe(self, error: BaseException) -> Failure | None:
        """``error`` as a Failure, or None when it is not this provider's."""
        raise NotImplementedError

    def read_limits(self, headers: Mapping[str, str | bytes]) -> LimitReadings | None:
        """The limit headers of an answer (or a 429) in ``dimensions``; None if it had none."""
        raise NotImplementedError

    def to_wire(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    # --- the HTTP exchange, as the limited clients' transport sees it (a request's JSON body,
    # --- the answer's JSON or its stream's events, an error's status and body) --------------
    def counted_path(self, path: str) -> bool:
        """True for the endpoint whose calls the limits count (a realtime generation)."""
        raise NotImplementedError

    def call_params(self, body: dict[str, Any]) -> dict[str, Any]:
        """A request body in drover's (Messages-shaped) params: model, max_tokens, system,
        messages, tools, as far as the estimate and the route need them."""
        raise NotImplementedError

    def answer_usage(self, body: dict[str, Any]) -> AnswerUsage:
        """The usage of a whole (not streamed) answer."""
        raise NotImplementedError

    def on_stream_event(self, seen: Any, event: dict[str, Any]) -> None:
        """Fold one event of a streamed answer (its JSON) into ``seen`` (``streams.Seen``)."""
        raise NotImplementedError

    def stream_usage(self, seen: Any, input_estimate: int) -> AnswerUsage:
        """The usage of a streamed answer that ended whole (``seen.finished``); a stream that
        said no usage is counted from what streamed (its input at ``input_estimate``)."""
        raise NotImplementedError

    def stream_failure(self, event: dict[str, Any]) -> Failure | None:
        """An event of a stream that began (status 200) which ends it with the provider's
        error, as the Failure its SDK's exception describes; None for any other event."""
        raise NotImplementedError

    def status_failure(self, status: int, headers: Mapping[str, str], content: bytes,
                       url: str) -> Failure:
        """An error answer (status >= 400) as the Failure its SDK's exception describes."""
        raise NotImplementedError

    def auth_headers(self, api_key: str) -> dict[str, str]:
        """The headers that send a request on ``api_key`` (a pool's key the limiter chose)."""
        raise NotImplementedError

    # Its pool entries send through their own SDK client (``send_http``), which lives on the
    # runtime's loop; else the request goes out as it is, on the transport's connections.
    sends_through_client: ClassVar[bool] = False

    async def send_http(self, request: Any, inner: Any, key: Any = None,
                        client: Any = None) -> Any:
        """Send one request of the limited clients' transport (the caller's SDK's own, an
        ``httpx2.Request`` whose body is read) on ``inner`` (its connections), answered as
        its API answers it. ``key``: the pool's entry the grant chose (a ``PoolKey``: its
        credentials and endpoint go on the request; None: the one key, already on it), and
        ``client`` that entry's SDK client. Raises the HTTP client's errors of a send that got
        no answer (httpx2's: a connect error, a read timeout, a dropped connection)."""
        if key is not None:
            request.headers.update(self.auth_headers(key.secret()))
            if key.base_url:
                base = type(request.url)(key.base_url)
                request.url = request.url.copy_with(scheme=base.scheme, host=base.host,
                                                    port=base.port)
                request.headers["host"] = request.url.netloc.decode()
        return await inner.handle_async_request(request)

    def response_failure(self, response: Any, content: bytes, url: str) -> Failure:
        """An error answer of ``send_http`` (status >= 400, its body ``content``) as the
        Failure the loop's call would have met (``status_failure`` of its status, headers
        and body)."""
        return self.status_failure(response.status_code, response.headers, content, url)

    def sdk_error(self, message: str) -> BaseException:
        """Its SDK's base error: what the limited clients' transport raises (from drover's
        signal) for the SDK to pass on as it is, without a retry of its own."""
        raise NotImplementedError


def read_retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a response asks to wait (``retry-after-ms``, or ``retry-after`` in seconds
    or as an HTTP date), or None when it names none."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return float(value) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # the header may also be an HTTP date
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None
