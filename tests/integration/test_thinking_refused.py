"""Extended thinking is refused at submit, before anything is enqueued (issue 36, item 4):
a budget not below max_tokens, or a model known to have no thinking."""

from __future__ import annotations

import pytest
import redis

import drover
from drover import JobSpec, submit


def _queued(redis_url: str, env: dict[str, str]) -> int:
    """Messages in the test's Celery queue and job records under its prefix."""
    r = redis.Redis.from_url(redis_url)
    prefix = env["DROVER_KEY_PREFIX"]
    return (r.llen(f"{prefix}:celery:{env['DROVER_QUEUE']}")
            + len(list(r.scan_iter(match=f"{prefix}:job:*:spec", count=1000))))


@pytest.mark.parametrize("model", ["claude-3-5-haiku-20241022", "claude-3-haiku-20240307",
                                   "claude-3-opus-latest", "claude-3-5-sonnet-20241022"])
def test_thinking_on_a_model_without_it_is_refused_and_nothing_is_enqueued(
        drover_env, redis_url, model):
    before = _queued(redis_url, drover_env)
    with pytest.raises(drover.JobRefused) as caught:
        submit(JobSpec(subtasks=["Weigh cargo"], model=model, max_tokens=4000, thinking=2000))
    assert "no extended thinking" in str(caught.value) and model in str(caught.value)
    assert _queued(redis_url, drover_env) == before


def test_thinking_not_below_max_tokens_is_refused_before_anything_is_enqueued(
        drover_env, redis_url):
    before = _queued(redis_url, drover_env)
    with pytest.raises(ValueError, match="must be below max_tokens"):
        submit({"subtasks": ["Weigh cargo"], "max_tokens": 2048, "thinking": 2048})
    assert _queued(redis_url, drover_env) == before


def test_thinking_on_a_model_with_it_is_accepted(drover_env, redis_url):
    handle = submit(JobSpec(subtasks=["Weigh cargo"], model="claude-3-7-sonnet-20250219",
                            max_tokens=4000, thinking=2000))
    try:
        assert _queued(redis_url, drover_env) >= 1  # its record and message are there
    finally:
        handle.cancel()
