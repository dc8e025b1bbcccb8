"""Crashes under a running job: Redis killed and started again, a task message the broker
lost, and the recovery sweep on its own. Every sub-agent still ends ``ok`` and no finished
result is lost. (A killed, paused or stopped worker: tests/system/test_worker_loss.py, with default
settings.)

The Redis restart test runs with a short visibility timeout (15 s) and the countdown cap and
task time limit that Settings requires under it: a message a worker had taken when Redis died
comes back through the broker. The resumed sub-agents resume from their checkpoints: only a
call that was in flight at the moment of the crash can be sent twice.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from drover import JobSpec, submit
from drover.config import Settings, load_settings
from drover.workers.connections.redis_clients import sync_redis
from drover.workers.jobs.claims import token_of
from drover.workers.jobs.records import SubagentResult
from drover.workers.jobs.store import JobStore
from drover.workers.recovery import subagent_of, subagents_in_broker, sweep
from drover.workers.services import Services
from tests.helpers import configure, wait_until
from tests.helpers.fleet import SHORT_BROKER_TIMEOUTS, VISIBILITY_TIMEOUT_S, submit_elsewhere
from tests.helpers.private_redis import PrivateRedis

# Time for the rest of a job after the tasks come back, generous for a busy 2-core machine.
MARGIN_S = 75
WORKER_THREADS = 8


def test_a_task_message_the_broker_lost_is_sent_again(sim, drover_env, spawn_worker,
                                                      monkeypatch, redis_url):
    configure(monkeypatch, drover_env, resend_after_s=3)
    handle = submit(JobSpec(subtasks=[f"Weigh cargo {i}" for i in range(10)], max_tokens=60))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    prefix, queue = drover_env["DROVER_KEY_PREFIX"], drover_env["DROVER_QUEUE"]
    ours = {s for s in subagents_in_broker(client, prefix, queue) if s[0] == handle.id}
    assert ours == {(handle.id, i) for i in range(10)}
    # Take sub-agent 4's message off the queue, as a worker killed right after its BRPOP does
    # (before kombu records the message as unacked): the broker has no copy left.
    queue_key = f"{prefix}:celery:{queue}"
    lost = [raw for raw in client.lrange(queue_key, 0, -1)
            if subagent_of(json.loads(raw)) == (handle.id, 4)]
    assert len(lost) == 1 and client.lrem(queue_key, 1, lost[0]) == 1

    spawn_worker(concurrency=4)
    result = handle.wait(timeout=90)

    assert result.status == "done"
    assert result.counts["ok"] == 10, [r.error for r in result.results if r.status != "ok"]
    assert client.hgetall(f"{prefix}:job:{handle.id}:resent") == {"4": "1"}  # sent once more
    assert client.hget(f"{prefix}:job:{handle.id}:claims", "4") is None  # its claim ended
    assert sim.stats()["accepted"] == 10  # nothing else ran twice
    client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    with contextlib.suppress(Exception):
        server.kill()


def test_redis_killed_and_restarted_mid_job_loses_no_result(sim, drover_env, spawn_worker,
                                                            monkeypatch, private_redis):
    configure(monkeypatch, drover_env, redis_url=private_redis.url, **SHORT_BROKER_TIMEOUTS)
    sim.configure(latency_mean_s=0.3, latency_p95_s=0.6, output_tokens_mean=20, tool_turns=1,
                  tools_per_turn=1)
    spawn_worker(concurrency=WORKER_THREADS)
    spawn_worker(concurrency=WORKER_THREADS)
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Inspect crane {i}" for i in range(100)], tools=["lookup_fact"],
        max_tokens=60))
    wait_until("25 sub-agents done", lambda: handle.progress()["ok"] >= 25, 120)
    done_before = {r.index for r in handle.store.records.all(handle.id).values()}

    private_redis.kill()
    time.sleep(5)  # Redis stays away a while: what the workers must ride out
    private_redis.start()
    try:
        result = handle.wait(timeout=VISIBILITY_TIMEOUT_S + MARGIN_S + 30)
    except TimeoutError as error:
        from tests.helpers.fleet import Fleet
        fleet = Fleet({**drover_env, "DROVER_REDIS_URL": private_redis.url})
        raise AssertionError(f"{error}: {fleet.explain(handle.id, 100)}") from None

    assert result.status == "done"
    assert [r.index for r in result.results] == list(range(100))
    assert result.counts["ok"] == 100, [r.error for r in result.results if r.status != "ok"]
    assert done_before <= {r.index for r in result.results if r.status == "ok"}
    stats = sim.stats()
    assert stats["duplicate_accepted"] <= 2 * WORKER_THREADS  # only calls in flight at the crash
    assert stats["accepted"] - stats["duplicate_accepted"] == result.usage.calls == 200


# --- the recovery sweep on its own (real Redis, no workers) ----------------------------------

def kombu_envelope(job_id: str, index: int) -> str:
    """A run_subagent message as kombu stores it in Redis (the test above reads real ones)."""
    body = json.dumps([[job_id, index], {}, {"callbacks": None, "errbacks": None,
                                              "chain": None, "chord": None}])
    return json.dumps({"body": base64.b64encode(body.encode()).decode(),
                       "content-type": "application/json",
                       "headers": {"task": "drover.run_subagent", "id": f"t-{index}"},
                       "properties": {"body_encoding": "base64", "delivery_tag": f"d-{index}"}})


def sweep_into(sent: list, store: JobStore, settings: Settings) -> list:
    """One sweep, its re-sends appended to ``sent``, with the queues' schedulers as the
    worker's root hands them to its sweeper."""
    return sweep(store, settings, lambda *args: sent.append(args),
                 Services(settings, client=store.r).fairshare)


def minted(store: JobStore, job_id: str, part: int | str) -> int:
    """The token the part's claim carries now (the one the sweep minted)."""
    token = token_of(store.claims.claim(job_id, part))
    assert token > 0
    return token


# The sweep re-sends a part missing for DROVER_RESEND_AFTER_S. The tests' own steps between two
# sweeps must take less than that, or a sweep meant to only notice already re-sends: 0.2 s was
# exceeded beside a busy test run (the part given up on one round early). 1 s is far beyond
# those steps' time and keeps each test a few seconds long.
RESEND_S = 1.0


def test_the_sweep_resends_only_tasks_the_broker_no_longer_has_and_never_gives_them_up(
        redis_url, key_prefix):
    """The sweep leaves a queued and an unacked message alone, re-sends a lost one with a new
    claim token, and again each time it is lost again: past DROVER_MAX_ATTEMPTS too, since a
    message the broker lost is the broker's fault, not the sub-agent's (issue 53: a stuck
    connection's messages spent the budget and sub-agents nobody lost failed)."""
    settings = load_settings(key_prefix=key_prefix, queue="q-sweep", resend_after_s=RESEND_S,
                             max_attempts=2)
    store = JobStore(sync_redis(redis_url), prefix=key_prefix, ttl_s=600)
    job_id = "sweepjob"
    store.specs.create(job_id, JobSpec(subtasks=["a", "b", "c", "d"]), ["a", "b", "c", "d"],
                       status="queued", queue="q-sweep")
    store.meta.claim_launch(job_id)
    store.records.put(SubagentResult(job_id=job_id, index=0, status="ok"))
    # 1 is still queued, 2 is unacked (taken by a worker), 3 is nowhere: lost.
    store.r.lpush(f"{key_prefix}:celery:q-sweep", kombu_envelope(job_id, 1))
    store.r.hset(f"{key_prefix}:celery:unacked", "d-2",
                 json.dumps([json.loads(kombu_envelope(job_id, 2)), "", "q-sweep"]))
    sent: list[tuple[str, str, int | None]] = []

    def sweep_after_a_stall() -> list:
        unlock(store)  # the locks of the previous sweep
        first = sweep_into(sent, store, settings)
        time.sleep(RESEND_S + 0.2)  # past DROVER_RESEND_AFTER_S: still missing, so lost
        unlock(store)
        return first + sweep_into(sent, store, settings)

    assert sweep_after_a_stall() == [(job_id, 3)]
    # with a new claim token (the first one minted: EPOCH * 1000000 + 1, see claims.py)
    assert sent == [("q-sweep", job_id, 3, minted(store, job_id, 3))]
    assert minted(store, job_id, 3) % 1_000_000 == 1
    sweep_after_a_stall()  # lost again: sent a second time
    assert sent[-1] == ("q-sweep", job_id, 3, minted(store, job_id, 3)) and len(sent) == 2
    assert minted(store, job_id, 3) == sent[0][3] + 1
    sweep_after_a_stall()  # and a third time, past DROVER_MAX_ATTEMPTS=2: not given up
    assert sent[-1] == ("q-sweep", job_id, 3, minted(store, job_id, 3)) and len(sent) == 3
    assert all(store.records.get(job_id, i) is None for i in (1, 2, 3))


def test_only_a_worker_that_died_running_a_sub_agent_spends_its_budget(redis_url, key_prefix):
    """A dead worker's parts are sent again every time; a sub-agent is failed as lost only
    once workers died running it DROVER_MAX_ATTEMPTS times (a task that kills its worker). A
    part a dead worker merely held, and one running on a worker that stopped beating because
    its broker connection was stuck (``{prefix}:worker:{id}:stuck``), spend nothing."""
    settings = load_settings(key_prefix=key_prefix, queue="q-deaths", max_attempts=2)
    store = JobStore(sync_redis(redis_url), prefix=key_prefix, ttl_s=600)
    job_id = "deathjob"
    store.specs.create(job_id, JobSpec(subtasks=["a", "b", "c"]), ["a", "b", "c"],
                       status="queued", queue="q-deaths")
    store.meta.claim_launch(job_id)
    sent: list[tuple] = []

    def die(worker: str, index: int, running: bool, stuck: bool = False) -> None:
        """``worker`` took the sub-agent's message (and ran it), then its heartbeat went."""
        token = token_of(store.claims.claim(job_id, index))
        assert store.claims.receive(job_id, index, token, worker) == 1
        if running:
            assert store.claims.start(job_id, index, token, worker) > 0
        store.r.zadd(f"{key_prefix}:workers", {worker: time.time()})  # no heartbeat key
        if stuck:
            store.r.set(f"{key_prefix}:worker:{worker}:stuck", '["the Celery consumer"]')
        unlock(store)
        sweep_into(sent, store, settings)

    for attempt in range(4):  # held only, or running on a worker stuck on its broker: free
        die(f"held:{attempt}:w", 0, running=False)
        die(f"stuck:{attempt}:w", 1, running=True, stuck=True)
    for attempt in range(2):  # two deaths while running it: within DROVER_MAX_ATTEMPTS=2
        die(f"dead:{attempt}:w", 2, running=True)
    assert [s[2] for s in sent].count(2) == 2
    assert all(store.records.get(job_id, i) is None for i in range(3))
    die("dead:2:w", 2, running=True)  # the third: given up on
    record = store.records.get(job_id, 2)
    assert record is not None and record.status == "failed" and record.error_type == "task_lost"
    assert "died while running it 2 times" in (record.error or "")
    assert [s[2] for s in sent].count(0) == 4 and [s[2] for s in sent].count(1) == 4



def test_the_stalled_job_scan_leaves_a_sub_agent_running_on_a_live_worker(redis_url, key_prefix):
    """Redis broker: a sub-agent that runs past the visibility timeout has no message left in
    the broker (kombu handed it out again and the late copy acked it), but its claim says
    ``running`` on a worker whose heartbeat lives: the stalled-job scan leaves it be. Beside
    it, a sub-agent that is nowhere is sent again (so the scan did run)."""
    from drover.workers.jobs.liveness import heartbeat_key

    settings = load_settings(key_prefix=key_prefix, queue="q-live", resend_after_s=RESEND_S)
    store = JobStore(sync_redis(redis_url), prefix=key_prefix, ttl_s=600)
    job_id = "livejob"
    store.specs.create(job_id, JobSpec(subtasks=["a", "b"]), ["a", "b"], status="queued",
                       queue="q-live")
    store.meta.claim_launch(job_id)
    worker = "livehost:1:abc"
    store.r.zadd(f"{key_prefix}:workers", {worker: time.time()})
    store.r.set(heartbeat_key(key_prefix, worker), "1", ex=600)  # alive
    assert store.claims.start(job_id, 0, 0, worker) > 0
    running = store.claims.claim(job_id, 0)
    assert running is not None and running.endswith(f"|running|{worker}")
    sent: list[tuple] = []
    sweep_into(sent, store, settings)
    time.sleep(RESEND_S + 0.2)  # past DROVER_RESEND_AFTER_S: the job is stalled
    unlock(store)
    sweep_into(sent, store, settings)
    assert sent == [("q-live", job_id, 1, minted(store, job_id, 1))], (
        "the scan sent again a sub-agent running on a live worker" if any(
            s[2] == 0 for s in sent) else sent)
    assert store.claims.claim(job_id, 0) == running


def unlock(store: JobStore) -> None:
    store.r.delete(f"{store.prefix}:recovery:lock", f"{store.prefix}:recovery:scan")


def test_the_sweep_sends_the_join_of_a_job_whose_records_are_all_in(redis_url, key_prefix):
    settings = load_settings(key_prefix=key_prefix, queue="q-sweep", resend_after_s=RESEND_S)
    store = JobStore(sync_redis(redis_url), prefix=key_prefix, ttl_s=600)
    # joinjob runs on another queue of this deployment: its join goes to its own queue.
    store.specs.create("joinjob", JobSpec(subtasks=["a"]), ["a"], status="queued",
                       queue="other-queue")
    store.meta.claim_launch("joinjob")
    store.specs.create("ourjob", JobSpec(subtasks=["a"]), ["a"], status="queued", queue="q-sweep")
    store.meta.claim_launch("ourjob")
    for job_id in ("joinjob", "ourjob"):
        store.records.put(SubagentResult(job_id=job_id, index=0, status="ok"))
    sent: list[tuple[str, str, int | None]] = []
    sweep_into(sent, store, settings)
    time.sleep(RESEND_S + 0.2)  # past DROVER_RESEND_AFTER_S, when the sweep sends what is due
    unlock(store)
    sweep_into(sent, store, settings)
    assert sorted(sent) == [("other-queue", "joinjob", "join", minted(store, "joinjob", "join")),
                            ("q-sweep", "ourjob", "join", minted(store, "ourjob", "join"))]


def test_a_message_taken_by_a_worker_that_died_before_recording_it_is_sent_again(
        redis_url, key_prefix):
    """kombu recorded the message as unacked, the worker died before drover's receipt: the
    claim still says "sent", the broker would hand it out only after the visibility
    timeout. The sweep that finds the dead worker re-sends it from the unacked hash."""
    settings = load_settings(key_prefix=key_prefix, queue="q-orphan")
    store = JobStore(sync_redis(redis_url), prefix=key_prefix, ttl_s=600)
    store.specs.create("orphanjob", JobSpec(subtasks=["a", "b"]), ["a", "b"], status="queued",
                       queue="q-orphan")
    store.meta.claim_launch("orphanjob")
    store.r.hset(f"{key_prefix}:celery:unacked", "d-1",
                 json.dumps([json.loads(kombu_envelope("orphanjob", 1)), "", "q-orphan"]))
    store.r.zadd(f"{key_prefix}:celery:unacked_index", {"d-1": time.time() - 30})
    store.r.zadd(f"{key_prefix}:workers", {"deadhost:1:abc": time.time() - 60})  # no heartbeat
    sent: list[tuple] = []
    assert sweep_into(sent, store, settings) == [("orphanjob", 1)]
    assert sent == [("q-orphan", "orphanjob", 1, minted(store, "orphanjob", 1))]
    unlock(store)
    sweep_into(sent, store, settings)
    assert len(sent) == 1  # its claim now carries a token: the old copy is no orphan any more
