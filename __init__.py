"""drover: a distributed fan-out runtime for LLM sub-agents on Celery and Redis.

The public API::

    from drover import submit, JobSpec, tool

    handle = submit(JobSpec(subtasks=["...", "..."], tools=["lookup_fact"]))
    result = handle.wait(timeout=600)

A team's own sub-agent code runs the same way: ``@drover.subagent`` on an ``async def
name(item, llm)``, then ``submit(JobSpec(subagent="name", inputs=[...]))``; and anywhere,
``drover.AsyncAnthropic()`` (``Anthropic``, ``AsyncOpenAI``, ``OpenAI``) is the SDK's own
client with every call inside the fleet's limits (docs/own-code.md).

Every exception drover raises for a user descends from ``drover.DroverError`` (the tree is in
``drover/errors.py``); each keeps its standard parent too (``JobNotFound`` is a LookupError).

This file is the repository's root: ``pyproject.toml`` maps the package ``drover`` to it, so
``config/``, ``workers/``, ``orchestrator/`` and ``simulator/`` install as ``drover.config``,
``drover.workers``, ``drover.orchestrator`` and ``drover.simulator`` and nothing else takes a
top-level import name (a project's own ``config/`` never meets ours).

The names are imported on first use (PEP 562), so ``drover --help`` and the CLI's quick
refusals do not pay for importing the SDK and Celery. ``drover.app`` is the Celery app, so
``celery -A drover worker`` finds it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    from drover.errors import (
        AgentError,
        CallFailed,
        Cancelled,
        CostCapReached,
        DroverError,
        JobNotFound,
        JobRefused,
        NeverFits,
        PlanningFailed,
        ResultsStoreError,
        SettingsError,
        Unreachable,
        WaitTimeout,
        WorkerCannotStart,
    )
    from drover.orchestrator.client.estimates import Estimate, estimate
    from drover.orchestrator.client.jobs import JobHandle, submit
    from drover.orchestrator.client.limited import Anthropic, AsyncAnthropic, AsyncOpenAI, OpenAI
    from drover.orchestrator.client.planning import plan
    from drover.workers.jobs.records import JobResult, SubagentResult, Usage
    from drover.workers.jobs.spec import JobSpec
    from drover.workers.tools import subagent, tool

    app: Celery

_ERRORS = ("AgentError", "CallFailed", "Cancelled", "CostCapReached", "DroverError",
           "JobNotFound", "JobRefused",
           "NeverFits", "PlanningFailed", "ResultsStoreError", "SettingsError", "Unreachable",
           "WaitTimeout", "WorkerCannotStart")

__all__ = ["AgentError", "Anthropic", "AsyncAnthropic", "AsyncOpenAI", "CallFailed", "Cancelled",
           "CostCapReached", "DroverError", "Estimate", "JobHandle", "JobNotFound", "JobRefused",
           "JobResult", "JobSpec", "NeverFits", "OpenAI", "PlanningFailed", "ResultsStoreError",
           "SettingsError",
           "SubagentResult", "Unreachable", "Usage", "WaitTimeout", "WorkerCannotStart", "app",
           "estimate", "plan", "subagent", "submit", "tool"]

_WHERE = {"JobHandle": "drover.orchestrator.client.jobs",
          "estimate": "drover.orchestrator.client.estimates",
          "Estimate": "drover.orchestrator.client.estimates",
          "submit": "drover.orchestrator.client.jobs",
          "plan": "drover.orchestrator.client.planning",
          "JobResult": "drover.workers.jobs.records",
          "SubagentResult": "drover.workers.jobs.records", "Usage": "drover.workers.jobs.records",
          "JobSpec": "drover.workers.jobs.spec", "tool": "drover.workers.tools",
          "subagent": "drover.workers.tools",
          "app": "drover.workers.app",
          # The SDKs' clients inside the fleet's limits (docs/own-code.md).
          **dict.fromkeys(("AsyncAnthropic", "Anthropic", "AsyncOpenAI", "OpenAI"),
                          "drover.orchestrator.client.limited"),
          # The exception tree (drover/errors.py) imports nothing, so it costs nothing.
          **dict.fromkeys(_ERRORS, "drover.errors")}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'drover' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
