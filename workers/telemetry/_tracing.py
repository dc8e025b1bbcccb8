"""OpenTelemetry traces: one trace per job, off unless asked for.

On when ``DROVER_TRACING=true``, or when the standard ``OTEL_TRACES_EXPORTER`` (not ``none``)
or an ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` is set; ``OTEL_SDK_DISABLED=true`` wins.
Where the process already has an SDK ``TracerProvider`` (``opentelemetry-instrument``, or the
application's own set-up, or a test's in-memory exporter) drover uses it; otherwise it makes
one that exports with OTLP over HTTP (``OTEL_TRACES_EXPORTER=console`` prints instead).

The tree of a job: ``drover.submit`` -> ``apply_async/drover.run_subagent`` (the publish) ->
``run/drover.run_subagent`` (the task, one per delivery; retries hang under the run that
retried) -> ``invoke_agent drover.subagent`` -> ``chat {model}`` and ``execute_tool {name}``.
The Celery spans and the context in the task message headers come from
``opentelemetry-instrumentation-celery``; the join is published by the worker that finishes
the chord's last header task, so it hangs under that sub-agent's run.

The LLM spans carry the GenAI semantic conventions' attributes (model, token usage, finish
reasons, error type) and never the prompt, the completion or the API key, unless
``DROVER_TRACE_CONTENT=true`` asks for the messages.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from opentelemetry import trace

__all__ = ["content_capture", "enabled", "ensure_tracing", "tracer"]

log = logging.getLogger(__name__)
_lock = threading.Lock()
_done_pid: int | None = None
CONTENT_CHARS = 32_000


def tracer() -> trace.Tracer:
    return trace.get_tracer("drover")


def enabled(settings: Any) -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(getattr(settings, "tracing", False) or exporter
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def content_capture(settings: Any) -> bool:
    return bool(getattr(settings, "trace_content", False))


def ensure_tracing(settings: Any, service: str) -> bool:
    """Set tracing up once per process when it is on; True when it is on."""
    global _done_pid
    if not enabled(settings):
        return False
    if _done_pid == os.getpid():
        return True
    with _lock:
        if _done_pid == os.getpid():
            return True
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.sdk.trace import TracerProvider

        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = _make_provider(service)
            trace.set_tracer_provider(provider)
        instrumentor = CeleryInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
        _done_pid = os.getpid()
        return True


def _make_provider(service: str) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    provider = TracerProvider(resource=resource)
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    exporter: Any
    if kind == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("tracing is on but opentelemetry-exporter-otlp-proto-http is not "
                        "installed; install it, or set OTEL_TRACES_EXPORTER=console")
            return provider
        exporter = OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def content(value: Any) -> str:
    """Messages as a JSON string for a span attribute, cut to a size exporters accept."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= CONTENT_CHARS else text[:CONTENT_CHARS] + "…"
