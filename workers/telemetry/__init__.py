"""Prometheus metrics and OpenTelemetry traces of the fleet.

The call path wears the hooks (``llm_call``, ``acquire_wait``, ``tool_call``, ``subagent_run``,
``subagent_finished``, ``job_submitted``, ``worker_started``); each process adds its counts to
Redis (``_recorder``) and ``drover metrics`` (``drover.orchestrator.ops.metrics``) reads them back
through ``TelemetryReader`` (``_reader``), serving them with the state the limiter and the job
store keep there. ``METRICS`` lists every series.
"""

from drover.workers.telemetry._hooks import (
    acquire_wait,
    call_cost,
    client_call,
    held_back,
    job_submitted,
    llm_call,
    stream_timing,
    subagent_finished,
    subagent_run,
    tenant_of,
    tool_call,
    unanswered_try,
    with_trace_context,
    worker_started,
)
from drover.workers.telemetry._metrics import (
    CALL_OUTCOMES,
    DIMENSIONS,
    METRICS,
    SUBAGENT_STATUSES,
    TOKEN_TYPES,
    Metric,
    metric,
)
from drover.workers.telemetry._reader import ActiveJob, TelemetryReader
from drover.workers.telemetry._recorder import Recorder, get_recorder, register_job, use_recorder
from drover.workers.telemetry._tracing import content_capture, enabled, ensure_tracing, tracer

__all__ = ["CALL_OUTCOMES", "DIMENSIONS", "METRICS", "SUBAGENT_STATUSES", "TOKEN_TYPES",
           "ActiveJob", "Metric", "Recorder", "TelemetryReader", "acquire_wait", "call_cost",
           "client_call",
           "content_capture", "enabled", "ensure_tracing", "get_recorder", "held_back",
           "job_submitted",
           "llm_call", "metric", "register_job", "stream_timing", "subagent_finished",
           "subagent_run",
           "tenant_of", "tool_call", "tracer", "unanswered_try", "use_recorder",
           "with_trace_context",
           "worker_started"]
