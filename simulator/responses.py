"""Wire shapes: message bodies, error bodies, ids and the rate-limit headers."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .buckets import KeyBuckets, NestedBuckets, TokenBucket

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def request_id() -> str:
    return "req_011C" + os.urandom(12).hex()


def message_id() -> str:
    return "msg_01" + os.urandom(12).hex()


def message_body(model: str, content: list[dict[str, Any]], stop_reason: str,
                 usage: dict[str, int]) -> bytes:
    return _dumps({
        "id": message_id(), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason, "stop_sequence": None, "usage": usage,
    }).encode()


def error_body(error_type: str, message: str, req_id: str,
               details: dict[str, Any] | None = None) -> bytes:
    error: dict[str, Any] = {"type": error_type, "message": message}
    if details:
        error["details"] = details
    return _dumps({"type": "error", "error": error, "request_id": req_id}).encode()


def json_body(value: Any) -> bytes:
    return _dumps(value).encode()


_rfc3339_cache: dict[int, str] = {}


def rfc3339(wall: float) -> str:
    second = int(wall + 0.999)  # round up: "full again" must not be promised early
    text = _rfc3339_cache.get(second)
    if text is None:
        if len(_rfc3339_cache) > 4096:
            _rfc3339_cache.clear()
        text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        _rfc3339_cache[second] = text
    return text


def _set(headers: dict[str, str], name: str, bucket: TokenBucket, remaining: int,
         wall: float) -> None:
    prefix = "anthropic-ratelimit-" + name
    headers[prefix + "-limit"] = str(int(bucket.limit))
    headers[prefix + "-remaining"] = str(remaining)
    headers[prefix + "-reset"] = rfc3339(wall + bucket.seconds_to_full())


def _token_remaining(bucket: TokenBucket, rounded: bool) -> int:
    level = max(0.0, bucket.level)
    return int(round(level / 1000.0)) * 1000 if rounded else int(level)


def ratelimit_headers(buckets: KeyBuckets | NestedBuckets, now: float, wall: float,
                      round_tokens: bool) -> dict[str, str]:
    """anthropic-ratelimit-* for every configured limit, from the buckets as they are now
    (a pool's key: per dimension, the level with the least left)."""
    buckets.refill(now)
    if isinstance(buckets, NestedBuckets):
        requests, inputs, outputs = (buckets.tightest(d) for d in ("requests", "input",
                                                                    "output"))
    else:
        requests, inputs, outputs = buckets.requests, buckets.input, buckets.output
    headers: dict[str, str] = {}
    if requests is not None:
        _set(headers, "requests", requests, int(max(0.0, requests.level)), wall)
    token_buckets: list[tuple[int, str, TokenBucket]] = []
    for name, bucket in (("input-tokens", inputs), ("output-tokens", outputs)):
        if bucket is not None:
            remaining = _token_remaining(bucket, round_tokens)
            _set(headers, name, bucket, remaining, wall)
            token_buckets.append((remaining, name, bucket))
    if token_buckets:
        # The most restrictive in effect: the one with the least left.
        remaining, _, bucket = min(token_buckets, key=lambda t: (t[0], t[1]))
        _set(headers, "tokens", bucket, remaining, wall)
    return headers
