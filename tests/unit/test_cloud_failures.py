"""A cloud entry's failures as the call path judges them, whichever way they came."""

from __future__ import annotations

import pytest

from drover.workers.providers import provider


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
def test_a_throttle_mid_answer_cools_the_entry_down_as_one_before_the_answer(cloud):
    """The loop's turn reads a cloud's stream through the transport, where a throttle mid-answer
    arrives as the API's rate_limit_error event: a 429 with the entry's cooldown, as the same
    throttle raised before the answer is (not a rate limit without a wait, backed off)."""
    cloud_provider = provider(cloud)
    throttle = cloud_provider.stream_failure(
        {"type": "error", "error": {"type": "rate_limit_error", "message": "Too many tokens"}})
    assert throttle is not None
    assert throttle.status_code == 429
    assert throttle.retry_after_s == cloud_provider.throttle_cooldown_s
    overloaded = cloud_provider.stream_failure(
        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    assert overloaded is not None and overloaded.status_code != 429
    assert cloud_provider.stream_failure({"type": "ping"}) is None
