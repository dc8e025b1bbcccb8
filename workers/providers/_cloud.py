"""Claude on a cloud (Bedrock, Vertex AI): the Anthropic provider's Messages wire through one
of the Anthropic SDK's cloud clients, what the two clouds have in common.

Each is a pool entry under no organisation (``alone``) whose quotas are the entry's own; it
sends none of the ``anthropic-ratelimit-*`` headers (nothing to read, no -remaining steps)
and has no count endpoint drover asks (its sizes borrow a factor); its turn is the Anthropic
API's, on the entry's SDK client with the cloud's model id; and its throttling (a 429 that
names no wait) is a rate limit cooled down on that entry alone for ``throttle_cooldown_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from drover.workers.providers._anthropic import Anthropic
from drover.workers.providers._base import Failure, LimitReadings
from drover.workers.providers.answers import Answer

__all__ = ["Cloud"]


class Cloud(Anthropic):
    remaining_steps: ClassVar[dict[str, float]] = {}
    alone = True
    counts_input = False
    # A throttled entry waits this long: the cloud names no wait, its quota refills
    # continuously.
    throttle_cooldown_s: ClassVar[float] = 2.0

    async def stream_turn(self, client: Any, params: dict[str, Any], seen: Any,
                          generating: Any = None) -> Answer:
        return await super().stream_turn(client.sdk, client.params(params), seen, generating)

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

    def read_limits(self, headers: Mapping[str, str | bytes]) -> LimitReadings | None:
        return None
