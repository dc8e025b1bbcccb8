"""The team's own sub-agent of ``bench/own_code.py`` (its workers load it through
DROVER_TOOL_MODULES): a plan call, ``steps`` check calls each built on the last answer, and a
summary, written against the SDK's client as a team writes it. Every prompt names the input
and the step, so no two calls of a run send the same body (the simulator counts a body sent
twice: the calls a resumed sub-agent sent again).
"""

from __future__ import annotations

import os
from typing import Any

import drover

CONTEXT = "Port inspection notes: cranes, berths, manifests and tides. " * 25  # ~300 tokens
MAX_TOKENS = 200


async def ask(llm: Any, prompt: str) -> str:
    """One call through the client drover hands in (Anthropic's or OpenAI's); its text."""
    model = os.environ.get("DROVER_MODEL", "claude-sonnet-4-6")
    if hasattr(llm, "messages"):
        message = await llm.messages.create(
            model=model, max_tokens=MAX_TOKENS, system=CONTEXT,
            messages=[{"role": "user", "content": prompt}])
        return "".join(b.text for b in message.content if b.type == "text")
    reply = await llm.chat.completions.create(
        model=model, max_completion_tokens=MAX_TOKENS,
        messages=[{"role": "system", "content": CONTEXT}, {"role": "user", "content": prompt}])
    return reply.choices[0].message.content or ""


@drover.subagent
async def inspect_berth(item: dict[str, Any], llm: Any) -> dict[str, Any]:
    """Plan, ``item["steps"]`` checks (each parsing the last answer), a summary: 3-8 calls."""
    berth, steps = item["id"], int(item["steps"])
    words = (await ask(llm, f"Berth {berth}: plan {steps} checks.")).split()
    lengths = []
    for step in range(steps):
        focus = max(words, key=len).strip(".:,") if words else "nothing"
        words = (await ask(llm, f"Berth {berth}, check {step + 1}: look at {focus}.")).split()
        lengths.append(len(words))
    summary = await ask(llm, f"Berth {berth}: summarise {steps} checks, {sum(lengths)} words.")
    return {"berth": berth, "checks": lengths, "summary_words": len(summary.split())}
