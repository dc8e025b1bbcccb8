"""The failure table in ``drover.workers.agent.retry``, decided by its ``classify``: each kind of
error the SDK raises (and the limiter's refusals) gets its retry, backoff, cooldown or
failure, with the jitter bounds checked. No server: errors are built as the SDK builds them."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import anthropic
import pytest

from drover.workers.agent.retry import (
    Decision,
    classify,
    full_jitter,
    limiter_countdown,
    poll_wait,
    retry_reason,
)
from tests.helpers.api_errors import REQUEST, api_error
from tests.helpers.ports import free_port

BASE_S, CAP_S = 0.5, 30.0


def decide(error: BaseException, attempt: int = 0, seed: int | None = None) -> Decision:
    rng = random.Random(seed) if seed is not None else None
    return classify(error, attempt=attempt, base_s=BASE_S, cap_s=CAP_S, rng=rng)


# --- 429 -----------------------------------------------------------------------------------

def test_429_with_retry_after_cools_the_scope_and_retries_after_it_plus_jitter():
    error = api_error(429, "rate_limit_error", "Number of request tokens has exceeded your "
                      "per-minute rate limit", headers={"retry-after": "4"})
    assert isinstance(error, anthropic.RateLimitError)
    decision = decide(error)
    assert decision.action == "retry"
    assert decision.status_code == 429 and decision.error_type == "rate_limit_error"
    assert decision.cooldown_s == 4.0  # every worker on every host backs off
    assert decision.counter == "n429"
    assert 4.0 <= decision.countdown <= 4.0 + 1.0 + 0.25 * 4.0


def test_429_retry_after_jitter_stays_in_bounds_and_spreads_the_retries():
    error = api_error(429, "rate_limit_error", "slow down", headers={"retry-after": "2"})
    countdowns = [decide(error, seed=seed).countdown for seed in range(400)]
    low, high = 2.0, 2.0 + 1.0 + 0.25 * 2.0
    assert all(low <= c <= high for c in countdowns)
    # Spread over the whole window, not bunched: the retries do not resynchronise.
    assert min(countdowns) < low + 0.1 and max(countdowns) > high - 0.1
    assert len({round(c, 3) for c in countdowns}) > 300


@pytest.mark.parametrize("headers, expected", [
    ({"retry-after-ms": "1500"}, 1.5),
    ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # the precise header wins
    ({"retry-after": "0"}, 0.0),
])
def test_429_retry_after_forms(headers, expected):
    decision = decide(api_error(429, "rate_limit_error", "slow down", headers=headers))
    assert decision.action == "retry" and decision.cooldown_s == pytest.approx(expected)
    assert expected <= decision.countdown <= expected + 1.0 + 0.25 * expected


def test_429_retry_after_as_an_http_date():
    when = datetime.now(UTC) + timedelta(seconds=20)
    decision = decide(api_error(429, "rate_limit_error", "slow down",
                                headers={"retry-after": format_datetime(when, usegmt=True)}))
    assert decision.action == "retry"
    assert 15.0 <= decision.cooldown_s <= 21.0


def test_429_countdown_never_exceeds_the_cap():
    decision = decide(api_error(429, "rate_limit_error", "slow down",
                                headers={"retry-after": "600"}))
    assert decision.action == "retry" and decision.cooldown_s == 600.0
    assert decision.countdown == CAP_S


def test_the_spend_cap_without_retry_after_fails_at_once():
    decision = decide(api_error(429, "rate_limit_error", "You have reached your specified API "
                                "usage limits.", error_code="enforced_spend_limit_reached"))
    assert decision.action == "fail"
    assert decision.status_code == 429 and decision.cooldown_s is None
    assert "enforced_spend_limit_reached" in decision.message
    assert "usage limits" in decision.message


def test_a_plain_429_without_retry_after_backs_off_with_full_jitter():
    # No spend-cap code: the SDK retries it (every 429 is retryable there); with no
    # retry-after there is no length to cool the scope for, so it backs off like a 529.
    error = api_error(429, "rate_limit_error", "Number of requests has exceeded your rate "
                      "limit")
    assert "retry-after" not in error.response.headers
    bound = min(CAP_S, BASE_S * 2 ** 3)
    decisions = [decide(error, attempt=3, seed=s) for s in range(200)]
    assert all(d.action == "retry" and d.cooldown_s is None for d in decisions)
    assert all(d.status_code == 429 and d.counter == "n429" for d in decisions)
    countdowns = [d.countdown for d in decisions]
    assert all(0.0 <= c <= bound for c in countdowns)
    assert max(countdowns) > 0.9 * bound  # a real backoff, not "retry at once"


def test_the_spend_cap_fails_even_when_a_retry_after_comes_with_it():
    decision = decide(api_error(429, "rate_limit_error", "You have reached your specified API "
                                "usage limits.", headers={"retry-after": "60"},
                                error_code="enforced_spend_limit_reached"))
    assert decision.action == "fail" and "enforced_spend_limit_reached" in decision.message


# --- x-should-retry: the server's word, checked first (as the SDK's _should_retry does) ------

def test_x_should_retry_false_fails_a_status_that_would_be_retried():
    for status, kind in ((529, "overloaded_error"), (503, "api_error"),
                         (429, "rate_limit_error")):
        decision = decide(api_error(status, kind, "do not retry this",
                                    headers={"x-should-retry": "false", "retry-after": "3"}))
        assert decision.action == "fail" and decision.status_code == status
        assert decision.cooldown_s is None


def test_x_should_retry_true_retries_a_status_that_would_fail():
    decision = decide(api_error(400, "invalid_request_error", "try again",
                                headers={"x-should-retry": "true"}), attempt=2, seed=1)
    assert decision.action == "retry" and decision.cooldown_s is None
    assert 0.0 <= decision.countdown <= BASE_S * 4
    # With a 429's retry-after, that retry-after still sets the countdown and the cooldown.
    decision = decide(api_error(429, "rate_limit_error", "slow down",
                                headers={"x-should-retry": "true", "retry-after": "5"}))
    assert decision.action == "retry" and decision.cooldown_s == 5.0
    assert 5.0 <= decision.countdown <= 5.0 + 1.0 + 0.25 * 5


def test_other_x_should_retry_values_leave_the_status_to_decide():
    assert decide(api_error(529, "overloaded_error", "Overloaded",
                            headers={"x-should-retry": "maybe"})).action == "retry"
    assert decide(api_error(400, "invalid_request_error", "no",
                            headers={"x-should-retry": "TRUE"})).action == "fail"


# --- 529 and 5xx ---------------------------------------------------------------------------

def test_529_backs_off_with_full_jitter_and_no_cooldown():
    error = api_error(529, "overloaded_error", "Overloaded")
    decision = decide(error, attempt=3)
    assert decision.action == "retry"
    assert decision.status_code == 529 and decision.error_type == "overloaded_error"
    assert decision.cooldown_s is None  # the rate is not the problem
    assert decision.counter == "n529"
    assert 0.0 <= decision.countdown <= BASE_S * 2 ** 3


@pytest.mark.parametrize("status, error_type", [
    (500, "api_error"), (502, "api_error"), (503, "api_error"), (504, "api_error"),
    (408, "timeout_error"), (409, "conflict_error"),
])
def test_server_errors_retry_with_backoff(status, error_type):
    decision = decide(api_error(status, error_type, "try later"), attempt=1)
    assert decision.action == "retry" and decision.cooldown_s is None
    assert decision.status_code == status and decision.error_type == error_type
    assert 0.0 <= decision.countdown <= BASE_S * 2
    assert decision.counter == ("n5xx" if status >= 500 else "n4xx")


@pytest.mark.parametrize("attempt", [0, 1, 4, 10])
def test_full_jitter_is_uniform_up_to_the_capped_exponential(attempt):
    bound = min(CAP_S, BASE_S * 2 ** attempt)
    error = api_error(529, "overloaded_error", "Overloaded")
    countdowns = [decide(error, attempt=attempt, seed=s).countdown for s in range(400)]
    assert all(0.0 <= c <= bound for c in countdowns)
    assert min(countdowns) < 0.05 * bound and max(countdowns) > 0.95 * bound
    assert all(0.0 <= full_jitter(attempt, BASE_S, CAP_S) <= bound for _ in range(100))


# --- no retry --------------------------------------------------------------------------------

@pytest.mark.parametrize("status, error_type, cls", [
    (400, "invalid_request_error", anthropic.BadRequestError),
    (401, "authentication_error", anthropic.AuthenticationError),
    (403, "permission_error", anthropic.PermissionDeniedError),
    (404, "not_found_error", anthropic.NotFoundError),
    (413, "request_too_large", anthropic.APIStatusError),
])
def test_client_errors_fail_with_status_type_and_message(status, error_type, cls):
    error = api_error(status, error_type, f"the provider says no ({status})")
    assert isinstance(error, cls)
    decision = decide(error)
    assert decision.action == "fail" and decision.countdown == 0.0
    assert decision.status_code == status and decision.error_type == error_type
    assert decision.message == f"the provider says no ({status})"
    assert decision.counter == "n4xx"


def test_an_error_that_is_not_from_the_api_is_not_retried():
    decision = decide(ValueError("bad input"))
    assert decision.action == "fail" and decision.error_type == "ValueError"


# --- the connection --------------------------------------------------------------------------

def test_a_refused_connection_is_retried_with_backoff():
    port = free_port()  # nothing listens here
    client = anthropic.Anthropic(api_key="sk-test", base_url=f"http://127.0.0.1:{port}",
                                 max_retries=0)
    with pytest.raises(anthropic.APIConnectionError) as caught:
        client.messages.create(**REQUEST)
    decision = decide(caught.value, attempt=2)
    assert decision.action == "retry" and decision.error_type == "connection_error"
    assert decision.status_code is None and decision.counter == "nconn"
    assert 0.0 <= decision.countdown <= BASE_S * 4


# --- the limiter's own jitter, and every countdown capped ------------------------------------

def test_limiter_countdown_is_jittered_and_capped():
    countdowns = [limiter_countdown(20.0, 300.0, random.Random(s)) for s in range(200)]
    assert all(20.0 <= c <= 20.5 for c in countdowns)
    assert max(countdowns) - min(countdowns) > 0.4  # spread, so workers do not come back at once
    assert limiter_countdown(600.0, 30.0, random.Random(1)) == 30.0


def test_the_in_flight_poll_waits_a_jittered_while():
    waits = [poll_wait(0.1, random.Random(s)) for s in range(200)]
    assert all(0.1 <= w <= 0.15 for w in waits)
    assert max(waits) - min(waits) > 0.04


def test_retry_reasons_say_status_kind_wait_and_attempt():
    backoff = decide(api_error(529, "overloaded_error", "Overloaded"), attempt=2, seed=3)
    assert retry_reason(backoff, 3, 8) == (
        f"529 overloaded_error: backoff {backoff.countdown:.1f} s, attempt 3 of 8")
    cooled = decide(api_error(429, "rate_limit_error", "slow", headers={"retry-after": "7"}))
    assert retry_reason(cooled, 1, 8) == (
        "429 rate_limit_error: retry-after 7 s (every worker waits), attempt 1 of 8")


# --- the real call path: in-process runtime, real Redis limiter, the SDK to the simulator -----


class DrawLog(random.Random):
    """A seeded random source that remembers the ranges drawn from (which jitter was used)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.ranges.append((a, b))
        return super().uniform(a, b)




# --- an error event inside a stream ----------------------------------------------------------

@pytest.mark.parametrize("error_type, status, counter", [
    ("overloaded_error", 529, "n529"), ("api_error", 500, "n5xx")])
def test_an_error_event_mid_stream_is_retried_as_the_status_it_stands_for(
        error_type, status, counter):
    # The stream had answered 200 before the event: the SDK raises it with that response,
    # as its SSE decoder does (anthropic._streaming: an `error` event).
    import httpx2

    client = anthropic.Anthropic(api_key="sk-test", base_url="http://api.test")
    response = httpx2.Response(200, request=httpx2.Request("POST", "http://api.test/v1/messages"))
    error = client._make_status_error(
        "Overloaded", body={"type": "error", "error": {"type": error_type,
                                                       "message": "Overloaded"}},
        response=response)
    decision = decide(error, attempt=1)
    assert decision.action == "retry" and decision.status_code == status
    assert decision.counter == counter and decision.error_type == error_type
    assert 0.0 <= decision.countdown <= BASE_S * 2
