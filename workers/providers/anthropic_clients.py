"""``drover.AsyncAnthropic`` and ``drover.Anthropic``: the anthropic SDK's own clients, every
request of which goes through the fleet's limits (``limited``: the hook that gives them
their HTTP client). Everything else is the SDK's: its methods, types, retries, exceptions."""

from __future__ import annotations

from typing import Any

import anthropic

from drover.workers.providers.limited import limited_client_args

__all__ = ["Anthropic", "AsyncAnthropic"]


class AsyncAnthropic(anthropic.AsyncAnthropic):
    """``anthropic.AsyncAnthropic`` inside the fleet's global limits: each HTTP attempt
    reserves from drover's limiter, waits its turn, and settles with the answer's usage.
    Arguments are the SDK's; the key and endpoint default to drover's settings
    (``ANTHROPIC_API_KEY``, ``DROVER_ANTHROPIC_BASE_URL``)."""

    def __init__(self, *, http_client: Any = None, **kwargs: Any) -> None:
        super().__init__(**limited_client_args("anthropic", True, http_client, kwargs))


class Anthropic(anthropic.Anthropic):
    """``anthropic.Anthropic`` (blocking) inside the fleet's global limits; see
    ``AsyncAnthropic``."""

    def __init__(self, *, http_client: Any = None, **kwargs: Any) -> None:
        super().__init__(**limited_client_args("anthropic", False, http_client, kwargs))
