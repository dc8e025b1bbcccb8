"""The failure table in ``drover.workers.agent.retry``, decided by its ``classify``, and the retry
path that uses it: jitter, countdown caps, the backoff exponent, what an aborted call leaves
counted, and the log line of a call whose attempts are used up.

The errors are the SDK's own: a real ``anthropic.Anthropic`` client (``max_retries=0``) parses
real ``httpx2`` responses served by an ``httpx2.MockTransport`` (the HTTP layer is the only
thing stood in for), or fails to connect to a port where nothing listens. The call-path tests
run the real runtime in this process: Redis limiter, SDK, the simulator over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
import uuid
from collections.abc import Iterator

import anthropic
import pytest

from drover import JobSpec, submit
from drover.workers.agent import SubagentRun
from drover.workers.agent.errors import CallFailed, Cancelled, LimiterSaysLater, RetryableFailure
from drover.workers.agent.limits import llm_limits
from drover.workers.agent.llm import CallContext, acquire, create_message
from drover.workers.agent.retry import (
    Decision,
    classify,
)
from drover.workers.limiter import llm_scope
from tests.helpers import configure
from tests.helpers.api_errors import REQUEST

BASE_S, CAP_S = 0.5, 30.0


def decide(error: BaseException, attempt: int = 0, seed: int | None = None) -> Decision:
    rng = random.Random(seed) if seed is not None else None
    return classify(error, attempt=attempt, base_s=BASE_S, cap_s=CAP_S, rng=rng)


# --- 429 -----------------------------------------------------------------------------------


# --- x-should-retry: the server's word, checked first (as the SDK's _should_retry does) ------


# --- 529 and 5xx ---------------------------------------------------------------------------


# --- no retry --------------------------------------------------------------------------------


# --- the connection --------------------------------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts and never answers: the call times out."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def test_a_timeout_is_retried_with_backoff(silent_server):
    client = anthropic.Anthropic(api_key="sk-test", base_url=f"http://127.0.0.1:{silent_server}",
                                 max_retries=0, timeout=0.3)
    with pytest.raises(anthropic.APITimeoutError) as caught:
        client.messages.create(**REQUEST)
    decision = decide(caught.value)
    assert decision.action == "retry" and decision.error_type == "timeout"
    assert decision.counter == "nconn"


# --- the limiter's own jitter, and every countdown capped ------------------------------------


# --- the real call path: in-process runtime, real Redis limiter, the SDK to the simulator -----

def _runtime(monkeypatch, drover_env, **settings):  # noqa: ANN001, ANN202
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    configure(monkeypatch, drover_env, **settings)
    rt = get_runtime(services())
    scope = llm_scope(rt.settings.key_alias, rt.settings.model)
    return rt, scope, llm_limits(rt.settings, rt.settings.model)


def _params(rt, text: str = "Summarise the contract") -> dict:  # noqa: ANN001
    return {"model": rt.settings.model, "max_tokens": 50,
            "messages": [{"role": "user", "content": text}]}


def test_a_cooldown_refusal_frees_the_slot_with_a_jittered_countdown(monkeypatch, drover_env):
    rt, scope, limits = _runtime(monkeypatch, drover_env)
    rt.run(rt.limiter.cooldown(scope, limits, 20.0))

    async def refusals() -> list[tuple[float, float]]:
        out = []
        for i in range(30):
            before = await rt.limiter.acquire(scope, limits, input_tokens=10, output_tokens=10)
            assert not before.granted and before.reason == "cooldown"
            try:
                # Waiting 20 s in the slot instead of a Celery retry would time out here.
                await asyncio.wait_for(acquire(rt, scope, limits, CallContext("j", i,
                                       asyncio.Event()), input_tokens=10, output_tokens=10), 5)
            except LimiterSaysLater as later:
                out.append((before.retry_after_s, later.countdown))
                assert "limiter cooldown" in str(later)
            else:
                raise AssertionError("a cooldown refusal was granted")
        return out

    pairs = rt.run(refusals())
    # The cooldown only shrinks between the two asks, so without jitter every countdown would
    # be at most the retry-after read just before it.
    assert all(countdown <= ra + 0.5 for ra, countdown in pairs)
    assert sum(countdown > ra + 0.2 for ra, countdown in pairs) >= 3
    assert rt.run(rt.limiter.state(scope))["leases"] == 0


def test_a_horizon_refusal_becomes_a_retry_later_not_a_wait_in_the_slot(monkeypatch,
                                                                        drover_env):
    # Two requests a minute: the second's capacity is 30 s away, beyond the 15 s horizon.
    rt, scope, limits = _runtime(monkeypatch, drover_env, rpm=2, target_utilization=1,
                                 burst_seconds=1)

    async def two() -> tuple[object, BaseException | None]:
        ctx = CallContext("j", 0, asyncio.Event())
        first = await acquire(rt, scope, limits, ctx, input_tokens=10, output_tokens=10)
        try:
            await asyncio.wait_for(acquire(rt, scope, limits, ctx, input_tokens=10,
                                           output_tokens=10), 5)
        except LimiterSaysLater as later:
            return first, later
        return first, None

    first, later = rt.run(two())
    assert isinstance(later, LimiterSaysLater), "the second acquire did not free its slot"
    assert "limiter horizon" in str(later) and "DROVER_HORIZON_S=15" in str(later)
    assert rt.settings.horizon_s < later.countdown <= rt.settings.countdown_cap_s
    assert rt.run(rt.limiter.state(scope))["leases"] == 1  # the first grant's only
    rt.run(rt.limiter.release(scope, first))


class DrawLog(random.Random):
    """A seeded random source that remembers the ranges drawn from (which jitter was used)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.ranges.append((a, b))
        return super().uniform(a, b)


def test_the_in_flight_poll_in_the_call_path_is_jittered(monkeypatch, drover_env):
    rt, scope, limits = _runtime(monkeypatch, drover_env, max_in_flight=1)
    held = rt.run(rt.limiter.acquire(scope, limits, input_tokens=10, output_tokens=10,
                                     lease_ttl_s=60))
    assert held.granted
    draws = DrawLog(7)

    async def poll_then_get_it() -> object:
        ctx = CallContext("j", 0, asyncio.Event(), rng=draws)
        waiting = asyncio.ensure_future(acquire(rt, scope, limits, ctx, input_tokens=10,
                                                output_tokens=10))
        for _ in range(300):  # until it has polled three times (or long enough to have)
            if len(draws.ranges) >= 3 or waiting.done():
                break
            await asyncio.sleep(0.01)
        await rt.limiter.release(scope, held)
        return await asyncio.wait_for(waiting, 5)

    grant = rt.run(poll_then_get_it())
    assert grant.granted
    assert len(draws.ranges) >= 3 and set(draws.ranges) == {(1.0, 1.5)}
    rt.run(rt.limiter.release(scope, grant))


def test_a_limiter_countdown_is_capped_at_the_countdown_cap(monkeypatch, drover_env):
    # A 429 with a 10-minute retry-after: the cooldown holds that long, the countdown may not
    # (a longer countdown than the visibility timeout allows is delivered twice).
    rt, scope, limits = _runtime(monkeypatch, drover_env, countdown_cap_s=30)
    rt.run(rt.limiter.cooldown(scope, limits, 600.0))

    async def refused() -> LimiterSaysLater:
        try:
            await acquire(rt, scope, limits, CallContext("j", 0, asyncio.Event()),
                          input_tokens=10, output_tokens=10)
        except LimiterSaysLater as later:
            return later
        raise AssertionError("granted during a cooldown")

    assert rt.run(refused()).countdown <= 30.0


def test_an_aborted_call_keeps_its_input_tokens_counted(monkeypatch, drover_env, sim):
    rt, scope, _ = _runtime(monkeypatch, drover_env)
    sim.configure(latency_mean_s=5, latency_p95_s=5)
    params = _params(rt)
    estimate = rt.calibration.input_tokens(scope, params, False)

    async def aborted() -> BaseException:
        cancel = asyncio.Event()
        call = asyncio.ensure_future(create_message(rt, params, CallContext("j", 0, cancel)))
        while sim.stats()["in_flight"] < 1:  # it has reached the provider
            await asyncio.sleep(0.01)
        cancel.set()
        try:
            await call
        except Cancelled as error:
            return error
        raise AssertionError("the call was not cancelled")

    rt.run(aborted())
    usage = rt.run(rt.limiter.usage(scope, 60))
    assert estimate > 0
    assert sum(row["requests"] for row in usage) == 1
    # The provider counted the request and its input at admission: so does drover (the
    # input its stream's message_start said, or the estimate when the cancel came first).
    assert sum(row["input_tokens"] for row in usage) in (
        estimate, sim.stats()["billed"]["input_tokens"])
    assert sum(row["output_tokens"] for row in usage) == 0  # nothing generated yet


def _job(rt, subtasks: list[str]) -> str:  # noqa: ANN001
    """A job in the store with no task on the broker: the test runs its deliveries."""
    job_id = uuid.uuid4().hex
    rt.store.specs.create(job_id, JobSpec(subtasks=subtasks, max_tokens=50), subtasks,
                          status="queued", queue=rt.settings.queue)
    return job_id


def test_backoff_grows_with_each_failed_delivery_and_the_last_logs_next_failed(
        monkeypatch, drover_env, sim, caplog):
    # drover's default retry settings: 8 attempts, a 1 s base, a 300 s cap.
    rt, _, _ = _runtime(monkeypatch, drover_env, backoff_base_s=1, max_attempts=8,
                        countdown_cap_s=300)
    caplog.set_level(logging.INFO, logger="drover.workers.agent.llm")
    job_id = _job(rt, ["Check the tides [[sim:529]]"])
    countdowns, reasons = [], []
    token = 0  # the claim token the next delivery's message carries
    for _ in range(7):  # each delivery fails once and asks for a Celery retry
        run = SubagentRun(rt, job_id, 0, token=token)
        with pytest.raises(RetryableFailure) as caught:
            rt.run(run.run())
        countdowns.append(caught.value.countdown)
        reasons.append(caught.value.reason)
        # What the Celery retry does: the new message carries the claim, which is released.
        token = run.token
        rt.store.claims.release(job_id, 0, token, run.worker)
    record = rt.run(SubagentRun(rt, job_id, 0, token=token).run())  # the 8th is the last

    assert record.status == "failed" and record.attempts == 8
    assert all(c <= 2 ** k for k, c in enumerate(countdowns))  # full jitter, base 1 s
    # Grows: with the exponent stuck at 0 every countdown would be at most 1 s.
    assert max(countdowns[3:]) > 1.0
    assert reasons[2].startswith("529 overloaded_error: backoff ")
    assert reasons[2].endswith(", attempt 3 of 8")
    lines = [r.getMessage() for r in caplog.records if "outcome=n529" in r.getMessage()]
    assert len(lines) == 8
    assert all(" next=retry countdown=" in line for line in lines[:7])
    assert lines[7].endswith(" next=failed countdown=0.0"), lines[7]


def test_a_call_that_fails_for_good_logs_next_failed(monkeypatch, drover_env, sim, caplog):
    rt, _, _ = _runtime(monkeypatch, drover_env)
    caplog.set_level(logging.INFO, logger="drover.workers.agent.llm")
    with pytest.raises(CallFailed):
        rt.run(create_message(rt, _params(rt, "Check [[sim:400]]"),
                              CallContext("j", 0, asyncio.Event())))
    (line,) = [r.getMessage() for r in caplog.records if "outcome=n4xx" in r.getMessage()]
    assert "status=400 " in line and line.endswith(" next=failed countdown=0.0")


def test_planning_backs_off_and_gives_up_after_its_attempts(monkeypatch, drover_env, sim,
                                                            worker, caplog):
    # The planning call goes through the same retries as a sub-agent's: its backoff grows
    # with each retry of plan_job, and the last attempt fails the job with the last error.
    configure(monkeypatch, drover_env, max_attempts=3)
    caplog.set_level(logging.INFO, logger="drover.workers.agent.llm")
    worker(concurrency=2)
    result = submit(JobSpec(goal="Plan the tides [[sim:529]]", max_tokens=100)
                    ).wait(timeout=90)

    assert result.status == "failed" and result.results == []
    assert result.reason.startswith("planning failed: gave up after 3 attempts")
    assert "Overloaded" in result.reason
    assert sim.stats()["overloaded_529"] == 3
    lines = [r.getMessage() for r in caplog.records if "outcome=n529" in r.getMessage()]
    assert [line.split(" next=")[1].split()[0] for line in lines] == ["retry", "retry", "failed"]
