"""Claude on Google Vertex AI behind the seam: the Anthropic provider's Messages wire, through
the Anthropic SDK's own ``AsyncAnthropicVertex`` client (the ``vertex`` extra: google-auth).

- Credentials: an OAuth access token (``access_token``), else Google's application default
  credentials, which the SDK refreshes.
- Limits: requests, input and output tokens per minute of the entry's region and project
  (``rpm``, ``itpm``, ``otpm``), counted as the Anthropic API counts them.
- Vertex AI sends none of the ``anthropic-ratelimit-*`` headers and throttles with a 429
  ``RESOURCE_EXHAUSTED`` that names no wait (``_cloud.Cloud``: a rate limit, cooled down on
  that entry only for ``THROTTLE_COOLDOWN_S``).
"""

from __future__ import annotations

from typing import Any

import anthropic

from drover.workers.providers._base import CloudClient, Failure
from drover.workers.providers._cloud import Cloud

__all__ = ["THROTTLE_COOLDOWN_S", "VERTEX", "Vertex"]

THROTTLE_COOLDOWN_S = Cloud.throttle_cooldown_s


class Vertex(Cloud):
    name = "vertex"
    dimensions = ("requests", "input", "output")

    def build_key_client(self, key: Any, *, base_url: str | None, connect_s: float,
                         idle_s: float) -> CloudClient:
        token = key.access_token.get_secret_value() if key.access_token is not None else None
        sdk = anthropic.AsyncAnthropicVertex(
            region=key.region, project_id=key.project, access_token=token, base_url=base_url,
            max_retries=0, timeout=anthropic.Timeout(idle_s, connect=connect_s, read=idle_s,
                                                     write=idle_s, pool=connect_s))
        return CloudClient(sdk, dict(key.models))

    def describe(self, error: BaseException) -> Failure | None:
        failure = super().describe(error)
        if failure is None or not isinstance(error, anthropic.APIStatusError):
            return failure
        body = error.body if isinstance(error.body, dict) else {}
        inner = body.get("error")
        google: dict[str, Any] = inner if isinstance(inner, dict) else {}
        status = google.get("status") if isinstance(google.get("status"), str) else None
        # Google's shape: {"error": {"code", "message", "status"}}
        message = str(google.get("message") or "") if status else None
        return self.throttled(failure, status, message,
                              error.status_code == 429 or status == "RESOURCE_EXHAUSTED")


VERTEX = Vertex()
