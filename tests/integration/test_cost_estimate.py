"""``drover estimate SPEC`` and ``drover.estimate(spec)``: a job's expected and worst-case
cost and duration at the key's limits, from the spec alone (nothing sent, no Redis)."""

from __future__ import annotations

import json

import pytest

import drover
from drover.config import load_settings
from tests.helpers.cli import clean_env
from tests.helpers.cli import drover as run_drover


def test_the_estimate_prices_the_calls_and_times_them_at_the_tightest_limit():
    settings = load_settings(rpm=60, itpm=1_000_000, otpm=1_000_000,
                             prices={"claude-sonnet-4-6": {"input": 3.0, "output": 15.0}})
    spec = drover.JobSpec(subtasks=[f"Assess supplier {i}" for i in range(114)],
                          max_tokens=400)
    found = drover.estimate(spec, settings=settings, mean_output_tokens=100)
    expected, worst = found.expected, found.worst
    assert (expected.calls, worst.calls) == (114, 114)  # no tools: one call each
    assert (expected.output_tokens, worst.output_tokens) == (11_400, 45_600)
    assert expected.cost_usd == pytest.approx(
        (expected.input_tokens * 3.0 + expected.output_tokens * 15.0) / 1e6)
    # 114 requests at 60 x 0.95 a minute: two minutes, the request limit deciding.
    assert expected.duration_s == pytest.approx(120.0)
    assert expected.bound_by == "requests/min"
    assert found.prices == "DROVER_PRICES"


def test_tools_turns_and_batches_change_the_worst_case_and_the_price():
    settings = load_settings()
    tools = drover.JobSpec(subtasks=["a", "b"], tools=["lookup_fact"], max_turns=4,
                           max_tokens=500)
    found = drover.estimate(tools, settings=settings)
    assert (found.expected.calls, found.worst.calls) == (4, 8)
    assert found.worst.input_tokens > found.expected.input_tokens
    realtime = drover.estimate(drover.JobSpec(subtasks=["a"] * 10), settings=settings)
    batch = drover.estimate(drover.JobSpec(subtasks=["a"] * 10, delivery="batch"),
                            settings=settings)
    assert batch.worst.cost_usd == pytest.approx(realtime.worst.cost_usd * 0.5)
    assert batch.worst.duration_s is None and "batch" in batch.worst.bound_by
    unpriced = drover.estimate(drover.JobSpec(subtasks=["a"], model="llama-local"),
                               settings=settings)
    assert unpriced.worst.cost_usd is None and unpriced.prices == "unpriced"


def test_the_cli_prints_the_table_and_refuses_what_it_cannot_estimate(tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"subtasks": ["Summarise vendor A", "Summarise vendor B"],
                                "max_tokens": 400, "tools": ["lookup_fact"]}))
    env = clean_env(DROVER_REDIS_URL="redis://127.0.0.1:1/0")  # nothing is needed from Redis
    done = run_drover(["estimate", str(spec)], env, tmp_path)
    assert done.returncode == 0, done.stderr
    for word in ("expected", "worst case", "cost", "duration", "$"):
        assert word in done.stdout
    own = run_drover(["estimate", "-"], env, tmp_path,
                     stdin='{"subagent": "mine", "inputs": [1, 2]}')
    assert own.returncode == 2 and "cannot estimate a job of your own @subagent" in own.stderr
    assert "Traceback" not in own.stderr
    bad = run_drover(["estimate", "-"], env, tmp_path, stdin='{"subtasks": []}')
    assert bad.returncode == 2 and "nothing was enqueued" in bad.stderr
