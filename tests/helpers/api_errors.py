"""API errors as the SDK raises them, from real HTTP answers (an ``httpx2.MockTransport``:
the HTTP layer is the only thing replaced; the SDK parses status, headers and body)."""

from __future__ import annotations

import anthropic
import httpx2
import pytest

__all__ = ["REQUEST", "api_error"]

REQUEST = {"model": "claude-sonnet-4-6", "max_tokens": 10,
           "messages": [{"role": "user", "content": "hi"}]}


def api_error(status: int, error_type: str, message: str, *, headers: dict[str, str] | None = None,
              error_code: str | None = None) -> anthropic.APIError:
    """The exception the SDK raises for this HTTP answer."""
    body: dict = {"type": "error", "error": {"type": error_type, "message": message}}
    if error_code:
        body["error"]["details"] = {"error_code": error_code}

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, json=body,
                               headers={"request-id": "req_1", **(headers or {})})

    client = anthropic.Anthropic(api_key="sk-test", base_url="http://api.test", max_retries=0,
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(answer)))
    with pytest.raises(anthropic.APIError) as caught:
        client.messages.create(**REQUEST)
    return caught.value
