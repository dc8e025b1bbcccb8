"""Every write of a sub-agent is fenced by its claim's token: once the sweep (or a second
delivery) has taken the part over, the old delivery's late writes are refused, whatever they
are (the record, a checkpoint, a tool result), and the new delivery's are stored.

Real Redis, the job store's own scripts, no worker: a delivery is what ``Checkpoints.start``
hands out, a takeover what the recovery sweep calls. The record script's fence is the one a
paused worker's late record meets; the end-to-end paused-worker test cannot see it (its job
ends before the worker wakes)."""

from __future__ import annotations

import uuid

import pytest

from drover import JobSpec
from drover.workers.jobs.claims import ClaimLost
from drover.workers.jobs.records import Checkpoint, SubagentResult
from drover.workers.services import Services


@pytest.fixture
def store(redis_url, key_prefix, monkeypatch):
    from drover.config import load_settings

    shared = Services.from_settings(load_settings(redis_url=redis_url, key_prefix=key_prefix))
    yield shared.store
    shared.close()


def _job(store) -> str:
    job_id = uuid.uuid4().hex
    store.specs.create(job_id, JobSpec(subtasks=["a"], max_tokens=16), ["a"], status="running",
                       queue="q-fences")
    return job_id


def _taken_over(store, job_id: str) -> tuple[int, int]:
    """Delivery A starts on worker wA and goes quiet; the sweep takes the part from wA and
    delivery B starts with the new message's token. Returns (A's token, B's token)."""
    a = store.checkpoints.start(job_id, 0, worker="wA", token=0)
    assert a.token > 0 and not a.stale
    sent = store.claims.takeover(job_id, 0, a.token, "wA")
    assert sent > a.token
    b = store.checkpoints.start(job_id, 0, worker="wB", token=sent)
    assert b.token > sent and not b.stale
    # A's message is old
    assert store.checkpoints.start(job_id, 0, worker="wA", token=a.token).stale
    return a.token, b.token


def _record(job_id: str, summary: str) -> SubagentResult:
    return SubagentResult(job_id=job_id, index=0, status="ok", summary=summary)


def test_a_stale_deliverys_record_is_refused_and_the_current_ones_is_stored(store):
    job_id = _job(store)
    old, new = _taken_over(store, job_id)
    with pytest.raises(ClaimLost):
        store.records.put(_record(job_id, "late, from A"), token=old, worker="wA")
    assert store.records.get(job_id, 0) is None
    assert store.records.count(job_id) == 0
    stored = store.records.put(_record(job_id, "from B"), token=new, worker="wB")
    assert stored.summary == "from B"
    assert store.records.get(job_id, 0).summary == "from B"
    # once recorded, a late writer is handed the record there is (stored once), not its own
    late = store.records.put(_record(job_id, "later still, from A"), token=old, worker="wA")
    assert late.summary == "from B"
    assert store.records.get(job_id, 0).summary == "from B"
    assert store.records.status_counts(job_id, 1)["ok"] == 1


def test_a_stale_deliverys_checkpoint_is_refused(store):
    job_id = _job(store)
    old, new = _taken_over(store, job_id)
    mine = Checkpoint(messages=[{"role": "user", "content": "from B"}])
    store.checkpoints.save(job_id, 0, mine, token=new)
    late = Checkpoint(messages=[{"role": "user", "content": "late, from A"}])
    with pytest.raises(ClaimLost):
        store.checkpoints.save(job_id, 0, late, token=old)
    assert store.checkpoints.load(job_id, 0).messages == mine.messages


def test_a_stale_deliverys_tool_result_is_refused(store):
    job_id = _job(store)
    old, new = _taken_over(store, job_id)
    store.checkpoints.save_tool_result(job_id, 0, "toolu_1", {"content": "from B"}, token=new)
    with pytest.raises(ClaimLost):
        store.checkpoints.save_tool_result(job_id, 0, "toolu_1", {"content": "late, from A"},
                                           token=old)
    with pytest.raises(ClaimLost):
        store.checkpoints.save_tool_result(job_id, 0, "toolu_2", {"content": "late, from A"},
                                           token=old)
    assert store.checkpoints.tool_results(job_id, 0) == {"toolu_1": {"content": "from B"}}


def test_the_cancel_check_before_a_send_sees_a_takeover(store):
    """The check a sub-agent makes right before each send (after its limiter wait) answers
    ClaimLost once the part was taken over while it waited, so it sends nothing."""
    job_id = _job(store)
    a = store.checkpoints.start(job_id, 0, worker="wA", token=0)
    assert store.cancels.cancelled(job_id, fence=(0, a.token)) is None  # still ours: go on
    store.claims.takeover(job_id, 0, a.token, "wA")  # the sweep, while A waited
    with pytest.raises(ClaimLost):
        store.cancels.cancelled(job_id, fence=(0, a.token))


def test_a_start_sent_again_after_its_reply_was_lost_gets_its_token(redis_url, key_prefix):
    """Redis ran a delivery's start, and the reply was lost (the server killed right after
    it: CI of 16e0310, test_redis_killed_and_restarted_mid_job_loses_no_result); the client
    sends the command again. That start gets the token it took: told "stale", its delivery
    stopped as a late copy and left the claim running on a live worker that ran nothing, so
    no sweep sent it again and the job never ended. Another delivery of the message is stale."""
    from urllib.parse import urlsplit

    from drover.config import load_settings
    from tests.helpers.tcp_proxy import TcpProxy

    where = urlsplit(redis_url)
    with TcpProxy(where.port or 6379, where.hostname or "127.0.0.1") as proxy:
        shared = Services.from_settings(load_settings(redis_url=proxy.url(tail=where.path),
                                                      key_prefix=key_prefix))
        try:
            store = shared.store
            store.checkpoints.start(_job(store), 0, worker="wA", token=0)  # the script loaded
            job_id = _job(store)
            proxy.lose_reply(store.claims._start.sha.encode())
            start = store.checkpoints.start(job_id, 0, worker="wA", token=0)
            assert proxy.replies_lost == 1
            assert not start.stale and start.token > 0, start
            assert store.claims.claim(job_id, 0) == f"{start.token}|running|wA"
            assert store.checkpoints.start(job_id, 0, worker="wA", token=0).stale
            assert store.checkpoints.start(job_id, 0, worker="wB", token=0).stale
            # Its record lets go of the claim and of the start's note.
            store.records.put(_record(job_id, "done"), token=start.token, worker="wA")
            assert not store.r.hexists(store.keys.job(job_id, "starts"), "0")
        finally:
            shared.close()
