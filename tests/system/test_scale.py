"""Fan-out at scale: a large job is handed to the workers at submit, dispatched in pipelined
batches as one chord, cancellable before its messages are out, and joined a page at a time.

Real Redis, real worker subprocesses, the real SDK against the simulator. No timing
assertions: what is checked is the order of things (submit returned before any sub-agent
was published, the cancel stopped the dispatch) and what is stored.
"""

from __future__ import annotations

import base64
import json
import tracemalloc
import uuid

from drover import JobHandle, JobSpec, submit
from drover.workers.connections.redis_clients import sync_redis
from drover.workers.jobs import JobStore, SubagentResult
from tests.helpers import configure

UNLIMITED = {"rpm": "1e9", "itpm": "1e12", "otpm": "1e12", "max_in_flight": "100000"}


def test_a_2000_subagent_job_through_real_workers_completes_with_2000_records(
        sim, spawn_worker, drover_env, monkeypatch):
    configure(monkeypatch, drover_env, **UNLIMITED)
    sim.configure(tool_turns=0, latency_mean_s=0.0, latency_p95_s=0.0, output_tokens_mean=10)
    spawn_worker(concurrency=16)
    spawn_worker(concurrency=16)
    n = 2000
    handle = submit(JobSpec(subtasks=[f"One line on region {i}" for i in range(n)]))
    result = handle.wait(timeout=300)

    assert result.status == "done" and result.counts["ok"] == n
    assert [r.index for r in result.results] == list(range(n))
    assert sim.stats()["accepted"] == n
    assert handle.progress() == {"ok": n, "failed": 0, "cancelled": 0, "budget_exceeded": 0,
                                 "total": n, "pending": 0}
    assert sum(1 for _ in handle.records()) == n
    assert len({r.index for r in JobHandle.attach(handle.id).as_completed(timeout=60)}) == n


def test_submit_returns_before_the_fan_out_and_a_cancel_ends_the_job_without_it(
        sim, spawn_worker, drover_env, redis_client):
    n = 3000
    queue_key = f"{drover_env['DROVER_KEY_PREFIX']}:celery:{drover_env['DROVER_QUEUE']}"

    def queued() -> list[str]:
        return [json.loads(m)["headers"]["task"] for m in redis_client.lrange(queue_key, 0, -1)]

    # No worker yet: submit publishes the first window only (the fallback, 32 places).
    handle = submit(JobSpec(subtasks=[f"Grade answer {i}" for i in range(n)]))
    assert queued() == ["drover.run_subagent"] * 32
    assert handle.progress()["pending"] == n

    assert handle.cancel("not needed after all")
    # Every sub-agent that had not started has its record at once, in bulk; none of the
    # other 2,968 is ever published, the join goes out now.
    assert handle.progress()["cancelled"] == n
    assert sorted(queued()) == ["drover.join_results"] + ["drover.run_subagent"] * 32
    spawn_worker(concurrency=4)
    result = handle.wait(timeout=120)

    assert result.status == "cancelled" and result.reason == "not needed after all"
    assert result.counts["cancelled"] == n and len(result.results) == n
    assert all(r.error == "not needed after all" and r.usage.calls == 0
               for r in result.results)
    assert sim.stats()["accepted"] == 0
    assert sorted(r.index for r in handle.as_completed(timeout=30)) == list(range(n))


def test_dispatch_publishes_chord_members_in_bulk(drover_env, redis_client):
    from drover.config import get_settings
    from drover.workers.tasklayer.dispatch import dispatch

    settings = get_settings()
    job_id = uuid.uuid4().hex
    assert dispatch(job_id, range(1200), settings.queue) == 1200

    queued = [json.loads(m) for m in redis_client.lrange(
        f"{settings.key_prefix}:celery:{settings.queue}", 0, -1)]
    assert sorted(m["headers"]["group_index"] for m in queued) == list(range(1200))
    first = queued[0]
    assert first["headers"]["task"] == "drover.run_subagent"
    assert first["headers"]["group"] == job_id  # one chord per job, Celery's own fields
    chord = json.loads(base64.b64decode(first["body"]))[2]["chord"]
    assert chord["task"] == "drover.join_results" and chord["args"] == [job_id]


def test_the_join_holds_compact_records_whatever_the_stored_ones_weigh(drover_env):
    from drover.config import get_settings
    from drover.workers.agent.join import collect
    from drover.workers.jobs.records import JobResult, Usage, record_chars

    settings = get_settings()
    store = JobStore(sync_redis(settings.redis_url), prefix=settings.key_prefix)

    def job(job_id: str, n: int, error_chars: int) -> int:
        spec = JobSpec(subtasks=[f"t{i}" for i in range(n)])
        store.specs.create(job_id, spec, list(spec.subtasks), status="running",
                           queue=settings.queue)
        for i in range(n):
            store.records.put(SubagentResult(job_id=job_id, index=i, status="failed",
                                             summary="s" * 400, error="e" * error_chars))
        return n * error_chars

    def peak(job_id: str, n: int) -> tuple[int, int]:
        tracemalloc.start()
        try:
            tally = collect(store, job_id, n, page=50)
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        size = len(JobResult(job_id=job_id, status="done", results=tally.results,
                             counts=tally.counts, usage=Usage(), wall_s=0,
                             record_chars=tally.chars).model_dump_json())
        return peak_bytes, size

    n, small, big = 1000, uuid.uuid4().hex, uuid.uuid4().hex
    job(small, n, 200)
    stored = job(big, n, 40_000)  # 40 MB of error text in the records
    small_peak, small_size = peak(small, n)
    big_peak, big_size = peak(big, n)

    assert big_peak < stored / 4  # pages, not the whole hash at once
    assert big_size <= small_size + n * record_chars(n)  # each record's text is capped
    assert big_peak < 3 * small_peak + 50 * 40_000 * 4  # compact records + one page
    full = store.records.get(big, 7)
    assert full is not None and len(full.error or "") == 40_000  # the full one stays in Redis
    for job_id in (small, big):  # 80 MB of a shared Redis: gone now, not at the session's end
        store.r.delete(*store.r.keys(store.keys.job(job_id, "*")))
