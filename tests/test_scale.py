"""Fan-out at scale: a large job is handed to the workers at submit, dispatched in pipelined
batches as one chord, cancellable before its messages are out, and joined a page at a time.

Real Redis, real worker subprocesses, the real SDK against the simulator. No timing
assertions: what is checked is the order of things (submit returned before any sub-agent
was published, the cancel stopped the dispatch) and what is stored.
"""

from __future__ import annotations

import json
import tracemalloc
import uuid

from orchestrator import JobHandle, JobSpec, submit
from tests.conftest import configure
from workers.jobs import JobStore, SubagentResult, sync_redis

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
    meta = handle.store.meta(handle.id)
    assert int(meta["dispatched"]) == n  # the launch task published every one
    assert sum(1 for _ in handle.records()) == n
    assert len({r.index for r in JobHandle.attach(handle.id).as_completed(timeout=60)}) == n


def test_submit_returns_before_the_fan_out_and_a_cancel_ends_the_job_without_it(
        sim, spawn_worker, drover_env, redis_client):
    n = 3000
    # No worker yet: submit returns with the fan-out still to do (it is a worker's job).
    handle = submit(JobSpec(subtasks=[f"Grade answer {i}" for i in range(n)]))
    queue_key = f"{drover_env['DROVER_KEY_PREFIX']}:celery:{drover_env['DROVER_QUEUE']}"
    assert "dispatched" not in handle.store.meta(handle.id)
    assert redis_client.llen(queue_key) == 1  # the launch task, not 3,000 sub-agents
    assert handle.progress()["pending"] == n

    assert handle.cancel("not needed after all")
    # Every sub-agent that had not started has its record at once, in bulk.
    assert handle.progress()["cancelled"] == n
    spawn_worker(concurrency=4)
    result = handle.wait(timeout=120)

    assert result.status == "cancelled" and result.reason == "not needed after all"
    assert result.counts["cancelled"] == n and len(result.results) == n
    assert all(r.error == "not needed after all" and r.usage.calls == 0
               for r in result.results)
    assert sim.stats()["accepted"] == 0
    assert "dispatched" not in handle.store.meta(handle.id)  # no sub-agent was ever published
    assert sorted(r.index for r in handle.as_completed(timeout=30)) == list(range(n))


def test_a_cancel_stops_the_dispatch_at_the_next_batch(drover_env, redis_client):
    from config import get_settings
    from workers.dispatch import fan_out

    settings = get_settings()
    cancels: list[int] = []

    class CancelAfterFirstBatch(JobStore):
        def set_dispatched(self, job_id: str, count: int) -> None:
            super().set_dispatched(job_id, count)
            if not cancels:
                cancels.append(count)
                self.cancel(job_id, "stop")

    store = CancelAfterFirstBatch(sync_redis(settings.redis_url), prefix=settings.key_prefix)
    n, batch, job_id = 1000, 100, uuid.uuid4().hex
    spec = JobSpec(subtasks=[f"Check item {i}" for i in range(n)])
    store.create(job_id, spec, list(spec.subtasks), status="queued", queue=settings.queue)
    store.claim_launch(job_id)
    done = fan_out(store, job_id, settings.queue, batch=batch)

    assert done.cancelled and done.dispatched == batch and cancels == [batch]
    queued = [json.loads(m) for m in redis_client.lrange(
        f"{settings.key_prefix}:celery:{settings.queue}", 0, -1)]
    tasks = [m["headers"]["task"] for m in queued]
    assert tasks.count("drover.run_subagent") == batch and tasks.count("drover.join_results") == 1
    member = next(m for m in queued if m["headers"]["task"] == "drover.run_subagent")
    assert member["headers"]["group"] == job_id  # one chord per job, Celery's own fields
    assert store.status_counts(job_id, n)["cancelled"] == n


def test_the_join_holds_compact_records_whatever_the_stored_ones_weigh(drover_env):
    from config import get_settings
    from workers.agent.join import collect
    from workers.jobs.records import JobResult, Usage, record_chars

    settings = get_settings()
    store = JobStore(sync_redis(settings.redis_url), prefix=settings.key_prefix)

    def job(job_id: str, n: int, error_chars: int) -> int:
        spec = JobSpec(subtasks=[f"t{i}" for i in range(n)])
        store.create(job_id, spec, list(spec.subtasks), status="running", queue=settings.queue)
        for i in range(n):
            store.finish(SubagentResult(job_id=job_id, index=i, status="failed",
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
    full = store.record(big, 7)
    assert full is not None and len(full.error or "") == 40_000  # the full one stays in Redis
    for job_id in (small, big):  # 80 MB of a shared Redis: gone now, not at the session's end
        store.r.delete(*store.r.keys(store.key(job_id, "*")))
