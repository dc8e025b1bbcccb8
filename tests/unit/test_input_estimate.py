"""The input estimate's first guess (workers/agent/estimate.py), before any answer calibrates
it, against the simulator's tokenizer (simulator/tokens.py: words, and each quote, brace and
colon of JSON, a token of their own)."""

from __future__ import annotations

from drover.simulator.openai import to_messages
from drover.simulator.tokens import count_tokens
from drover.workers.agent.estimate import Calibration
from drover.workers.agent.subagent import request_params
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
