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

from drover import JobSpec, submit
from tests.helpers import configure

SYSTEM = "You are a careful researcher; the secret system words are zebra-lantern."


_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch, drover_env: dict[str, str]
          ) -> Iterator[InMemorySpanExporter]:
    """An in-memory exporter on the process's tracer provider, tracing on for this test."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    from drover.workers.telemetry import _tracing

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
        assert a["drover.cost_usd"] > 0  # the call's dollars at the model's list price
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


class _OtlpReceiver:
    """A minimal OTLP/HTTP trace receiver: what a collector would get from the workers."""

    def __init__(self) -> None:
        import http.server
        import threading

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                import gzip

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        receiver.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_the_trace_crosses_real_prefork_worker_processes_over_otlp(spans, spawn_worker, sim,
                                                                    drover_env):
    from drover.config import get_settings
    from tests.helpers import wait_until

    chat = f"chat {get_settings().model}"
    receiver = _OtlpReceiver()
    try:
        # The worker exports through the real OTLP/HTTP exporter; tracing is on because an
        # endpoint is set (no drover setting); prefork children set it up after the fork.
        spawn_worker(concurrency=2, pool="prefork", DROVER_TRACING="false",
                     OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="100",
                     OTEL_SERVICE_NAME="drover-worker-test")
        handle = submit(JobSpec(subtasks=["Research tide tables", "Research kelp forests"],
                                max_tokens=100))
        assert handle.wait(timeout=90).counts["ok"] == 2
        (root,) = [s for s in spans.get_finished_spans() if s.name == "drover.submit"
                   and s.attributes.get("drover.job_id") == handle.id]
        trace_id = root.context.trace_id.to_bytes(16, "big")
        published = {s.context.span_id.to_bytes(8, "big") for s in spans.get_finished_spans()
                     if s.context.trace_id == root.context.trace_id
                     and s.name == "apply_async/drover.run_subagent"}
        assert len(published) == 2

        def theirs() -> list:
            got = [s for s in receiver.spans if s.trace_id == trace_id]
            names = [s.name for s in got]
            # Each span is exported by its own process's batch: a run span ends (and is sent)
            # after its chat span, from whichever prefork child ran it, so wait for both runs.
            done = names.count(chat) >= 2 and names.count("run/drover.run_subagent") >= 2 \
                and "run/drover.join_results" in names
            return got if done else []

        remote = wait_until("the workers' spans to reach the OTLP receiver", theirs, timeout=30)
        runs = [s for s in remote if s.name == "run/drover.run_subagent"]
        assert {s.parent_span_id for s in runs} == published  # parented across the broker
        remote_ids = {s.span_id for s in remote} | published
        for s in remote:
            assert s.parent_span_id in remote_ids, s.name
    finally:
        receiver.close()


def test_an_openai_call_is_named_openai_in_its_span(spans, worker, monkeypatch, drover_env,
                                                    sim_factory):
    # The GenAI attributes name the API that served the call (every call was "anthropic").
    from tests.helpers.openai import on_openai

    on_openai(monkeypatch, drover_env, sim_factory, tool_turns=0)
    worker(concurrency=2)
    handle = submit(JobSpec(subtasks=["Say hello"], max_tokens=100))
    assert handle.wait(timeout=60).counts["ok"] == 1
    chats = [s for s in _job_spans(spans, handle.id) if s.name.startswith("chat ")]
    assert chats and {c.attributes["gen_ai.provider.name"] for c in chats} == {"openai"}
