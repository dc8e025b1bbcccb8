"""``drover.estimate(spec)`` / ``drover estimate SPEC``: what a job will cost and how long it
will take at the key's limits, before it runs.

Worked out from the spec alone (nothing is sent, Redis is not needed): each sub-agent's first
request is built exactly as the worker will build it (system prompt, tool definitions, its
task) and estimated as the limiter estimates input (characters / 4 and the message overhead).
Then two cases:

- **expected**: a job without tools makes one call per sub-agent; with tools, two (one tool
  round, then the answer), at most ``max_turns``. Each answer is ``mean_output_tokens`` long
  (default: half of ``max_tokens``), each tool round adds ``EXPECTED_TOOL_RESULT_TOKENS``.
- **worst case**: every sub-agent with tools uses all of ``max_turns``, every answer is
  ``max_tokens`` long, each tool round adds one tool result at its cap
  (``DROVER_MAX_TOOL_RESULT_CHARS`` / 4 tokens).

A later turn's input is the conversation so far: the first request plus every earlier answer
and tool result. A goal adds its planning call (``max_subtasks`` sub-agents planned); a
synthesis adds its call. Prompt-cache reads would make the input cheaper: not counted.

Cost is at ``DROVER_PRICES`` over the bundled table (a Message Batch job at the batch
discount); a model without a price has none (``None``), never $0. Duration is the time the
key's limits (the model's, times ``DROVER_TARGET_UTILIZATION``; a pool's organisation
limits) need to admit those requests and tokens, the tightest limit deciding; the time of the
answers themselves is on top. A Message Batch job's duration is the provider's (most batches
end within an hour, all within 24 h), not estimated.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from drover.config import Settings, get_settings
from drover.workers.agent.delivery import uses_batch
from drover.workers.agent.estimate import raw_estimate
from drover.workers.jobs.records import SUMMARY_CHARS
from drover.workers.jobs.spec import JobSpec

__all__ = ["EXPECTED_TOOL_RESULT_TOKENS", "Case", "Estimate", "estimate"]

EXPECTED_TOOL_RESULT_TOKENS = 250  # a tool round's results in the expected case


@dataclass(frozen=True)
class Case:
    """One case of an estimate: calls, tokens, dollars and seconds at the limits."""

    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: the model has no price
    duration_s: float | None  # None: no limits configured, or a batch job
    bound_by: str  # the limit that sets the duration ("requests/min", ...), or why none


@dataclass(frozen=True)
class Estimate:
    """A job's expected and worst-case cost and duration (see the module's docstring)."""

    model: str
    subagents: int
    expected: Case
    worst: Case
    prices: str  # where the model's price comes from
    batch: bool

    def table(self) -> Table:
        """The estimate as a short table (what ``drover estimate`` prints)."""
        table = Table(title=f"estimate: {self.subagents} sub-agents on {self.model}"
                      + (" (Message Batches)" if self.batch else ""),
                      caption=f"prices: {self.prices}; duration at the key's limits "
                              "(the answers' own time on top)")
        table.add_column("")
        table.add_column("expected", justify="right")
        table.add_column("worst case", justify="right")
        rows = (("LLM calls", lambda c: f"{c.calls:,}"),
                ("input tokens", lambda c: f"{c.input_tokens:,}"),
                ("output tokens", lambda c: f"{c.output_tokens:,}"),
                ("cost", lambda c: "unpriced" if c.cost_usd is None else f"${c.cost_usd:,.4f}"),
                ("duration", lambda c: (c.bound_by if c.duration_s is None else
                                        f"{_clock(c.duration_s)} ({c.bound_by})")))
        for name, cell in rows:
            table.add_row(name, cell(self.expected), cell(self.worst))
        return table


def _clock(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def estimate(spec: JobSpec, *, settings: Settings | None = None,
             mean_output_tokens: int | None = None) -> Estimate:
    """The expected and worst-case cost and duration of ``spec`` at the key's limits.

    ``mean_output_tokens``: how long an answer is expected to be (default: half of
    ``max_tokens``). Raises ValueError for a spec it cannot estimate (a team's own
    ``@subagent``, whose calls are its code's)."""
    from drover.workers.agent.loop import request_params
    from drover.workers.connections.preflight import import_tool_modules
    from drover.workers.tools import get_tools

    settings = settings or get_settings()
    import_tool_modules(settings)  # the tools' definitions are part of every request
    if spec.subagent is not None:
        raise ValueError(f"drover cannot estimate a job of your own @subagent "
                         f"{spec.subagent!r}: its calls are its code's; estimate a job of "
                         "subtasks, or price your function's calls with DROVER_PRICES")
    model = spec.model or settings.model
    tools = get_tools(spec.tools)
    tasks = spec.subtasks or [spec.goal or ""] * spec.max_subtasks
    firsts = [raw_estimate(request_params(spec, model, tools, [{"role": "user",
                                                                 "content": task}]))
              for task in tasks]
    max_turns = spec.max_turns or settings.max_turns
    mean_out = mean_output_tokens or max(1, spec.max_tokens // 2)
    turns_e = min(2, max_turns) if tools else 1
    turns_w = max_turns if tools else 1
    result_w = settings.max_tool_result_chars // 4
    extra = _job_calls(spec, len(tasks))
    expected = _case(settings, spec, model, firsts, turns_e, mean_out,
                     EXPECTED_TOOL_RESULT_TOKENS, extra, mean_out)
    worst = _case(settings, spec, model, firsts, turns_w, spec.max_tokens, result_w, extra,
                  spec.max_tokens)
    return Estimate(model, len(tasks), expected, worst, settings.price_table.source_of(model),
                    uses_batch(spec, settings))


def _job_calls(spec: JobSpec, n: int) -> list[int]:
    """The input estimate of the job's own calls: planning (a goal) and synthesis."""
    calls = []
    if spec.goal:
        calls.append(len(spec.goal) // 4 + len(spec.system or "") // 4 + 200)
    if spec.synthesize:
        calls.append(n * SUMMARY_CHARS // 4 + 200)
    return calls


def _case(settings: Settings, spec: JobSpec, model: str, firsts: list[int], turns: int,
          out: int, tool_result: int, job_calls: list[int], job_out: int) -> Case:
    calls = len(firsts) * turns + len(job_calls)
    # Turn k (from 0) carries the first request and k answers and tool rounds.
    growth = (out + tool_result) * turns * (turns - 1) // 2
    input_tokens = sum(first * turns + growth for first in firsts) + sum(job_calls)
    output_tokens = len(firsts) * turns * out + len(job_calls) * job_out
    price = settings.price_of(model)
    batch = uses_batch(spec, settings)
    cost = None if price is None else price.cost(input_tokens, output_tokens, batch=batch)
    if batch:
        return Case(calls, input_tokens, output_tokens, cost, None,
                    "the provider's batch queue (most within an hour, all within 24 h)")
    seconds, bound = _at_limits(settings, model, calls, input_tokens, output_tokens,
                                spec.max_tokens)
    return Case(calls, input_tokens, output_tokens, cost, seconds, bound)


def _at_limits(settings: Settings, model: str, calls: int, input_tokens: int,
               output_tokens: int, max_tokens: int) -> tuple[float | None, str]:
    """Seconds the limits need to admit all of it, and which limit that is."""
    limits = settings.limits_for(model)
    if limits is None:
        return None, f"no limits configured for {model} (DROVER_LIMITS)"
    u = settings.target_utilization
    # OpenAI's one tokens bucket takes each request's input and max tokens at admission.
    needs = (("requests/min", limits.rpm, calls),
             ("input tokens/min", limits.itpm, input_tokens),
             ("output tokens/min", limits.otpm, output_tokens),
             ("tokens/min", limits.tpm, input_tokens + calls * max_tokens))
    times = [(amount / (limit * u) * 60, name) for name, limit, amount in needs if limit]
    if not times:
        return None, f"no limits configured for {model} (DROVER_LIMITS)"
    return max(times)
