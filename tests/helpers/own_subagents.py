"""A team's own sub-agents, as a team writes them (loaded through DROVER_TOOL_MODULES by the
tests of ``@drover.subagent``): a plan call, a few check calls each parsing the last answer,
a summary; and the ways such a function goes wrong.

``llm`` is the client drover hands in (the SDK's own objects and exceptions): the functions
use only ``messages.create`` (or ``chat.completions.create`` for OpenAI) and read the answers'
text, as code written against the plain SDK does. Each request's text names the input and
the step, so no two calls of a job send the same body (the simulator counts a body sent twice).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import drover

MODEL = "claude-sonnet-4-6"


async def ask(llm: Any, prompt: str, max_tokens: int = 120) -> str:
    """One call, its answer's text (either provider's client)."""
    if hasattr(llm, "messages"):
        message = await llm.messages.create(model=MODEL, max_tokens=max_tokens,
                                            messages=[{"role": "user", "content": prompt}])
        return "".join(b.text for b in message.content if b.type == "text")
    reply = await llm.chat.completions.create(
        model=os.environ.get("DROVER_MODEL", "gpt-4o-mini"), max_completion_tokens=max_tokens,
        messages=[{"role": "user", "content": prompt}])
    return reply.choices[0].message.content or ""


@drover.subagent
async def research(item: dict[str, Any], llm: Any) -> dict[str, Any]:
    """Plan, ``item["checks"]`` checks (each built on the last answer's words), a summary."""
    topic, checks = item["topic"], int(item.get("checks", 2))
    plan = await ask(llm, f"Plan a review of {topic} in {checks} checks.")
    words = plan.split()
    found = []
    for step in range(checks):
        # Parse the last answer the team's way: carry its longest word into the next prompt.
        focus = max(words, key=len).strip(".:,") if words else "nothing"
        answer = await ask(llm, f"Check {step + 1} of {topic}: look at {focus}.")
        words = answer.split()
        found.append(len(words))
        if item.get("pause_s"):
            await asyncio.sleep(float(item["pause_s"]))
    summary = await ask(llm, f"Summarise {topic}: {len(found)} checks, {sum(found)} words.")
    return {"topic": topic, "checks": found, "summary_words": len(summary.split()),
            "calls": checks + 2}


@drover.subagent
async def side_by_side(item: dict[str, Any], llm: Any) -> dict[str, Any]:
    """``item["n"]`` calls at once (``asyncio.gather`` inside the function), then one more."""
    answers = await asyncio.gather(*(ask(llm, f"Angle {k} on {item['topic']}.")
                                     for k in range(int(item["n"]))))
    verdict = await ask(llm, f"Weigh {len(answers)} angles on {item['topic']}.")
    return {"topic": item["topic"], "angles": [len(a.split()) for a in answers],
            "verdict_words": len(verdict.split())}


@drover.subagent("fragile")
async def fragile_research(item: dict[str, Any], llm: Any) -> Any:
    """Fails the team's own way on ``item["fail"]``, after one call."""
    await ask(llm, f"First look at {item['topic']}.")
    if item.get("fail") == "raise":
        raise KeyError(f"no source for {item['topic']}")
    if item.get("fail") == "not_json":
        return {"topic": item["topic"], "seen": {1, 2}}
    return {"topic": item["topic"]}


@drover.subagent
def not_async(item: Any, llm: Any) -> Any:
    return item


@drover.subagent
async def takes_one(item: Any) -> Any:
    return item


@drover.subagent
async def long_answer(item: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One long answer, streamed (``item["out"]`` tokens): by ``messages.stream`` (the SDK's
    helper, in its ``async with``); by ``messages.create(stream=True)`` read event by event
    (``item["how"] == "create"``, the stream never closed by the function); or so read in a
    task of the function's own that it waits for with ``asyncio.wait`` and a timeout
    (``"wait"``: a cancel of the function does not reach that task)."""
    prompt = f"Write the whole of {item['topic']} [[sim:out={int(item['out'])}]]"
    kwargs = {"model": MODEL, "max_tokens": int(item["out"]),
              "messages": [{"role": "user", "content": prompt}]}

    async def read() -> int:
        deltas = 0
        async for event in await llm.messages.create(stream=True, **kwargs):
            deltas += event.type == "content_block_delta"
        return deltas

    if item.get("how") == "create":
        deltas = await read()
    elif item.get("how") == "wait":
        reader = asyncio.ensure_future(read())
        done, _ = await asyncio.wait({reader}, timeout=600)
        deltas = reader.result()
    else:
        deltas = 0
        async with llm.messages.stream(**kwargs) as stream:
            async for _ in stream.text_stream:
                deltas += 1
    return {"topic": item["topic"], "deltas": deltas}
