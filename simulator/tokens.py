"""Deterministic, roughly BPE-like token counting.

Not len/4: words and punctuation are tokens, and long words split into ~4-character
pieces, so short chatty text and long identifiers cost what they would with a real
tokenizer, give or take. The count is additive over whitespace-separated pieces, which
lets the generator build text of an exact length.

The request is cut into segments in cache order (tools -> system -> message blocks) so
prompt caching can price the prefix up to the last `cache_control` with the same counter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# Fixed costs, small like the provider's framing tokens.
REQUEST_OVERHEAD = 3
MESSAGE_OVERHEAD = 3
TOOL_OVERHEAD = 5
# Images and documents are not tokenised; a flat price keeps them visible in the limits.
BINARY_BLOCK_TOKENS = 500


def count_text(text: str) -> int:
    n = 0
    for piece in _TOKEN_RE.findall(text):
        size = len(piece)
        n += 1 if size <= 4 else (size + 3) // 4
    return n


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def count_tool(tool: dict[str, Any]) -> int:
    return (TOOL_OVERHEAD + count_text(str(tool.get("name", "")))
            + count_text(str(tool.get("description", "") or ""))
            + count_text(_dumps(tool.get("input_schema", {}))))


def count_block(block: Any) -> int:
    if isinstance(block, str):
        return count_text(block)
    if not isinstance(block, dict):
        return 0
    kind = block.get("type")
    if kind == "text":
        return count_text(str(block.get("text", "")))
    if kind == "tool_use":
        return count_text(str(block.get("name", ""))) + count_text(_dumps(block.get("input", {})))
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, list):
            return 2 + sum(count_block(b) for b in content)
        return 2 + count_text(str(content) if content is not None else "")
    if kind in ("thinking", "redacted_thinking"):
        return count_text(str(block.get("thinking", block.get("data", ""))))
    if kind in ("image", "document"):
        return BINARY_BLOCK_TOKENS
    return count_text(_dumps(block))


@dataclass(frozen=True, slots=True)
class Segment:
    tokens: int
    cache_control: bool
    # What identifies this segment's content for the cache key.
    item: Any


def _system_blocks(system: Any) -> list[Any]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return list(system)


def segments(body: dict[str, Any]) -> list[Segment]:
    """The request cut in cache order; the sum of tokens plus REQUEST_OVERHEAD is the count."""
    out: list[Segment] = []
    for tool in body.get("tools") or ():
        out.append(Segment(count_tool(tool), "cache_control" in tool, tool))
    for block in _system_blocks(body.get("system")):
        tokens = (count_text(str(block.get("text", ""))) if isinstance(block, dict)
                  else count_block(block))
        out.append(Segment(tokens, isinstance(block, dict) and "cache_control" in block, block))
    for message in body.get("messages") or ():
        role = message.get("role")
        content = message.get("content")
        blocks = [content] if isinstance(content, str) else list(content or ())
        if not blocks:
            out.append(Segment(MESSAGE_OVERHEAD, False, (role, None)))
            continue
        for i, block in enumerate(blocks):
            tokens = count_block(block) + (MESSAGE_OVERHEAD if i == 0 else 0)
            cached = isinstance(block, dict) and "cache_control" in block
            out.append(Segment(tokens, cached, (role, block)))
    return out


def count_tokens(body: dict[str, Any]) -> int:
    """Input tokens of a Messages request body (what /v1/messages/count_tokens returns)."""
    return REQUEST_OVERHEAD + sum(s.tokens for s in segments(body))


def cacheable_prefix(segs: list[Segment]) -> tuple[int, int]:
    """(number of segments, tokens) up to and including the last one with cache_control."""
    last = -1
    for i, seg in enumerate(segs):
        if seg.cache_control:
            last = i
    if last < 0:
        return 0, 0
    return last + 1, sum(s.tokens for s in segs[: last + 1])


def prefix_key_material(segs: list[Segment], n: int) -> bytes:
    # cache_control itself is markup, not content: moving the marker must not change the key
    # of an unchanged prefix beyond what the prefix boundary already changes.
    items = [_strip_cache_control(s.item) for s in segs[:n]]
    return _dumps(items).encode()


def _strip_cache_control(item: Any) -> Any:
    if isinstance(item, dict) and "cache_control" in item:
        return {k: v for k, v in item.items() if k != "cache_control"}
    if isinstance(item, tuple):
        return [item[0], _strip_cache_control(item[1])]
    return item
