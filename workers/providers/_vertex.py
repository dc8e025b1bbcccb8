"""Claude on Google Vertex AI behind the seam: the Anthropic provider's Messages wire, through
the Anthropic SDK's own ``AsyncAnthropicVertex`` client (the ``vertex`` extra: google-auth).

- Credentials: an OAuth access token (``access_token``), else Google's application default
  credentials, which the SDK refreshes.
- Limits: requests, input and output tokens per minute of the entry's region and project
  (``rpm``, ``itpm``, ``otpm``), counted as the Anthropic API counts them.
- Vertex AI sends none of the ``anthropic-ratelimit-*`` headers (nothing to read) and
  throttles with a 429 ``RESOURCE_EXHAUSTED`` that names no wait: a rate limit, cooled down
  on that entry only for ``THROTTLE_COOLDOWN_S``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import anthropic

from drover.workers.providers._anthropic import Anthropic
from drover.workers.providers._base import CloudClient, Failure, LimitReadings
from drover.workers.providers.answers import Answer

__all__ = ["THROTTLE_COOLDOWN_S", "VERTEX", "Vertex"]

# A throttled entry waits this long (Vertex AI names no wait; its quota refills continuously).
THROTTLE_COOLDOWN_S = 2.0


class Vertex(Anthropic):
    name = "vertex"
    dimensions = ("requests", "input", "output")
    remaining_steps = {}
    alone = True
    counts_input = False  # its sizes borrow a factor (no count endpoint asked here)

    def build_key_client(self, key: Any, *, base_url: str | None, connect_s: float,
                         idle_s: float) -> CloudClient:
        token = key.access_token.get_secret_value() if key.access_token is not None else None
        sdk = anthropic.AsyncAnthropicVertex(
            region=key.region, project_id=key.project, access_token=token, base_url=base_url,
            max_retries=0, timeout=anthropic.Timeout(idle_s, connect=connect_s, read=idle_s,
                                                     write=idle_s, pool=connect_s))
        return CloudClient(sdk, dict(key.models))

    async def stream_turn(self, client: Any, params: dict[str, Any], seen: Any,
                          generating: Any = None) -> Answer:
        # The Anthropic API's turn, on the entry's SDK client and the cloud's model id.
        return await super().stream_turn(client.sdk, client.params(params), seen, generating)

    def describe(self, error: BaseException) -> Failure | None:
        failure = super().describe(error)
        if failure is None or not isinstance(error, anthropic.APIStatusError):
            return failure
        body = error.body if isinstance(error.body, dict) else {}
        inner = body.get("error")
        google: dict[str, Any] = inner if isinstance(inner, dict) else {}
        status = google.get("status") if isinstance(google.get("status"), str) else None
        if status:  # Google's shape: {"error": {"code", "message", "status"}}
            failure = replace(failure, kind=status,
                              message=str(google.get("message") or failure.message)[:500])
        if error.status_code == 429 or status == "RESOURCE_EXHAUSTED":
            failure = replace(failure, status_code=429, retry_after_s=THROTTLE_COOLDOWN_S)
        return failure

    def read_limits(self, headers: Mapping[str, str | bytes]) -> LimitReadings | None:
        return None


VERTEX = Vertex()
