"""The LLM APIs drover calls, each behind one small interface (``Provider``, in ``_base``).

Only this room imports a provider SDK. ``provider(name)`` is the one for a name;
``describe(error)`` asks each provider whether ``error`` is one of its SDK's errors.
Message Batches are Anthropic's only: the batcher uses the Anthropic names exported here
(``Message``, ``MessageBatchIndividualResponse``, ``StatusError``, ``ConnectionFailed``,
``batch_results_text``). ``Pool`` holds a key pool's clients (one per key).
docs/providers.md tells how a provider is added.
"""

from __future__ import annotations

from drover.workers.providers._anthropic import (
    ANTHROPIC,
    ConnectionFailed,
    Message,
    MessageBatchIndividualResponse,
    StatusError,
    batch_results_text,
)
from drover.workers.providers._base import (
    Failure,
    LimitReadings,
    Provider,
    coarse_readings_dropped,
)
from drover.workers.providers._openai import OPENAI
from drover.workers.providers.pool import Pool
from drover.workers.providers.streams import CHARS_PER_TOKEN, Seen

__all__ = ["ANTHROPIC", "OPENAI", "CHARS_PER_TOKEN", "PROVIDERS", "ConnectionFailed", "Failure",
           "LimitReadings", "Message", "MessageBatchIndividualResponse", "Pool", "Provider", "Seen",
           "StatusError", "api_errors", "batch_results_text", "coarse_readings_dropped", "describe",
           "provider"]

PROVIDERS: dict[str, Provider] = {ANTHROPIC.name: ANTHROPIC, OPENAI.name: OPENAI}


def provider(name: str) -> Provider:
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ValueError(f"unknown provider {name!r}: one of {', '.join(PROVIDERS)}") from None


def describe(error: BaseException) -> Failure | None:
    """``error`` as a Failure, by the provider whose SDK raised it (None: no provider's)."""
    for each in PROVIDERS.values():
        failure = each.describe(error)
        if failure is not None:
            return failure
    return None


def api_errors() -> tuple[type[BaseException], ...]:
    """The base error class of every provider's SDK (for an ``except``)."""
    return tuple(each.api_error for each in PROVIDERS.values())
