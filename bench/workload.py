"""The benchmark workload: N research sub-agents of 3 to 8 LLM calls each, and its limits.

Every contender sends byte-for-byte the same requests (same system prompt, tool definition,
prompt-caching marks, tool results and assistant turns as drover's own sub-agent loop), so
the simulator answers each of them with the same content and the total demand is identical:

- each task carries `[[sim:turns=N]]` (N = calls - 1 tool turns, then the final answer) and
  `[[sim:out=M]]` (final answer of about M tokens), drawn per sub-agent from the seed, plus a
  context paragraph of 20 to 700 words, so prompts and outputs vary;
- the only tool is drover's offline `lookup_fact` (deterministic, never fails);
- the system prompt is short, so nothing is cached and every contender pays full input.

The demand (requests, input and output tokens) is computed by replaying the conversations
against an in-process simulator engine with no limits and no faults; the lower bound is, per
dimension, (demand - bucket capacity) / refill rate, and the largest of the three.

Limits keep the shape of drover's defaults (an entry tier: 50 RPM, 30k ITPM, 8k OTPM),
scaled so the lower bound is the target (about 60 s for 200 sub-agents). The simulator
enforces them with 1-second buckets (the API says per-minute limits may be enforced over
shorter intervals), the same burst window as drover's default `DROVER_BURST_SECONDS`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from drover.simulator import SimConfig
from drover.simulator.engine import Engine, Pending

MODEL = "claude-sonnet-4-6"
SYSTEM = ("You are one sub-agent of a research team. Work only on your own subtask, use "
          "lookup_fact for every fact you need, and end with a short report of your findings.")
TOOL_NAMES = ["lookup_fact"]
MAX_TOKENS = 1024
CACHE = {"type": "ephemeral"}
# drover's default limits: the ratios of an entry tier, scaled per workload.
SHAPE = {"rpm": 50.0, "itpm": 30_000.0, "otpm": 8_000.0}

_WORDS = ("market supply demand pricing region vendor contract margin risk growth segment "
          "forecast baseline scenario capacity logistics freight warehouse routing fleet "
          "customer retention churn revenue cost labour regulation tariff inventory lead time "
          "quality audit compliance survey interview benchmark competitor share trend").split()


def tool_definitions() -> list[dict[str, Any]]:
    """The tools as drover's workers define them (from the registered functions)."""
    import drover.workers.tools.demo  # noqa: F401  (registers lookup_fact)
    from drover.workers.tools import get_tools

    return [t.definition() for t in get_tools(TOOL_NAMES)]


def request_params(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One turn's Messages request, shaped as the docs recommend (and as drover sends it):
    the system prompt and the tool list marked for prompt caching."""
    tools = tool_definitions()
    tools[-1] = {**tools[-1], "cache_control": CACHE}
    return {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages, "tools": tools,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": CACHE}]}


def assistant_turn(content: list[Any]) -> dict[str, Any]:
    """The model's reply as the next request's assistant message (SDK blocks or dicts)."""
    blocks = [b if isinstance(b, dict) else b.model_dump(mode="json", exclude_none=True)
              for b in content]
    return {"role": "assistant", "content": blocks}


def tool_results(content: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Run the turn's tool calls (offline, deterministic); None when the model is done."""
    from drover.workers.tools.demo import lookup_fact

    uses = [b for b in content if b.get("type") == "tool_use"]
    if not uses:
        return None
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": u["id"], "content": lookup_fact(**u["input"]),
         "is_error": False} for u in uses]}


@dataclass(frozen=True)
class Demand:
    requests: int
    input_tokens: int
    output_tokens: int
    calls_per_subagent: tuple[int, ...] = field(repr=False, default=())

    def of(self, dim: str) -> int:
        return {"rpm": self.requests, "itpm": self.input_tokens, "otpm": self.output_tokens}[dim]


@dataclass(frozen=True)
class Workload:
    subagents: int = 200
    target_lower_bound_s: float = 60.0
    seed: int = 11
    min_calls: int = 3
    max_calls: int = 8
    burst_s: float = 1.0
    overload_rate: float = 0.02
    latency_mean_s: float = 0.4
    latency_p95_s: float = 1.0
    tools_per_turn: int = 2

    # --- what the sub-agents are asked -------------------------------------------------
    @cached_property
    def tasks(self) -> list[str]:
        rng = random.Random(self.seed)
        out = []
        for i in range(self.subagents):
            calls = rng.randint(self.min_calls, self.max_calls)
            answer = rng.randint(60, 500)
            context = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 700)))
            out.append(f"Sub-agent {i}: assess {rng.choice(_WORDS)} {rng.choice(_WORDS)} for "
                       f"client {i}. Context: {context}. [[sim:turns={calls - 1}]] "
                       f"[[sim:out={answer}]]")
        return out

    # --- the provider ------------------------------------------------------------------
    def sim_config(self, **changes: Any) -> SimConfig:
        limits = self.limits
        return SimConfig(rpm=limits["rpm"], itpm=limits["itpm"], otpm=limits["otpm"],
                         burst_s=self.burst_s, overload_rate=self.overload_rate,
                         latency_mean_s=self.latency_mean_s, latency_p95_s=self.latency_p95_s,
                         tools_per_turn=self.tools_per_turn, seed=self.seed).replaced(**changes)

    def _content_config(self) -> SimConfig:
        # Content depends on the seed and these knobs only, never on limits or faults.
        return SimConfig(tools_per_turn=self.tools_per_turn, seed=self.seed)

    @cached_property
    def demand(self) -> Demand:
        """What the workload asks of the provider: replayed against an unlimited engine."""
        engine = Engine(self._content_config())
        headers = {"x-api-key": "bench", "content-type": "application/json"}
        calls: list[int] = []
        for task in self.tasks:
            messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
            n = 0
            while True:
                raw = json.dumps(request_params(messages)).encode()
                pending = engine.begin_message(headers, raw)
                assert isinstance(pending, Pending), "the replay engine refused a request"
                reply = json.loads(pending.finish().body)
                n += 1
                messages.append(assistant_turn(reply["content"]))
                follow_up = tool_results(reply["content"])
                if follow_up is None:
                    break
                messages.append(follow_up)
            calls.append(n)
        stats = engine.snapshot()
        assert stats["cache_read_input_tokens"] == 0  # nothing cached: every contender pays alike
        return Demand(stats["accepted"], stats["input_tokens"], stats["output_tokens"],
                      tuple(calls))

    @cached_property
    def limits(self) -> dict[str, float]:
        """Per-minute limits of SHAPE's proportions that put the lower bound at the target."""
        d = self.demand
        # lower bound = max_d demand_d / rate_d - burst_s, with rate_d = k * SHAPE[d] / 60
        k = max(d.of(dim) * 60 / SHAPE[dim] for dim in SHAPE) / (
            self.target_lower_bound_s + self.burst_s)
        return {dim: float(_round_nice(k * SHAPE[dim])) for dim in SHAPE}

    def lower_bound_by_dim(self) -> dict[str, float]:
        d = self.demand
        return {dim: max(0.0, d.of(dim) / (lim / 60) - self.burst_s)
                for dim, lim in self.limits.items()}

    @property
    def lower_bound_s(self) -> float:
        return max(self.lower_bound_by_dim().values())

    @property
    def binding(self) -> str:
        bounds = self.lower_bound_by_dim()
        return max(bounds, key=bounds.__getitem__)

    def scaled(self, subagents: int, target_lower_bound_s: float) -> Workload:
        return replace(self, subagents=subagents, target_lower_bound_s=target_lower_bound_s)


def _round_nice(x: float) -> int:
    """Round up to 2 significant digits (a limit a console could show)."""
    if x <= 0:
        return 1
    digits = len(str(int(x))) - 2
    step = 10 ** max(0, digits)
    return int(-(-x // step) * step)


QUICK = Workload(subagents=30, target_lower_bound_s=12.0)
FULL = Workload()


if __name__ == "__main__":  # a summary of the workload, for RESULTS.md and sizing
    for w in (FULL, QUICK):
        d = w.demand
        print(f"{w.subagents} sub-agents: {d.requests} calls, {d.input_tokens:,} input and "
              f"{d.output_tokens:,} output tokens; limits {w.limits}; lower bound "
              f"{w.lower_bound_s:.1f} s ({w.binding}); by dim "
              f"{ {k: round(v, 1) for k, v in w.lower_bound_by_dim().items()} }")
