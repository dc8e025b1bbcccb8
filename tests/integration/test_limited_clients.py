"""drover's limited SDK clients (``drover.AsyncAnthropic`` and kin, issue 50): the SDKs' own
clients whose every HTTP attempt reserves from the fleet's limiter and settles with the
answer's usage. The real SDKs over HTTP to the simulator, the limiter in the real Redis."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from drover.workers.limiter import llm_scope
from tests.helpers import configure, wait_until
from tests.helpers.openai import MODEL as OPENAI_MODEL
from tests.helpers.openai import on_openai


def _limiter_usage(settings) -> dict[str, int]:  # noqa: ANN001
    """What the limiter counted in the last minute on the default model's scope."""
    from drover.workers.services import services

    scope = llm_scope(settings.key_alias, settings.limit_class(settings.model))
    rows = services(settings).limiter.usage(scope, 60)
    return {name: sum(row.get(name, 0) for row in rows)
            for name in ("requests", "input_tokens", "output_tokens")}


def _ask(i: int, words: int = 10) -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join([f"question {i}"] * words)}]


def _fan_out(model: str, n: int) -> list[object]:
    """``n`` calls at once through one ``drover.AsyncAnthropic``, on a loop of this test's
    own (a notebook's or a web app's, not drover's): answers or exceptions."""
    import drover

    async def fan_out() -> list[object]:
        llm = drover.AsyncAnthropic()
        return await asyncio.gather(*(llm.messages.create(
            model=model, max_tokens=40, messages=_ask(i)) for i in range(n)),
            return_exceptions=True)

    return asyncio.run(fan_out())


def test_many_calls_at_once_through_one_async_client_wait_in_line_with_no_429(
        monkeypatch, drover_env, sim):
    """30 calls at once into 5 requests a second (a bucket of 5): the plain SDK would send
    them all and see 25 429s; the limited client sends them as the bucket refills."""
    sim.configure(rpm=300, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=300, burst_seconds=1)
    from drover.config import get_settings

    settings = get_settings()

    results = _fan_out(settings.model, 30)
    failed = [r for r in results if isinstance(r, BaseException)]
    stats = sim.stats()
    assert not failed, failed[:2]
    assert stats["rejected_429"] == 0, stats["timeline"]
    assert stats["accepted"] == 30
    counted = _limiter_usage(settings)
    # Every answer settled with its real usage: the limiter counted what the provider billed.
    assert counted == {"requests": 30, "input_tokens": stats["billed"]["input_tokens"],
                       "output_tokens": stats["billed"]["output_tokens"]}


def test_a_streamed_answer_settles_its_real_usage_also_when_its_reader_stops_half_way(
        monkeypatch, drover_env, sim):
    """``messages.stream`` read to its end settles the usage its events said; a stream
    whose reader stops after a few events and closes it settles what had streamed (the
    provider bills the output generated until the connection closed)."""
    sim.configure(tool_turns=0, output_tokens_mean=400, output_tokens_per_s=200)
    configure(monkeypatch, drover_env)
    import drover
    from drover.config import get_settings

    settings = get_settings()

    async def streams() -> tuple[object, int]:
        llm = drover.AsyncAnthropic()
        async with llm.messages.stream(model=settings.model, max_tokens=800,
                                       messages=_ask(1)) as stream:
            whole = await stream.get_final_message()
        read = 0
        async with llm.messages.stream(model=settings.model, max_tokens=800,
                                       messages=_ask(2)) as stream:
            async for _text in stream.text_stream:
                read += 1
                if read == 5:
                    break  # the caller stops reading: leaving the block closes the stream
        return whole, read

    whole, read = asyncio.run(streams())
    assert read == 5 and whole.usage.output_tokens > 100
    stats = sim.stats()
    counted = _limiter_usage(settings)
    assert counted["requests"] == 2
    assert counted["input_tokens"] == stats["billed"]["input_tokens"]
    cut = counted["output_tokens"] - whole.usage.output_tokens
    assert 0 < cut < whole.usage.output_tokens / 2, (counted, whole.usage)
    # What the cut stream cost by the provider's count (the tokens it had sent), within the
    # characters / 4 of what arrived before the close.
    billed_cut = stats["billed"]["output_tokens"] - whole.usage.output_tokens
    assert abs(cut - billed_cut) <= max(10, billed_cut), (cut, billed_cut)


def test_a_paced_streams_headers_pace_the_next_send_on_its_admission(monkeypatch, drover_env,
                                                                       sim):
    """At a key whose bucket holds one request (60 RPM in 1 s bursts), a stream's response
    headers, which come at its admission, are told to the limiter as they arrive: the scope's
    next paced send may go one interval of the provider's (1 s) and 10 ms after them, so no
    earlier than that after the stream's own check (`ar` >= `ls` + 1.01 s: hold_back.lua,
    admitted.lua). A whole answer (not streamed) tells nothing: its headers come at its end;
    the next waits the limiter's interval (the target's, 60 / 57 s) after it left (`ar`)."""
    sim.configure(rpm=60, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=60, burst_seconds=1)
    import drover
    from drover.config import get_settings
    from drover.workers.services import services

    settings = get_settings()
    limiter = services(settings).limiter
    bucket = limiter.keys(llm_scope(settings.key_alias, settings.limit_class(settings.model)))[0]

    async def whole_then_stream() -> dict[bytes, bytes]:
        llm = drover.AsyncAnthropic()
        await llm.messages.create(model=settings.model, max_tokens=40, messages=_ask(1))
        after_whole = limiter._client.hgetall(bucket)
        async with llm.messages.stream(model=settings.model, max_tokens=40,
                                       messages=_ask(2)) as stream:
            await stream.get_final_message()
        return after_whole

    after_whole = asyncio.run(whole_then_stream())
    assert float(after_whole[b"ar"]) == pytest.approx(
        float(after_whole[b"ls"]) + 60e6 / float(after_whole[b"Lr"]), abs=1)
    fields = limiter._client.hgetall(bucket)
    assert float(fields[b"ar"]) >= float(fields[b"ls"]) + 1.01e6
    assert sim.stats()["rejected_429"] == 0


def test_each_retry_of_the_sdk_is_reserved_and_settled(monkeypatch, drover_env, sim):
    """Half the requests answered 429 with retry-after 1 s: the SDK retries them itself
    (max_retries), and each attempt goes through the limiter: it counted every request the
    provider saw, 429s included."""
    sim.configure(tool_turns=0, output_tokens_mean=20, inject_429_rate=0.5,
                  inject_429_retry_after=1)
    configure(monkeypatch, drover_env)
    import drover
    from drover.config import get_settings

    settings = get_settings()

    async def calls() -> list[object]:
        llm = drover.AsyncAnthropic(max_retries=8)
        return await asyncio.gather(*(llm.messages.create(
            model=settings.model, max_tokens=40, messages=_ask(i)) for i in range(8)),
            return_exceptions=True)

    results = asyncio.run(calls())
    assert not [r for r in results if isinstance(r, BaseException)]
    stats = sim.stats()
    assert stats["rejected_429"] > 0 and stats["accepted"] == 8
    assert _limiter_usage(settings)["requests"] == stats["accepted"] + stats["rejected_429"]
    # And in the fleet's series, as a worker's calls are (drover metrics).
    from drover.orchestrator.ops.metrics import DroverCollector
    from drover.workers.services import services
    from tests.helpers.metrics import scrape, value

    services(settings).recorder.flush()
    families = scrape(DroverCollector(services(settings), broker_queues=False))
    scope = llm_scope(settings.key_alias, settings.limit_class(settings.model))
    calls = "drover_llm_calls_total"
    assert value(families, "drover_llm_calls", calls, scope=scope, outcome="ok") == 8
    assert value(families, "drover_llm_calls", calls, scope=scope, outcome="429") == \
        stats["rejected_429"]


def test_the_blocking_client_creates_streams_and_counts_tokens(monkeypatch, drover_env, sim):
    """``drover.Anthropic`` from several threads at a tight limit: no 429, each call
    counted; ``count_tokens`` (an endpoint of its own) passes through uncounted."""
    sim.configure(rpm=240, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=240, burst_seconds=1)
    import drover
    from drover.config import get_settings

    settings = get_settings()
    llm = drover.Anthropic()
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            if i % 2:
                llm.messages.create(model=settings.model, max_tokens=40, messages=_ask(i))
            else:
                with llm.messages.stream(model=settings.model, max_tokens=40,
                                         messages=_ask(i)) as stream:
                    assert stream.get_final_message().usage.output_tokens > 0
        except BaseException as error:  # noqa: BLE001  # reported below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:2]
    counted = llm.messages.count_tokens(model=settings.model, messages=_ask(0))
    assert counted.input_tokens > 0
    stats = sim.stats()
    assert stats["rejected_429"] == 0 and stats["accepted"] == 12
    assert _limiter_usage(settings)["requests"] == 12


def test_the_openai_clients_go_through_the_limiter_on_the_simulators_openai_routes(
        monkeypatch, drover_env, sim_factory):
    """``drover.AsyncOpenAI`` (20 at once into 4 requests a second) and ``drover.OpenAI``:
    no 429, each counted; a stream without a usage chunk is counted from what streamed."""
    sim = on_openai(monkeypatch, drover_env, sim_factory, rpm=240, tpm=10_000_000,
                    burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, burst_seconds=1)
    import drover
    from drover.config import get_settings

    settings = get_settings()

    async def fan_out() -> list[object]:
        llm = drover.AsyncOpenAI()
        return await asyncio.gather(*(llm.chat.completions.create(
            model=OPENAI_MODEL, max_completion_tokens=40, messages=_ask(i))
            for i in range(20)), return_exceptions=True)

    results = asyncio.run(fan_out())
    assert not [r for r in results if isinstance(r, BaseException)], results[:2]
    blocking = drover.OpenAI()
    chunks = list(blocking.chat.completions.create(
        model=OPENAI_MODEL, max_completion_tokens=40, messages=_ask(99), stream=True))
    assert chunks
    stats = sim.stats()
    assert stats["rejected_429"] == 0 and stats["accepted"] == 21
    assert _limiter_usage(settings)["requests"] == 21


@pytest.mark.parametrize("stream", [False, True])
def test_a_subagents_rerun_replays_its_answered_calls_from_the_journal(
        monkeypatch, drover_env, sim, stream):
    """A sub-agent's client keeps each answered call; a re-run (its worker died) making the
    same requests gets the same answers without sending them, and a request that differs is
    sent. Streamed answers are replayed as their stream."""
    sim.configure(tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env)
    from drover.workers.agent.call import CallContext
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.clients import subagent_client
    from drover.workers.services import services

    rt = get_runtime(services())
    usage: list[object] = []

    async def counted(u: object, model: str | None = None) -> None:  # the call's model, too
        usage.append(u)

    async def run(questions: list[int]) -> list[str]:
        ctx = CallContext("journal-job", 3, rt.cancel_event("journal-job"))
        ctx.answered = counted
        llm = subagent_client(rt, ctx)
        answers = []
        for q in questions:
            if stream:
                async with llm.messages.stream(model=rt.settings.model, max_tokens=40,
                                               messages=_ask(q)) as s:
                    message = await s.get_final_message()
            else:
                message = await llm.messages.create(model=rt.settings.model, max_tokens=40,
                                                    messages=_ask(q))
            answers.append(message.content[0].text)
        return answers

    first = rt.run(run([1, 2, 3]))
    assert sim.stats()["accepted"] == 3 and len(usage) == 3
    again = rt.run(run([1, 2, 3]))
    assert again == first
    assert sim.stats()["accepted"] == 3, "a replayed call was sent"
    assert len(usage) == 3, "a replayed call was counted again"
    rt.run(run([1, 2, 4]))  # the third request differs: sent
    assert sim.stats()["accepted"] == 4 and len(usage) == 4


TWIN = """
import asyncio, sys
import drover
from drover.config import get_settings

async def main():
    llm = drover.AsyncAnthropic()
    model = get_settings().model
    answers = await asyncio.gather(*(llm.messages.create(
        model=model, max_tokens=40, messages=[{"role": "user", "content": f"twin {i}"}])
        for i in range(20)))
    print(len(answers))

asyncio.run(main())
"""


def test_two_processes_through_limited_clients_on_one_key_stay_inside_the_limits(
        monkeypatch, drover_env, sim):
    """Another process (a notebook beside this one) fires 20 calls at once while this one
    fires 20: one limiter in Redis lines both up, so the key sees no 429 and no second of
    more than its bucket."""
    import os
    import subprocess
    import sys

    sim.configure(rpm=240, burst_s=1, tool_turns=0, output_tokens_mean=20)
    configure(monkeypatch, drover_env, rpm=240, burst_seconds=1)
    from drover.config import get_settings

    settings = get_settings()
    twin = subprocess.Popen([sys.executable, "-c", TWIN], env={**os.environ, **drover_env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    results = _fan_out(settings.model, 20)
    out, err = twin.communicate(timeout=120)
    assert twin.returncode == 0, err[-2000:]
    assert out.strip() == "20"
    assert not [r for r in results if isinstance(r, BaseException)]
    stats = sim.stats()
    assert stats["accepted"] == 40 and stats["rejected_429"] == 0, stats["timeline"]
    assert _limiter_usage(settings)["requests"] == 40


def test_raw_responses_and_stream_true_are_the_sdks_own_and_counted(monkeypatch, drover_env,
                                                                     sim):
    sim.configure(tool_turns=0, output_tokens_mean=30)
    configure(monkeypatch, drover_env)
    import drover
    from drover.config import get_settings

    settings = get_settings()

    async def calls() -> tuple[object, int]:
        llm = drover.AsyncAnthropic()
        raw = await llm.messages.with_raw_response.create(
            model=settings.model, max_tokens=60, messages=_ask(1))
        assert raw.headers.get("content-type", "").startswith("application/json")
        message = await raw.parse()
        events = await llm.messages.create(model=settings.model, max_tokens=60,
                                           messages=_ask(2), stream=True)
        kinds = [event.type async for event in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        return message, len(kinds)

    message, _ = asyncio.run(calls())
    assert message.usage.output_tokens > 0
    stats = sim.stats()
    assert _limiter_usage(settings) == {"requests": 2,
                                        "input_tokens": stats["billed"]["input_tokens"],
                                        "output_tokens": stats["billed"]["output_tokens"]}


def _cancelled_call(monkeypatch, drover_env, job_id: str,  # noqa: ANN001
                    cancel: Callable[[asyncio.Event], Awaitable[None]] | None
                    ) -> tuple[Any, BaseException, list[tuple[int, int]]]:
    """A sub-agent's call through its limited client (``subagent_client``, 3 retries) whose
    job (``job_id``: a test's own, as the runtime keeps its cancel event) is cancelled:
    before the call (``cancel`` None) or by ``cancel``, awaited beside it with the job's
    cancel event. Returns the runtime, the error the call raised, and the calls counted
    unanswered (their estimates)."""
    configure(monkeypatch, drover_env)
    from drover.workers.agent.call import CallContext
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.clients import subagent_client
    from drover.workers.services import services

    rt = get_runtime(services())
    unanswered: list[tuple[int, int]] = []

    async def lost(est_in: int, est_out: int, model: str | None = None) -> None:
        unanswered.append((est_in, est_out))

    async def run() -> BaseException:
        event = rt.cancel_event(job_id)
        if cancel is None:
            event.set()
        ctx = CallContext(job_id, 0, event, unanswered=lost)
        llm = subagent_client(rt, ctx, max_retries=3)
        canceller = asyncio.ensure_future(cancel(event) if cancel else asyncio.sleep(0))
        try:
            await llm.messages.create(model=rt.settings.model, max_tokens=40,
                                      messages=_ask(1))
        except BaseException as error:  # noqa: BLE001  # the test reads it
            return error
        finally:
            await canceller
        raise AssertionError("the call was not cancelled")

    return rt, rt.run(run()), unanswered


def test_a_cancelled_subagents_call_ends_at_once_as_the_sdks_error_and_is_not_retried(
        monkeypatch, drover_env, sim):
    """The job's cancel fires mid-call: the request is aborted, the SDK raises its base
    error (which it never retries) from drover's Cancelled, and the call is counted once,
    unanswered."""
    import anthropic

    # The simulator holds the request 5 s; the cancel fires once it holds it.
    sim.configure(tool_turns=0, output_tokens_mean=30, latency_mean_s=5, latency_p95_s=5)

    async def cancel_mid_call(cancel: asyncio.Event) -> None:
        # Once the call is at the simulator, however long its reserve and send took (a
        # fixed 0.5 s fell before the send on a loaded host: the call ended unsent,
        # uncounted, as a cancel before the send does).
        await asyncio.to_thread(wait_until, "the call at the simulator",
                                lambda: sim.stats()["in_flight"] == 1)
        cancel.set()

    rt, error, unanswered = _cancelled_call(monkeypatch, drover_env, "cancelled-job",
                                             cancel_mid_call)
    from drover.errors import Cancelled

    assert isinstance(error, anthropic.AnthropicError), repr(error)
    assert not isinstance(error, anthropic.APIConnectionError)  # not retried as one
    assert isinstance(error.__cause__, Cancelled)
    assert len(unanswered) == 1
    assert _limiter_usage(rt.settings)["requests"] == 1
    assert sim.stats()["accepted"] == 1  # sent once: not retried


def test_a_subagents_call_cancelled_before_it_is_sent_is_neither_sent_nor_counted(
        monkeypatch, drover_env, sim):
    """The job was cancelled before the call: the SDK raises its base error from drover's
    Cancelled, nothing goes out and nothing is counted."""
    import anthropic

    sim.configure(tool_turns=0, output_tokens_mean=30)
    rt, error, unanswered = _cancelled_call(monkeypatch, drover_env, "cancelled-first-job",
                                             None)
    from drover.errors import Cancelled

    assert isinstance(error, anthropic.AnthropicError), repr(error)
    assert isinstance(error.__cause__, Cancelled)
    assert unanswered == []
    assert _limiter_usage(rt.settings)["requests"] == 0
    stats = sim.stats()
    assert stats["accepted"] == 0 and stats["in_flight"] == 0


def test_a_pool_of_keys_sends_each_call_on_the_key_its_grant_chose(monkeypatch, drover_env,
                                                                   sim):
    """DROVER_KEYS: two keys of 120 requests a minute in an organisation of 240; 24 calls at
    once through one client go out on both keys (the key the limiter chose, its credential
    put on the request), no 429 on either."""
    import json

    tag = drover_env["DROVER_KEY_ALIAS"]
    pool = [{"alias": f"{name}-{tag}", "api_key": f"sk-sim-{tag}-{name}", "rpm": 120}
            for name in ("a", "b")]
    sim.configure(pool=pool, rpm=240, burst_s=1, tool_turns=0, output_tokens_mean=20)
    model = "claude-sonnet-4-6"
    configure(monkeypatch, drover_env, model=model, keys=json.dumps(pool), rpm=240,
              burst_seconds=1, limit_groups=json.dumps({f"cls-{tag}": [model]}))
    results = _fan_out(model, 24)
    assert not [r for r in results if isinstance(r, BaseException)], results[:2]
    stats = sim.stats()
    assert stats["rejected_429"] == 0 and stats["accepted"] == 24, stats["per_key"]
    assert all(stats["per_key"][k["alias"]]["accepted"] > 0 for k in pool), stats["per_key"]
