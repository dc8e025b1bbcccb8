"""drover's limited clients (``drover.AsyncAnthropic``) over a pool of the Anthropic API,
Amazon Bedrock and Google Vertex AI: each call goes out on the entry its grant chose, a cloud's
through that entry's SDK client (``AsyncAnthropicBedrock`` / ``AsyncAnthropicVertex``), and
the caller's SDK reads the Anthropic API's own answer whichever entry served it (its JSON, its
server-sent events, its errors). Real Redis, the real SDKs over HTTP to three simulators
(simulator/clouds.py), no mock of drover."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anthropic
import pytest
import redis

from drover.workers.limiter import Limiter, org_scope, pool_scope
from tests.helpers import configure

MODEL = "claude-sonnet-4-6"
BEDROCK_ID = "anthropic.claude-sonnet-4-6-v1:0"
VERTEX_ID = "claude-sonnet-4-6@20260101"


def _entries(tag: str, urls: dict[str, str], **limits: dict) -> list[dict]:
    """The pool's entries of ``urls`` (api, bed, vtx: those given), each with its limits."""
    every = {
        "api": {"alias": f"api-{tag}", "api_key": "sk-test-not-a-secret",
                "base_url": urls.get("api")},
        "bed": {"alias": f"bed-{tag}", "provider": "bedrock", "region": "us-east-1",
                "api_key": f"bedrock-key-{tag}", "base_url": urls.get("bed"),
                "models": {MODEL: BEDROCK_ID}},
        "vtx": {"alias": f"vtx-{tag}", "provider": "vertex", "region": "us-east5",
                "project": "proj", "access_token": f"ya29.token-{tag}",
                "base_url": f"{urls.get('vtx')}/v1", "models": {MODEL: VERTEX_ID}},
    }
    return [{**every[name], **limits.get(name, {})} for name in urls]


def _pool(monkeypatch, drover_env, entries: list[dict]) -> None:  # noqa: ANN001
    tag = drover_env["DROVER_KEY_ALIAS"]
    configure(monkeypatch, drover_env, model=MODEL, keys=json.dumps(entries),
              limit_groups=json.dumps({f"cls-{tag}": [MODEL]}), rpm="600", itpm="600000",
              otpm="120000", burst_seconds=1, late_send_s=0.4)


def _requests(drover_env, scope: str) -> dict[str, int]:  # noqa: ANN001
    lim = Limiter(redis.Redis.from_url(drover_env["DROVER_REDIS_URL"]),
                  prefix=drover_env["DROVER_KEY_PREFIX"])
    rows = lim.usage(scope, 600)
    return {name: sum(row.get(name, 0) for row in rows)
            for name in ("requests", "input_tokens", "output_tokens")}


def _ask(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Survey harbour {i} and say what it holds."}]


def test_limited_client_calls_land_on_every_entry_and_read_the_apis_own_answers(
        sim, sim_factory, drover_env, monkeypatch):
    """36 calls at once through one ``drover.AsyncAnthropic``, a third streamed with
    ``messages.stream``, a third with ``stream=True``: every entry serves some, each cloud on
    its own credential and model id, every answer the SDK's own Message (or events) naming
    the caller's model, 0 throttles, each entry's limiter counting what it served."""
    common = {"seed": 5, "tool_turns": 0, "output_tokens_mean": 40, "burst_s": 1.0,
              "overload_rate": 0.0}
    limits = {"api": {"rpm": 120}, "bed": {"rpm": 120, "tpm": 120_000},
              "vtx": {"rpm": 120, "itpm": 60_000, "otpm": 12_000}}
    # The simulators hold ten times the entries' limits: the limiter's bind, and a 429 here
    # would be a call sent where its grant did not say (test_cloud_pool.py holds the
    # limits at the edge).
    sim.configure(**common, rpm=1200)
    bed = sim_factory(provider="bedrock", **common, rpm=1200, tpm=1_200_000)
    vtx = sim_factory(provider="vertex", **common, rpm=1200, itpm=600_000, otpm=120_000)
    tag = drover_env["DROVER_KEY_ALIAS"]
    _pool(monkeypatch, drover_env, _entries(
        tag, {"api": sim.url, "bed": bed.url, "vtx": vtx.url}, **limits))
    import drover

    async def one(llm: anthropic.AsyncAnthropic, i: int) -> tuple[str, object]:
        if i % 3 == 0:
            return "whole", await llm.messages.create(model=MODEL, max_tokens=200,
                                                      messages=_ask(i))
        if i % 3 == 1:
            async with llm.messages.stream(model=MODEL, max_tokens=200,
                                           messages=_ask(i)) as stream:
                return "stream", await stream.get_final_message()
        events = [e async for e in await llm.messages.create(
            model=MODEL, max_tokens=200, messages=_ask(i), stream=True)]
        return "events", events

    async def fan_out() -> list[tuple[str, object]]:
        llm = drover.AsyncAnthropic()
        return await asyncio.gather(*(one(llm, i) for i in range(36)))

    answers = asyncio.run(fan_out())
    for kind, answer in answers:
        if kind == "events":
            types = [e.type for e in answer]  # type: ignore[attr-defined]
            assert types[0] == "message_start" and types[-1] == "message_stop", types
            assert answer[0].message.model == MODEL  # type: ignore[index]
            assert any(e.type == "content_block_delta" for e in answer)  # type: ignore[attr-defined]
        else:
            assert isinstance(answer, anthropic.types.Message), answer
            assert answer.model == MODEL and answer.content and answer.usage.output_tokens > 0

    stats = {name: s.stats() for name, s in (("api", sim), ("bed", bed), ("vtx", vtx))}
    assert {n: s["rejected_429"] for n, s in stats.items()} == {"api": 0, "bed": 0, "vtx": 0}, {
        n: s["by_status"] for n, s in stats.items()}
    accepted = {name: s["accepted"] for name, s in stats.items()}
    assert all(n > 0 for n in accepted.values()) and sum(accepted.values()) == 36, accepted
    # Each cloud saw one credential on every call (the simulator keeps a digest of it).
    assert list(stats["bed"]["keys_seen"].values()) == [accepted["bed"]]
    assert list(stats["vtx"]["keys_seen"].values()) == [accepted["vtx"]]
    cls = f"cls-{tag}"
    counted = {name: _requests(drover_env, pool_scope(f"{name}-{tag}", cls))
               for name in ("api", "bed", "vtx")}
    assert {n: c["requests"] for n, c in counted.items()} == accepted
    # Vertex AI counts as the API does: its entry settled exactly what it billed.
    assert counted["vtx"]["input_tokens"] == stats["vtx"]["billed"]["input_tokens"]
    assert counted["vtx"]["output_tokens"] == stats["vtx"]["billed"]["output_tokens"]
    # The organisation (the Anthropic API's limits) counted the API's calls only.
    assert _requests(drover_env, org_scope(cls))["requests"] == accepted["api"]


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
def test_a_throttled_cloud_entry_cools_down_alone_and_the_caller_gets_its_answer(
        sim, sim_factory, drover_env, monkeypatch, cloud):
    """The cloud entry's simulator admits one request a minute while drover thinks it takes
    6,000 (the API's key: 600). Six calls at once go mostly to the cloud (the emptiest
    entry), which throttles all but one (ThrottlingException / RESOURCE_EXHAUSTED): a caller with
    ``max_retries=0`` sees the API's 429 ``rate_limit_error`` with the entry's cooldown as
    its retry-after. The entry cools down alone: the organisation and the API's key have no
    cooldown, and callers that keep the SDK's retries get their answers."""
    sim.configure(seed=2, tool_turns=0, output_tokens_mean=20, rpm=600)
    throttling = sim_factory(provider=cloud, seed=2, tool_turns=0, output_tokens_mean=20,
                             rpm=1)
    tag = drover_env["DROVER_KEY_ALIAS"]
    name = "bed" if cloud == "bedrock" else "vtx"
    cloud_limits = {"bed": {"rpm": 6000, "tpm": 6_000_000},
                    "vtx": {"rpm": 6000, "itpm": 6_000_000, "otpm": 600_000}}[name]
    _pool(monkeypatch, drover_env, _entries(
        tag, {"api": sim.url, name: throttling.url}, api={"rpm": 600},
        **{name: cloud_limits}))
    import drover

    async def calls() -> tuple[list[object], list[object]]:
        bare = drover.AsyncAnthropic(max_retries=0)
        first = await asyncio.gather(*(bare.messages.create(
            model=MODEL, max_tokens=40, messages=_ask(i)) for i in range(6)),
            return_exceptions=True)
        llm = drover.AsyncAnthropic(max_retries=4)
        then = [await llm.messages.create(model=MODEL, max_tokens=40, messages=_ask(10 + i))
                for i in range(3)]
        return first, then

    first, then = asyncio.run(calls())
    refused = [r for r in first if isinstance(r, BaseException)]
    assert refused and all(isinstance(r, anthropic.RateLimitError) for r in refused), refused
    for error in refused:
        assert error.status_code == 429  # type: ignore[attr-defined]
        assert error.body["error"]["type"] == "rate_limit_error", error.body  # type: ignore[attr-defined]
        assert error.response.headers["retry-after"] == "2"  # type: ignore[attr-defined]
        assert "token" not in str(error) and "bedrock-key" not in str(error)
    answers = [r for r in first if not isinstance(r, BaseException)] + then
    assert all(isinstance(a, anthropic.types.Message) and a.model == MODEL for a in answers)
    stats = {"api": sim.stats(), name: throttling.stats()}
    assert stats[name]["accepted"] == 1 and stats[name]["rejected_429"] >= len(refused)
    assert stats["api"]["rejected_429"] == 0
    cls = f"cls-{tag}"
    lim = Limiter(redis.Redis.from_url(drover_env["DROVER_REDIS_URL"]),
                  prefix=drover_env["DROVER_KEY_PREFIX"])
    for scope in (org_scope(cls), pool_scope(f"api-{tag}", cls)):
        assert lim.state(scope)["cooldown_s"] == 0, lim.state(scope)


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
def test_a_cloud_stream_its_reader_stops_half_way_settles_at_what_streamed(
        sim, sim_factory, drover_env, monkeypatch, cloud):
    """A pool of one cloud entry: a stream read whole settles its real usage; one whose
    reader stops after five text events closes the cloud's stream and settles at what had
    streamed (the cloud bills the output generated until the close)."""
    on = sim_factory(provider=cloud, seed=4, tool_turns=0, output_tokens_mean=400,
                     output_tokens_per_s=200)
    tag = drover_env["DROVER_KEY_ALIAS"]
    name = "bed" if cloud == "bedrock" else "vtx"
    limits = {"bed": {"rpm": 600, "tpm": 600_000, "output_burndown": 1},
              "vtx": {"rpm": 600, "itpm": 600_000, "otpm": 60_000}}[name]
    _pool(monkeypatch, drover_env, _entries(tag, {name: on.url}, **{name: limits}))
    import drover

    async def streams() -> tuple[object, int]:
        llm = drover.AsyncAnthropic()
        async with llm.messages.stream(model=MODEL, max_tokens=800,
                                       messages=_ask(1)) as stream:
            whole = await stream.get_final_message()
        read = 0
        async with llm.messages.stream(model=MODEL, max_tokens=800,
                                       messages=_ask(2)) as stream:
            async for _text in stream.text_stream:
                read += 1
                if read == 5:
                    break
        return whole, read

    whole, read = asyncio.run(streams())
    assert read == 5 and whole.model == MODEL and whole.usage.output_tokens > 100  # type: ignore[attr-defined]
    stats = on.stats()
    counted = _requests(drover_env, pool_scope(f"{name}-{tag}", f"cls-{tag}"))
    assert counted["requests"] == 2
    assert counted["input_tokens"] == stats["billed"]["input_tokens"]
    cut = counted["output_tokens"] - whole.usage.output_tokens  # type: ignore[attr-defined]
    assert 0 < cut < whole.usage.output_tokens / 2, (counted, whole.usage)  # type: ignore[attr-defined]
    billed_cut = stats["billed"]["output_tokens"] - whole.usage.output_tokens  # type: ignore[attr-defined]
    assert abs(cut - billed_cut) <= max(10, billed_cut), (cut, billed_cut)


def test_the_gateway_sends_its_callers_to_every_entry_of_the_pool(
        sim, sim_factory, drover_env, monkeypatch, gateway):
    """A real ``drover gateway`` over the same pool: the plain ``anthropic`` SDK (retries off)
    pointed at it gets its messages and streams from all three entries, each naming the model
    it asked for, and no cloud credential in any answer."""
    from tests.helpers.gateway import GATEWAY_KEYS

    common = {"seed": 6, "tool_turns": 0, "output_tokens_mean": 30, "overload_rate": 0.0}
    sim.configure(**common, rpm=1200)
    bed = sim_factory(provider="bedrock", **common, rpm=1200, tpm=1_200_000)
    vtx = sim_factory(provider="vertex", **common, rpm=1200, itpm=600_000, otpm=120_000)
    tag = drover_env["DROVER_KEY_ALIAS"]
    _pool(monkeypatch, drover_env, _entries(
        tag, {"api": sim.url, "bed": bed.url, "vtx": vtx.url}, api={"rpm": 120},
        bed={"rpm": 120, "tpm": 120_000}, vtx={"rpm": 120, "itpm": 60_000, "otpm": 12_000}))
    gw = gateway()

    async def one(llm: anthropic.AsyncAnthropic, i: int) -> object:
        if i % 2:
            async with llm.messages.stream(model=MODEL, max_tokens=100,
                                           messages=_ask(i)) as stream:
                return await stream.get_final_message()
        return await llm.messages.create(model=MODEL, max_tokens=100, messages=_ask(i))

    async def calls() -> list[object]:
        llm = anthropic.AsyncAnthropic(base_url=gw.url, api_key=GATEWAY_KEYS["web"],
                                       max_retries=0)
        return await asyncio.gather(*(one(llm, i) for i in range(18)))

    answers = asyncio.run(calls())
    assert all(isinstance(a, anthropic.types.Message) and a.model == MODEL and a.content
               for a in answers), answers[:2]
    accepted = {name: s.stats()["accepted"] for name, s in (("api", sim), ("bed", bed),
                                                             ("vtx", vtx))}
    assert all(n > 0 for n in accepted.values()) and sum(accepted.values()) == 18, accepted
    assert all(s.stats()["rejected_429"] == 0 for s in (sim, bed, vtx))
    assert "bedrock-key" not in json.dumps([a.to_dict() for a in answers])  # type: ignore[attr-defined]


async def _slow_then_dead_stream(client: Callable[[], Any], caught: type[BaseException]
                                 ) -> tuple[list[str], BaseException | None]:
    """Two streams on ``client()``: one whose first token is 8 s away (the event types the
    caller got), then one that sends no byte for 30 s (the ``caught`` error it ended with,
    None if it ended without one)."""
    llm = client()
    kinds = []
    async with llm.messages.stream(model=MODEL, max_tokens=100, messages=[
            {"role": "user", "content": "Weigh it [[sim:think=8]]"}]) as stream:
        async for event in stream:
            kinds.append(event.type)
    try:
        async with llm.messages.stream(model=MODEL, max_tokens=100, messages=[
                {"role": "user", "content": "Weigh it [[sim:stall=30]]"}]) as stream:
            await stream.get_final_message()
    except caught as error:
        return kinds, error
    return kinds, None


def test_a_cloud_stream_whose_first_token_is_slow_but_alive_is_never_abandoned(
        sim, sim_factory, drover_env, monkeypatch):
    """The caller's read timeout (3 s) is the cloud's request's: Vertex AI pings a stream
    whose first token is 8 s away, and the caller gets its whole answer, sent once; a
    stream that carries no byte at all (a dead connection) ends at that timeout as the
    SDK's APITimeoutError, as the Anthropic API's would. (The simulator's Bedrock stream
    sends no pings: there a first token slower than the read timeout ends the stream, as in
    the loop.)"""
    cloud = "vertex"
    on = sim_factory(provider=cloud, seed=7, tool_turns=0, output_tokens_mean=30,
                     ping_every_s=1.0)
    tag = drover_env["DROVER_KEY_ALIAS"]
    name = "bed" if cloud == "bedrock" else "vtx"
    limits = {"bed": {"rpm": 600, "tpm": 600_000},
              "vtx": {"rpm": 600, "itpm": 600_000, "otpm": 60_000}}[name]
    _pool(monkeypatch, drover_env, _entries(tag, {name: on.url}, **{name: limits}))
    import drover

    kinds, dead = asyncio.run(_slow_then_dead_stream(
        lambda: drover.AsyncAnthropic(max_retries=0, timeout=anthropic.Timeout(30, read=3)),
        anthropic.APIConnectionError))  # APITimeoutError is one
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert isinstance(dead, anthropic.APITimeoutError), repr(dead)
    assert on.stats()["accepted"] == 2


def test_the_gateway_pings_its_caller_while_a_cloud_streams_no_event(
        sim, sim_factory, drover_env, monkeypatch, gateway):
    """Through the gateway (a network hop to the caller): while Vertex AI pings a stream whose
    first token is 8 s away, and the SDK drops those pings, the gateway says ``ping`` to its
    caller (every half of its DROVER_STREAM_IDLE_S, 4 s), whose SDK reads with a 3 s timeout:
    the caller gets its whole answer, sent once; a cloud stream with no byte at all is cut at
    the gateway's idle limit."""
    from tests.helpers.gateway import GATEWAY_KEYS

    on = sim_factory(provider="vertex", seed=8, tool_turns=0, output_tokens_mean=30,
                     ping_every_s=1.0)
    tag = drover_env["DROVER_KEY_ALIAS"]
    _pool(monkeypatch, drover_env, _entries(tag, {"vtx": on.url}, vtx={
        "rpm": 600, "itpm": 600_000, "otpm": 60_000}))
    gw = gateway(DROVER_STREAM_IDLE_S="4")

    kinds, cut = asyncio.run(_slow_then_dead_stream(
        lambda: anthropic.AsyncAnthropic(base_url=gw.url, api_key=GATEWAY_KEYS["web"],
                                         max_retries=0, timeout=anthropic.Timeout(30, read=3)),
        anthropic.APIError))
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert cut is not None
    assert on.stats()["accepted"] == 2


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
def test_a_cloud_stream_that_fails_mid_answer_reaches_the_caller_as_the_apis_error_event(
        sim, sim_factory, drover_env, monkeypatch, cloud):
    """The cloud fails a stream after a few events (Bedrock's serviceUnavailableException
    frame, Vertex AI's error event): the caller's SDK raises its error of the API's
    ``overloaded_error`` event, and the call settles unanswered at what had streamed. The
    blocking client reads a cloud's answers too."""
    on = sim_factory(provider=cloud, seed=9, tool_turns=0, output_tokens_mean=200,
                     output_tokens_per_s=1000)
    tag = drover_env["DROVER_KEY_ALIAS"]
    name = "bed" if cloud == "bedrock" else "vtx"
    limits = {"bed": {"rpm": 600, "tpm": 600_000, "output_burndown": 1},
              "vtx": {"rpm": 600, "itpm": 600_000, "otpm": 60_000}}[name]
    _pool(monkeypatch, drover_env, _entries(tag, {name: on.url}, **{name: limits}))
    import drover

    async def failing() -> BaseException:
        llm = drover.AsyncAnthropic(max_retries=0)
        try:
            async with llm.messages.stream(model=MODEL, max_tokens=400, messages=[
                    {"role": "user", "content": "Weigh it [[sim:cut_error=6]]"}]) as stream:
                await stream.get_final_message()
        except anthropic.APIStatusError as error:
            return error
        raise AssertionError("the stream did not fail")

    failed = asyncio.run(failing())
    assert failed.body["error"]["type"] == "overloaded_error", failed.body  # type: ignore[attr-defined]
    counted = _requests(drover_env, pool_scope(f"{name}-{tag}", f"cls-{tag}"))
    billed = on.stats()["billed"]
    # Settled at what had streamed: not below what the cloud billed, below max_tokens.
    assert counted["requests"] == 1 and counted["input_tokens"] == billed["input_tokens"]
    assert billed["output_tokens"] <= counted["output_tokens"] < 400, (counted, billed)

    blocking = drover.Anthropic()
    whole = blocking.messages.create(model=MODEL, max_tokens=100, messages=_ask(1))
    with blocking.messages.stream(model=MODEL, max_tokens=100, messages=_ask(2)) as stream:
        streamed = stream.get_final_message()
    assert whole.model == streamed.model == MODEL and whole.content and streamed.content
    assert on.stats()["accepted"] == 3


def test_a_cloud_entry_without_credentials_sends_nothing_and_spends_nothing(
        sim, sim_factory, drover_env, monkeypatch):
    """A Vertex AI entry with no access token where Google's default credentials are none:
    its SDK client refuses before sending, so the call is not counted as sent (the limiter
    gets its reservation back, as the loop's call would), and the caller's SDK raises."""
    on = sim_factory(provider="vertex", seed=10, tool_turns=0)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/drover-test.json")
    tag = drover_env["DROVER_KEY_ALIAS"]
    entry = _entries(tag, {"vtx": on.url}, vtx={"rpm": 600, "itpm": 600_000,
                                                "otpm": 60_000})[0]
    _pool(monkeypatch, drover_env, [{k: v for k, v in entry.items() if k != "access_token"}])
    import drover

    async def call() -> BaseException:
        try:
            await drover.AsyncAnthropic(max_retries=0).messages.create(
                model=MODEL, max_tokens=40, messages=_ask(1))
        except anthropic.AnthropicError as error:
            return error
        raise AssertionError("sent without credentials")

    error = asyncio.run(call())
    assert "DefaultCredentialsError" in repr(error.__cause__), repr(error.__cause__)
    assert on.stats()["accepted"] == 0
    assert _requests(drover_env, pool_scope(f"vtx-{tag}", f"cls-{tag}"))["requests"] == 0
