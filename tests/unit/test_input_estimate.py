"""The input estimate's first guess (workers/agent/estimate.py), before any answer calibrates
it, against the simulator's tokenizer (simulator/tokens.py: words, and each quote, brace and
colon of JSON, a token of their own)."""

from __future__ import annotations

from drover.simulator.openai import to_messages
from drover.simulator.tokens import count_tokens
from drover.workers.agent.estimate import Calibration
from drover.workers.agent.loop import request_params
from drover.workers.jobs.spec import JobSpec
from drover.workers.providers.registry import provider
from drover.workers.tools import get_tools


def test_a_first_turn_that_is_mostly_a_tool_schema_is_reserved_at_least_what_is_counted():
    # bench.tool_turns' first call: one tool whose JSON schema is most of the request. Counted
    # as prose (characters / 4) it was estimated at 53 tokens against the 89 counted, and the
    # uncalibrated margin's 66 fell short: the job's first burst overdrew OpenAI's bucket.
    import drover.workers.tools.demo  # noqa: F401  (registers lookup_fact)

    spec = JobSpec(subtasks=["Look up the facts of account 1"], tools=["lookup_fact"],
                   max_tokens=200)
    params = request_params(spec, "gpt-sim-1", get_tools(spec.tools),
                            [{"role": "user", "content": spec.subtasks[0]}])
    counted = count_tokens(to_messages(provider("openai").to_wire(params)))
    assert counted == count_tokens(params)  # OpenAI's wire shape counts as the Messages one

    calibration = Calibration()
    estimate = calibration.input_tokens("llm:a:gpt-sim-1", params, cache_reads_count=False)
    reserved = calibration.input_reservation("llm:a:gpt-sim-1", estimate)
    assert estimate <= counted <= reserved, (estimate, counted, reserved)


def test_a_stream_closed_early_is_settled_at_the_fewest_characters_a_token_its_scope_showed():
    # The limiter's count of a stream closed early must not fall below the bill: 3 characters
    # a token until the scope's answers show fewer (JSON, punctuation), then that; answers of
    # a few tokens teach nothing.
    from drover.workers.providers import Seen

    calibration, scope = Calibration(), "llm:a:m"
    seen = Seen(chars=1200)
    assert seen.partial_output_at_most(8000, calibration.output_chars_per_token(scope)) == 400
    calibration.observe_output_chars(scope, chars=30, tokens=15)  # too short to teach
    calibration.observe_output_chars(scope, chars=500, tokens=100)  # 5 a token: not fewer
    assert calibration.output_chars_per_token(scope) == 3.0
    calibration.observe_output_chars(scope, chars=200, tokens=100)
    assert seen.partial_output_at_most(8000, calibration.output_chars_per_token(scope)) == 600
    assert seen.partial_output_at_most(500, 2.0) == 500  # never above max_tokens
    assert Seen(chars=40, output_tokens=90).partial_output_at_most(8000, 2.0) == 90  # said


def _ask(text: str) -> dict:
    return {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": text}]}


# bench.small_keys --mix's two prompts: the simulator counts 26 and 927 tokens.
SHORT = _ask("Summarise account 12 in a few lines [[sim:out=100]]")
LONG = _ask("Summarise account 12 in a few lines [[sim:out=100]]: "
            + " ".join(["ledger entry"] * 225))


def test_the_estimate_is_calibrated_per_size_of_request():
    # One factor per scope, learnt on short prompts whose markup weighs (26 counted for 17
    # estimated), reserved the long ones at 1.24 x their count (1,146 for 927). Per size, a
    # size not answered yet borrows the nearest one's factor; once answered, its own.
    calibration, scope = Calibration(), "llm:a:m"
    for _ in range(10):
        calibration.observe(scope, SHORT, Usage(26), 26, cache_reads_count=False)
    assert calibration.input_tokens(scope, SHORT, False) == count_tokens(SHORT) == 26
    borrowed = calibration.input_tokens(scope, LONG, False)
    assert borrowed > count_tokens(LONG) == 927  # borrowed: above, never below, here
    calibration.observe(scope, LONG, Usage(927), 927, cache_reads_count=False)
    assert calibration.input_tokens(scope, LONG, False) == 927
    assert calibration.input_tokens(scope, SHORT, False) == 26  # the short size's own


def test_a_new_large_size_is_counted_once_before_it_is_reserved():
    # From 256 raw tokens up, the first request of a size the scope has not calibrated asks
    # the provider's count (once per size: the calls after it are granted before the first
    # one answers); a count that did not come is not asked again (the size borrows).
    calibration, scope = Calibration(), "llm:a:m"
    assert not calibration.new_size(scope, SHORT, False)  # too small to matter
    assert calibration.new_size("llm:b:m", LONG, False)
    calibration.counted("llm:b:m", LONG, None, False)  # no count: borrow, do not ask again
    assert not calibration.new_size("llm:b:m", LONG, False)
    assert calibration.new_size(scope, LONG, False)
    assert not calibration.new_size(scope, LONG, False)  # asked already
    calibration.counted(scope, LONG, 927, False)
    assert calibration.input_tokens(scope, LONG, False) == 927
    assert not calibration.new_size(scope, LONG, False)
    cached = {**LONG, "system": [{"type": "text", "text": "x", "cache_control": {
        "type": "ephemeral"}}]}
    assert not calibration.new_size("llm:b:m", cached, False)  # its count knows no cache


class Usage:
    def __init__(self, input_tokens: int) -> None:
        self.input_tokens, self.output_tokens = input_tokens, 100
        self.cache_read_input_tokens = self.cache_creation_input_tokens = 0
