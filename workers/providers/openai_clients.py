"""``drover.AsyncOpenAI`` and ``drover.OpenAI``: the openai SDK's own clients, every request
of which goes through the fleet's limits (``limited``: the hook that gives them their HTTP
client). Everything else is the SDK's: its methods, types, retries, exceptions."""

from __future__ import annotations

from typing import Any

import openai

from drover.workers.providers.limited import limited_client_args

__all__ = ["AsyncOpenAI", "OpenAI"]


class AsyncOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` inside the fleet's global limits: each HTTP attempt of a chat
    completion reserves from drover's limiter, waits its turn, and settles with the answer's
    usage. Arguments are the SDK's; the key and endpoint default to drover's settings
    (``OPENAI_API_KEY``, ``DROVER_OPENAI_BASE_URL``)."""

    def __init__(self, *, http_client: Any = None, **kwargs: Any) -> None:
        super().__init__(**limited_client_args("openai", True, http_client, kwargs))


class OpenAI(openai.OpenAI):
    """``openai.OpenAI`` (blocking) inside the fleet's global limits; see ``AsyncOpenAI``."""

    def __init__(self, *, http_client: Any = None, **kwargs: Any) -> None:
        super().__init__(**limited_client_args("openai", False, http_client, kwargs))
