"""Sharing the key with software drover does not run (issue 14, item 4).

The real scripts on the real Redis with an injected clock, against the simulator's own
buckets (``drover.simulator.buckets.KeyBuckets``, with ``other_share`` = another consumer
taking that fraction of every limit) and its headers (token counts rounded to the thousand,
as the API does): a discrete-event run of callers that acquire, wait, send, and settle with the
response's headers, or cool down on a 429 and come back after its retry-after. Virtual time
and a seeded generator, so a run takes seconds, not minutes, and gives the same figures on
a loaded machine as on an idle one.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

import pytest

from drover.simulator import SimConfig
from drover.simulator.buckets import KeyBuckets
from drover.simulator.engine import lognormal_params
from drover.simulator.responses import ratelimit_headers
from drover.workers.limiter import Limiter, ScopeLimits
from drover.workers.providers import ANTHROPIC, coarse_readings_dropped, fine_dimensions
from tests.helpers.limiter_model import T0, Clock


def read(headers):
    """What the Anthropic provider reads from these headers (the limiter folds readings)."""
    return ANTHROPIC.read_limits(headers)


@dataclass
class Callers:
    """``n`` callers making calls of ``cost()`` input tokens (reserved ``estimate(cost)``) that
    take ``latency()`` seconds and answer ``output()`` tokens (reserved: ``output_estimate``),
    against the provider's buckets ``sim``; ``calls`` left to make (None: for ever).
    ``admitted`` counts the input tokens the provider took per whole second."""

    lim: Limiter
    clock: Clock
    sim: KeyBuckets
    limits: ScopeLimits
    n: int
    cost: object
    estimate: object
    latency: object
    calls: int | None = None
    output: object = lambda: 0
    output_estimate: int = 0
    read_headers: object = read  # what the call path makes of a response's headers
    learnable: list[str] | None = None  # the dimensions a 429 cuts the share of (None: all)
    scope: str = "llm:k:shared"
    sent: int = 0
    n429: int = 0
    t429: list[float] = field(default_factory=list)
    done: int = 0
    last_done: float = 0.0
    admitted: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seq = itertools.count()
        self.events = [(0.001 * i, next(self.seq), "acquire", None, 0) for i in range(self.n)]

    def run(self, until_s: float = float("inf")) -> None:
        """Advance to virtual time ``until_s`` (or until the calls are all done)."""
        while self.events and self.events[0][0] <= until_s:
            t, _, kind, grant, cost = heapq.heappop(self.events)  # cost: (input, output)
            self.clock.us = T0 + int(t * 1e6)
            if kind == "acquire":
                self._acquire(t)
            elif kind == "send":
                self._send(t, grant, cost)
            else:
                self.sim.settle_output(cost[1], 0, t)
                headers = ratelimit_headers(self.sim, t, t, round_tokens=True)
                self.lim.settle(self.scope, self.limits, grant, input_tokens=cost[0],
                                output_tokens=cost[1], readings=self.read_headers(headers))
                self.done, self.last_done = self.done + 1, t
                self._later(t, "acquire")

    def _later(self, t: float, kind: str, grant=None, cost: tuple[int, int] = (0, 0)) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, grant, cost))

    def _acquire(self, t: float) -> None:
        if self.calls is not None:
            if self.calls == 0:
                return
            self.calls -= 1
        cost = self.cost()
        g = self.lim.acquire(self.scope, self.limits, input_tokens=self.estimate(cost),
                             output_tokens=self.output_estimate)
        if g.granted:
            cost = (cost, self.output())
            self._later(t + g.wait_s, "send", g, cost)
        else:
            self.calls = None if self.calls is None else self.calls + 1
            self._later(t + g.retry_after_s, "acquire")

    def _send(self, t: float, grant, cost: tuple[int, int]) -> None:
        self.sent += 1
        rejected = self.sim.try_admit(cost[0], 0, t)
        if rejected is None:
            self.admitted[int(t)] = self.admitted.get(int(t), 0) + cost[0]
            self._later(t + self.latency(), "done", grant, cost)
            return
        self.n429 += 1
        self.t429.append(t)
        self.lim.settle(self.scope, self.limits, grant, input_tokens=0, output_tokens=0)
        self.lim.cooldown(self.scope, self.limits, rejected.retry_after_s, self.learnable)
        self.calls = None if self.calls is None else self.calls + 1
        self._later(t + rejected.retry_after_s, "acquire")

    def rate(self, start: int, end: int) -> float:
        """Mean tokens/s the provider admitted in seconds [start, end)."""
        return sum(self.admitted.get(s, 0) for s in range(start, end)) / (end - start)

    def share(self) -> float:
        return self.lim.state(self.scope, self.limits)["input_tokens"]["share"]

    def output_share(self) -> float:
        return self.lim.state(self.scope, self.limits)["output_tokens"]["share"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_job_on_a_key_40_percent_used_elsewhere_with_buckets_equal_to_ours(
        redis_client, key_prefix, seed):
    """bench.limit_tracking --sim other_share=0.4 in virtual time: its workload's shape (1,080
    calls of 300 to 2,100 input tokens estimated within 7%, answers of 30 to 170 tokens
    reserved as 100, latency 0.4 s mean and 1 s p95, 32 callers), its limits (2,200 requests,
    1.3 M input and 350 k output tokens a minute; drover at the 95% target) and 1 s buckets
    on both sides, the provider's starting full and drover knowing nothing of the other
    user. The issue's goals: at most 2% of requests draw a 429, at least 90% of what is left
    is used, the makespan within 1.15 x the bound for the 60% left."""
    rng = random.Random(seed)
    mu, sigma = lognormal_params(0.4, 1.0)
    rpm, itpm, otpm, target = 2_200, 1_300_000, 350_000, 0.95
    limits = ScopeLimits(rpm=rpm * target, itpm=itpm * target, otpm=otpm * target,
                         burst_s=1.0, learned_utilization=target, learn_share=True)
    clock = Clock()
    sim = KeyBuckets(SimConfig(rpm=rpm, itpm=itpm, otpm=otpm, burst_s=1, other_share=0.4), 0.0)
    callers = Callers(
        Limiter(redis_client, prefix=key_prefix, horizon_s=15, clock=clock), clock, sim,
        limits, n=32, cost=lambda: rng.randint(300, 2_100),
        estimate=lambda cost: int(cost * rng.uniform(0.93, 1.07)),
        latency=lambda: rng.lognormvariate(mu, sigma), calls=1_080,
        output=lambda: rng.randint(30, 170), output_estimate=100)
    callers.run()

    assert callers.done == 1_080 and callers.calls == 0
    tokens, left = sum(callers.admitted.values()), 0.6 * itpm / 60
    bound = tokens / left - 1.0  # the 60% left's refill, after its 1 s bucket
    print(f"seed {seed}: 429s {callers.n429} of {callers.sent} requests "
          f"({callers.n429 / callers.sent:.1%}, the last at {max(callers.t429, default=0):.1f} s);"
          f" makespan {callers.last_done:.1f} s = {callers.last_done / bound:.3f} x the bound "
          f"for the 60% left; {tokens / callers.last_done / left:.1%} of what is left used")
    assert callers.n429 <= 0.02 * callers.sent
    assert tokens / callers.last_done >= 0.90 * left
    assert callers.last_done <= 1.15 * bound


def test_the_limiter_learns_its_share_of_a_shared_key_and_climbs_back(redis_client, key_prefix):
    """A minute-long provider bucket (the API's): 40 callers of 1,000-token calls that take
    1 s, for ever. With 40% of the key used elsewhere drover settles near its 60% without a
    429; when the other user stops it plans to the whole limit again within a minute."""
    itpm = 600_000  # 10,000 tokens/s, 1,000 tokens a call: 10 calls/s when the key is ours
    limits = ScopeLimits(rpm=6_000 * 0.95, itpm=itpm * 0.95, burst_s=1.0,
                         learned_utilization=0.95, learn_share=True)
    clock = Clock()
    callers = Callers(
        Limiter(redis_client, prefix=key_prefix, horizon_s=15, clock=clock), clock,
        KeyBuckets(SimConfig(rpm=6_000, itpm=itpm, burst_s=60, other_share=0.4), 0.0), limits,
        n=40, cost=lambda: 1_000, estimate=lambda cost: cost, latency=lambda: 1.0)

    callers.run(240)  # someone else takes 40% of the key
    left = 0.6 * itpm / 60
    assert callers.n429 <= 0.02 * callers.sent, callers.n429
    assert callers.rate(120, 240) >= 0.90 * left, callers.rate(120, 240) / left
    assert 0.5 <= callers.share() <= 0.7, callers.share()

    callers.sim.refill(240.0)
    callers.sim.other_share = 0.0  # ... and stops: within a minute drover plans to all of it
    n429 = callers.n429
    callers.run(300)
    assert callers.share() >= 0.95
    assert callers.rate(290, 300) >= 0.90 * itpm / 60, callers.rate(290, 300) / (itpm / 60)
    assert callers.n429 == n429


def test_the_simulators_other_user_takes_its_share_of_every_limit_and_can_stop():
    from drover.simulator.engine import Engine

    engine = Engine(SimConfig(rpm=600, itpm=60_000, burst_s=1, other_share=0.5))
    buckets = engine._buckets_for("k", 0.0)
    assert buckets.try_admit(1_000, 0, 0.0) is None  # the whole input bucket
    buckets.refill(1.0)
    assert buckets.input.level == 500  # half of a second's refill was the other user's
    with_other = buckets.try_admit(1_000, 0, 1.0)
    assert with_other is not None and with_other.limit_name == "input tokens"
    engine.configure(other_share=0.0)  # the other user stops: the buckets stay
    assert engine._buckets_for("k", 1.0) is buckets and buckets.other_share == 0.0
    buckets.refill(1.5)
    assert buckets.input.level == 1_000
    for bad in (-0.1, 1.0):
        try:
            SimConfig(other_share=bad)
        except ValueError as error:
            assert "other_share" in str(error)
        else:
            raise AssertionError(f"other_share={bad} accepted")


@pytest.mark.parametrize("coarse", ["dropped", "read"])
def test_a_small_key_all_ours_runs_at_its_request_limit(redis_client, key_prefix, coarse):
    """bench.small_keys in virtual time (issue 36, item 3): 60 RPM, 40,000 ITPM, 12,000 OTPM,
    1 s buckets (an output bucket of 200 tokens), 8 callers, 60 calls of 17 input tokens
    answering 80-240 tokens (160 reserved), 0.4 s each; the key is all ours. The provider's
    token -remaining, rounded to the thousand, reads 0 there full or empty: read as a level
    it taught the limiter that others took most of the key (the share fell: 1.8-1.9 x the
    bound in the bench); dropped (what Route.settle does), no 429 and within 1.10 x the
    bound the requests set."""
    rng = random.Random(7)
    rpm, itpm, otpm, target = 60, 40_000, 12_000, 0.95
    # learned_utilization 1: these callers do not ask hold_back.lua before a send, so no
    # pacing on admissions is the tolerance of a request bucket planned at the full rate
    limits = ScopeLimits(rpm=rpm * target, itpm=itpm * target, otpm=otpm * target,
                         burst_s=1.0, learned_utilization=1.0, learn_share=True)
    clock = Clock()
    reader = ((lambda h: coarse_readings_dropped(read(h), ANTHROPIC.remaining_steps, 1.0))
              if coarse == "dropped" else read)
    callers = Callers(
        Limiter(redis_client, prefix=key_prefix, horizon_s=15, clock=clock), clock,
        KeyBuckets(SimConfig(rpm=rpm, itpm=itpm, otpm=otpm, burst_s=1), 0.0), limits, n=8,
        cost=lambda: 17, estimate=lambda cost: cost, latency=lambda: 0.4, calls=60,
        output=lambda: rng.randint(80, 240), output_estimate=160, read_headers=reader)
    callers.run()

    assert callers.done == 60
    bound = 60 / rpm * 60 - 1.0  # the requests' refill after the 1 s bucket
    print(f"{coarse}: makespan {callers.last_done:.1f} s = {callers.last_done / bound:.3f} x "
          f"the bound; 429s {callers.n429}; output share {callers.output_share():.2f}")
    if coarse == "dropped":
        assert callers.n429 == 0
        assert callers.last_done <= 1.10 * bound
    else:  # the cause, shown: a share learnt from readings of 0 holds the calls back
        assert callers.last_done > 1.25 * bound


def test_a_429_at_a_small_key_cuts_no_share_its_headers_could_not_teach_back(redis_client,
                                                                             key_prefix):
    """bench.small_keys --mix in virtual time (issue 53, item 3): the small key as drover
    holds it (57 RPM, 38,000 ITPM, 11,400 OTPM in 0.8 s buckets), 8 callers, 40 calls whose
    answers (160-480 tokens) run past their reservation of a whole output bucket (152), so
    the provider's output bucket (200) draws 429s (these callers do not ask hold_back.lua
    before a send, which holds such sends back). A 429 cuts the share learnt by a tenth;
    at this key every -remaining is rounded too coarsely to be read, so nothing ever taught
    a cut back: four 429s left the rest of the job at 0.66 of the key. Route.cooldown cuts
    only the dimensions whose headers are read (``fine_dimensions``): here none."""
    limits = ScopeLimits(rpm=57, itpm=38_000, otpm=11_400, burst_s=0.8,
                         learned_utilization=0.95, learn_share=True)

    def run(scope: str, learnable: list[str] | None) -> Callers:
        rng, clock = random.Random(3), Clock()
        callers = Callers(
            Limiter(redis_client, prefix=key_prefix, horizon_s=15, clock=clock), clock,
            KeyBuckets(SimConfig(rpm=60, itpm=40_000, otpm=12_000, burst_s=1), 0.0), limits,
            n=8, cost=lambda: 26, estimate=lambda cost: cost, latency=lambda: 0.4, calls=40,
            output=lambda: rng.randint(160, 480), output_estimate=152,
            read_headers=lambda h: coarse_readings_dropped(read(h), ANTHROPIC.remaining_steps,
                                                           0.8),
            learnable=learnable, scope=scope)
        callers.run()
        return callers

    learnable = fine_dimensions({"requests": 57, "input": 38_000, "output": 11_400},
                                ANTHROPIC.remaining_steps, 0.8)
    assert learnable == []
    kept, cut = run("llm:k:kept", learnable), run("llm:k:cut", None)
    print(f"kept: {kept.last_done:.1f} s, {kept.n429} 429s; cut: {cut.last_done:.1f} s, "
          f"{cut.n429} 429s, output share {cut.output_share():.2f}")
    assert kept.done == cut.done == 40
    assert kept.n429 > 0 and cut.n429 > 0  # the case: answers that overdraw the bucket
    assert kept.output_share() == 1.0 and kept.share() == 1.0
    assert cut.output_share() < 1.0  # each 429's cut, never taught back
    assert kept.last_done < cut.last_done
