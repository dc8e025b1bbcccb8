"""Claude's clouds in the limiter (real Redis, an injected clock): Bedrock's one tokens quota
counts input + max tokens at admission and input + burndown x output once the answer is done
(a weighted tokens dimension), and a cloud's entry in a pool is under no organisation: the
organisation's buckets and cooldown neither hold nor count it."""

from __future__ import annotations

import pytest

from drover.workers.limiter import Limiter, ScopeLimits, org_scope, pool_scope


@pytest.fixture
def lim(redis_client, key_prefix):
    clock = [0]
    limiter = Limiter(redis_client, prefix=key_prefix, clock=lambda: clock[0])
    limiter.clock = clock
    return limiter


def test_bedrocks_tokens_take_max_tokens_at_admission_and_five_times_the_output_once_done(lim):
    # 600,000 a minute in 1 s bursts: a bucket of 10,000 tokens, refilled 10,000 a second.
    scope = "llm:bedrock:cls"
    bedrock = ScopeLimits(rpm=6000, tpm=600_000, output_weight=5)
    lim.clock[0] = 100_000_000
    g = lim.acquire(scope, bedrock, input_tokens=100, output_tokens=50, max_tokens=400)
    assert lim.state(scope, bedrock)["tokens"]["level"] == 10_000 - 100 - 400  # max tokens
    lim.settle(scope, bedrock, g, input_tokens=100, output_tokens=120)
    assert lim.state(scope, bedrock)["tokens"]["level"] == 10_000 - 100 - 5 * 120
    # An output estimate that weighs more than max tokens is what is reserved.
    lim.clock[0] = 110_000_000
    g = lim.acquire(scope, bedrock, input_tokens=100, output_tokens=150, max_tokens=400)
    assert lim.state(scope, bedrock)["tokens"]["level"] == 10_000 - 100 - 5 * 150
    lim.release(scope, g)  # never sent: all of it back
    assert lim.state(scope, bedrock)["tokens"]["level"] == 10_000
    # Counted once (OpenAI's tokens bucket, the weight's default), nothing changes.
    once = ScopeLimits(rpm=6000, tpm=60_000)
    g = lim.acquire("llm:openai:cls", once, input_tokens=100, output_tokens=400, max_tokens=400)
    lim.settle("llm:openai:cls", once, g, input_tokens=100, output_tokens=400)
    assert lim.state("llm:openai:cls", once)["tokens"]["level"] == 500


def test_a_cloud_entry_is_under_no_organisation(lim):
    org = ScopeLimits(rpm=60)  # the Anthropic organisation's: one request a second
    keys = [("api", ScopeLimits(rpm=600)),
            ("bedrock", ScopeLimits(rpm=120, tpm=600_000, output_weight=5, alone=True))]
    grants = [lim.acquire_pool("cls", org, keys, input_tokens=10, output_tokens=10,
                               max_tokens=100) for _ in range(6)]
    by_key = {alias: [g.wait_s for g in grants if g.key == alias] for alias, _ in keys}
    # The organisation's 1/s holds the API key alone; Bedrock's own 2/s runs beside it.
    assert by_key["api"] == pytest.approx([0, 1])
    assert by_key["bedrock"] == pytest.approx([0, 0, 0.5, 1])
    assert lim.state(org_scope("cls"))["leases"] == 2  # the cloud's grants are not the org's
    assert lim.state(pool_scope("bedrock", "cls"))["leases"] == 4
    # The organisation's cooldown holds its keys, not the cloud's entry.
    lim.cooldown(org_scope("cls"), org, 30)
    later = [lim.acquire_pool("cls", org, keys) for _ in range(2)]
    assert [g.key for g in later if g.granted] == ["bedrock", "bedrock"]


def test_a_long_bedrock_answer_holds_the_sends_planned_before_its_settle(lim):
    # 60,000 a minute in 1 s bursts: a bucket of 1,000 tokens. Two calls of 100 input and max
    # tokens 100 fit it at once; the first answer, 300 tokens long, takes 100 + 5 x 300 once
    # done where its admission took 200: the quota Bedrock holds is 600 tokens in debt, and
    # the second call, granted before that settle, waits until it is not.
    scope = "llm:bedrock:held"
    bedrock = ScopeLimits(rpm=6000, tpm=60_000, output_weight=5)
    lim.clock[0] = 100_000_000
    first = lim.acquire(scope, bedrock, input_tokens=100, output_tokens=10, max_tokens=100)
    second = lim.acquire(scope, bedrock, input_tokens=100, output_tokens=10, max_tokens=100)
    assert first.wait_s == second.wait_s == 0
    assert lim.hold_back(first, scope) == 0  # it goes
    lim.settle(scope, bedrock, first, input_tokens=100, output_tokens=300)
    wait = lim.hold_back(second, scope)
    assert wait == pytest.approx(-0.6), wait  # 1,600 taken of a 1,000 bucket: 0.6 s of refill
    lim.clock[0] += int(-wait * 1e6)
    assert lim.hold_back(second, scope) == 0
