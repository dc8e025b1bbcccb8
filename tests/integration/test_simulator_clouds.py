"""The simulator's clouds (SimConfig.provider "bedrock" and "vertex", simulator/clouds.py), over
real HTTP, through the Anthropic SDK's own cloud clients (AnthropicBedrock, AnthropicVertex,
max_retries=0): their routes and credentials, their streams (Bedrock's binary event stream,
Vertex AI's pinged server-sent events), their throttling in their own words, and Bedrock's
tokens quota counting each output token five times once the answer is done."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import pytest

from drover.simulator import SimulatorServer

ASK: dict[str, Any] = {"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
BEDROCK_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"


@pytest.fixture
def cloud(sim_factory: Callable[..., SimulatorServer]) -> Callable[..., SimulatorServer]:
    return lambda provider, **config: sim_factory(provider=provider, seed=1, tool_turns=0,
                                                  **config)


def bedrock(server: SimulatorServer, **credentials: str) -> anthropic.AnthropicBedrock:
    credentials = credentials or {"api_key": "bedrock-api-key"}
    return anthropic.AnthropicBedrock(aws_region="us-east-1", base_url=server.url,
                                      max_retries=0, **credentials)


def vertex(server: SimulatorServer, token: str = "ya29.token") -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(region="us-east5", project_id="my-project",
                                     access_token=token, base_url=server.url + "/v1",
                                     max_retries=0)


@pytest.mark.parametrize("credentials", [{"api_key": "bedrock-api-key"},
                                         {"aws_access_key": "AKIDEXAMPLE",
                                          "aws_secret_key": "secret"}])
def test_bedrock_answers_and_streams_through_the_sdks_bedrock_client(cloud, credentials):
    server = cloud("bedrock", rpm=600, tpm=100_000)
    client = bedrock(server, **credentials)
    message = client.messages.create(model=BEDROCK_MODEL, **ASK)
    assert message.content[0].text and message.usage.output_tokens > 0
    with client.messages.stream(model=BEDROCK_MODEL, **ASK) as stream:  # AWS's event stream
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text and final.usage.input_tokens > 0
    assert server.stats()["accepted"] == 2


def test_vertex_answers_and_streams_through_the_sdks_vertex_client(cloud):
    server = cloud("vertex", rpm=600, itpm=100_000, otpm=20_000)
    client = vertex(server)
    message = client.messages.create(model=VERTEX_MODEL, **ASK)
    assert message.content[0].text and message.usage.output_tokens > 0
    with client.messages.stream(model=VERTEX_MODEL, **ASK) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens > 0 and server.stats()["accepted"] == 2


def test_a_request_without_credentials_is_refused_in_each_clouds_words(cloud):
    bed = cloud("bedrock", rpm=600, tpm=100_000)
    reply = httpx2.post(f"{bed.url}/model/{BEDROCK_MODEL}/invoke",
                        json={"anthropic_version": "bedrock-2023-05-31", **ASK})
    assert reply.status_code == 403 and reply.headers["x-amzn-ErrorType"].startswith(
        "AccessDeniedException")
    vtx = cloud("vertex")
    reply = httpx2.post(f"{vtx.url}/v1/projects/p/locations/us-east5/publishers/anthropic/"
                        f"models/{VERTEX_MODEL}:rawPredict", json=ASK)
    assert reply.status_code == 401 and reply.json()["error"]["status"] == "UNAUTHENTICATED"
    assert bed.stats()["accepted"] == vtx.stats()["accepted"] == 0


def test_throttling_is_a_429_in_each_clouds_words_without_anthropics_headers(cloud):
    bed = bedrock(cloud("bedrock", rpm=1, tpm=100_000))
    bed.messages.create(model=BEDROCK_MODEL, **ASK)
    with pytest.raises(anthropic.RateLimitError) as refused:
        bed.messages.create(model=BEDROCK_MODEL, **ASK)
    headers = refused.value.response.headers
    assert headers["x-amzn-ErrorType"].startswith("ThrottlingException")
    assert refused.value.body == {"message": "Too many requests, please wait before trying "
                                             "again."}
    assert "retry-after" not in headers
    assert not any(h.startswith("anthropic-ratelimit") for h in headers)

    vtx = vertex(cloud("vertex", rpm=1))
    vtx.messages.create(model=VERTEX_MODEL, **ASK)
    with pytest.raises(anthropic.RateLimitError) as refused:
        vtx.messages.create(model=VERTEX_MODEL, **ASK)
    assert refused.value.body["error"]["status"] == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize(("burndown", "second"), [(5.0, "throttled"), (1.0, "ok")])
def test_bedrock_counts_each_output_token_burndown_times_once_the_answer_is_done(
        cloud, burndown, second):
    # A tokens quota of 600 a minute (10 a second, a minute's burst): the first call takes
    # 7 + 100 (input + max_tokens) at admission and, its 100 output tokens done, 7 + 5 x 100:
    # 93 are left, too few for a second call's 107. Counted once, 493 would be left.
    server = cloud("bedrock", rpm=600, tpm=600, burst_s=60, output_burndown=burndown,
                   output_tokens_mean=100)
    client = bedrock(server)
    first = client.messages.create(model=BEDROCK_MODEL, **ASK)
    assert first.usage.output_tokens == 100
    try:
        client.messages.create(model=BEDROCK_MODEL, **ASK)
        outcome = "ok"
    except anthropic.RateLimitError:
        outcome = "throttled"
    assert outcome == second


def test_a_vertex_stream_is_pinged_before_a_slow_first_token_and_bedrocks_is_not(cloud):
    # The SDKs drop pings before any event: the raw bytes show them.
    body = {**ASK, "messages": [{"role": "user", "content": "think [[sim:think=2.5]]"}]}
    vtx = cloud("vertex", ping_every_s=1.0)
    url = (f"{vtx.url}/v1/projects/p/locations/us-east5/publishers/anthropic/models/"
           f"{VERTEX_MODEL}:streamRawPredict")
    with httpx2.stream("POST", url, json=body, headers={"Authorization": "Bearer t"},
                       timeout=30) as reply:
        raw = b"".join(reply.iter_bytes())
    assert raw.count(b"event: ping") >= 3  # the first, then one a second while it thinks
    bed = cloud("bedrock", ping_every_s=1.0)
    with httpx2.stream("POST", f"{bed.url}/model/{BEDROCK_MODEL}/invoke-with-response-stream",
                       json=body, headers={"Authorization": "Bearer t"}, timeout=30) as reply:
        raw = b"".join(reply.iter_bytes())
    assert reply.headers["content-type"] == "application/vnd.amazon.eventstream"
    assert b"event: ping" not in raw and b":event-type" in raw
