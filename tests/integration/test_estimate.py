"""The input estimate learns what the provider really counts (workers/agent/estimate.py).

Each call goes through drover's real LLM path (limiter, the SDK, the simulator's tokenizer,
which is not characters / 4): the estimate for the next request must move from chars / 4
towards the simulator's count, leave a cached prefix out once it was read from the cache, and
follow the mean output length.
"""

from __future__ import annotations

import asyncio
from typing import Any

from drover.orchestrator.cli.demo import SYSTEM as LONG_SYSTEM
from drover.workers.agent.llm import CallContext, create_message
from drover.workers.limiter import llm_scope

# Two-letter words: the simulator counts a token each, chars / 4 counts about 0.75 a word, so
# the first estimate is a third too low.
WORDS = " ".join(["ok"] * 300)
LONG_WORDS = " ".join(["abcdefgh"] * 300)  # 9 characters, two tokens a word


def _params(model: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 200,
            "messages": [{"role": "user", "content": text}], **extra}


def _call(rt: Any, params: dict[str, Any]) -> Any:
    return rt.run(create_message(rt, params, CallContext("estimate", 0, asyncio.Event())))


def test_the_input_estimate_converges_on_what_the_provider_counts(sim, drover_env):
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    sim.configure(tool_turns=0)
    rt = get_runtime(services())
    model = rt.settings.model
    scope = llm_scope(rt.settings.key_alias, model)

    def errors(text: str, calls: int) -> list[float]:
        seen = []
        for i in range(calls):
            params = _params(model, f"{text} request {i}")
            estimate = rt.calibration.input_tokens(scope, params, cache_reads_count=False)
            counted = _call(rt, params).usage.input_tokens
            seen.append(abs(estimate - counted) / counted)
        return seen

    short = errors(WORDS, 6)
    assert short[0] > 0.2, short  # chars / 4 is far off for this text ...
    assert max(short[-3:]) < 0.05, short  # ... and the calibrated estimate is not
    # The text changes character (longer words: fewer tokens per character than before): the
    # estimate follows the new ratio instead of keeping the first one it learnt.
    long = errors(LONG_WORDS, 16)
    assert long[0] > 0.2 and max(long[-3:]) < 0.05, long


def test_a_prefix_read_from_the_cache_is_left_out_of_the_estimate(sim, drover_env):
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    sim.configure(tool_turns=0, cache_reads_count=False)
    rt = get_runtime(services())
    model = rt.settings.model
    scope = llm_scope(rt.settings.key_alias, model)
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    params = _params(model, "Assess the vendor", system=system)
    cold = rt.calibration.input_tokens(scope, params, cache_reads_count=False)
    written = _call(rt, params).usage
    warm = rt.calibration.input_tokens(scope, params, cache_reads_count=False)
    read = _call(rt, params).usage

    assert written.cache_creation_input_tokens >= 1024 and read.cache_read_input_tokens >= 1024
    assert warm < cold / 10  # the system prompt no longer counts once it is cached
    # What the limiter reserves is close to what counts: the uncached part of the request.
    assert abs(warm - read.input_tokens) <= max(5, read.input_tokens // 2)
    # Where cache reads do count (a per-model setting), the prefix stays in the estimate.
    assert rt.calibration.input_tokens(scope, params, cache_reads_count=True) > cold / 2


def test_the_output_reservation_follows_the_mean_answer_length(sim, drover_env):
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    sim.configure(tool_turns=0, output_tokens_mean=40)
    rt = get_runtime(services())
    model = rt.settings.model
    scope = llm_scope(rt.settings.key_alias, model)
    assert rt.calibration.output_tokens(scope, 1000) == 512  # nothing seen yet: a guess
    outputs = [_call(rt, _params(model, f"Summarise item {i}")).usage.output_tokens
               for i in range(10)]

    reserved = rt.calibration.output_tokens(scope, 1000)
    mean = sum(outputs) / len(outputs)
    assert 0.5 * mean <= reserved <= 2 * mean, (reserved, outputs)
    assert rt.calibration.output_tokens(scope, 10) <= 10  # never more than max_tokens


def test_the_input_reservations_margin_fades_as_answers_calibrate_the_estimate(
        sim, drover_env):
    """What the limiter reserves for a request's input carries the UNCALIBRATED margin
    (x 1.25) before the scope's first answer, and less after each answer the real LLM path
    observes (x 1.20, 1.16, ... about 1.03 after ten): a margin that never fades, or answers
    that do not count towards it, fail this."""
    from drover.workers.agent.estimate import UNCALIBRATED
    from drover.workers.agent.runtime import get_runtime
    from drover.workers.services import services

    sim.configure(tool_turns=0)
    rt = get_runtime(services())
    model = rt.settings.model
    scope = llm_scope(rt.settings.key_alias, model)
    estimate = 10_000  # the margin is a ratio: a round estimate shows it to 1e-4

    def margin() -> float:
        return rt.calibration.input_reservation(scope, estimate) / estimate

    margins = [margin()]
    for i in range(10):
        _call(rt, _params(model, f"{WORDS} request {i}"))
        margins.append(margin())
    assert margins[0] == UNCALIBRATED
    assert all(b < a for a, b in zip(margins, margins[1:], strict=False)), margins
    assert margins[1] < 1.21 and 1.0 < margins[-1] < 1.04, margins
    # Another scope has seen no answer: its reservation still carries the whole margin.
    other = rt.calibration.input_reservation(f"{scope}-other", estimate)
    assert other == round(estimate * UNCALIBRATED)
