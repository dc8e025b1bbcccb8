"""What a Redis failover can lose with RabbitMQ as the broker, and the sweep's stalled-job step
that redoes it (workers/recovery/sweep.py, step 3). RabbitMQ has acked the deliveries by then,
so nothing in the broker will bring them back: a chord whose count failed never sends its
join, and a sub-agent whose receipt, start and record were lost has no message left."""

from __future__ import annotations

import base64
import importlib
import json
import time
import uuid

import pytest

from drover.config import load_settings
from drover.workers.connections.redis_clients import sync_redis
from drover.workers.jobs.liveness import heartbeat_key, mark_message_gap
from drover.workers.jobs.records import SubagentResult
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.store import JobStore
from drover.workers.recovery.sweep import resend_lost_messages, sweep
from drover.workers.services import Services

AFTER_S = 0.05  # DROVER_RESEND_AFTER_S of these tests: the job counts as stalled at once


@pytest.fixture
def rabbitmq_job(redis_url, key_prefix):
    settings = load_settings(redis_url=redis_url, key_prefix=key_prefix,
                             broker_url="amqp://guest:guest@127.0.0.1:5672/unused",
                             resend_after_s=AFTER_S, heartbeat_s=0.1, heartbeat_ttl_s=0.5)
    store = JobStore(sync_redis(redis_url), prefix=key_prefix)
    job_id = uuid.uuid4().hex
    store.specs.create(job_id, JobSpec(subtasks=["a", "b", "c"], max_tokens=16), ["a", "b", "c"],
                       status="running", queue="q-lost")
    store.meta.claim_launch(job_id)
    yield settings, store, job_id
    store.r.close()


def ok(job_id: str, index: int) -> SubagentResult:
    return SubagentResult(job_id=job_id, index=index, status="ok", attempts=1, finished_at=0.0)


def sweep_stalled(settings, store) -> list[tuple[str, int | str, int]]:
    """Whole sweeps, as a worker's sweeper thread makes them, until one sends something (the
    stalled-job scan runs at most once a second fleet-wide; its first look starts the wait)."""
    sent: list[tuple[str, int | str, int]] = []

    def send(queue: str, job_id: str, part: int | str, token: int) -> None:
        assert queue == "q-lost"
        sent.append((job_id, part, token))

    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        sweep(store, settings, send, Services(settings, client=store.r).fairshare)
        time.sleep(0.1)
    return sent


def test_a_job_whose_chord_failed_gets_its_join_once_every_record_is_in(rabbitmq_job):
    settings, store, job_id = rabbitmq_job
    assert settings.broker_is_rabbitmq
    for index in range(3):
        store.records.put(ok(job_id, index))
    sent = sweep_stalled(settings, store)
    assert [(j, part) for j, part, _token in sent] == [(job_id, "join")]
    assert store.claims.claim(job_id, "join").split("|")[1] == "sent"


def test_a_sub_agent_that_no_live_worker_holds_is_sent_again_with_a_new_token(rabbitmq_job):
    settings, store, job_id = rabbitmq_job
    store.records.put(ok(job_id, 0))
    # 1: its receipt and start went with the old master; 2: held by a worker that is alive
    live = "w-live"
    store.r.set(heartbeat_key(store.prefix, live), "1", ex=60)
    assert store.claims.receive(job_id, 2, 0, live) == 1
    sent = sweep_stalled(settings, store)
    assert [(j, part) for j, part, _token in sent] == [(job_id, 1)]
    token = sent[0][2]
    assert token > 0 and store.claims.claim(job_id, 1) == f"{token}|sent|"
    # the chord's own message for 1, should RabbitMQ still hold one, is stale now
    assert store.claims.start(job_id, 1, 0, "w-other") == -1


def test_a_job_that_keeps_gaining_records_is_left_alone(rabbitmq_job):
    settings, store, job_id = rabbitmq_job
    sent: list[tuple[str, int | str, int]] = []
    schedulers = Services(settings, client=store.r).fairshare
    for index in range(2):
        assert resend_lost_messages(store, settings, lambda *a: sent.append(a), schedulers,
                                    AFTER_S) == []
        time.sleep(2 * AFTER_S)
        store.records.put(ok(job_id, index))
    assert resend_lost_messages(store, settings, lambda *a: sent.append(a), schedulers,
                                AFTER_S) == []
    assert sent == []


def test_a_parked_sub_agent_resumed_while_the_sweep_reads_is_not_taken_for_lost(
        redis_url, key_prefix, monkeypatch):
    """Redis broker: the batcher resumes a parked sub-agent (off the parked list, onto the
    queue) right after the sweep has read the broker. It was parked when the sweep first
    looked, so it is not lost; before, the sweep read the broker first and the parked list
    after, found it in neither, and sent it again (a second delivery then queued the same
    batch turn twice: 1,001 batch requests for 1,000 turns in a fresh-clone run)."""
    # The module, not the package's ``sweep`` function of the same name.
    sweep_module = importlib.import_module("drover.workers.recovery.sweep")
    settings = load_settings(redis_url=redis_url, key_prefix=key_prefix,
                             resend_after_s=AFTER_S, heartbeat_s=0.1, heartbeat_ttl_s=0.5)
    assert not settings.broker_is_rabbitmq
    store = JobStore(sync_redis(redis_url), prefix=key_prefix)
    job_id = uuid.uuid4().hex
    store.specs.create(job_id, JobSpec(subtasks=["a", "b"], max_tokens=16), ["a", "b"],
                       status="running", queue="q-lost")
    store.meta.claim_launch(job_id)
    parked = store.keys.job(job_id, "bpark")
    store.r.hset(parked, "0", "{}")  # 0 waits for its batch; 1's message is gone for good
    read_broker = sweep_module.subagents_in_broker

    def resumed_meanwhile(r, prefix, queue):  # noqa: ANN001, ANN202
        found = read_broker(r, prefix, queue)
        r.hdel(parked, "0")  # the batcher's resume: its message goes on the queue next
        return found

    monkeypatch.setattr(sweep_module, "subagents_in_broker", resumed_meanwhile)
    sent: list[tuple[str, str, int | str, int]] = []
    schedulers = Services(settings, client=store.r).fairshare
    assert resend_lost_messages(store, settings, lambda *a: sent.append(a), schedulers,
                                AFTER_S) == []
    time.sleep(2 * AFTER_S)  # the job gains no record for DROVER_RESEND_AFTER_S
    resend_lost_messages(store, settings, lambda *a: sent.append(a), schedulers, AFTER_S)
    assert [(job_id_, part) for _queue, job_id_, part, _token in sent] == [(job_id, 1)]
    store.r.close()


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_job_nobody_works_on_has_its_lost_message_sent_again_after_a_heartbeat_ttl(
        redis_url, key_prefix, broker):
    """Redis broker: connections that went silent took a sub-agent's message with them (the
    consumer's BRPOP popped it; it never reached the worker's unacked list), and no heartbeat
    saw Redis go away, so nothing marked the gap and step 3 would wait for
    DROVER_RESEND_AFTER_S (120 s: tests/system/test_silent_connections.py[redis] then failed,
    39 of 40 after 90 s). The window's repair sees a job with a sub-agent out that no live
    worker holds or runs and sends it again after a heartbeat TTL without a record; while a
    live worker runs it, nothing is sent. On RabbitMQ too (its queue cannot be read: CI of
    8a70ee9, test_silent_connections[rabbitmq], three sub-agents never received and none sent
    again after 32 s stalled)."""
    from drover.workers.recovery import repair_windows

    amqp = {"broker_url": "amqp://guest:guest@127.0.0.1:5672/unused"} if broker != "redis" else {}
    settings = load_settings(redis_url=redis_url, key_prefix=key_prefix, queue="q-lost",
                             heartbeat_s=0.1, heartbeat_ttl_s=0.5, **amqp)
    assert settings.broker_is_rabbitmq == (broker == "rabbitmq")
    assert settings.resend_after_s >= 60
    store = JobStore(sync_redis(redis_url), prefix=key_prefix)
    job_id = uuid.uuid4().hex
    store.specs.create(job_id, JobSpec(subtasks=["a", "b", "c"], max_tokens=16), ["a", "b", "c"],
                       status="running", queue="q-lost")
    store.meta.claim_launch(job_id)
    schedulers = Services(settings, client=store.r).fairshare
    fs = schedulers("q-lost")
    fs.published(fs.add(job_id, n=3, tenant="t", weight=1.0, priority="normal"))
    live = "w-live"
    store.r.set(heartbeat_key(store.prefix, live), "1", ex=60)
    assert int(store.claims.start(job_id, 1, 0, live)) > 0  # 1 runs on a live worker
    for index in (0, 2):
        store.records.put(ok(job_id, index))
    fs.finished(job_id, store.records.count(job_id))
    sent: list[tuple[str, str, int | str, int]] = []

    def repair_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not sent and time.monotonic() < deadline:
            repair_windows(store, settings, lambda *a: sent.append(a), schedulers)
            time.sleep(0.1)

    repair_for(3 * settings.heartbeat_ttl_s)
    assert sent == []  # a live worker runs it: not lost
    store.r.delete(heartbeat_key(store.prefix, live))  # now nobody does, and no message
    store.r.hdel(store.keys.job(job_id, "claims"), "1")  # (its claim gone with the message)
    repair_for(10)
    assert [(job_id_, part) for _queue, job_id_, part, _token in sent] == [(job_id, 1)]
    new = sent[0][3]
    assert new > 0 and store.claims.claim(job_id, 1) == f"{new}|sent|"
    assert store.claims.start(job_id, 1, 0, "w-other") == -1  # the chord's message: stale
    store.r.close()


def _unacked(store: JobStore, job_id: str, index: int, token: int, age_s: float) -> None:
    """A run_subagent message in kombu's unacked hash and index (its Redis layout), taken
    ``age_s`` ago by a consumer."""
    body = base64.b64encode(json.dumps([[job_id, index], {}, {}]).encode()).decode()
    message = {"body": body, "headers": {"task": "drover.run_subagent", "drover_token": token},
               "properties": {"body_encoding": "base64", "delivery_tag": uuid.uuid4().hex}}
    tag = message["properties"]["delivery_tag"]
    base = f"{store.prefix}:celery:"
    store.r.hset(base + "unacked", tag, json.dumps([message, "", "q-lost"]))
    store.r.zadd(base + "unacked_index", {tag: store.meta.server_time() - age_s})


def test_after_redis_was_away_a_message_taken_but_never_received_is_sent_again(
        redis_url, key_prefix):
    """Redis broker, no worker dead: Redis was away, a consumer had taken a message (kombu's
    unacked hash) whose receipt could not be recorded, and dropped it when it reconnected.
    Kombu hands it out again only after the visibility timeout (an hour by default, and its
    restore lock can outlive a pause by 5 minutes: CI of dc6d2b9, test_redis_away, 39 of 40
    after 240 s). While the heartbeats' mark of a message gap lasts, the sweep sends such a
    message again; one a live worker has said it holds stays where it is."""
    settings = load_settings(redis_url=redis_url, key_prefix=key_prefix, queue="q-lost",
                             heartbeat_s=0.1, heartbeat_ttl_s=0.5)
    store = JobStore(sync_redis(redis_url), prefix=key_prefix)
    job_id = uuid.uuid4().hex
    store.specs.create(job_id, JobSpec(subtasks=["a", "b"], max_tokens=16), ["a", "b"],
                       status="running", queue="q-lost")
    store.meta.claim_launch(job_id)
    live = "w-live"
    store.r.set(heartbeat_key(store.prefix, live), "1", ex=60)
    assert store.claims.receive(job_id, 0, 0, live) == 1  # 0: held by a live worker
    for index in (0, 1):
        _unacked(store, job_id, index, 0, age_s=5)
    sent: list[tuple[str, str, int | str, int]] = []
    schedulers = Services(settings, client=store.r).fairshare

    def sweep_once() -> None:
        store.r.delete(store.keys.recovery("lock"))
        sweep(store, settings, lambda *a: sent.append(a), schedulers)

    sweep_once()
    assert sent == []  # no gap marked: nothing says a consumer lost what it took
    mark_message_gap(store.r, store.prefix, settings)  # a heartbeat got Redis back
    sweep_once()
    assert [(job_id_, part) for _queue, job_id_, part, _token in sent] == [(job_id, 1)]
    new = sent[0][3]
    assert store.claims.claim(job_id, 1) == f"{new}|sent|"
    assert store.claims.start(job_id, 1, 0, live) == -1  # the dropped copy, if ever run: stale
    store.r.close()
