"""Redis that fails over mid-job (Sentinel: a master, a replica and three sentinels of the
test's own). The master and the first sentinel listed are SIGKILLed while workers run a job
(a host lost whole); Sentinel promotes the replica; every client reconnects through the
sentinels that are left, scripts are loaded again on the new master, and every sub-agent
ends with exactly one ``ok`` record. Once on the Redis broker (which fails over with
everything else) and once with RabbitMQ as the broker.

What the promoted replica lacks (the last writes before the kill) is redone: a checkpoint
that did not replicate means a turn asked again, a record that did not replicate a sub-agent
run again from its last replicated checkpoint, a message whose push did not replicate is
found by the sweep (DROVER_RESEND_AFTER_S) and sent again.

Jobs are submitted from a process of their own (``submit_elsewhere``): this process's Celery
app keeps the broker it was first built with.
"""

from __future__ import annotations

import collections
import json
import time

from drover import JobSpec
from drover.workers.connections.redis_clients import sync_redis
from tests.helpers import configure
from tests.helpers.fleet import (
    SHORT_BROKER_TIMEOUTS,
    VISIBILITY_TIMEOUT_S,
    Fleet,
    submit_elsewhere,
)

SUBAGENTS = 60
WORKER_THREADS = 6
MARGIN_S = 120  # for the rest of the job after the failover, on a busy 2-core machine


def records_written(env: dict[str, str], job_id: str) -> collections.Counter:
    """Records as the job's event stream saw them written: one per sub-agent, unless a
    sub-agent's second delivery wrote one too."""
    client = sync_redis(env["DROVER_REDIS_URL"], master=env["DROVER_SENTINEL_MASTER"],
                        decode_responses=True)
    entries = client.xrange(f"{env['DROVER_KEY_PREFIX']}:job:{job_id}:events")
    client.close()
    return collections.Counter(int(fields["i"]) if "i" in fields
                               else json.loads(fields["record"])["index"]
                               for _id, fields in entries if "i" in fields or "record" in fields)


def run_through_a_failover(sim, drover_env, spawn_worker, monkeypatch, sentinel_set,
                           **settings: object) -> None:
    configure(monkeypatch, drover_env, **sentinel_set.env(), **SHORT_BROKER_TIMEOUTS,
              **settings)
    sim.configure(latency_mean_s=0.3, latency_p95_s=0.6, output_tokens_mean=20, tool_turns=1,
                  tools_per_turn=1)
    spawn_worker(concurrency=WORKER_THREADS)
    spawn_worker(concurrency=WORKER_THREADS)
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Inspect crane {i}" for i in range(SUBAGENTS)], tools=["lookup_fact"],
        max_tokens=60))
    deadline = time.monotonic() + 180
    while handle.progress()["ok"] < 10:
        assert time.monotonic() < deadline, f"10 sub-agents not done: {handle.progress()}"
        time.sleep(0.2)

    old = sentinel_set.kill_master(with_sentinel=True)
    assert sentinel_set.wait_for_failover(old) != old
    fleet = Fleet(drover_env)
    result = fleet.wait(handle, SUBAGENTS, VISIBILITY_TIMEOUT_S + MARGIN_S)

    assert result.status == "done"
    assert [r.index for r in result.results] == list(range(SUBAGENTS))
    assert result.counts["ok"] == SUBAGENTS, [r.error for r in result.results
                                              if r.status != "ok"]
    written = records_written(drover_env, handle.id)
    assert sorted(written) == list(range(SUBAGENTS))
    assert all(count == 1 for count in written.values()), written
    stats = sim.stats()
    # only calls in flight at the kill, or whose checkpoint did not replicate, are asked twice
    assert stats["duplicate_accepted"] <= 2 * 2 * WORKER_THREADS, stats


def test_a_failover_mid_job_loses_nothing_on_the_redis_broker(
        sim, drover_env, spawn_worker, monkeypatch, sentinel_set):
    run_through_a_failover(sim, drover_env, spawn_worker, monkeypatch, sentinel_set)


def test_a_failover_mid_job_loses_nothing_with_rabbitmq_as_the_broker(
        sim, drover_env, spawn_worker, monkeypatch, sentinel_set, rabbitmq_url):
    run_through_a_failover(sim, drover_env, spawn_worker, monkeypatch, sentinel_set,
                           broker_url=rabbitmq_url)


# --- the claim race: a start the new master never saw ----------------------------------------

def test_a_claim_lost_in_a_failover_is_never_handed_to_a_second_delivery(sentinel_set):
    """Delivery A takes sub-agent 0's claim on the master, and that write never reaches the
    replica (the replica is stopped and its link cut first); the master dies and the replica
    is promoted, still saying the part's message is out with the old token. Delivery B (the
    broker's copy of the same message) takes the claim there: it must get a token A does not
    hold, so A's checkpoint, tool result and record are refused and only B's are stored."""
    import os
    import signal
    import uuid

    import pytest

    from drover.config import load_settings
    from drover.workers.jobs.claims import ClaimLost
    from drover.workers.jobs.records import Checkpoint, SubagentResult
    from drover.workers.services import Services

    shared = Services.from_settings(load_settings(
        redis_url=sentinel_set.url, sentinel_master=sentinel_set.master_name,
        key_prefix="ha-race"))
    store = shared.store
    job_id = uuid.uuid4().hex
    store.specs.create(job_id, JobSpec(subtasks=["a"], max_tokens=16), ["a"], status="running",
                       queue="q-race")
    sent = store.claims.takeover(job_id, 0, -1, "")  # the message is out with this token
    assert store.r.wait(1, 5000) == 1  # ... and the replica has it

    master = sentinel_set.master_port()
    replica = next(p for p in sentinel_set.redis_ports if p != master)
    os.kill(sentinel_set.procs[replica].pid, signal.SIGSTOP)
    try:
        with sentinel_set.client(master) as direct:
            direct.client_kill_filter(_type="replica")
        a = store.checkpoints.start(job_id, 0, worker="wA", token=sent)  # on the old master only
        assert a.token > sent and not a.stale
        old = sentinel_set.kill_master()
    finally:
        os.kill(sentinel_set.procs[replica].pid, signal.SIGCONT)
    assert sentinel_set.wait_for_failover(old) == replica

    # the same message, delivered again
    b = store.checkpoints.start(job_id, 0, worker="wB", token=sent)
    assert not b.stale and b.token > 0
    assert b.token != a.token
    # the same count within the part, of another epoch: without the epoch they would collide
    assert b.token % 1_000_000 == a.token % 1_000_000 and b.token > a.token
    with pytest.raises(ClaimLost):
        store.checkpoints.save(job_id, 0, Checkpoint(messages=[
            {"role": "user", "content": "late, from A"}]), token=a.token)
    with pytest.raises(ClaimLost):
        store.checkpoints.save_tool_result(job_id, 0, "toolu_1", {"content": "from A"},
                                           token=a.token)
    with pytest.raises(ClaimLost):
        store.records.put(SubagentResult(job_id=job_id, index=0, status="ok", summary="from A"),
                          token=a.token, worker="wA")
    mine = Checkpoint(messages=[{"role": "user", "content": "from B"}])
    store.checkpoints.save(job_id, 0, mine, token=b.token)
    store.checkpoints.save_tool_result(job_id, 0, "toolu_1", {"content": "from B"}, token=b.token)
    # (read before B's record: the record's write drops what only a resume needs, tool
    # results included, since each answer is kept once)
    assert store.checkpoints.tool_results(job_id, 0) == {"toolu_1": {"content": "from B"}}
    stored = store.records.put(SubagentResult(job_id=job_id, index=0, status="ok",
                                              summary="from B"), token=b.token, worker="wB")
    assert stored.summary == "from B"
    assert store.records.get(job_id, 0).summary == "from B"
    shared.close()


# --- the limiter after a failover -------------------------------------------------------------

STALE_S = 1.0  # how much of the limiter's state a failover may lose: docs/high-availability.md


def test_after_a_failover_the_limiter_lets_through_at_most_a_second_of_refill(
        sim, drover_env, spawn_worker, monkeypatch, sentinel_set):
    """The simulator enforces drover's own RPM with a one-second bucket (burst_s 1: any
    excess is a 429). Buckets, leases and cooldowns on the promoted replica may be up to
    about a second stale, so a failover may let through up to a second of refill above the
    limit: the provider answers it with 429s, each retried after a cooldown. No 60 s window
    goes over the limit by more than that, and every sub-agent ends ok."""
    rpm = 600
    configure(monkeypatch, drover_env, **sentinel_set.env(), **SHORT_BROKER_TIMEOUTS,
              rpm=rpm, burst_seconds=1)
    sim.configure(rpm=rpm, burst_s=1, latency_mean_s=0.2, latency_p95_s=0.4,
                  output_tokens_mean=20, tool_turns=1, tools_per_turn=1)
    spawn_worker(concurrency=WORKER_THREADS)
    spawn_worker(concurrency=WORKER_THREADS)
    handle = submit_elsewhere(drover_env, JobSpec(
        subtasks=[f"Inspect crane {i}" for i in range(SUBAGENTS)], tools=["lookup_fact"],
        max_tokens=60))
    deadline = time.monotonic() + 180
    while handle.progress()["ok"] < 10:
        assert time.monotonic() < deadline, f"10 sub-agents not done: {handle.progress()}"
        time.sleep(0.2)
    old = sentinel_set.kill_master(with_sentinel=True)
    sentinel_set.wait_for_failover(old)
    result = Fleet(drover_env).wait(handle, SUBAGENTS, VISIBILITY_TIMEOUT_S + MARGIN_S)

    assert result.counts["ok"] == SUBAGENTS, [r.error for r in result.results
                                              if r.status != "ok"]
    stats = sim.stats()
    one_second = rpm / 60 * STALE_S
    assert stats["rejected_429"] <= one_second, stats["by_status"]
    assert stats["max_60s"]["requests"] <= rpm + one_second, stats["max_60s"]
    # every 429 was asked again: each sub-agent's two calls were accepted (a repeat of one
    # whose checkpoint did not replicate is counted as a duplicate)
    assert stats["accepted"] - stats["duplicate_accepted"] == 2 * SUBAGENTS, stats


# --- every client moves to the new master ---------------------------------------------------

def test_sync_and_asyncio_clients_move_to_the_new_master_without_an_error(sentinel_set):
    """The command in flight when the master dies is retried until the sentinels name the
    promoted replica: no error reaches the caller, scripts are loaded again there (EVALSHA's
    NOSCRIPT fallback), and the first sentinel listed being dead changes nothing. (Before
    drover's own connection class, redis.asyncio retried the dead address until its retries
    ran out.)"""
    import asyncio

    from drover.workers.connections.redis_clients import async_redis

    sync = sync_redis(sentinel_set.url, master=sentinel_set.master_name)
    aio = async_redis(sentinel_set.url, master=sentinel_set.master_name)
    script = "return redis.call('INCR', KEYS[1])"
    sync_script, aio_script = sync.register_script(script), aio.register_script(script)
    assert sync_script(keys=["ha:n"]) == 1

    async def across_the_kill() -> tuple[int, int, int]:
        before = await aio_script(keys=["ha:n"])
        old = sentinel_set.kill_master(with_sentinel=True)
        after = await aio_script(keys=["ha:n"])  # blocks until the new master answers
        await aio.aclose()
        return old, before, after

    old, before, value = asyncio.run(across_the_kill())
    assert before == 2 and value >= 1
    assert sync_script(keys=["ha:n"]) == value + 1
    pipe = sync.pipeline()
    pipe.incr("ha:n")
    sync_script(keys=["ha:n"], client=pipe)
    assert pipe.execute() == [value + 2, value + 3]
    new = sentinel_set.wait_for_failover(old)
    assert sync.connection_pool.get_master_address()[1] == new
    sync.close()
