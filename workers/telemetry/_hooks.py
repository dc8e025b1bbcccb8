"""The hooks the call path wears: one decorator (or one call) per place, each counting into
this process's recorder and opening the span of that step.

They are decorators so that the code they measure reads as before: ``create_message``,
``acquire``, a tool's ``_invoke``, a sub-agent's ``run`` and ``_finish``, ``submit``.
Nothing here raises into the call path: a metric or span that cannot be made is skipped.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from drover.workers.telemetry import _tracing
from drover.workers.telemetry._recorder import get_recorder

if TYPE_CHECKING:  # an answer's usage is drover's own (the providers room's answers)
    from drover.workers.providers import AnswerUsage

__all__ = ["acquire_wait", "client_call", "job_submitted", "llm_call", "subagent_finished",
           "subagent_run", "tool_call", "with_trace_context", "worker_started"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_AsyncFn = Callable[..., Coroutine[Any, Any, T]]  # an async def (a coroutine function)
# How long the current LLM call waited for the limiter (set by acquire_wait, read by llm_call:
# both run in the same task, so they share the context).
_WAITED: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "drover_waited", default=None)
# The current LLM call's stream timing (time to first token, output tokens a second), told by
# the call (``stream_timing``) in the same task and read by llm_call.
_TIMING: contextvars.ContextVar[list[tuple[float | None, float | None]] | None] = (
    contextvars.ContextVar("drover_stream_timing", default=None))
# The current LLM call's try that went out and was never answered (its input and output
# estimates), told by the call path (``unanswered_try``) wherever it settles it (the limited
# transport the loop sends through, a stream closed by a cancel) and read by llm_call when the
# exception that ends the call does not carry it (a cancel: ``llm.race`` raises a new one).
_LOST: contextvars.ContextVar[list[tuple[int, int]] | None] = contextvars.ContextVar(
    "drover_unanswered", default=None)
_OUTCOMES = {"n429": "429", "n529": "529", "n5xx": "5xx", "n4xx": "4xx", "nconn": "connection"}


def _settings() -> Any:
    from drover.config import get_settings

    return get_settings()


def _safe(what: str, fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception as error:  # a metric must never break the call it measures
        log.debug("telemetry: %s skipped (%s: %s)", what, type(error).__name__, error)
        return None


# --- the LLM call ------------------------------------------------------------------------

def held_back(scope: str) -> None:
    """A granted call that a cooldown emptied while it waited for its send: it acquires again
    (so a scope's acquires are its sends plus these)."""
    _safe("held back", lambda: get_recorder().inc("drover_limiter_deferrals",
                                                   (scope, "held_back")))


def acquire_wait(fn: _AsyncFn[T]) -> _AsyncFn[T]:
    """For ``acquire(rt, scope, limits, ctx, ...)``: the wait until the grant may be sent."""

    @functools.wraps(fn)
    async def wrapper(rt: Any, scope: str, *args: Any, **kwargs: Any) -> T:
        started = time.monotonic()
        try:
            grant = await fn(rt, scope, *args, **kwargs)
        except Exception as error:
            reason = getattr(error, "reason", None)
            if reason is not None and getattr(error, "countdown", None) is not None:
                kind = str(reason).removeprefix("limiter: ")
                _safe("deferral", lambda: get_recorder().inc(
                    "drover_limiter_deferrals", (scope, kind)))
            raise
        waited = time.monotonic() - started + float(getattr(grant, "wait_s", 0.0) or 0.0)
        box = _WAITED.get()
        if box is not None:
            box.append(waited)
        _safe("wait", lambda: get_recorder().observe(
            "drover_limiter_acquire_wait_seconds", (scope,), waited))
        return grant

    return wrapper


def stream_timing(first_token_s: float | None, output_per_s: float | None) -> None:
    """The current call's stream: seconds from the send to its first token, and output tokens
    a second after that (None: not known); counted with the call by ``llm_call``."""
    box = _TIMING.get()
    if box is not None:
        box.append((first_token_s, output_per_s))


def unanswered_try(est_in: int, est_out: int) -> None:
    """The current call's try went out and was never answered: what it cost (``llm_call``)."""
    box = _LOST.get()
    if box is not None:
        box.append((est_in, est_out))


def llm_call(fn: _AsyncFn[T]) -> _AsyncFn[T]:
    """For ``create_message(rt, params, ctx, **kw)``: the chat span, call outcome, duration,
    tokens."""

    @functools.wraps(fn)
    async def wrapper(rt: Any, params: dict[str, Any], ctx: Any, **kw: Any) -> T:
        settings = rt.settings
        model = str(params.get("model"))
        route = rt.route(model)
        scope = route.scope
        provider = route.provider.name  # the API that serves the model: its series and spans
        waited: list[float] = []
        token = _WAITED.set(waited)
        timing: list[tuple[float | None, float | None]] = []
        timing_token = _TIMING.set(timing)
        tries_lost: list[tuple[int, int]] = []
        lost_token = _LOST.set(tries_lost)
        started = time.monotonic()
        with _tracing.tracer().start_as_current_span(
                f"chat {model}", kind=SpanKind.CLIENT, record_exception=False,
                set_status_on_exception=False) as span:
            if span.is_recording():
                _safe("span", lambda: _request_attributes(span, provider, settings, scope, params,
                                                          ctx))
            outcome, error_type, lost = "ok", "", None
            message: Any = None  # the provider's message (an SDK's type, or OpenAI's adapted)
            try:
                message = await fn(rt, params, ctx, **kw)
                return message
            except BaseException as error:
                # The agent's exceptions say what they mean for the count (this room knows
                # no agent): ``call_outcome`` and the retry policy's ``decision``.
                kind = getattr(error, "call_outcome", None)
                decision = getattr(error, "decision", None)
                if kind == "cancelled":
                    outcome, error_type = "cancelled", "cancelled"
                elif kind == "not_sent":  # refused before sending (it could never fit)
                    outcome = ""
                elif decision is not None:
                    outcome = _OUTCOMES.get(decision.counter, "4xx")
                    error_type = decision.error_type
                elif kind == "deferred":  # the limiter wanted a later start: no call made
                    outcome = ""
                    span.set_attribute("drover.deferred", str(getattr(error, "reason", "")))
                elif isinstance(error, asyncio.CancelledError):  # the worker shut down
                    outcome, error_type = "cancelled", "CancelledError"
                else:  # a bug or a broken deployment: the sub-agent records it as failed
                    outcome, error_type = "error", type(error).__name__
                lost = getattr(error, "unanswered", None) or (
                    tries_lost[-1] if tries_lost else None)
                raise
            finally:
                _WAITED.reset(token)
                _TIMING.reset(timing_token)
                _LOST.reset(lost_token)
                if timing:
                    _safe("stream timing", lambda: _record_timing(provider, model, timing[-1]))
                    if span.is_recording():
                        _safe("span", lambda: _timing_attributes(span, timing[-1]))
                if lost is not None:  # sent, never answered: billed at its estimate
                    outcome = "unanswered"
                    _safe("unanswered", lambda: _record_unanswered(provider, model, lost))
                if (message is not None or lost is not None) and span.is_recording():
                    # (drover_cost_usd is counted by the call path, for every door: call.py)
                    usd = _safe("cost", lambda: price_usd(
                        settings, model, message.usage if message is not None else None, lost))
                    if usd is not None:
                        span.set_attribute("drover.cost_usd", round(usd, 8))
                if outcome:
                    if getattr(ctx, "key", None):  # a pool: the series of the key it went to
                        scope = route.key_scope(ctx.key)
                    duration = max(0.0, time.monotonic() - started - sum(waited))
                    _safe("llm call", lambda: _record_call(
                        provider, scope, model, outcome, error_type, duration, message))
                    if span.is_recording():
                        _safe("span", lambda: _response_attributes(
                            span, settings, outcome, error_type, message, sum(waited)))

    return wrapper


def _request_attributes(span: Any, provider: str, settings: Any, scope: str,
                        params: dict[str, Any], ctx: Any) -> None:
    span.set_attributes({
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
        "gen_ai.request.model": str(params.get("model")),
        "gen_ai.request.max_tokens": int(params.get("max_tokens") or 0),
        "drover.scope": scope, "drover.job_id": str(getattr(ctx, "job_id", "")),
        "drover.subagent.index": int(getattr(ctx, "index", -1)),
    })
    if _tracing.content_capture(settings):
        span.set_attribute("gen_ai.input.messages", _tracing.content(params.get("messages")))
        if params.get("system"):
            span.set_attribute("gen_ai.system_instructions", _tracing.content(params["system"]))


def _response_attributes(span: Any, settings: Any, outcome: str, error_type: str,
                         message: Any, waited: float) -> None:
    span.set_attribute("drover.limiter.wait_s", round(waited, 6))
    span.set_attribute("drover.outcome", outcome)
    if outcome != "ok":
        span.set_attribute("error.type", error_type or outcome)
        span.set_status(Status(StatusCode.ERROR, error_type or outcome))
        return
    usage = message.usage
    span.set_attributes({
        "gen_ai.response.model": str(getattr(message, "model", "") or ""),
        "gen_ai.response.id": str(getattr(message, "id", "") or ""),
        "gen_ai.response.finish_reasons": [str(message.stop_reason or "")],
        "gen_ai.usage.input_tokens": int(usage.input_tokens or 0),
        "gen_ai.usage.output_tokens": int(usage.output_tokens or 0),
        "gen_ai.usage.cache_read.input_tokens": int(
            getattr(usage, "cache_read_input_tokens", 0) or 0),
        "gen_ai.usage.cache_creation.input_tokens": int(
            getattr(usage, "cache_creation_input_tokens", 0) or 0),
    })
    if _tracing.content_capture(settings):
        span.set_attribute("gen_ai.output.messages", _tracing.content(
            message.content_json()))


def client_call(provider: str, scope: str, model: str, outcome: str, error_type: str,
                duration_s: float, usage: Any = None) -> None:
    """One attempt of a limited SDK client (``drover.AsyncAnthropic`` and kin) ended: counted
    in the same series as a worker's calls (``llm_call``). ``outcome``: "ok", "cancelled",
    "unanswered", or a failed call's counter (n429, n529, ...); ``usage``: the answer's."""
    message = SimpleNamespace(usage=usage) if usage is not None else None
    _safe("llm call", lambda: _record_call(provider, scope, model,
                                           _OUTCOMES.get(outcome, outcome), error_type,
                                           duration_s, message))


def _record_call(provider: str, scope: str, model: str, outcome: str, error_type: str,
                 duration: float, message: Any) -> None:
    rec = get_recorder()
    rec.inc("drover_llm_calls", (scope, outcome))
    genai = ("chat", provider, model)
    rec.observe("drover_gen_ai_client_operation_duration_seconds",
                (*genai, "" if outcome == "ok" else error_type or outcome), duration)
    if message is None:
        return
    usage = message.usage
    for kind, value in (("input", usage.input_tokens),
                        ("output", usage.output_tokens),
                        ("cache_read", getattr(usage, "cache_read_input_tokens", 0)),
                        ("cache_write", getattr(usage, "cache_creation_input_tokens", 0))):
        rec.inc("drover_gen_ai_client_token_usage", (*genai, kind), float(value or 0))


def _record_timing(provider: str, model: str, timing: tuple[float | None, float | None]) -> None:
    rec = get_recorder()
    genai = ("chat", provider, model)
    first, per_s = timing
    if first is not None:
        rec.observe("drover_gen_ai_server_time_to_first_token_seconds", genai, first)
    if per_s:
        rec.observe("drover_gen_ai_server_time_per_output_token_seconds", genai, 1.0 / per_s)


def _timing_attributes(span: Any, timing: tuple[float | None, float | None]) -> None:
    first, per_s = timing
    if first is not None:
        span.set_attribute("gen_ai.server.time_to_first_token", round(first, 6))
    if per_s:
        span.set_attribute("gen_ai.server.time_per_output_token", round(1.0 / per_s, 6))
        span.set_attribute("drover.output_tokens_per_s", round(per_s, 2))


def price_usd(settings: Any, model: str, usage: AnswerUsage | None,
              lost: tuple[int, int] | None = None,
              *, batch: bool = False) -> float | None:
    """One call's dollars: an answer's ``usage``, or the (input, output) a call sent and never
    answered is counted at; None when the model has no price."""
    price = settings.price_of(model)
    if price is None:
        return None
    if usage is not None:
        return float(price.cost(int(usage.input_tokens or 0), int(usage.output_tokens or 0),
                                int(getattr(usage, "cache_creation_input_tokens", 0) or 0),
                                int(getattr(usage, "cache_read_input_tokens", 0) or 0),
                                batch=batch))
    return float(price.cost(*(lost or (0, 0))))


def call_cost(settings: Any, model: str, tenant: str | None, usage: AnswerUsage | None,
              lost: tuple[int, int] | None = None, *, batch: bool = False) -> float | None:
    """Count one call's dollars in ``drover_cost_usd`` (model, tenant) and return them (see
    ``price_usd``); a model without a price counts in ``drover_unpriced_calls`` instead. Never
    raises: a metric must not fail the call it counts."""
    def count() -> float | None:
        usd = price_usd(settings, model, usage, lost, batch=batch)
        rec = get_recorder()
        if usd is None:
            rec.inc("drover_unpriced_calls", (model,))
        else:
            rec.inc("drover_cost_usd", (model, tenant or "default"), usd)
        return usd

    return _safe("cost", count)


def _record_unanswered(provider: str, model: str, lost: tuple[int, int]) -> None:
    rec = get_recorder()
    genai = ("chat", provider, model)
    rec.inc("drover_gen_ai_client_token_usage", (*genai, "unanswered_input"), float(lost[0]))
    rec.inc("drover_gen_ai_client_token_usage", (*genai, "unanswered_output"), float(lost[1]))


# --- tools, sub-agents, jobs -------------------------------------------------------------

def tool_call(fn: _AsyncFn[dict[str, Any]]) -> _AsyncFn[dict[str, Any]]:
    """For a tool's ``_invoke(tool_, call, default_timeout)``: its span, outcome and duration."""

    @functools.wraps(fn)
    async def wrapper(tool_: Any, call: dict[str, Any], *args: Any, **kwargs: Any
                      ) -> dict[str, Any]:
        started = time.monotonic()
        with _tracing.tracer().start_as_current_span(
                f"execute_tool {tool_.name}", kind=SpanKind.INTERNAL) as span:
            if span.is_recording():
                span.set_attributes({"gen_ai.operation.name": "execute_tool",
                                     "gen_ai.tool.name": tool_.name,
                                     "gen_ai.tool.call.id": str(call.get("id", "")),
                                     "gen_ai.tool.type": "function"})
                if _tracing.content_capture(_settings()):
                    span.set_attribute("gen_ai.tool.call.arguments",
                                       _tracing.content(call.get("input")))
            result = await fn(tool_, call, *args, **kwargs)
            outcome = "error" if result.get("is_error") else "ok"
            if span.is_recording() and outcome == "error":
                span.set_attribute("error.type", "tool_error")
                span.set_status(Status(StatusCode.ERROR, "tool_error"))
        duration = time.monotonic() - started

        def record() -> None:
            rec = get_recorder()
            rec.inc("drover_tool_calls", (tool_.name, outcome))
            rec.observe("drover_tool_call_duration_seconds", (tool_.name,), duration)

        _safe("tool call", record)
        return result

    return wrapper


def subagent_run(fn: _AsyncFn[T]) -> _AsyncFn[T]:
    """For ``SubagentRun.run(self)``: the sub-agent's span, and it counts as running here."""

    @functools.wraps(fn)
    async def wrapper(self: Any) -> T:
        job_id, index = str(self.job_id), int(self.index)
        _safe("running", lambda: get_recorder().running(job_id, +1))
        try:
            with _tracing.tracer().start_as_current_span(
                    "invoke_agent drover.subagent", kind=SpanKind.INTERNAL) as span:
                span.set_attributes({"gen_ai.operation.name": "invoke_agent",
                                     "gen_ai.agent.name": "drover.subagent",
                                     "drover.job_id": job_id, "drover.subagent.index": index})
                result = await fn(self)
                span.set_attribute("drover.subagent.status", str(getattr(result, "status", "")))
                return result
        finally:
            _safe("running", lambda: get_recorder().running(job_id, -1))

    return wrapper


def subagent_finished(fn: _AsyncFn[T]) -> _AsyncFn[T]:
    """For ``SubagentRun._finish(self, state, status, ...)``: one finished sub-agent."""

    @functools.wraps(fn)
    async def wrapper(self: Any, state: Any, status: str, *args: Any, **kwargs: Any) -> T:
        result = await fn(self, state, status, *args, **kwargs)
        _safe("finished", lambda: get_recorder().inc(
            "drover_subagents_finished", (str(getattr(result, "status", status)),)))
        return result

    return wrapper


def tenant_of(spec: Any) -> str:
    """A job's tenant: ``JobSpec.tenant`` where the spec has one, else metadata["tenant"]."""
    if isinstance(spec, dict):
        value = spec.get("tenant") or (spec.get("metadata") or {}).get("tenant")
    else:
        value = getattr(spec, "tenant", None) or (getattr(spec, "metadata", None) or {}).get(
            "tenant")
    return str(value or "default")


def job_submitted(fn: Callable[..., T]) -> Callable[..., T]:
    """For ``submit(spec, *, settings=None)``: the job's root span; the job is active."""

    @functools.wraps(fn)
    def wrapper(spec: Any, *args: Any, **kwargs: Any) -> T:
        settings = kwargs.get("settings") or _settings()
        _tracing.ensure_tracing(settings, "drover")
        with _tracing.tracer().start_as_current_span("drover.submit",
                                                     kind=SpanKind.PRODUCER) as span:
            handle = fn(spec, *args, **kwargs)
            job_id = str(getattr(handle, "id", ""))
            span.set_attribute("drover.job_id", job_id)
        _safe("submit", lambda: _job_active(settings, job_id, tenant_of(spec), handle))
        return handle

    return wrapper


def _job_active(settings: Any, job_id: str, tenant: str, handle: Any) -> None:
    from drover.workers.telemetry._recorder import register_job

    register_job(handle.store.r, settings.key_prefix, job_id, tenant, settings.result_ttl_s)
    get_recorder().inc("drover_jobs_submitted", (tenant,))


# --- the worker process ------------------------------------------------------------------

def worker_started(sender: Any = None) -> None:
    """From the worker's start signals: tracing on if asked, the heartbeat named."""
    settings = _settings()
    _tracing.ensure_tracing(settings, "drover-worker")
    node = getattr(sender, "hostname", None)
    rec = get_recorder()
    if node:
        rec.worker_ready(str(node))


def with_trace_context(coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """``coro`` carrying the caller's trace context onto the loop it is handed to.

    The worker runs each sub-agent on its runtime's event loop, in another thread: without
    this, the task's span (opened in Celery's thread) would not be the sub-agent's parent.
    """
    span = trace.get_current_span()
    if not span.get_span_context().is_valid:
        return coro
    ctx = otel_context.get_current()

    async def carried() -> T:
        token = otel_context.attach(ctx)
        try:
            return await coro
        finally:
            otel_context.detach(token)

    return carried()
