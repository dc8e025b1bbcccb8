"""Deterministic assistant output: end_turn text, tool turns and schema-shaped tool input.

Every choice comes from the `random.Random` handed in, which the engine seeds from
(seed, request body), so the same body always yields the same answer.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from . import triggers
from .tokens import count_text

_VOCAB = (
    "the analysis shows key risk market data trend growth cost signal evidence suggests "
    "further review of and with strong weak source notes indicate several factors across "
    "recent period primary secondary impact estimate range baseline scenario outlook "
    "because however overall likely moderate high low stable region segment demand supply "
    "pricing margin capacity timeline milestone assumption confidence summary"
).split()
_VOCAB_TOKENS = tuple(count_text(w) for w in _VOCAB)


@dataclass(slots=True)
class Generated:
    content: list[dict[str, Any]]
    stop_reason: str
    output_tokens: int


def task_words(messages: list[dict[str, Any]], limit: int = 8) -> str:
    """The first words of the first user message: proof the answer is about its task."""
    if not messages:
        return "the task"
    content = messages[0].get("content")
    text = ""
    if isinstance(content, str):
        text = content
    else:
        for block in content or ():
            if isinstance(block, dict) and block.get("type") == "text":
                text = str(block.get("text", ""))
                break
    words = triggers.strip(text).split()[:limit]
    return " ".join(words) if words else "the task"


def _fit(piece: str, budget: int) -> str:
    """Cut a piece down to at most `budget` tokens (never empty while budget >= 1)."""
    cut = piece[: 4 * budget]
    while cut and count_text(cut) > budget:
        cut = cut[:-1]
    return cut


def text_reply(task: str, target: int, max_tokens: int, rng: random.Random) -> tuple[str, bool]:
    """Text of about `target` tokens, capped at `max_tokens`; returns (text, was_capped)."""
    limit = min(target, max_tokens)
    pieces: list[str] = []
    used = 0
    head = f"Findings on {task}:".split()
    task_pieces = task.split()
    i = 0
    while used < limit:
        if i < len(head):
            piece = head[i]
            tokens = count_text(piece)
        elif task_pieces and rng.random() < 0.08:
            piece = rng.choice(task_pieces)
            tokens = count_text(piece)
        else:
            k = rng.randrange(len(_VOCAB))
            piece, tokens = _VOCAB[k], _VOCAB_TOKENS[k]
            if rng.random() < 0.08:
                piece, tokens = piece + ".", tokens + 1
        i += 1
        if tokens == 0:
            continue
        if used + tokens > limit:
            if limit == max_tokens:
                piece = _fit(piece, limit - used)
                if piece:
                    pieces.append(piece)
                    used += count_text(piece)
            break
        pieces.append(piece)
        used += tokens
    capped = target > max_tokens
    return " ".join(pieces), capped


def signature(thinking: str) -> str:
    """The thinking block's signature: the request that passes the block back must carry it
    unchanged (simulator/validation.py checks it, as the API does)."""
    return "sig_" + hashlib.sha256(thinking.encode()).hexdigest()[:40]


def thinking_block(task: str, target: int, rng: random.Random) -> dict[str, Any]:
    """A thinking block of about ``target`` tokens, signed."""
    text, _ = text_reply(f"considering {task}", target, target, rng)
    return {"type": "thinking", "thinking": text, "signature": signature(text)}


class _Counter:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


def value_for(schema: Any, rng: random.Random, plan_items: int, counter: _Counter) -> Any:
    """A value matching a JSON schema, enough for tool inputs and structured plans."""
    if not isinstance(schema, dict):
        return f"sample-{counter.next()}"
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for combo in ("anyOf", "oneOf", "allOf"):
        if schema.get(combo):
            return value_for(schema[combo][0], rng, plan_items, counter)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        # Only required properties (all of them when the schema lists none as required),
        # the minimum a strict client must cope with.
        required = schema.get("required")
        names = [n for n in required if n in props] if required is not None else list(props)
        return {n: value_for(props[n], rng, plan_items, counter) for n in names}
    if kind == "array":
        n = plan_items
        n = max(n, int(schema.get("minItems", 0)))
        if "maxItems" in schema:
            n = min(n, int(schema["maxItems"]))
        return [value_for(schema.get("items", {}), rng, plan_items, counter) for _ in range(n)]
    if kind == "integer":
        lo = int(schema.get("minimum", 1))
        hi = int(schema.get("maximum", max(lo, 100)))
        return rng.randint(lo, max(lo, hi))
    if kind == "number":
        low = float(schema.get("minimum", 0.0))
        high = float(schema.get("maximum", max(low, 100.0)))
        return round(rng.uniform(low, max(low, high)), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return f"sample-{counter.next()}"


def tool_use_id(body_digest: bytes, turn: int, index: int) -> str:
    # Unique per (body, turn, block) and reproducible, so reruns compare equal.
    h = hashlib.sha256(body_digest + f":{turn}:{index}".encode()).hexdigest()
    return "toolu_01" + h[:22]


def _tool_tokens(block: dict[str, Any]) -> int:
    return count_text(block["name"]) + count_text(
        json.dumps(block["input"], separators=(",", ":"), ensure_ascii=False))


def tool_turn(tools: list[dict[str, Any]], count: int, forced_name: str | None, task: str,
              turn: int, body_digest: bytes, max_tokens: int, plan_items: int,
              rng: random.Random, with_text: bool = True) -> Generated:
    """`count` tool_use blocks, tools picked round-robin from a seeded offset."""
    counter = _Counter()
    offset = rng.randrange(len(tools)) if tools else 0
    blocks: list[dict[str, Any]] = []
    for i in range(count):
        if i == 0 and forced_name is not None:
            tool = next((t for t in tools if t.get("name") == forced_name),
                        {"name": forced_name, "input_schema": {"type": "object", "properties": {
                            "query": {"type": "string"}}, "required": ["query"]}})
        else:
            tool = tools[(offset + i) % len(tools)]
        blocks.append({"type": "tool_use", "id": tool_use_id(body_digest, turn, i),
                       "name": tool["name"],
                       "input": value_for(tool.get("input_schema", {}), rng, plan_items, counter)})
    content: list[dict[str, Any]] = []
    if with_text:
        names = " and ".join(dict.fromkeys(b["name"] for b in blocks))
        content.append({"type": "text", "text": f"I will use {names} to work on {task}."})
    tokens = sum(count_text(b["text"]) for b in content) + sum(_tool_tokens(b) for b in blocks)
    if tokens > max_tokens:
        # Out of room mid tool call: the provider drops the incomplete tool_use.
        text = content[0]["text"] if content else f"I will work on {task}."
        cut, _ = text_reply_from(text, max_tokens)
        return Generated([{"type": "text", "text": cut}], "max_tokens", count_text(cut))
    return Generated(content + blocks, "tool_use", tokens)


def text_reply_from(text: str, max_tokens: int) -> tuple[str, bool]:
    pieces: list[str] = []
    used = 0
    for piece in text.split():
        tokens = count_text(piece)
        if used + tokens > max_tokens:
            piece = _fit(piece, max_tokens - used)
            if piece:
                pieces.append(piece)
            return " ".join(pieces), True
        pieces.append(piece)
        used += tokens
    return " ".join(pieces), False
