"""The agent: one sub-agent's loop, the LLM call, retry policy, estimates, planning, the join.

Depends on ``drover.workers.limiter``, ``drover.workers.jobs`` and ``drover.workers.tools``;
knows no Celery.

The names below are imported when first used (PEP 562): most of them need the anthropic SDK,
which takes a second or more to import, and the processes that only read settings or
counters (``drover stats``, ``drover jobs``, the exporter) import a light module of this
package (``limits``, ``caching``) and must not pay for the SDK.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drover.workers.agent.batch import Batcher, Parked, batch_message
    from drover.workers.agent.delivery import uses_batch
    from drover.workers.agent.errors import (
        AgentError,
        CallFailed,
        Cancelled,
        LimiterSaysLater,
        RetryableFailure,
        RetryLater,
    )
    from drover.workers.agent.join import Incomplete, join
    from drover.workers.agent.llm import CallContext, create_message
    from drover.workers.agent.planning import plan_goal, plan_job_goal
    from drover.workers.agent.retry import Decision, classify
    from drover.workers.agent.runtime import Runtime, get_runtime, reset_runtime
    from drover.workers.agent.subagent import SubagentRun

__all__ = ["AgentError", "Batcher", "CallContext", "CallFailed", "Cancelled", "Decision",
           "Incomplete", "LimiterSaysLater", "Parked", "RetryLater", "RetryableFailure",
           "Runtime", "SubagentRun", "batch_message", "classify", "create_message",
           "get_runtime", "join", "plan_goal", "plan_job_goal", "reset_runtime", "uses_batch"]

# name -> the module of this package that defines it
_HOME = {
    "Batcher": "batch", "Parked": "batch", "batch_message": "batch", "uses_batch": "delivery",
    "AgentError": "errors", "CallFailed": "errors", "Cancelled": "errors",
    "LimiterSaysLater": "errors", "RetryableFailure": "errors", "RetryLater": "errors",
    "Incomplete": "join", "join": "join",
    "CallContext": "llm", "create_message": "llm",
    "plan_goal": "planning", "plan_job_goal": "planning",
    "Decision": "retry", "classify": "retry",
    "Runtime": "runtime", "get_runtime": "runtime", "reset_runtime": "runtime",
    "SubagentRun": "subagent",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{home}")
    for other, where in _HOME.items():  # the next lookups are plain module attributes
        if where == home:
            globals()[other] = getattr(module, other)
    return globals()[name]


class _Package(types.ModuleType):
    """The package's ``join`` stays the function when the submodule of that name is
    imported (the import system binds a submodule to its package's attribute of the same
    name), as the eager imports used to leave it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (name in _HOME and isinstance(value, types.ModuleType)
                and value.__name__ == f"{__name__}.{name}"):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
