"""Which provider serves a name, each imported on first use.

A provider's module imports its SDK, and an SDK costs a worker start about half a second of
CPU (the openai SDK's types) to a second and a half (anthropic's): a fleet on Anthropic does
not pay for openai, nor one on OpenAI for anthropic (the package's Anthropic names, which the
batcher uses, are imported when first asked for); `drover stats` imports neither, since it
never imports this room (``Services.loop_parts`` does, on a worker).
"""

from __future__ import annotations

import importlib
import sys

from drover.config.providers import PROVIDERS, about
from drover.workers.providers._base import Failure, Provider

__all__ = ["describe", "loaded", "provider"]

_LOADED: dict[str, Provider] = {}


def provider(name: str) -> Provider:
    """The provider called ``name``, its module imported on first use."""
    found = _LOADED.get(name)
    if found is None:
        where = about(name)
        found = _LOADED[name] = getattr(importlib.import_module(where.module), where.attribute)
    return found


def loaded() -> list[Provider]:
    """The providers whose SDK this process has imported: only they can have raised one of
    its errors."""
    return [provider(name) for name, each in PROVIDERS.items() if each.sdk in sys.modules]


def describe(error: BaseException) -> Failure | None:
    """``error`` as a Failure, by the provider whose SDK raised it (None: no provider's)."""
    for each in loaded():
        failure = each.describe(error)
        if failure is not None:
            return failure
    return None
