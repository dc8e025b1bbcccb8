"""The bookkeeping that recovery and the fair-share window rest on, against real Redis and
without workers: a claim that a worker holds is always in that worker's list (so the sweep
finds it when the worker dies), and the window's places equal the parts out."""

from __future__ import annotations

import redis

from drover.workers.jobs.claims import Claims


def test_a_retry_received_before_its_release_stays_in_the_workers_list(redis_url, key_prefix):
    """With a thread pool the consumer can take a retry's message (a countdown it keeps in
    memory) before the task's thread has released the claim: the part must stay listed as
    held by that worker, or a kill -9 leaves it 'held' by a dead worker that nobody sweeps
    (issue 24: the job stuck at 27/30)."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    claims = Claims(r, key_prefix, 600)
    token = int(claims.start("job", 3, 0, "w1"))  # running on w1
    assert claims.receive("job", 3, token, "w1") == 1  # the retry's message, received first
    assert not claims.release("job", 3, token, "w1")  # then the task's thread lets go
    assert claims.claim("job", 3) == f"{token}|held|w1"
    assert [(h.job_id, h.part) for h in claims.held_by("w1")] == [("job", "3")]
    # The usual order is unchanged: released ("sent", off the list), then received.
    token = int(claims.start("job", 4, 0, "w1"))
    assert claims.release("job", 4, token, "w1")
    assert claims.claim("job", 4) == f"{token}|sent|"
    assert claims.receive("job", 4, token, "w2") == 1
    assert {h.part for h in claims.held_by("w1")} == {"3"}
    assert {h.part for h in claims.held_by("w2")} == {"4"}
