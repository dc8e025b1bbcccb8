"""The worker's SDK warm-up (workers/providers/warmup.py): one call through the SDK, answered by
a server of its own in this process, never the configured provider."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import pytest

from drover.workers.providers.warmup import warm_up


@pytest.fixture
def provider() -> Iterator[str]:
    """A "provider" that would see any connection: a listening socket nobody should dial; its
    address, to set wherever the SDK or drover would look for a base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        conn = None
    listener.close()
    assert conn is None, "the warm-up dialled the configured base URL"


def test_the_warm_up_call_is_answered_locally_and_never_reaches_the_configured_provider(
        monkeypatch, provider):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", provider)
    monkeypatch.setenv("DROVER_ANTHROPIC_BASE_URL", provider)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-must-not-be-sent")

    seen = asyncio.run(warm_up())

    # The SDK's request went out and its answer parsed: the call made the whole round trip.
    assert seen == ["POST /v1/messages HTTP/1.1"]


def test_a_failed_warm_up_does_not_stop_the_worker(monkeypatch):
    # No local server can be bound: the warm-up gives up quietly (the first call stays slow).
    async def refuse(*_a, **_k):
        raise OSError("no sockets here")

    monkeypatch.setattr(asyncio, "start_server", refuse)
    assert asyncio.run(warm_up()) == []


def test_a_worker_on_openai_also_streams_one_chat_completion_through_its_provider(
        monkeypatch, caplog, provider):
    # The openai SDK is as cold as Anthropic's, and the Anthropic call warms none of it: a
    # worker that calls OpenAI streams one answer through drover's OpenAI provider too,
    # still never to the configured endpoint.
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-be-sent")

    with caplog.at_level(logging.DEBUG, logger="drover.workers.providers.warmup"):
        seen = asyncio.run(warm_up({"anthropic", "openai"}))

    assert seen == ["POST /v1/messages HTTP/1.1", "POST /v1/chat/completions HTTP/1.1"]
    # and both answers were read to their end (the stream's chunks, usage and [DONE])
    assert not [r.message for r in caplog.records if "failed" in r.getMessage()]


def test_each_provider_is_warmed_through_its_own_stream_turn_and_only_the_workers(
        monkeypatch, caplog, provider):
    # A worker on OpenAI alone warms OpenAI alone (it warmed Anthropic's SDK always); a
    # worker on Anthropic streams its warm-up answer through the provider as a real call does.
    monkeypatch.setenv("OPENAI_BASE_URL", f"{provider}/v1")
    monkeypatch.setenv("DROVER_ANTHROPIC_BASE_URL", provider)
    with caplog.at_level(logging.DEBUG, logger="drover.workers.providers.warmup"):
        assert asyncio.run(warm_up({"openai"})) == ["POST /v1/chat/completions HTTP/1.1"]
        assert asyncio.run(warm_up({"anthropic"})) == ["POST /v1/messages HTTP/1.1"]
        # Claude on a cloud is warmed as the Anthropic API (the same SDK's stream), once
        assert asyncio.run(warm_up({"bedrock", "vertex"})) == ["POST /v1/messages HTTP/1.1"]
    assert not [r.message for r in caplog.records if "failed" in r.getMessage()]
