"""The LLM APIs drover calls, each behind one small interface (``Provider``, in ``_base``).

Only this room imports a provider SDK. A turn's answer is drover's own ``Answer`` (``answers``:
its ``Block``s in the Messages shape, stop reason, model, ``AnswerUsage``), each provider
converting its SDK's at its edge. ``provider(name)`` is the one for a name;
``describe(error)`` asks each provider whether ``error`` is one of its SDK's errors. A
provider's module (and its SDK) is imported on first use (``registry``), and so are the
names below that are Anthropic's (PEP 562): an OpenAI-only fleet never imports its SDK.
Message Batches are Anthropic's only: the batcher calls its endpoints through ``batches``
(each batch it sees as a ``BatchSeen``, its results by custom_id as JSON) and tells the SDK's
errors apart by ``StatusError`` and ``ConnectionFailed``.
``Pool`` holds a key pool's clients (one per key).
The limited clients (``drover.AsyncAnthropic`` and kin) are the SDKs' own classes in
``anthropic_clients`` and ``openai_clients``, given their HTTP client through ``limited``;
each provider also sends (``Provider.send_http``: a cloud entry through its SDK client,
answered as the Anthropic API) and reads the HTTP exchange their transport sees
(``counted_path``, ``call_params``, ``answer_usage``, ``on_stream_event``,
``response_failure``).
docs/providers.md tells how a provider is added.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drover.workers.providers._base import (
    Failure,
    LimitReadings,
    Provider,
    coarse_readings_dropped,
    fine_dimensions,
    json_body,
    went_out,
)
from drover.workers.providers.answers import Answer, AnswerUsage, BatchSeen, Block
from drover.workers.providers.pool import Pool
from drover.workers.providers.registry import describe, provider
from drover.workers.providers.streams import CHARS_PER_TOKEN, Seen, SseEvents

if TYPE_CHECKING:
    from drover.workers.providers._anthropic import (
        ANTHROPIC,
        ConnectionFailed,
        StatusError,
        batch_results,
        batches,
    )

__all__ = ["ANTHROPIC", "CHARS_PER_TOKEN", "Answer", "AnswerUsage", "BatchSeen", "Block",
           "ConnectionFailed", "Failure", "LimitReadings", "Pool", "Provider", "Seen",
           "SseEvents", "StatusError", "batch_results", "batches", "coarse_readings_dropped",
           "describe", "fine_dimensions", "json_body", "provider", "went_out"]

# The names of Anthropic's module, imported (with its SDK) when first asked for.
_ANTHROPIC_NAMES = ("ANTHROPIC", "ConnectionFailed", "StatusError", "batch_results", "batches")


def __getattr__(name: str) -> Any:
    if name not in _ANTHROPIC_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}._anthropic")
    for each in _ANTHROPIC_NAMES:  # the next lookups are plain module attributes
        globals()[each] = getattr(module, each)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
