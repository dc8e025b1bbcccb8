"""The agent: one sub-agent's loop, the LLM call, retry policy, estimates, planning, the join.

Depends on ``workers.limiter``, ``workers.jobs`` and ``workers.tools``; knows no Celery.
"""

from workers.agent.batch import Batcher, Parked, batch_message, uses_batch
from workers.agent.errors import (
    AgentError,
    CallFailed,
    Cancelled,
    LimiterSaysLater,
    RetryableFailure,
    RetryLater,
)
from workers.agent.join import Incomplete, join
from workers.agent.llm import CallContext, create_message
from workers.agent.planning import plan_goal, plan_job_goal
from workers.agent.retry import Decision, classify
from workers.agent.runtime import Runtime, get_runtime, reset_runtime
from workers.agent.subagent import SubagentRun

__all__ = ["AgentError", "Batcher", "CallContext", "CallFailed", "Cancelled", "Decision",
           "Incomplete", "LimiterSaysLater", "Parked", "RetryLater", "RetryableFailure",
           "Runtime", "SubagentRun", "batch_message", "classify", "create_message",
           "get_runtime", "join", "plan_goal", "plan_job_goal", "reset_runtime", "uses_batch"]
