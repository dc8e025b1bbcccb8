"""The simulator's Message Batches API, through the real anthropic SDK (max_retries=0)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anthropic
import pytest

from drover.simulator import SimulatorServer

MODEL = "claude-sim-1"




def client_for(server: SimulatorServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="sk-test", max_retries=0)


def request(custom_id: str, text: str, **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id,
            "params": {"model": MODEL, "max_tokens": 1024,
                       "messages": [{"role": "user", "content": text}], **params}}


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 10.0
               ) -> anthropic.types.messages.MessageBatch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.processing_status}"
        time.sleep(0.05)


def test_batch_lifecycle_counts_results_and_stats_match_the_sdk_types(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(batch_processing_s=0.2, tool_turns=0)
    client = client_for(sim)
    reqs = [request(f"ok-{i}", f"Summarise document {i}") for i in range(5)]
    reqs.append(request("bad", "please fail [[sim:400]]"))
    reqs.append(request("gone", "this one expires [[sim:expire]]"))
    batch = client.messages.batches.create(requests=reqs)
    assert batch.type == "message_batch" and batch.id.startswith("msgbatch_")
    assert batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 7 and batch.results_url is None
    assert (batch.expires_at - batch.created_at).total_seconds() == pytest.approx(86400)

    ended = wait_ended(client, batch.id)
    counts = ended.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.expired) == (0, 5, 1, 1)
    assert ended.ended_at is not None and ended.results_url.endswith(f"/{batch.id}/results")

    results = {line.custom_id: line.result for line in client.messages.batches.results(batch.id)}
    assert set(results) == {r["custom_id"] for r in reqs}
    assert results["bad"].type == "errored"
    assert results["bad"].error.error.type == "invalid_request_error"
    assert results["gone"].type == "expired"
    ok = [r for r in results.values() if r.type == "succeeded"]
    assert all(r.message.stop_reason == "end_turn" and r.message.usage.output_tokens > 0
               for r in ok)

    stats = sim.stats()
    assert stats["accepted"] == 0, "batch requests are not realtime messages.create calls"
    b = stats["batches"]
    assert b["requests"] == 7 and b["outcomes"] == {"succeeded": 5, "errored": 1,
                                                    "canceled": 0, "expired": 1}
    assert b["output_tokens"] == sum(r.message.usage.output_tokens for r in ok)
    assert b["calls"]["create"] == 1 and b["in_progress"] == 0


def test_list_pages_newest_first_and_cancel_keeps_finished_requests(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    # Each request ends at a random instant within batch_processing_s: within an hour, none
    # ends during the test (30 s let one of three end before its delete on a loaded box).
    sim = sim_factory(batch_processing_s=3600.0)
    client = client_for(sim)
    ids = [client.messages.batches.create(requests=[request("a", f"task {i}")]).id
           for i in range(3)]
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert [b.id for b in client.messages.batches.list(limit=2)] == ids[::-1]  # auto-paging

    canceling = client.messages.batches.cancel(ids[0])
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at
    ended = wait_ended(client, ids[0])
    assert ended.request_counts.canceled == 1
    assert [r.result.type for r in client.messages.batches.results(ids[0])] == ["canceled"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.delete(ids[1])  # still in progress
    assert client.messages.batches.delete(ids[0]).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(ids[0])
    assert sim.stats()["batches"]["canceling"] == 0


def test_batch_limits_are_their_own_rpm_and_queue_cap(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    # batch_rpm 12 with a 10 s burst: two calls at once, then one every 5 s, so a loaded box's
    # gaps between the three calls cannot refill the bucket (at 120 RPM with a 1 s burst a
    # 0.5 s gap did, in a fresh-clone run beside a CPU hog).
    sim = sim_factory(batch_processing_s=30.0, batch_queue_cap=3, batch_rpm=12, burst_s=10.0,
                      rpm=1)
    client = client_for(sim)
    client.messages.batches.create(requests=[request(f"r{i}", "x") for i in range(3)])
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.batches.create(requests=[request("one-more", "x")])
    assert "waiting to be processed" in refused.value.message
    assert int(refused.value.response.headers["retry-after"]) >= 1
    # The realtime RPM of 1 is untouched by batch calls; the batch RPM (its two calls spent)
    # refuses the next call with a retry-after of its own.
    with pytest.raises(anthropic.RateLimitError) as busy:
        client.messages.batches.list()
    assert "batch requests per minute" in busy.value.message
    client.messages.create(model=MODEL, max_tokens=10,
                           messages=[{"role": "user", "content": "realtime still works"}])
    stats = sim.stats()
    assert stats["batches"]["queue_cap_429"] == 1 and stats["batches"]["rejected_429"] == 2
    assert stats["accepted"] == 1 and stats["batches"]["queued"] == 3


def test_bad_batch_bodies_get_400s_that_name_the_field(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    client = client_for(sim_factory(batch_max_requests=2))
    for reqs, words in (([], "non-empty list"),
                        ([request("same", "x"), request("same", "y")], "not unique"),
                        ([request("bad id!", "x")], "custom_id"),
                        ([request(f"r{i}", "x") for i in range(3)], "at most 2")):
        with pytest.raises(anthropic.BadRequestError) as bad:
            client.messages.batches.create(requests=reqs)
        assert words in bad.value.message


def test_error_and_expiry_rates_and_the_expiry_window(
        sim_factory: Callable[..., SimulatorServer]) -> None:
    sim = sim_factory(batch_processing_s=0.3, batch_errored_rate=1.0)
    client = client_for(sim)
    first = client.messages.batches.create(requests=[request("r", "x")])
    wait_ended(client, first.id)
    [line] = client.messages.batches.results(first.id)
    assert line.result.type == "errored" and line.result.error.error.type == "overloaded_error"
    # Requests not done within batch_expires_s expire, and the batch ends then.
    sim.configure(batch_errored_rate=0.0, batch_processing_s=3600.0, batch_expires_s=0.2)
    late = client.messages.batches.create(requests=[request(f"r{i}", "x") for i in range(4)])
    assert wait_ended(client, late.id, timeout=3).request_counts.expired == 4
