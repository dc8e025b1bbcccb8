"""OpenTelemetry traces: one job is one tree (submit -> sub-agent tasks -> LLM and tool calls),
its context carried in the Celery task headers; the LLM spans carry the GenAI attributes and
never the prompt or the key unless content capture is asked for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator import JobSpec, submit
from tests.conftest import configure

SYSTEM = "You are a careful researcher; the secret system words are zebra-lantern."


_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch, drover_env: dict[str, str]
          ) -> Iterator[InMemorySpanExporter]:
    """An in-memory exporter on the process's tracer provider, tracing on for this test."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    from workers.telemetry import _tracing

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_drover_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        provider._drover_test_exporter = True  # type: ignore[attr-defined]
    configure(monkeypatch, drover_env, DROVER_TRACING="true")
    yield _EXPORTER
    _EXPORTER.clear()
    CeleryInstrumentor().uninstrument()
    _tracing._done_pid = None  # the next test that turns tracing on instruments Celery again


def _job_spans(exporter: InMemorySpanExporter, job_id: str) -> list:
    finished = exporter.get_finished_spans()
    (root,) = [s for s in finished if s.name == "drover.submit"
               and s.attributes.get("drover.job_id") == job_id]
    return [s for s in finished if s.context.trace_id == root.context.trace_id]


def _run(worker, **spec):  # noqa: ANN001, ANN003, ANN202
    worker(concurrency=4)
    subtasks = ["Research the history of tea clippers", "Research the Suez canal tolls",
                "Research lighthouse lenses [[sim:429:1]]"]
    handle = submit(JobSpec(subtasks=subtasks, system=SYSTEM, tools=["lookup_fact"],
                            max_tokens=200, **spec))
    result = handle.wait(timeout=90)
    assert result.counts["ok"] == 3
    return handle, subtasks


def test_one_job_is_one_tree_with_genai_attributes_and_no_prompt_text(spans, worker, sim,
                                                                      drover_env):
    handle, subtasks = _run(worker)
    job = _job_spans(spans, handle.id)
    by_id = {s.context.span_id: s for s in job}

    roots = [s for s in job if s.parent is None]
    assert [r.name for r in roots] == ["drover.submit"]
    for s in job:  # every other span hangs under one that belongs to the same trace
        assert s.parent is None or s.parent.span_id in by_id, s.name

    def ancestors(span) -> list[str]:  # noqa: ANN001
        names = []
        while span.parent is not None:
            span = by_id[span.parent.span_id]
            names.append(span.name)
        return names

    names = [s.name for s in job]
    assert names.count("apply_async/drover.run_subagent") >= 3  # the chord's header (+ retry)
    assert "run/drover.join_results" in names
    agents = [s for s in job if s.name == "invoke_agent drover.subagent"]
    assert {a.attributes["drover.subagent.index"] for a in agents} == {0, 1, 2}
    for a in agents:
        assert ancestors(a)[0] == "run/drover.run_subagent"
        assert ancestors(a)[-1] == "drover.submit"

    chats = [s for s in job if s.name.startswith("chat ")]
    provider = sim.stats()
    assert len(chats) == provider["accepted"] + provider["rejected_429"]
    ok = [c for c in chats if c.attributes["drover.outcome"] == "ok"]
    assert len(ok) == provider["accepted"]
    for c in ok:
        a = c.attributes
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.request.model"] == a["gen_ai.response.model"]
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.response.finish_reasons"][0] in ("end_turn", "tool_use")
        assert "invoke_agent drover.subagent" in ancestors(c)
    assert sum(c.attributes["gen_ai.usage.output_tokens"] for c in ok) == \
        provider["output_tokens"]
    (limited,) = [c for c in chats if c.attributes["drover.outcome"] == "429"]
    assert limited.attributes["error.type"] == "rate_limit_error"
    assert not limited.status.is_ok

    tools = [s for s in job if s.name == "execute_tool lookup_fact"]
    assert tools, "the simulator asks for a tool call in the first turn"
    for t in tools:
        assert t.attributes["gen_ai.tool.name"] == "lookup_fact"
        assert "invoke_agent drover.subagent" in ancestors(t)

    secrets = [*subtasks, "zebra-lantern", "tea clippers", drover_env["ANTHROPIC_API_KEY"]]
    for s in job:
        text = repr(dict(s.attributes)) + repr([e.attributes for e in s.events]) + s.name
        for secret in secrets:
            assert secret not in text, f"{secret!r} in span {s.name}"


def test_content_capture_puts_the_messages_on_llm_spans_when_asked(spans, worker, sim,
                                                                   monkeypatch, drover_env):
    configure(monkeypatch, drover_env, DROVER_TRACE_CONTENT="true")
    handle, _ = _run(worker)
    chats = [s for s in _job_spans(spans, handle.id) if s.name.startswith("chat ")
             and s.attributes["drover.outcome"] == "ok"]
    assert chats
    assert any("tea clippers" in c.attributes["gen_ai.input.messages"] for c in chats)
    assert all("zebra-lantern" in c.attributes["gen_ai.system_instructions"] for c in chats)
    assert all(c.attributes["gen_ai.output.messages"] for c in chats)
