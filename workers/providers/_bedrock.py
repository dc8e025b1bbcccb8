"""Claude on Amazon Bedrock behind the seam: the Anthropic provider's Messages wire, through
the Anthropic SDK's own ``AsyncAnthropicBedrock`` client (the ``bedrock`` extra: botocore
reads Bedrock's binary event stream and signs with SigV4).

- Credentials: a Bedrock API key (``api_key``, sent as a bearer token), else the AWS
  credential chain (environment, profile, instance role), which the SDK signs with.
- Limits: requests and one tokens quota per minute (``rpm``, ``tpm``). The tokens quota takes
  input + max tokens at admission and, once the answer is done, input + ``output_burndown`` x
  output (5 for the current Claude models): the limiter's tokens dimension weighs output
  that many times and takes at least input + max tokens at admission.
- Bedrock sends none of the ``anthropic-ratelimit-*`` headers and throttles with a 429
  ``ThrottlingException`` that names no wait (``_cloud.Cloud``: a rate limit, cooled down on
  that entry only for ``THROTTLE_COOLDOWN_S``).
"""

from __future__ import annotations

from typing import Any

import anthropic

from drover.workers.providers._base import CloudClient, Failure
from drover.workers.providers._cloud import Cloud

__all__ = ["BEDROCK", "THROTTLE_COOLDOWN_S", "Bedrock"]

THROTTLE_COOLDOWN_S = Cloud.throttle_cooldown_s
OUTPUT_BURNDOWN = 5.0  # AWS's quota docs: each output token of the current Claude models


class Bedrock(Cloud):
    name = "bedrock"
    dimensions = ("requests", "tokens")

    def output_weight(self, key: Any) -> float:
        return float(key.output_burndown or OUTPUT_BURNDOWN)

    def build_key_client(self, key: Any, *, base_url: str | None, connect_s: float,
                         idle_s: float) -> CloudClient:
        secret = key.api_key.get_secret_value() if key.api_key is not None else None
        sdk = anthropic.AsyncAnthropicBedrock(
            aws_region=key.region, api_key=secret, base_url=base_url, max_retries=0,
            timeout=anthropic.Timeout(idle_s, connect=connect_s, read=idle_s, write=idle_s,
                                      pool=connect_s))
        return CloudClient(sdk, dict(key.models))

    def describe(self, error: BaseException) -> Failure | None:
        failure = super().describe(error)
        if failure is None or not isinstance(error, anthropic.APIStatusError):
            return failure
        # x-amzn-ErrorType: "ThrottlingException:http://internal.amazon.com/..."
        kind = error.response.headers.get("x-amzn-errortype", "").split(":", 1)[0]
        body = error.body if isinstance(error.body, dict) else {}
        return self.throttled(failure, kind, str(body.get("message") or ""),
                              error.status_code == 429 or kind == "ThrottlingException")


BEDROCK = Bedrock()
