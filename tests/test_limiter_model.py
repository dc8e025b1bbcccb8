"""The Lua buckets agree exactly with the reference model, and no sequence of acquires,
settles, releases, cooldowns and header syncs lets more through than the bucket allows.

Real Redis; the scripts' ``now_us`` override (tests only) drives the clock so the comparison
is exact.
"""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from limiter_model import ScopeModel, window_violations

from workers.limiter import Limiter, ScopeLimits

T0 = 1_700_000_000_000_000  # us

limits_strategy = st.builds(
    ScopeLimits,
    rpm=st.sampled_from([None, 6.0, 57.0, 600.0, 3000.0]),
    itpm=st.sampled_from([None, 6000.0, 28500.0, 400000.0]),
    otpm=st.sampled_from([None, 600.0, 7600.0, 90000.0]),
    burst_s=st.sampled_from([0.5, 1.0, 3.0]),
    max_in_flight=st.sampled_from([None, 1, 3, 8]),
    learned_utilization=st.sampled_from([1.0, 0.9]),
)

# (-remaining, -limit) per dimension: requests, input tokens, output tokens
headers_strategy = st.tuples(
    st.lists(st.none() | st.integers(0, 50), min_size=3, max_size=3),
    st.lists(st.none() | st.sampled_from([60, 6000, 50_000]), min_size=3, max_size=3),
)


def make_machine(client, prefix: str):
    class LimiterMachine(RuleBasedStateMachine):
        grants = Bundle("grants")

        @initialize(limits=limits_strategy, horizon=st.sampled_from([0.5, 2.0, 15.0]))
        def setup(self, limits: ScopeLimits, horizon: float) -> None:
            self.limits = limits
            self.lim = Limiter(client, prefix=prefix, horizon_s=horizon)
            self.scope = f"llm:k:{uuid.uuid4().hex[:8]}"
            self.model = ScopeModel(horizon_s=horizon)
            self.now = T0
            self.lim._now_us = self.now
            # per configured dimension: list of [send time s, reserved, final cost]
            self.sends: list[list[float]] = []
            self.attempts = 0

        def _tick(self, dt_us: int) -> None:
            self.now += dt_us
            self.lim._now_us = self.now

        @rule(target=grants,
              input_tokens=st.integers(0, 3000) | st.sampled_from([0, 100_000]),
              output_tokens=st.integers(0, 800),
              lease_ttl_s=st.sampled_from([0.2, 3.0, 180.0]))
        def acquire(self, input_tokens, output_tokens, lease_ttl_s):
            self.attempts += 1
            g = self.lim.acquire(self.scope, self.limits, input_tokens=input_tokens,
                                 output_tokens=output_tokens, lease_ttl_s=lease_ttl_s)
            m = self.model.acquire(self.now, self.limits, input_tokens, output_tokens,
                                   g.lease_id or "-", lease_ttl_s)
            assert (g.granted, g.reason) == (m.granted, m.reason)
            assert g.wait_s == m.wait_s
            assert g.retry_after_s == m.retry_after_s
            if not g.granted:
                assert g.retry_after_s > 0 and g.lease_id is None
                return None
            assert g.send_at == self.now / 1e6 + g.wait_s
            assert g.send_us == self.now + g.wait_s * 1e6
            rec = [self.now + g.wait_s * 1e6, 1, input_tokens, output_tokens]
            self.sends.append(rec)
            return (g, rec)

        @rule(target=grants, input_tokens=st.integers(0, 200), output_tokens=st.integers(0, 50))
        def acquire_small(self, input_tokens, output_tokens):
            return self.acquire(input_tokens, output_tokens, 180.0)

        @rule(item=consumes(grants), actual_in=st.integers(0, 4000),
              actual_out=st.integers(0, 1000))
        def settle(self, item, actual_in, actual_out):
            if item is None:
                return
            g, rec = item
            self.lim.settle(self.scope, self.limits, g, input_tokens=actual_in,
                            output_tokens=actual_out)
            self.model.settle(self.now, self.limits, g.lease_id, actual_in - g.input_tokens,
                              actual_out - g.output_tokens, 0, g.send_us, g.input_tokens,
                              g.output_tokens)
            rec[2] = min(rec[2], actual_in)
            rec[3] = min(rec[3], actual_out)

        @rule(item=consumes(grants), actual_in=st.integers(0, 4000),
              actual_out=st.integers(0, 1000), headers=headers_strategy)
        def settle_with_headers(self, item, actual_in, actual_out, headers):
            """One round trip: exactly a settle followed by a header sync at the same time."""
            if item is None:
                return
            g, rec = item
            remaining, learn = headers
            self.lim.settle(self.scope, self.limits, g, input_tokens=actual_in,
                            output_tokens=actual_out, headers=self._headers(remaining, learn))
            self.model.settle(self.now, self.limits, g.lease_id, actual_in - g.input_tokens,
                              actual_out - g.output_tokens, 0, g.send_us, g.input_tokens,
                              g.output_tokens)
            self._model_sync(remaining, learn)
            rec[2] = min(rec[2], actual_in)
            rec[3] = min(rec[3], actual_out)

        @rule(item=consumes(grants))
        def release(self, item):
            if item is None:
                return
            g, rec = item
            self.lim.release(self.scope, g)
            self.model.settle(self.now, None, g.lease_id, -g.input_tokens, -g.output_tokens, -1,
                              g.send_us, g.input_tokens, g.output_tokens)
            rec[1] = rec[2] = rec[3] = 0

        @rule(dt_us=st.integers(0, 200_000) | st.integers(0, 20_000_000))
        def advance(self, dt_us):
            self._tick(dt_us)

        @rule(retry_after=st.integers(0, 30) | st.floats(0, 3))
        def cooldown(self, retry_after):
            left = self.lim.cooldown(self.scope, self.limits, retry_after)
            assert left == self.model.cooldown(self.now, self.limits, retry_after)

        @staticmethod
        def _headers(remaining, learn) -> dict[str, str]:
            headers = {}
            for name, rem, lim in zip(("requests", "input-tokens", "output-tokens"),
                                      remaining, learn, strict=True):
                if rem is not None:
                    headers[f"anthropic-ratelimit-{name}-remaining"] = str(rem)
                if lim is not None:
                    headers[f"Anthropic-RateLimit-{name.title()}-Limit"] = str(lim)
            return headers

        def _model_sync(self, remaining, learn) -> None:
            conf = (self.limits.rpm, self.limits.itpm, self.limits.otpm)
            learned = [float(v) if v is not None and c is None else None
                       for v, c in zip(learn, conf, strict=True)]
            rem = [None if v is None else float(v) for v in remaining]
            if any(v is not None for v in (*rem, *learned)):
                self.model.sync(self.now, self.limits, rem, learned)

        @rule(headers=headers_strategy)
        def sync(self, headers):
            remaining, learn = headers
            self.lim.sync_headers(self.scope, self.limits, self._headers(remaining, learn))
            self._model_sync(remaining, learn)

        @invariant()
        def agrees_with_model(self):
            if not hasattr(self, "model"):
                return
            for limits in (self.limits, None):
                got = self.lim.state(self.scope, limits)
                want = self.model.state(self.now, limits)
                assert got["cooldown_s"] == want["cooldown_s"]
                assert got["leases"] == want["leases"]
                for k, name in enumerate(("requests", "input_tokens", "output_tokens")):
                    d = got[name]
                    if want["levels"][k] is None:
                        assert d is None
                    else:
                        assert (d["level"], d["capacity"]) == (want["levels"][k],
                                                               want["caps"][k])
                if self.model.t is None:  # nothing written yet: '*' has nothing stored
                    break

        def teardown(self):
            if not hasattr(self, "model"):
                return
            for k, (name, conf) in enumerate(zip(("requests", "input", "output"),
                                                 (self.limits.rpm, self.limits.itpm,
                                                  self.limits.otpm), strict=True)):
                if conf is None:
                    continue
                rate = conf / 60
                cap = rate * self.limits.burst_s
                sends = [(rec[0] / 1e6, rec[1 + k]) for rec in self.sends]
                bad = window_violations(sends, rate, cap)
                assert not bad, f"{name}: more than the bucket allows in {bad[:3]}"

    return LimiterMachine


def test_lua_bucket_agrees_with_the_model_and_never_overshoots(redis_client, key_prefix):
    machine = make_machine(redis_client, key_prefix)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=300, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_window_check_catches_an_overshoot():
    # the checker itself can fail: two full bursts 0.1 s apart at 10/s with capacity 10
    sends = [(0.0, 10), (0.1, 10)]
    assert window_violations(sends, rate=10, cap=10)
    assert not window_violations([(0.0, 10), (1.0, 10)], rate=10, cap=10)


@pytest.mark.parametrize("tokens", [100_000])
def test_request_costlier_than_capacity_gets_through(redis_client, key_prefix, tokens):
    limits = ScopeLimits(rpm=600, itpm=6000, burst_s=1)  # input capacity 100 tokens
    lim = Limiter(redis_client, prefix=key_prefix, horizon_s=5)
    lim._now_us = T0
    g = lim.acquire("llm:k:big", limits, input_tokens=tokens)
    assert g.granted and g.wait_s == pytest.approx((tokens - 100) / 100)
    # the next small request queues behind the whole debt
    g2 = lim.acquire("llm:k:big", limits, input_tokens=1)
    assert not g2.granted and g2.reason == "horizon"


def _run_both(redis_client, key_prefix, limits, steps):
    """Drive the Lua bucket and the model through the same steps; returns the grants and the
    model's state after each. Steps: ("at", s) | ("acquire", name, input_tokens) |
    ("settle", name, actual_input_tokens)."""
    lim = Limiter(redis_client, prefix=key_prefix, horizon_s=15)
    model = ScopeModel(horizon_s=15)
    scope = f"llm:k:{uuid.uuid4().hex[:8]}"
    now, grants, sends = T0, {}, {}
    for step in steps:
        if step[0] == "at":
            now = T0 + int(step[1] * 1e6)
            lim._now_us = now
        elif step[0] == "acquire":
            _, name, tokens = step
            g = lim.acquire(scope, limits, input_tokens=tokens)
            m = model.acquire(now, limits, tokens, 0, g.lease_id, 180.0)
            assert g.granted and m.granted and g.wait_s == m.wait_s
            grants[name] = g
            sends[name] = [g.send_us / 1e6, tokens]
        else:
            _, name, actual = step
            g = grants[name]
            lim.settle(scope, limits, g, input_tokens=actual, output_tokens=0)
            model.settle(now, limits, g.lease_id, actual - g.input_tokens, 0, 0, g.send_us,
                         g.input_tokens, 0)
            sends[name][1] = actual
        assert lim.state(scope, limits)["input_tokens"]["level"] == \
            model.state(now, limits)["levels"][1]
    return grants, list(sends.values())


def test_refund_while_callers_are_queued_is_credited_up_to_the_peak_since_its_send(
        redis_client, key_prefix):
    # input capacity 100 tokens, refill 100/s. x and y queue behind a full burst; x's
    # over-estimate of 50 is refunded while y is still queued. Since x's send the send-side
    # level has been at most 60 (just before y), so 40 of it was really saved: z, planned
    # next, goes out with y. (The old bound, 50 - 100/s x 0.6 s, credited nothing.)
    limits = ScopeLimits(itpm=6000, burst_s=1)
    grants, sends = _run_both(redis_client, key_prefix, limits, [
        ("at", 0), ("acquire", "a", 100), ("at", 0.3), ("acquire", "x", 60),
        ("acquire", "y", 60), ("settle", "x", 10), ("acquire", "z", 40)])
    assert (grants["x"].send_us - T0) / 1e6 == pytest.approx(0.6)
    assert (grants["y"].send_us - T0) / 1e6 == pytest.approx(1.2)
    assert grants["z"].send_us == grants["y"].send_us
    assert not window_violations(sends, rate=100, cap=100)


def test_refund_is_not_credited_past_the_level_the_queue_already_reached(
        redis_client, key_prefix):
    # x takes the whole burst; y is planned once 99 tokens have refilled, 0.99 s later.
    # Refunding x in full would let z (100) leave with y: 199 tokens in one instant with a
    # capacity of 100. Since x's send the level reached 99, so at most 1 is credited.
    limits = ScopeLimits(itpm=6000, burst_s=1)
    grants, sends = _run_both(redis_client, key_prefix, limits, [
        ("at", 0), ("acquire", "x", 100), ("at", 0.3), ("acquire", "y", 99),
        ("settle", "x", 0), ("acquire", "z", 100)])
    assert (grants["y"].send_us - T0) / 1e6 == pytest.approx(0.99)
    assert (grants["z"].send_us - grants["y"].send_us) / 1e6 >= 0.99 - 1e-9
    assert not window_violations(sends, rate=100, cap=100)
