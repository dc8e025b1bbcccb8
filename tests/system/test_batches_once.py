"""A Message Batch is created once: the batcher records its intent (the requests' custom_ids,
under the job) before the create call, and a batcher that never learnt what its create call
made (it died, or the answer was lost) is followed by one that adopts the batch from the
provider's list instead of sending the requests again.

Worker subprocesses, Redis, the real SDK against the simulator, whose create call can hold
back or drop its answer after the batch exists.
"""

from __future__ import annotations

import contextlib
import os
import signal

from drover import JobSpec, submit
from tests.helpers import configure, wait_for_workers, wait_until

FAST = {"DROVER_BATCH_LINGER_S": "0.3", "DROVER_BATCH_POLL_S": "0.2",
        "DROVER_BATCH_TICK_S": "0.1", "DROVER_BATCH_RPM": "6000",
        "DROVER_RESEND_AFTER_S": "600", "DROVER_BATCH_LOCK_S": "3"}


def _created(sim) -> int:  # noqa: ANN001
    return sim.stats()["batches"]["batches_created"]


def test_a_batcher_killed_right_after_the_create_call_leaves_one_batch_billed(
        sim, spawn_worker, drover_env, monkeypatch):
    # All ten requests in one batch: it goes out when the tenth waits.
    configure(monkeypatch, drover_env, **{**FAST, "DROVER_BATCH_SIZE": "10",
                                                 "DROVER_BATCH_LINGER_S": "60"})
    sim.configure(batch_processing_s=0.5, tool_turns=0, batch_create_delay_s=120)
    victim = spawn_worker(concurrency=4)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Summarise document {i}" for i in range(10)],
                            delivery="batch"))
    wait_until("the batch created at the provider, its answer held back",
               lambda: _created(sim) == 1, 60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(victim.pid, signal.SIGKILL)  # it never learns the batch's id
    victim.wait()
    sim.configure(batch_create_delay_s=0)
    spawn_worker(concurrency=4)
    result = handle.wait(timeout=120)

    b = sim.stats()["batches"]
    assert result.counts["ok"] == 10, [r.error for r in result.results if r.error]
    assert b["batches_created"] == 1 and b["requests"] == 10, b  # billed once
    assert b["duplicate_accepted"] == 0
    assert b["calls"].get("list", 0) >= 1  # the survivor looked for it
    assert result.usage.batch_calls == result.usage.calls == 10
    assert (result.usage.batch_input_tokens, result.usage.batch_output_tokens) == (
        b["input_tokens"], b["output_tokens"])


def test_a_create_call_whose_answer_is_lost_is_adopted_not_made_again(
        sim, spawn_worker, drover_env, monkeypatch):
    configure(monkeypatch, drover_env, **{**FAST, "DROVER_BATCH_SIZE": "6",
                                                 "DROVER_BATCH_LINGER_S": "60"})
    sim.configure(batch_processing_s=0.5, tool_turns=0, batch_create_drop=True)
    spawn_worker(concurrency=4)
    wait_for_workers(1)
    handle = submit(JobSpec(subtasks=[f"Summarise memo {i}" for i in range(6)],
                            delivery="batch"))
    wait_until("the batch created, its answer dropped", lambda: _created(sim) >= 1, 60)
    sim.configure(batch_create_drop=False)
    result = handle.wait(timeout=120)

    b = sim.stats()["batches"]
    assert result.counts["ok"] == 6, [r.error for r in result.results if r.error]
    assert b["batches_created"] == 1 and b["requests"] == 6, b
    assert result.usage.batch_calls == 6


def test_a_batch_job_plans_and_synthesises_by_batch_too(sim, spawn_worker, drover_env,
                                                        monkeypatch):
    configure(monkeypatch, drover_env, **FAST)
    sim.configure(batch_processing_s=0.3, tool_turns=0, plan_items=3)
    spawn_worker(concurrency=4)
    wait_for_workers(1)
    result = submit(JobSpec(goal="Assess three depots", max_subtasks=3, synthesize=True,
                            delivery="batch")).wait(timeout=120)

    stats = sim.stats()
    b = stats["batches"]
    assert result.status == "done" and result.counts["ok"] == 3, result
    assert result.synthesis and not result.synthesis.startswith("(synthesis failed")
    assert stats["accepted"] == 0, "no realtime messages.create, planning and synthesis too"
    assert b["requests"] == 1 + 3 + 1 == b["outcomes"]["succeeded"]
    usage = result.usage
    assert usage.calls == usage.batch_calls == 5
    assert (usage.batch_input_tokens, usage.batch_output_tokens) == (
        b["input_tokens"], b["output_tokens"])
