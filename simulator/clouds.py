"""Claude on Amazon Bedrock and Google Vertex AI: their routes, credentials, errors and streams.

A simulator whose ``provider`` is ``bedrock`` or ``vertex`` serves the Messages API as that
cloud does, for the Anthropic SDK's ``AnthropicBedrock`` / ``AnthropicVertex`` clients:

- **Bedrock**: ``POST /model/{model}/invoke`` and ``/model/{model}/invoke-with-response-stream``
  (the model in the path, ``anthropic_version`` in the body); a Bedrock API key as a bearer
  token, or SigV4 (the access key id of its ``Credential=`` is the caller); a stream is AWS's
  binary event stream (each Messages event a ``chunk`` whose ``bytes`` are its JSON, base64);
  quotas are requests and tokens per minute, where the tokens quota takes input + max_tokens at
  admission and, once the answer is done, input + ``output_burndown`` x output (5 for the
  current Claude models); throttling is a 429 ``ThrottlingException`` (no retry-after).
- **Vertex AI**: ``POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/
  {model}:rawPredict`` and ``:streamRawPredict``; an OAuth access token as a bearer token;
  streams are the Messages API's own server-sent events (pinged); quotas are requests, input
  and output tokens per minute per region and project; throttling is a 429
  ``RESOURCE_EXHAUSTED`` in Google's error shape.

Neither sends the ``anthropic-ratelimit-*`` headers.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from typing import Any

CLOUDS = ("bedrock", "vertex")
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)")


def caller(provider: str, headers: Any) -> str:
    """The credential a cloud request carries: a bearer token, or (Bedrock) SigV4's access
    key id; "" when it has none."""
    auth = str(headers.get("authorization", ""))
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    if provider == "bedrock":
        found = _CREDENTIAL.search(auth)
        if auth.startswith("AWS4-HMAC-SHA256") and found:
            return found.group(1)
    return ""


def messages_body(raw: bytes, model: str, stream: bool) -> bytes:
    """A cloud request's body as the Messages request it stands for (the model from the
    path, the stream flag from the route, the cloud's ``anthropic_version`` dropped); a body
    that is not a JSON object passes through for the engine to refuse."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(body, dict):
        return raw
    body.pop("anthropic_version", None)
    body["model"] = model
    if stream:
        body["stream"] = True
    else:
        body.pop("stream", None)
    return json.dumps(body).encode()


def error_reply(provider: str, status: int, error_type: str, message: str
                ) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, extra headers) of the engine's error in the cloud's words."""
    if provider == "bedrock":
        kind = {429: "ThrottlingException", 400: "ValidationException",
                401: "AccessDeniedException", 403: "AccessDeniedException",
                404: "ResourceNotFoundException", 529: "ServiceUnavailableException",
                503: "ServiceUnavailableException"}.get(status, "InternalServerException")
        if status == 429:
            message = "Too many requests, please wait before trying again."
        if status == 401:
            status = 403
        if status == 529:
            status = 503
        return status, json.dumps({"message": message}).encode(), {
            "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    google = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
              404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}
    if status == 429:
        message = ("Quota exceeded for aiplatform.googleapis.com/"
                   "online_prediction_requests_per_base_model with base model: anthropic-claude. "
                   "Please submit a quota increase request. " + message)
    if status == 529:  # Vertex passes Claude's overload on as its own 529
        return status, json.dumps({"type": "error", "error": {
            "type": error_type, "message": message}}).encode(), {}
    return status, json.dumps({"error": {"code": status, "message": message,
                                         "status": google.get(status, "INTERNAL")}}).encode(), {}


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (struct.pack("!B", len(raw_name)) + raw_name + b"\x07"  # 7: a string value
            + struct.pack("!H", len(raw_value)) + raw_value)


def event_stream_frame(payload: bytes, headers: dict[str, str]) -> bytes:
    """One message of AWS's binary event stream: the prelude (total and headers length, its
    CRC32), the headers, the payload and the whole message's CRC32."""
    head = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack("!II", total, len(head))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + head + payload
    return body + struct.pack("!I", binascii.crc32(body) & 0xFFFFFFFF)


def bedrock_chunk(sse: bytes) -> bytes:
    """A Messages server-sent event as Bedrock streams it: a ``chunk`` event whose payload's
    ``bytes`` are the event's JSON, base64 (b"" for a frame that carries no data)."""
    data = b"".join(line[5:].strip() for line in sse.split(b"\n") if line.startswith(b"data:"))
    if not data:
        return b""
    payload = json.dumps({"bytes": base64.b64encode(data).decode(),
                          "p": "abcdefghijklmnopqrstuvwxyzABCDEF"[:len(data) % 32]}).encode()
    return event_stream_frame(payload, {":event-type": "chunk",
                                        ":content-type": "application/json",
                                        ":message-type": "event"})


def bedrock_stream_error(message: str) -> bytes:
    """A failure mid-stream as Bedrock sends it: an exception message of the event stream."""
    return event_stream_frame(json.dumps({"message": message}).encode(), {
        ":exception-type": "serviceUnavailableException",
        ":content-type": "application/json", ":message-type": "exception"})
