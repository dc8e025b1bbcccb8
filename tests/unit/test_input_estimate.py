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
