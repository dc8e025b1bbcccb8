"""The gateway's own answers in the provider's error shape, so a caller's SDK raises the
exception it always raises for that status (``AuthenticationError`` for a 401, and so on).

Anthropic: ``{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}``;
OpenAI: ``{"error": {"message": ..., "type": ..., "param": null, "code": ...}}``.
"""

from __future__ import annotations

import json
import uuid

__all__ = ["ANTHROPIC_TYPES", "error_body"]

# The Messages API's error type of each status (docs: /work/shared/anthropic-api.md).
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                   413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   502: "api_error", 503: "api_error", 504: "timeout_error"}
# Chat Completions' code of the statuses the gateway says itself.
OPENAI_CODES = {401: "invalid_api_key", 404: "not_found", 413: "context_length_exceeded"}


def error_body(provider: str, status: int, message: str) -> bytes:
    """An error answer of ``status`` saying ``message``, as ``provider`` writes it."""
    if provider == "openai":
        kind = "invalid_request_error" if status < 500 else "server_error"
        return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                     "code": OPENAI_CODES.get(status)}}).encode()
    return json.dumps({"type": "error",
                       "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"),
                                 "message": message},
                       "request_id": f"req_gw_{uuid.uuid4().hex[:20]}"}).encode()
