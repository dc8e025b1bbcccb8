"""The agent: one sub-agent's loop, the LLM call, retry policy, estimates, planning, the join.

Depends on ``drover.workers.limiter``, ``drover.workers.jobs`` and ``drover.workers.tools``;
knows no Celery.
"""

from drover.workers.agent.batch import Batcher, Parked, batch_message, uses_batch
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
