"""What to do about a failed LLM call (docs/failures.md tells it for users).

| what came back                              | decision                                         |
|---------------------------------------------|--------------------------------------------------|
| ``x-should-retry: false``                   | fail now (the server says so; checked first)      |
| ``x-should-retry: true``                    | retry (after retry-after if given, else backoff)  |
| 429 with the spend cap code                 | fail now: it will keep failing until next month   |
| 429 with retry-after                        | scope cooldown; retry after retry-after + jitter  |
| 429 without retry-after (no spend-cap code) | retry, exponential backoff with full jitter       |
| 529 overloaded                              | retry, exponential backoff with full jitter       |
| 408, 409, 5xx, connection error, timeout    | retry, exponential backoff with full jitter       |
| 401, or no credentials to send at all       | fail now as ``authentication_error``              |
| other 4xx (400, 403, 404, 413, ...)         | fail now with status, type and message            |

The header and the plain 429 are decided as the SDK's own ``_should_retry`` does (it
retries every 429; only the spend cap's code tells us that retrying cannot help). A plain
429 has no length to put on a cooldown: it backs off like a 529 and is counted as a 429.

Retries become Celery retries (the worker slot is freed while waiting); every countdown is
capped at ``cap_s`` (``DROVER_COUNTDOWN_CAP_S``) so it stays below the broker's visibility
timeout.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from drover.workers.providers import Failure, describe

RETRYABLE_STATUS = {408, 409, 500, 502, 503, 504, 529}
# The status an `error` event of a stream stands for (the stream answered 200 before it).
STREAM_ERROR_STATUS = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429,
                       "timeout_error": 504, "invalid_request_error": 400,
                       "authentication_error": 401, "permission_error": 403,
                       "not_found_error": 404, "request_too_large": 413}
AUTHENTICATION_ERROR = "authentication_error"


@dataclass(frozen=True)
class Decision:
    action: Literal["retry", "fail"]
    error_type: str
    message: str
    status_code: int | None = None
    countdown: float = 0.0
    cooldown_s: float | None = None  # set for a 429 with retry-after: every worker backs off
    # No call of the job can succeed (the fleet's only key, or every key of its pool, was
    # refused): every unfinished sub-agent of the job fails at once with this message.
    job_wide: bool = False
    # The provider's spend limit (enforced_spend_limit_reached, insufficient_quota): the key
    # is stopped fleet-wide until it is raised (workers/agent/spend_limit.py).
    spend_limit: bool = False

    @property
    def counter(self) -> str:
        """Which counter this outcome goes to: 429s, 529s and 5xx are different problems."""
        code = self.status_code
        if code in (429, 529):
            return f"n{code}"
        if code is not None and code >= 500:
            return "n5xx"
        return "n4xx" if code is not None else "nconn"


def retry_reason(decision: Decision, attempt: int, max_attempts: int) -> str:
    """Why a failed call is retried, in words (a Celery retry's exception text in Flower).

    ``attempt`` is the 1-based number of the attempt that just failed."""
    what = " ".join(str(p) for p in (decision.status_code, decision.error_type) if p)
    if decision.cooldown_s is not None:
        how = f"retry-after {decision.cooldown_s:g} s (every worker waits)"
    else:
        how = f"backoff {decision.countdown:.1f} s"
    return f"{what}: {how}, attempt {attempt} of {max_attempts}"


def full_jitter(attempt: int, base_s: float, cap_s: float,
                rng: random.Random | None = None) -> float:
    """AWS's "full jitter": uniform in [0, min(cap, base * 2**attempt)]."""
    return (rng or random).uniform(0.0, min(cap_s, base_s * 2 ** max(0, attempt)))


def retry_after_jitter(retry_after: float, rng: random.Random | None = None) -> float:
    """Spread the retries after a 429 so workers do not all come back at the same instant."""
    return (rng or random).uniform(0.0, 1.0 + 0.25 * retry_after)


def limiter_countdown(retry_after_s: float, cap_s: float,
                      rng: random.Random | None = None) -> float:
    """The countdown after the limiter refused past its horizon (or a cooldown holds).

    Jittered so the workers it sends away do not all come back at the same instant, and
    capped like every other countdown (a long retry-after would otherwise outlast the
    broker's visibility timeout and be delivered twice)."""
    return min(cap_s, retry_after_s + (rng or random).uniform(0.0, 0.5))


def poll_wait(retry_after_s: float, rng: random.Random | None = None) -> float:
    """How long to wait in the slot before asking the limiter again (in-flight full, or a
    short refusal): a little longer than it said, by a random amount, so pollers spread."""
    return retry_after_s * (rng or random).uniform(1.0, 1.5)


KEY_REFUSED = {401, 403}  # authentication_error, permission_error: the key itself is refused


def key_refused(decision: Decision) -> bool:
    """A 401/403 (or no key to send at all): this key will not work, whatever the retry."""
    return decision.action == "fail" and (decision.status_code in KEY_REFUSED or (
        decision.status_code is None and decision.error_type == AUTHENTICATION_ERROR))


def missing_credentials(error: BaseException) -> bool:
    """The SDK's refusal to send a request without any API key (raised before sending)."""
    return isinstance(error, TypeError) and "Could not resolve authentication method" in str(
        error)


def classify(error: BaseException | Failure, *, attempt: int, base_s: float, cap_s: float,
             rng: random.Random | None = None) -> Decision:
    """Decide about one failed call (an exception, or a provider's error already in drover's
    words); ``attempt`` counts the failures so far (0 for the first)."""
    failure = error if isinstance(error, Failure) else describe(error)
    if failure is not None and failure.status_code is not None:
        code = failure.status_code
        kind, message = failure.kind, failure.message
        if code < 400:
            # An `error` event in a stream that had begun (its HTTP status was 200): judged
            # as the status its type stands for (overloaded_error: a 529), retried alike.
            code = STREAM_ERROR_STATUS.get(kind, 500)
        if code == 401:  # a proxy's bare 401 has no body type: name it the way the API does
            kind = AUTHENTICATION_ERROR
        # The SDK's order: the server's explicit word first, then the status.
        should_retry = failure.should_retry
        if should_retry is None:
            should_retry = (code in RETRYABLE_STATUS or code == 429 or code >= 500) and not (
                code == 429 and failure.spend_cap)
        if not should_retry:
            return Decision("fail", kind, message, code,
                            spend_limit=code == 429 and failure.spend_cap)
        retry_after = failure.retry_after_s if code == 429 else None
        if retry_after is not None:
            countdown = min(cap_s, retry_after + retry_after_jitter(retry_after, rng))
            return Decision("retry", kind, message, code, countdown, cooldown_s=retry_after)
        return Decision("retry", kind, message, code, full_jitter(attempt, base_s, cap_s, rng))
    if failure is not None:  # no answer: a connection error or a timeout
        return Decision("retry", failure.kind, failure.message, None,
                        full_jitter(attempt, base_s, cap_s, rng))
    if isinstance(error, BaseException) and missing_credentials(error):
        return Decision("fail", AUTHENTICATION_ERROR, "no API key: set ANTHROPIC_API_KEY on "
                        "the workers' hosts", None)
    return Decision("fail", type(error).__name__, str(error)[:500], None)
