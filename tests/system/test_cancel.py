"""Cancel and deadlines stop a job on every worker: no new request reaches the provider, no
lease is left behind, and the join still lists every sub-agent.

Real Redis, worker subprocesses, the real SDK against the simulator. "Nothing after the cancel"
is checked on the order of events (the simulator's arrival times against the records' times on
the same host, after the workers have stopped), never on a poller's timing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import redis

from drover import JobHandle, JobSpec, submit
from drover.workers.agent.errors import Cancelled
from drover.workers.agent.llm import CallContext, create_message
from drover.workers.limiter import Limiter, llm_scope
from tests.helpers import ROOT, configure, stop_process_group, wait_for_workers, wait_until


def _stop_workers(procs: list[subprocess.Popen]) -> None:
    """Stop the workers: any request one of them still had to send has been sent by then."""
    for proc in procs:
        stop_process_group(proc)


def _no_request_after_the_records(sim, result) -> None:  # noqa: ANN001
    """Every request reached the provider before the last record was written.

    The order of events on one host, not a duration: an aborted request arrived before its
    sub-agent saw the cancel and wrote its record, and nothing is sent after that.
    """
    last_record = max(r.finished_at for r in result.results)
    arrivals = sim.arrivals()
    assert arrivals and max(arrivals) < last_record




def _limiter(redis_url: str, env: dict[str, str]) -> tuple[Limiter, str]:
    from drover.config import get_settings

    limiter = Limiter(redis.Redis.from_url(redis_url), prefix=env["DROVER_KEY_PREFIX"])
    return limiter, llm_scope(env["DROVER_KEY_ALIAS"], get_settings().model)


def _completed_calls(result) -> int:  # noqa: ANN001
    return sum(r.usage.calls for r in result.results)


SLOW = {"latency_mean_s": 0.7, "latency_p95_s": 1.0, "tool_turns": 1, "tools_per_turn": 1}


def test_cancel_in_the_middle_stops_every_worker_and_keeps_finished_results(
        sim, spawn_worker, drover_env, redis_url, monkeypatch):
    # The limiter binds while the cancel comes: 600 requests/min on both sides and 32 worker
    # slots for 16 requests in flight, so some sub-agents wait for the bucket or a lease.
    sim.configure(**SLOW, rpm=600)
    configure(monkeypatch, drover_env, rpm=600, max_in_flight=16)
    workers = [spawn_worker(concurrency=16), spawn_worker(concurrency=16)]
    wait_for_workers(2)
    handle = submit(JobSpec(subtasks=[f"Assess supplier {i}" for i in range(200)],
                            tools=["lookup_fact"]))
    early = []
    for record in handle.as_completed(timeout=120):
        early.append(record)
        if len(early) == 20:
            break
    assert handle.cancel()
    cancelled_at = time.time()
    result = handle.wait(timeout=120)
    _stop_workers(workers)

    _no_request_after_the_records(sim, result)
    # At most the requests already on their way (one per lease) arrive after the cancel.
    assert len([t for t in sim.arrivals() if t > cancelled_at]) <= 16
    assert result.status == "cancelled" and result.reason == "cancelled"
    assert [r.index for r in result.results] == list(range(200))
    assert result.counts["ok"] + result.counts["cancelled"] == 200
    assert result.counts["ok"] >= 20 and result.counts["cancelled"] >= 100
    for record in early:  # finished before the cancel: kept as they were
        assert record.status == "ok" and result.results[record.index] == record
    never_started = [r for r in result.by_status("cancelled") if r.usage.calls == 0]
    assert len(never_started) >= 100 and all(r.error == "cancelled" for r in never_started)
    # Requests in flight at the cancel were aborted: the provider took them, no one waited
    # for their answers (at most one per lease: 32 slots never had more than 16 out).
    stats = sim.stats()
    aborted = stats["accepted"] - _completed_calls(result)
    assert 1 <= aborted <= 16 and stats["max_in_flight"] <= 16
    limiter, scope = _limiter(redis_url, drover_env)
    assert limiter.state(scope)["leases"] == 0
    # Aborted calls stay counted (the provider counted them), calls never sent do not.
    limiter_requests = sum(row["requests"] for row in limiter.usage(scope, 600))
    assert stats["accepted"] <= limiter_requests <= stats["accepted"] + 2


def test_a_deadline_ends_a_long_job_the_same_way(sim, spawn_worker, drover_env, redis_url):
    sim.configure(**SLOW)
    workers = [spawn_worker(concurrency=8)]
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Assess depot {i}" for i in range(100)],
                            tools=["lookup_fact"], deadline_s=3))
    deadline = float(handle.store.meta.get(handle.id)["deadline"])  # Redis's clock (this host's)
    result = handle.wait(timeout=120)
    _stop_workers(workers)

    _no_request_after_the_records(sim, result)
    assert len([t for t in sim.arrivals() if t > deadline]) <= 8  # one per slot, on its way
    assert result.status == "cancelled" and result.reason == "deadline"
    assert [r.index for r in result.results] == list(range(100))
    assert result.counts["ok"] >= 1 and result.counts["cancelled"] >= 50
    assert result.counts["ok"] + result.counts["cancelled"] == 100
    assert all(r.error == "deadline" for r in result.by_status("cancelled"))
    assert sim.stats()["accepted"] - _completed_calls(result) >= 1  # in-flight ones aborted
    limiter, scope = _limiter(redis_url, drover_env)
    assert limiter.state(scope)["leases"] == 0


def test_a_deadline_aborts_a_call_in_flight_with_no_cancel_message(sim, spawn_worker,
                                                                    drover_env):
    # One sub-agent, one very slow call: nothing checks the store while it waits, and no
    # other worker announces the deadline. Only the worker's own timer can stop it.
    sim.configure(latency_mean_s=9, latency_p95_s=9, tool_turns=0)
    spawn_worker(concurrency=2)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=["Write the long report"], deadline_s=4))
    result = handle.wait(timeout=60)

    record = result.results[0]
    assert record.status == "cancelled" and record.error == "deadline"
    assert record.usage.calls == 0  # its one call never answered: it was aborted
    assert record.usage.unanswered_calls == 1  # and the provider bills it: counted
    # Its stream was closed: the provider stops generating (and billing) it.
    wait_until("the aborted stream closed", lambda: sim.stats()["in_flight"] == 0, timeout=10)
    assert sim.stats()["accepted"] == 1 and sim.stats()["streams"]["abandoned"] == 1


def test_cancel_aborts_in_flight_calls_and_refunds_what_was_not_sent(sim, monkeypatch,
                                                                     drover_env, redis_url):
    # One request/s: the first call goes out at once, the second waits for the bucket.
    configure(monkeypatch, drover_env, rpm=60, target_utilization=1)
    sim.configure(latency_mean_s=4, latency_p95_s=4)
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    rt = get_runtime(services())
    params = {"model": rt.settings.model, "max_tokens": 50,
              "messages": [{"role": "user", "content": "Summarise the contract"}]}

    async def two_calls() -> list[object]:
        cancel = asyncio.Event()
        calls = [asyncio.ensure_future(create_message(rt, params, CallContext("j", i, cancel)))
                 for i in range(2)]
        while sim.stats()["in_flight"] < 1:  # the first call has reached the provider
            await asyncio.sleep(0.01)
        cancel.set()
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = rt.run(two_calls())

    assert all(isinstance(o, Cancelled) for o in outcomes)
    # We stopped waiting, before its answer: its stream was closed.
    wait_until("the aborted stream closed", lambda: sim.stats()["in_flight"] == 0, timeout=10)
    stats = sim.stats()
    assert stats["streams"]["abandoned"] == stats["accepted"]
    limiter, scope = _limiter(redis_url, drover_env)
    assert limiter.state(scope)["leases"] == 0
    usage = limiter.usage(scope, 60)
    # The sent call stays counted, with its input; the unsent one was refunded entirely;
    # neither generated output.
    assert sum(row["requests"] for row in usage) == stats["accepted"]
    assert sum(row["output_tokens"] for row in usage) == 0


def test_cancelling_a_job_while_it_plans_ends_it_without_fanning_out(sim, spawn_worker,
                                                                      drover_env):
    sim.configure(latency_mean_s=5, latency_p95_s=5, plan_items=5)
    spawn_worker(concurrency=2)
    handle = submit(JobSpec(goal="Plan the depot network", max_subtasks=5))
    while sim.stats()["in_flight"] < 1:  # the planning call is out
        time.sleep(0.05)
    assert handle.cancel("changed my mind")
    result = handle.wait(timeout=60)

    assert result.status == "cancelled" and result.reason == "changed my mind"
    assert result.results == [] and sim.stats()["accepted"] == 1
    assert list(handle.as_completed(timeout=5)) == []


def test_drover_cancel_and_watch_work_from_another_process(sim, spawn_worker, drover_env):
    sim.configure(**SLOW)
    spawn_worker(concurrency=4)
    # One sub-agent of 40 tool turns (about 30 s of calls) keeps the job running well past the
    # start of two CLI processes on a loaded box: 40 short ones alone had all ended by then.
    subtasks = ["Assess route 0 [[sim:turns=40]]", *(f"Assess route {i}" for i in range(1, 40))]
    handle = submit(JobSpec(subtasks=subtasks, tools=["lookup_fact"], max_turns=45))
    env = {**os.environ, "COLUMNS": "200"}  # os.environ holds this test's DROVER_* settings
    watch = subprocess.Popen(_cli("watch", handle.id), cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = next(handle.as_completed(timeout=60))
    cancel = subprocess.run(_cli("cancel", handle.id), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    out, err = watch.communicate(timeout=90)

    assert cancel.returncode == 0 and "cancelling job" in cancel.stdout
    assert watch.returncode == 1, err  # the job did not finish "done"
    assert f"#{first.index} ok" in out
    assert "status=cancelled" in out
    result = JobHandle.attach(handle.id).result()
    assert result is not None and result.status == "cancelled"
    again = subprocess.run(_cli("cancel", handle.id), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "already ended" in again.stdout


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "drover.orchestrator.cli", *args]


TOOL_MODULES = "drover.workers.tools.demo,tests.helpers.agent_tools"


def test_cancel_stops_the_tools_that_are_running(sim, worker, monkeypatch, drover_env,
                                                 redis_client):
    from tests.helpers import agent_tools

    configure(monkeypatch, drover_env, tool_modules=TOOL_MODULES)
    sim.configure(tool_turns=1, tools_per_turn=2)
    worker(concurrency=4)
    key = f"{agent_tools.probe_key()}:log"

    def events() -> list[dict]:
        return [json.loads(x) for x in redis_client.lrange(key, 0, -1)]

    handle = submit(JobSpec(subtasks=[f"Survey archive {i}" for i in range(3)],
                            tools=["probe_slow"]))
    wait_until("six slow lookups running",
               lambda: len([e for e in events() if e["event"] == "started"]) == 6)
    assert handle.cancel()
    result = handle.wait(timeout=60)

    assert result.status == "cancelled" and result.counts["cancelled"] == 3
    started = sorted(e["item"] for e in events() if e["event"] == "started")
    stopped = sorted(e["item"] for e in events() if e["event"] == "stopped")
    assert stopped == started  # every running tool was stopped, not left to run 30 s
    assert not [e for e in events() if e["event"] == "finished"]


def test_a_cancelled_job_gets_no_synthesis(sim, spawn_worker, drover_env):
    sim.configure(**SLOW)
    workers = [spawn_worker(concurrency=8)]
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Assess warehouse {i}" for i in range(40)],
                            tools=["lookup_fact"], synthesize=True))
    next(handle.as_completed(timeout=60))
    assert handle.cancel()
    result = handle.wait(timeout=60)
    _stop_workers(workers)

    assert result.status == "cancelled" and not result.synthesis
    _no_request_after_the_records(sim, result)  # a synthesis call would come after them


def test_a_subagent_waiting_out_a_countdown_ends_cancelled_without_another_call(
        sim, worker, drover_env):
    """Every call draws a 429 with retry-after 6 s until the job is cancelled, and succeeds
    after: a call before the cancel cannot succeed, one after it would. So "no call after
    the cancel" is "nothing accepted", whatever the timing: a countdown that ends between
    the poll and the cancel only makes another 429 and another countdown. (The test used to
    stop the 429s before the cancel, and then a countdown ending in between made a call that
    succeeded: the job had one ``ok``.)"""
    from drover.workers.app import app

    # Each sub-agent's call draws a 429 (its send marked, so the cancel leaves it to record
    # itself): both wait out a Celery countdown, which a provider's retry-after still is
    # (the window's line holds only what the limiter could not serve in its horizon).
    sim.configure(inject_429_rate=1.0, inject_429_retry_after=6, tool_turns=0)
    worker(concurrency=4)
    handle = submit(JobSpec(subtasks=["Assess port A", "Assess port B"]))

    def scheduled() -> int:
        # A generous timeout: a reply missed on a loaded box only means another poll.
        replies = app.control.inspect(timeout=2.0).scheduled() or {}
        return sum(len(tasks) for tasks in replies.values())

    wait_until("both sub-agents waiting out a countdown", lambda: scheduled() == 2)
    assert sim.stats()["accepted"] == 0
    assert handle.cancel()
    sim.configure(inject_429_rate=0.0)  # from now on a call would be accepted
    result = handle.wait(timeout=60)

    assert result.status == "cancelled" and result.counts["cancelled"] == 2
    assert all(r.usage.calls == 0 and r.error == "cancelled" for r in result.results)
    assert sim.stats()["accepted"] == 0  # no call once the countdown was over


def test_cancel_ends_a_job_whose_parts_dead_workers_held(sim, spawn_worker, drover_env,
                                                        monkeypatch):
    """Both workers kill -9ed mid-job under a tight limit (sub-agents running, waiting for
    the limiter, in countdowns, in the window's line): the cancel alone records every
    sub-agent without a record as cancelled at once (none runs on a live worker), and the
    first worker that comes back runs the join: the job ends cancelled, nothing pending."""
    import signal

    configure(monkeypatch, drover_env, rpm=60, countdown_cap_s=30)
    sim.configure(rpm=60, tool_turns=1, tools_per_turn=1, latency_mean_s=0.3,
                  latency_p95_s=0.6, output_tokens_mean=20)
    workers = [spawn_worker(concurrency=4) for _ in range(2)]
    handle = submit(JobSpec(subtasks=[f"Seal container {i}" for i in range(24)],
                            tools=["lookup_fact"], max_tokens=40))
    wait_until("a few sub-agents done", lambda: handle.progress()["ok"] >= 3, 180)
    r = redis.Redis.from_url(drover_env["DROVER_REDIS_URL"], decode_responses=True)
    prefix = drover_env["DROVER_KEY_PREFIX"]
    pids = {str(proc.pid) for proc in workers}
    ours = [w for w in r.zrange(f"{prefix}:workers", 0, -1) if w.split(":")[-2] in pids]
    assert ours
    for proc in workers:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Dead as far as anyone can know: their heartbeats have expired (DROVER_HEARTBEAT_TTL_S).
    wait_until("the killed workers' heartbeats gone", lambda: not any(
        r.exists(f"{prefix}:worker:{w}") for w in ours), 60)
    assert handle.cancel("stopped by the test")
    # At once, every sub-agent has its record but those whose call was sent and never
    # answered (their send mark): the copies the sweep re-sends record those, counting it.
    records = set(r.hkeys(f"{prefix}:job:{handle.id}:records"))
    marked = set(r.hkeys(f"{prefix}:job:{handle.id}:sent"))
    assert {str(i) for i in range(24)} - records <= marked, (records, marked)
    spawn_worker(concurrency=2)
    result = handle.wait(timeout=120)
    assert result.status == "cancelled"
    assert {r.status for r in result.results} <= {"ok", "cancelled"}
    assert handle.progress()["pending"] == 0
