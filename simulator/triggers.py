"""Fault triggers written into the last user message, so a test can aim at one sub-agent.

`[[sim:400]]`, `[[sim:500]]`, `[[sim:529]]`, `[[sim:429]]`, `[[sim:spend_cap]]` fail every
attempt of that body; `[[sim:529:2]]` (also 500 / 429) fails only the first 2 attempts of
that body, then the request goes through (to test recovery). `[[sim:tool=NAME]]` makes the
first tool turn call NAME, known to the request or not.
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
