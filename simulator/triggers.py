"""Fault triggers written into the last user message, so a test can aim at one sub-agent.

`[[sim:400]]`, `[[sim:500]]`, `[[sim:529]]`, `[[sim:429]]`, `[[sim:spend_cap]]` fail every
attempt of that body; `[[sim:529:2]]` (also 500 / 429) fails only the first 2 attempts of
that body, then the request goes through (to test recovery). `[[sim:tool=NAME]]` makes the
first tool turn call NAME, known to the request or not. `[[sim:think=S]]` holds the first
token S seconds more on every attempt (a long prompt read or hidden thinking), the stream
pinged meanwhile as the API pings it; `[[sim:stall=S]]` holds the first attempt's first token
S seconds on a silent connection (no bytes at all, pings included).

Two knobs hold for a whole conversation and are read from its *first* user message (the
task), so one workload can mix short and long sub-agents: `[[sim:turns=N]]` gives it N tool
turns before the final answer (instead of `tool_turns`), `[[sim:out=N]]` makes its final
answer about N tokens long on average (instead of `output_tokens_mean`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TRIGGER_RE = re.compile(r"\[\[sim:([a-z0-9_]+)(?:[=:]([^\]]*))?\]\]")
MARKER = b"[[sim:"


@dataclass(frozen=True, slots=True)
class Trigger:
    name: str  # "400" | "500" | "529" | "429" | "spend_cap" | "tool"
    arg: str | None


def strip(text: str) -> str:
    return _TRIGGER_RE.sub("", text)


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for block in content or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            out.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            out.extend(_texts(block.get("content")))
    return out


def find(messages: list[dict[str, Any]]) -> list[Trigger]:
    """Triggers in the last user message (its text and its tool_result contents)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            found: list[Trigger] = []
            for text in _texts(message.get("content")):
                for m in _TRIGGER_RE.finditer(text):
                    found.append(Trigger(m.group(1), m.group(2)))
            return found
    return []


def conversation_knobs(messages: list[dict[str, Any]]) -> dict[str, int]:
    """`turns` / `out` set by `[[sim:turns=N]]` / `[[sim:out=N]]` in the first user message."""
    for message in messages:
        if message.get("role") == "user":
            knobs: dict[str, int] = {}
            for text in _texts(message.get("content")):
                for m in _TRIGGER_RE.finditer(text):
                    if m.group(1) in ("turns", "out") and m.group(2) and m.group(2).isdigit():
                        knobs[m.group(1)] = int(m.group(2))
            return knobs
    return {}
