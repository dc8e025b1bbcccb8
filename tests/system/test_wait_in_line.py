"""When the key is the bottleneck, sub-agents wait in line (unpublished, in the fair-share
window in Redis), not in Celery countdowns (issue 31). Real worker processes, real Flower,
the real SDK against the simulator at a binding requests-per-minute limit and at a binding
input-tokens-per-minute limit, DROVER_TARGET_UTILIZATION=1.0, default settings otherwise.

What is counted: the job's task messages as Flower saw them (each task once, plus one per
retry, which on either broker is a message of its own), the simulator's 429s, and the retries
Flower shows for each sub-agent. The busy period against its lower bound is printed, not
asserted (bench.limit_tracking measures it).

The binding limit is 100 a minute (it was 60: the same 40 sub-agents outnumber what the
limiter serves in its 15 s horizon, 25, and the 32 slots still outnumber that, so the line,
not the slots, holds them; the job takes 24 s instead of 40 s)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from urllib.parse import quote

import redis

from drover import JobSpec, submit
from drover.config import get_settings
from drover.workers.fairshare import FairShare
from tests.helpers import configure, wait_until
from tests.helpers.flower import running_flower

SLOTS = 16  # per worker, two workers: 32 slots, more than the limiter serves in 15 s (25)
RATE = 100  # a minute's requests (or thousands of input tokens): a 24 s job, not 40 s
N = 40
SYSTEM = "You are a careful port inspector. " * 100  # about 850 input tokens a call


def _run(sim, drover_env, monkeypatch, spawn_worker, tmp_path: Path, *, rpm: float,
         itpm: float, system: str, model: str | None = None) -> None:  # noqa: ANN001
    if model is None:
        configure(monkeypatch, drover_env, rpm=rpm, itpm=itpm, otpm=10_000_000,
                  target_utilization=1.0)
    else:  # the job's own model is the bottleneck; the default model's limits are loose
        configure(monkeypatch, drover_env, rpm=6000, itpm=10_000_000, otpm=10_000_000,
                  target_utilization=1.0,
                  limits=json.dumps({model: {"rpm": rpm, "itpm": itpm, "otpm": 10_000_000}}))
    sim.configure(rpm=rpm, itpm=itpm, tool_turns=0, output_tokens_mean=20,
                  latency_mean_s=0.3, latency_p95_s=0.6)
    with running_flower(drover_env, tmp_path / "flower.log",
                        password=secrets.token_urlsafe(16)) as flower:
        for _ in range(2):
            spawn_worker(concurrency=SLOTS)
        settings = get_settings()
        fs = FairShare.from_settings(redis.Redis.from_url(drover_env["DROVER_REDIS_URL"]),
                                     settings)
        wait_until("both workers' slots in the window",
                   lambda: fs.live_slots() == 2 * SLOTS, 90)
        handle = submit(JobSpec(subtasks=[f"Weigh container {i}" for i in range(N)],
                                system=system, max_tokens=40, model=model))
        seen_in_line: list[tuple[int, int, int]] = []  # (out, waiting in line, cap)

        def watch() -> bool:
            for share in fs.jobs():
                if share.job_id == handle.id and share.waiting:
                    seen_in_line.append((share.out, share.waiting, fs.cap() or 0))
            return handle.progress()["pending"] == 0

        wait_until("every record in", watch, 300)
        result = handle.wait(timeout=60)
        assert result.counts["ok"] == N, [r.error for r in result.results if r.status != "ok"]
        stats = sim.stats()
        assert stats["rejected_429"] == 0, stats["rejected_429"]
        # Sub-agents waited in line while worker slots were free: the limiter's line held
        # them, not the slots (the cap follows the limiter, so it may dip below what is out).
        assert any(out < 2 * SLOTS for out, _, _ in seen_in_line), seen_in_line[:20]

        def job_tasks() -> dict | None:
            status, tasks = flower.get(
                "/api/tasks?limit=1000&search=" + quote(f"args:job={handle.id}"))
            assert status == 200
            done = [t for t in tasks.values() if t.get("state") == "SUCCESS"]
            return tasks if len(done) >= N + 1 else None  # every sub-agent and the join

        tasks = wait_until("the job's tasks in Flower", job_tasks, 60)
        subagents = [t for t in tasks.values() if t["name"] == "drover.run_subagent"]
        retried = {t["args"]: t["retries"] for t in subagents if t.get("retries")}
        messages = sum(1 + (t.get("retries") or 0) for t in tasks.values())
        busy = stats["last_done_ts"] - stats["first_accept_ts"]
        bound = (stats["accepted"] - 1) / (rpm / 60) if itpm >= 1e6 else (
            (stats["input_tokens"] - itpm / 60) / (itpm / 60))
        print(f"\n{N} sub-agents at rpm={rpm:g} itpm={itpm:g}: {messages / N:.2f} task "
              f"messages per sub-agent, {len(retried)} retried, 429s 0; busy {busy:.1f} s "
              f"against a lower bound of {bound:.1f} s ({busy / max(bound, 1e-9):.3f} x); "
              f"most in line at once {max(w for _, w, _ in seen_in_line)}, cap "
              f"{max(c for _, _, c in seen_in_line)}")
        # A sub-agent that merely waited shows no retry in Flower.
        assert not retried, retried
        assert messages / N <= 2.0


def test_at_a_binding_rpm_subagents_wait_in_line_not_in_countdowns(
        sim, drover_env, monkeypatch, spawn_worker, tmp_path):
    _run(sim, drover_env, monkeypatch, spawn_worker, tmp_path, rpm=RATE, itpm=10_000_000,
         system="")


def test_at_a_binding_itpm_subagents_wait_in_line_not_in_countdowns(
        sim, drover_env, monkeypatch, spawn_worker, tmp_path):
    _run(sim, drover_env, monkeypatch, spawn_worker, tmp_path, rpm=6000, itpm=RATE * 1000,
         system=SYSTEM)


def test_a_job_on_a_model_of_its_own_waits_in_that_models_line(
        sim, drover_env, monkeypatch, spawn_worker, tmp_path):
    """The line is sized by the job's model class, not the default model's (whose limits
    here would let every slot out)."""
    _run(sim, drover_env, monkeypatch, spawn_worker, tmp_path, rpm=RATE, itpm=10_000_000,
         system="", model="claude-haiku-4-5")
