"""The failure table in ``workers.agent.retry``, decided by its ``classify``.

The errors are the SDK's own: a real ``anthropic.Anthropic`` client (``max_retries=0``) parses
real ``httpx2`` responses served by an ``httpx2.MockTransport`` (the HTTP layer is the only
thing stood in for), or fails to connect to a port where nothing listens.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import anthropic
import httpx2
import pytest

from orchestrator.services import free_port
from workers.agent.retry import Decision, classify, full_jitter

BASE_S, CAP_S = 0.5, 30.0
REQUEST = {"model": "claude-sonnet-4-6", "max_tokens": 10,
           "messages": [{"role": "user", "content": "hi"}]}


def api_error(status: int, error_type: str, message: str, *, headers: dict[str, str] | None = None,
              error_code: str | None = None) -> anthropic.APIError:
    """The exception the SDK raises for this HTTP answer."""
    body: dict = {"type": "error", "error": {"type": error_type, "message": message}}
    if error_code:
        body["error"]["details"] = {"error_code": error_code}

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, json=body,
                               headers={"request-id": "req_1", **(headers or {})})

    client = anthropic.Anthropic(api_key="sk-test", base_url="http://api.test", max_retries=0,
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(answer)))
    with pytest.raises(anthropic.APIError) as caught:
        client.messages.create(**REQUEST)
    return caught.value


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


def test_429_without_retry_after_fails_at_once():
    decision = decide(api_error(429, "rate_limit_error", "You have reached your specified API "
                                "usage limits.", error_code="enforced_spend_limit_reached"))
    assert decision.action == "fail"
    assert decision.status_code == 429 and decision.cooldown_s is None
    assert "enforced_spend_limit_reached" in decision.message
    assert "usage limits" in decision.message


def test_the_spend_cap_fails_even_when_a_retry_after_comes_with_it():
    decision = decide(api_error(429, "rate_limit_error", "You have reached your specified API "
                                "usage limits.", headers={"retry-after": "60"},
                                error_code="enforced_spend_limit_reached"))
    assert decision.action == "fail" and "enforced_spend_limit_reached" in decision.message


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
