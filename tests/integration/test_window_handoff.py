"""A sub-agent's record hands its place in the fair-share window on at once, in the same task
that writes the record (``workers/tasklayer/tasks.py`` ->
``workers/tasklayer/_window.py:refill``), not at the next round of a worker's pump
(``workers/fairshare/scheduler.py``, every ~2 s): the pump is a backstop, and with it alone
every place of the window sits idle for up to 2 s per record."""

from __future__ import annotations

import json

import redis

from drover import JobSpec, submit
from drover.config import get_settings
from drover.workers.services import services
from tests.helpers import configure


def test_the_record_of_a_subagent_publishes_the_next_one_itself(
        monkeypatch, drover_env, sim, redis_url):
    """A window of 1 and no worker on the test's queue, so no pump runs for it (a pump thread
    starts only in a worker process, on that worker's queue): submit publishes sub-agent 0
    alone; running its task here, to its record, must grant and publish sub-agent 1 before
    the task returns. Nothing else could: with the record's hand-on gone (``refill`` made a
    no-op, or its ``finished`` call dropped) sub-agent 1 stays unpublished."""
    from drover.workers.tasklayer.tasks import run_subagent

    configure(monkeypatch, drover_env, dispatch_window=1)
    settings = get_settings()
    handle = submit(JobSpec(subtasks=[f"Summarise chapter {i}" for i in range(3)],
                            max_tokens=100))
    fs = services(settings).fairshare(settings.queue)
    client = redis.Redis.from_url(redis_url)
    queue_key = f"{settings.key_prefix}:celery:{settings.queue}"

    def queued() -> list[int]:
        return sorted(json.loads(m)["headers"]["group_index"]
                      for m in client.lrange(queue_key, 0, -1))

    try:
        assert fs.dispatched(handle.id) == 1 and queued() == [0]
        # Sub-agent 0's task, run in this process (its message stays on the broker, unread):
        # one call to the simulator, its record, and what the record hands on.
        outcome = run_subagent.apply(args=(handle.id, 0)).get(timeout=60)
        assert outcome["status"] == "ok", outcome
        assert handle.progress()["ok"] == 1
        assert fs.dispatched(handle.id) == 2, "the record handed its place to nobody"
        assert queued() == [0, 1]  # published by the task itself, not just granted
        assert not client.hgetall(fs.granted_key)  # and the grant marked as published
    finally:
        client.close()
