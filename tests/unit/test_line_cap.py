"""The line cap (``workers/agent/capacity.py``) against real Redis and the real limiter: it
follows the limits of the model class the jobs use, with one key and with a pool of keys,
and a queue whose jobs use two classes gets the sum of their caps."""

from __future__ import annotations

import pytest
import redis

from drover.config import Settings
from drover.workers.agent.capacity import (
    MARGIN,
    line_cap,
    queue_line_cap,
    save_first_call_hint,
)
from drover.workers.agent.limits import bucket_seconds
from drover.workers.limiter import Limiter

TIGHT = "claude-tight"  # a model of its own class, 60 requests a minute


def _settings(redis_url: str, prefix: str, **extra: object) -> Settings:
    fields: dict = {"limits": {TIGHT: {"rpm": 60, "itpm": 10_000_000, "otpm": 10_000_000}},
                    **extra}
    return Settings(redis_url=redis_url, key_prefix=prefix, queue="q", key_alias="k",
                    rpm=6000, itpm=10_000_000, otpm=10_000_000, target_utilization=1.0,
                    burst_seconds=1.0, horizon_s=15.0, **fields)


def _expected(calls_per_s: float, settings: Settings) -> int:
    # the limiter's bucket: the burst less the late-send allowance (limits.bucket_seconds)
    return int(MARGIN * calls_per_s * (settings.horizon_s + bucket_seconds(settings)))


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_the_cap_is_the_jobs_model_classs_not_the_default_models(r, redis_url, key_prefix):
    settings = _settings(redis_url, key_prefix)
    limiter = Limiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)
    assert line_cap(settings, limiter, r, "q", TIGHT) == _expected(1.0, settings)
    assert line_cap(settings, limiter, r, "q") == _expected(100.0, settings)


def test_a_pools_cap_is_the_sum_of_its_keys_where_that_is_below_the_organisations(
        r, redis_url, key_prefix):
    keys = [{"alias": a, "api_key": "sk-sim", "rpm": 30} for a in ("a", "b")]
    settings = _settings(redis_url, key_prefix, keys=keys)
    limiter = Limiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)
    assert line_cap(settings, limiter, r, "q") == _expected(1.0, settings)  # 2 x 30 a minute
    limiter.disable_key("b", why="revoked")
    assert line_cap(settings, limiter, r, "q") == _expected(0.5, settings)


def test_token_limits_count_the_first_call_estimate_of_that_class(r, redis_url, key_prefix):
    settings = _settings(redis_url, key_prefix,
                         limits={TIGHT: {"rpm": 6000, "itpm": 60_000, "otpm": 10_000_000}})
    limiter = Limiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)
    save_first_call_hint(r, settings, "q", TIGHT, (2_000, 40))  # 30 calls a minute
    save_first_call_hint(r, settings, "q", settings.model, (10, 40))
    assert line_cap(settings, limiter, r, "q", TIGHT) == _expected(0.5, settings)
    both = queue_line_cap(settings, limiter, r, "q", [TIGHT, settings.model, TIGHT])
    assert both == _expected(0.5, settings) + _expected(100.0, settings)


def test_a_pump_does_not_write_a_cap_computed_before_a_new_first_call_estimate(
        r, redis_url, key_prefix):
    """report_line_cap writes the cap only if no submitter saved a first-call estimate while
    it computed it (the WATCH on the estimates): a pump that read none, writing after the
    submitter's cap, would open the window to the requests limit alone for a whole round.
    The submitter here comes between the pump's read of TIGHT's estimate (none yet) and its
    write, while the pump reads the second class's limiter state; the submitter's cap stands
    and the pump writes nothing. Without the check the pump's cap, TIGHT's at 100 requests a
    second instead of 0.5 calls, replaces it."""
    from drover.workers.agent.capacity import report_line_cap
    from drover.workers.fairshare import FairShare

    settings = _settings(redis_url, key_prefix,
                         limits={TIGHT: {"rpm": 6000, "itpm": 60_000, "otpm": 10_000_000}})
    fs = FairShare.from_settings(r, settings, "q")
    submitter = Limiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)
    models = [TIGHT, settings.model]
    submitted: list[int | None] = []

    class PumpsLimiter(Limiter):
        """The pump's limiter: the submitter acts while the pump reads the second class's
        state (after TIGHT's estimate was read)."""

        reads = 0

        def state(self, scope, limits=None):  # noqa: ANN001, ANN201
            self.reads += 1
            if self.reads == 2:
                save_first_call_hint(r, settings, "q", TIGHT, (2_000, 40))  # 30 calls a minute
                submitted.append(report_line_cap(settings, submitter, r, fs, lambda: models))
            return super().state(scope, limits)

    pump = PumpsLimiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)
    # computed from no estimate
    assert report_line_cap(settings, pump, r, fs, lambda: models) is None
    right = _expected(0.5, settings) + _expected(100.0, settings)
    assert submitted == [right]
    assert fs.cap() == right  # the submitter's, not the pump's
    # The pump's next round reads the estimate and writes the same cap.
    assert report_line_cap(settings, submitter, r, fs, lambda: models) == right == fs.cap()


def test_a_pump_that_finds_no_job_in_the_window_leaves_the_cap_alone(r, redis_url, key_prefix):
    """A pump that read the window empty, a moment before a submitter added its job, wrote
    the default model's cap over the submitter's (test_wait_in_line's job on a model of its
    own: cap 1,264 where its class served 25, 13 sub-agents in countdowns). It writes
    nothing now; the submitter's cap stands until the next round reads the job."""
    from drover.workers.agent.capacity import report_line_cap
    from drover.workers.fairshare import FairShare

    settings = _settings(redis_url, key_prefix)
    fs = FairShare.from_settings(r, settings, "q")
    limiter = Limiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)
    assert report_line_cap(settings, limiter, r, fs, lambda: [TIGHT]) == fs.cap() == \
        _expected(1.0, settings)
    assert report_line_cap(settings, limiter, r, fs, lambda: []) is None
    assert fs.cap() == _expected(1.0, settings)


def test_a_pump_reads_the_window_after_it_watches_the_estimates(r, redis_url, key_prefix):
    """The submitter saves its estimate, sizes the line and adds its job while the pump reads
    the window (after the pump's WATCH): the pump's write is refused, the submitter's cap
    stands."""
    from drover.workers.agent.capacity import report_line_cap
    from drover.workers.fairshare import FairShare

    settings = _settings(redis_url, key_prefix)
    fs = FairShare.from_settings(r, settings, "q")
    limiter = Limiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)

    def window_read_as_the_submitter_adds() -> list[str]:
        save_first_call_hint(r, settings, "q", TIGHT, (10, 40))
        assert report_line_cap(settings, limiter, r, fs, lambda: [TIGHT]) == \
            _expected(1.0, settings)
        return [settings.model]  # what the pump read: another job, not the new one

    assert report_line_cap(settings, limiter, r, fs, window_read_as_the_submitter_adds) is None
    assert fs.cap() == _expected(1.0, settings)


def test_the_lease_cap_is_written_beside_the_line_cap_per_model_class(r, redis_url, key_prefix):
    """The window's lease cap (the limiter's in-flight leases, which a gateway's calls must
    not outnumber) is DROVER_MAX_IN_FLIGHT per model class the line serves, written with the
    line cap; it stays while the class has no rate limit (the line cap is then removed)."""
    from drover.workers.agent.capacity import report_line_cap
    from drover.workers.fairshare import FairShare

    settings = _settings(redis_url, key_prefix, max_in_flight=7)
    fs = FairShare.from_settings(r, settings, "q")
    limiter = Limiter(r, prefix=key_prefix, horizon_s=settings.horizon_s)
    report_line_cap(settings, limiter, r, fs, lambda: [TIGHT])
    assert int(r.get(fs.leases_key)) == 7
    report_line_cap(settings, limiter, r, fs, lambda: [TIGHT, settings.model])
    assert int(r.get(fs.leases_key)) == 14
    loose = _settings(redis_url, key_prefix, max_in_flight=7, limits={"claude-free": {}})
    report_line_cap(loose, limiter, r, fs, lambda: ["claude-free"])  # limits only learned
    assert fs.cap() is None and int(r.get(fs.leases_key)) == 7
