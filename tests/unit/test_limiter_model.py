"""The Lua buckets agree with the reference model, and no sequence of acquires, settles,
releases, cooldowns and header syncs lets more through than the bound the algorithm keeps
(``limiter_model.window_violations``).

Real Redis, with a clock injected through the limiter's constructor. Every strategy keeps the
numbers whole microseconds (limits with a whole number of microseconds per unit, cooldowns
in quarter seconds), so the Lua's floats are exact and decisions must agree exactly; levels
agree to rounding.
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

from drover.workers.limiter import Limiter, ScopeLimits
from drover.workers.providers import ANTHROPIC
from tests.helpers import EXAMPLES
from tests.helpers.limiter_model import T0, Clock, ScopeModel, Send, window_violations


def read(headers):
    """What the Anthropic provider reads from these headers (the limiter folds readings)."""
    return ANTHROPIC.read_limits(headers)

limits_strategy = st.builds(
    ScopeLimits,
    rpm=st.sampled_from([None, 6.0, 60.0, 600.0, 3000.0]),
    itpm=st.sampled_from([None, 6000.0, 60000.0, 600000.0]),
    otpm=st.sampled_from([None, 600.0, 6000.0, 60000.0]),
    burst_s=st.sampled_from([0.5, 1.0, 3.0]),
    max_in_flight=st.sampled_from([None, 1, 3, 8]),
    learned_utilization=st.sampled_from([1.0, 0.5]),
)

# (-remaining, -limit) per dimension: requests, input tokens, output tokens
headers_strategy = st.tuples(
    st.lists(st.none() | st.integers(0, 50), min_size=3, max_size=3),
    st.lists(st.none() | st.sampled_from([60, 6000, 50_000]), min_size=3, max_size=3),
)


def approx_level(got: float, want, cap) -> bool:
    return abs(got - float(want)) <= 1e-9 * max(1.0, abs(float(want)), float(cap))


def make_machine(client, prefix: str):
    class LimiterMachine(RuleBasedStateMachine):
        grants = Bundle("grants")

        @initialize(limits=limits_strategy, horizon=st.sampled_from([0.5, 2.0, 15.0]))
        def setup(self, limits: ScopeLimits, horizon: float) -> None:
            self.limits = limits
            self.clock = Clock()
            self.lim = Limiter(client, prefix=prefix, horizon_s=horizon, clock=self.clock)
            self.scope = f"llm:k:{uuid.uuid4().hex[:8]}"
            self.model = ScopeModel(horizon_s=horizon)
            self.step = 0
            self.sends: list[list[Send]] = []  # per grant, one Send per dimension

        @rule(target=grants,
              input_tokens=st.integers(0, 3000) | st.sampled_from([0, 100_000]),
              output_tokens=st.integers(0, 800),
              lease_ttl_s=st.sampled_from([0.2, 3.0, 180.0]))
        def acquire(self, input_tokens, output_tokens, lease_ttl_s):
            self.step += 1
            g = self.lim.acquire(self.scope, self.limits, input_tokens=input_tokens,
                                 output_tokens=output_tokens, lease_ttl_s=lease_ttl_s)
            m = self.model.acquire(self.clock.us, self.limits, input_tokens, output_tokens,
                                   g.lease_id or "-", lease_ttl_s)
            assert (g.granted, g.reason, g.wait_s, g.retry_after_s) == (
                m.granted, m.reason, m.wait_s, m.retry_after_s)
            if not g.granted:
                assert g.retry_after_s > 0 and g.lease_id is None
                return None
            assert g.now_us == self.clock.us
            sends = [Send(g.send_at - T0 / 1e6, self.step, float(c))
                     for c in (1, input_tokens, output_tokens)]
            self.sends.append(sends)
            return (g, sends)

        @rule(target=grants, input_tokens=st.integers(0, 200), output_tokens=st.integers(0, 50))
        def acquire_small(self, input_tokens, output_tokens):
            return self.acquire(input_tokens, output_tokens, 180.0)

        def _settled(self, g, sends, used: tuple[int, int] | None) -> None:
            """The window bound's view of a settle (used) or a release (None)."""
            self.step += 1
            reserved = (1, g.input_tokens, g.output_tokens)
            final = (0, 0, 0) if used is None else (1, *used)
            for k, (send, res, use) in enumerate(zip(sends, reserved, final, strict=True)):
                conf = (self.limits.rpm, self.limits.itpm, self.limits.otpm)[k]
                if conf is None:
                    continue
                cap = conf / 60 * self.limits.burst_s
                send.cost = float(min(res, use))
                if use < res:
                    send.credits.append((self.step, min(res, cap) - min(use, cap)))

        @rule(item=consumes(grants), actual_in=st.integers(0, 4000),
              actual_out=st.integers(0, 1000))
        def settle(self, item, actual_in, actual_out):
            if item is None:
                return
            g, sends = item
            self.lim.settle(self.scope, self.limits, g, input_tokens=actual_in,
                            output_tokens=actual_out)
            self.model.settle(self.clock.us, self.limits, g.lease_id, True,
                              (g.input_tokens, g.output_tokens), (actual_in, actual_out))
            self._settled(g, sends, (actual_in, actual_out))

        @rule(item=consumes(grants), actual_in=st.integers(0, 4000),
              actual_out=st.integers(0, 1000), headers=headers_strategy)
        def settle_with_headers(self, item, actual_in, actual_out, headers):
            """One round trip: exactly a settle followed by a header sync at the same time."""
            if item is None:
                return
            g, sends = item
            remaining, learn = headers
            self.lim.settle(self.scope, self.limits, g, input_tokens=actual_in,
                            output_tokens=actual_out,
                            readings=read(self._headers(remaining, learn)))
            self.model.settle(self.clock.us, self.limits, g.lease_id, True,
                              (g.input_tokens, g.output_tokens), (actual_in, actual_out))
            self._model_sync(remaining, learn)
            self._settled(g, sends, (actual_in, actual_out))

        @rule(item=consumes(grants))
        def release(self, item):
            if item is None:
                return
            g, sends = item
            self.lim.release(self.scope, g)
            self.model.settle(self.clock.us, None, g.lease_id, False,
                              (g.input_tokens, g.output_tokens), (0, 0))
            self._settled(g, sends, None)

        @rule(dt_us=st.integers(0, 200_000) | st.integers(0, 20_000_000))
        def advance(self, dt_us):
            self.clock.us += dt_us

        @rule(retry_after=st.integers(0, 30) | st.sampled_from([0.25, 0.5, 1.5, 2.75]))
        def cooldown(self, retry_after):
            self.step += 1
            left = self.lim.cooldown(self.scope, self.limits, retry_after)
            assert left == self.model.cooldown(self.clock.us, self.limits, retry_after)

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
            learned = [float(v) if v is not None and c is None and v > 0 else None
                       for v, c in zip(learn, conf, strict=True)]
            rem = [None if v is None else float(v) for v in remaining]
            if any(v is not None for v in (*remaining, *learn)):  # then the script runs
                self.model.sync(self.clock.us, self.limits, rem, learned)

        @rule(headers=headers_strategy)
        def sync(self, headers):
            self.step += 1
            remaining, learn = headers
            self.lim.sync_headers(self.scope, self.limits, read(self._headers(remaining, learn)))
            self._model_sync(remaining, learn)

        @invariant()
        def agrees_with_model(self):
            if not hasattr(self, "model"):
                return
            for limits in (self.limits, None):
                got = self.lim.state(self.scope, limits)
                want = self.model.state(self.clock.us, limits)
                assert got["cooldown_s"] == want["cooldown_s"]
                assert got["leases"] == want["leases"]
                for k, name in enumerate(("requests", "input_tokens", "output_tokens")):
                    d = got[name]
                    if want["levels"][k] is None:
                        assert d is None
                    else:
                        assert approx_level(d["capacity"], want["caps"][k], 1)
                        assert approx_level(d["level"], want["levels"][k], want["caps"][k]), (
                            name, d, float(want["levels"][k]))

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
                bad = window_violations([s[k] for s in self.sends], rate, cap)
                assert not bad, f"{name}: more than the bound allows in {bad[:3]}"

    return LimiterMachine


def test_lua_bucket_agrees_with_the_model_and_keeps_the_bound(redis_client, key_prefix):
    machine = make_machine(redis_client, key_prefix)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_window_check_catches_an_overshoot():
    # the checker itself can fail: two full bursts 0.1 s apart at 10/s with capacity 10
    assert window_violations([Send(0.0, 1, 10), Send(0.1, 2, 10)], rate=10, cap=10)
    assert not window_violations([Send(0.0, 1, 10), Send(1.0, 2, 10)], rate=10, cap=10)
    # a refund of an earlier send credited between the two plannings is allowed for
    early = Send(-5.0, 0, 0, credits=[(2, 10)])
    assert not window_violations([early, Send(0.0, 1, 10), Send(0.1, 3, 10)], rate=10, cap=10)


@pytest.mark.parametrize("tokens", [100_000])
def test_request_costlier_than_capacity_gets_through(redis_client, key_prefix, tokens):
    limits = ScopeLimits(rpm=600, itpm=6000, burst_s=1)  # input capacity 100 tokens
    lim = Limiter(redis_client, prefix=key_prefix, horizon_s=5, clock=Clock())
    g = lim.acquire("llm:k:big", limits, input_tokens=tokens)
    assert g.granted and g.wait_s == pytest.approx((tokens - 100) / 100)
    # the next small request queues behind the whole debt
    g2 = lim.acquire("llm:k:big", limits, input_tokens=1)
    assert not g2.granted and g2.reason == "horizon"


def _run_both(redis_client, key_prefix, limits, steps):
    """Drive the Lua bucket and the model through the same steps; returns the grants and the
    sends (input tokens). Steps: ("at", s) | ("acquire", name, input_tokens) |
    ("settle", name, actual_input_tokens)."""
    clock = Clock()
    lim = Limiter(redis_client, prefix=key_prefix, horizon_s=15, clock=clock)
    model = ScopeModel(horizon_s=15)
    scope = f"llm:k:{uuid.uuid4().hex[:8]}"
    grants, sends = {}, {}
    for n, step in enumerate(steps):
        if step[0] == "at":
            clock.us = T0 + int(step[1] * 1e6)
        elif step[0] == "acquire":
            _, name, tokens = step
            g = lim.acquire(scope, limits, input_tokens=tokens)
            m = model.acquire(clock.us, limits, tokens, 0, g.lease_id, 180.0)
            assert g.granted and m.granted and g.wait_s == m.wait_s
            grants[name] = g
            sends[name] = Send(g.send_at - T0 / 1e6, n, tokens)
        else:
            _, name, actual = step
            g = grants[name]
            lim.settle(scope, limits, g, input_tokens=actual, output_tokens=0)
            model.settle(clock.us, limits, g.lease_id, True, (g.input_tokens, 0), (actual, 0))
            sends[name].cost = actual
            sends[name].credits.append((n, g.input_tokens - actual))
        assert approx_level(lim.state(scope, limits)["input_tokens"]["level"],
                            model.state(clock.us, limits)["levels"][1], 100)
    return grants, list(sends.values())


def test_a_refund_while_callers_are_queued_is_credited_in_full(redis_client, key_prefix):
    # input capacity 100 tokens, refill 100/s. x and y queue behind a full burst; x's
    # over-estimate of 50 is refunded while y is still queued: z, planned next, gains the
    # whole 50 and goes out 0.5 s earlier than it would have.
    limits = ScopeLimits(itpm=6000, burst_s=1)
    grants, sends = _run_both(redis_client, key_prefix, limits, [
        ("at", 0), ("acquire", "a", 100), ("at", 0.3), ("acquire", "x", 60),
        ("acquire", "y", 60), ("settle", "x", 10), ("acquire", "z", 40)])
    assert (grants["x"].send_us - T0) / 1e6 == pytest.approx(0.6)
    assert (grants["y"].send_us - T0) / 1e6 == pytest.approx(1.2)
    assert (grants["z"].send_us - T0) / 1e6 == pytest.approx(1.6 - 0.5)
    assert not window_violations([Send(s.at_s, s.planned, s.cost) for s in sends],
                                 rate=100, cap=100)


def test_the_worst_case_of_full_credit_is_the_bound_the_model_checks(redis_client, key_prefix):
    # x takes the whole burst and uses nothing; y is planned once 99 tokens have refilled,
    # 0.99 s later. The provider's bucket, which never saw x's tokens, is full by then; ours
    # gets x's 100 back at 0.3 s and hands them to z, which leaves with y: 199 tokens in one
    # instant against a capacity of 100. That is what crediting a refund in full can cost at
    # worst, and what the bound allows for: the refund of an earlier send, credited while
    # y's and z's sends were being planned. (bench/: with estimates a few percent off and a
    # capacity of ~20k tokens, no 429 from a simulator with buckets equal to ours.)
    limits = ScopeLimits(itpm=6000, burst_s=1)
    grants, sends = _run_both(redis_client, key_prefix, limits, [
        ("at", 0), ("acquire", "x", 100), ("at", 0.3), ("acquire", "y", 99),
        ("settle", "x", 0), ("acquire", "z", 100)])
    assert (grants["y"].send_us - T0) / 1e6 == pytest.approx(0.99)
    assert grants["z"].send_us == grants["y"].send_us
    plain = [Send(s.at_s, s.planned, s.cost) for s in sends]
    assert window_violations(plain, rate=100, cap=100)  # over the plain token bucket ...
    assert not window_violations(sends, rate=100, cap=100)  # ... by exactly the credit
