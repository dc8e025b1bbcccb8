"""``drover.AsyncAnthropic``, ``drover.Anthropic``, ``drover.AsyncOpenAI``, ``drover.OpenAI``:
the provider SDKs' own clients inside the fleet's global limits, for any process (a notebook,
a web app, a script, a Celery task of a team's own).

This module is their root in such a process: importing it registers how their HTTP clients
are made (``providers.limited``), on the process's parts for its ``DROVER_*`` settings
(``submitter_services``: one Redis client and limiter per process) and its agent runtime (the
event loop the call path runs on). The classes themselves are the providers' room's; each
is imported on first use, so a process on Anthropic never imports openai.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drover.config import get_settings
from drover.orchestrator.client.jobs import submitter_services
from drover.workers.agent.runtime import get_runtime
from drover.workers.clients import limited_http_client
from drover.workers.providers.clients import client_defaults
from drover.workers.providers.limited import limit_clients_with

if TYPE_CHECKING:
    from drover.workers.providers.anthropic_clients import Anthropic, AsyncAnthropic
    from drover.workers.providers.openai_clients import AsyncOpenAI, OpenAI

__all__ = ["Anthropic", "AsyncAnthropic", "AsyncOpenAI", "OpenAI"]

_WHERE = {"AsyncAnthropic": "anthropic_clients", "Anthropic": "anthropic_clients",
          "AsyncOpenAI": "openai_clients", "OpenAI": "openai_clients"}


def _make(provider_name: str, is_async: bool) -> tuple[Any, dict[str, Any]]:
    settings = get_settings()
    rt = get_runtime(submitter_services(settings))
    return (limited_http_client(rt, provider_name, is_async=is_async),
            client_defaults(settings, provider_name))


limit_clients_with(_make)


def __getattr__(name: str) -> Any:
    home = _WHERE.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"drover.workers.providers.{home}"), name)
    globals()[name] = value
    return value
