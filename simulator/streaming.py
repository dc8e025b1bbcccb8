"""The Messages API's server-sent events for ``stream: true``, and when each one is due.

A reply (its content blocks, stop reason and usage) becomes the events the provider sends:
``message_start``, a ``ping``, per block ``content_block_start`` / ``_delta`` / ``_stop``
(``text_delta``, ``input_json_delta`` for tool_use, ``thinking_delta`` then
``signature_delta`` for thinking), ``message_delta`` with the final usage and
``message_stop``. Each event carries how many output tokens have been generated once it is
out, so the server can pace them at the configured tokens per second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .responses import message_id

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(slots=True)
class Event:
    tokens: int  # output tokens generated once this event is out (paces it)
    data: bytes  # the whole SSE frame


def frame(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {_dumps(data)}\n\n".encode()


PING = frame("ping", {"type": "ping"})


def error_frame(error_type: str, message: str) -> bytes:
    return frame("error", {"type": "error", "error": {"type": error_type, "message": message}})


def _chunks(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _piece_text(block: dict[str, Any]) -> str:
    kind = block["type"]
    if kind == "text":
        return str(block["text"])
    if kind == "thinking":
        return str(block["thinking"])
    return _dumps(block.get("input") or {})


def events(model: str, content: list[dict[str, Any]], stop_reason: str,
           usage: dict[str, int], chunk_tokens: int) -> list[Event]:
    """Every event of one streamed reply, in order; ``chunk_tokens``: about how many tokens
    one delta carries."""
    total = int(usage["output_tokens"])
    chars = sum(len(_piece_text(b)) for b in content) or 1
    size = max(4, 4 * chunk_tokens)
    out: list[Event] = []
    start_usage = {**usage, "output_tokens": min(1, total)}
    out.append(Event(0, frame("message_start", {"type": "message_start", "message": {
        "id": message_id(), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}})))
    out.append(Event(0, PING))
    seen = 0
    for index, block in enumerate(content):
        kind = block["type"]
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            delta_type, field = "text_delta", "text"
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            delta_type, field = "thinking_delta", "thinking"
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta_type, field = "input_json_delta", "partial_json"
        tokens = round(total * seen / chars)
        out.append(Event(tokens, frame("content_block_start", {
            "type": "content_block_start", "index": index, "content_block": start})))
        for piece in _chunks(_piece_text(block), size):
            seen += len(piece)
            out.append(Event(round(total * seen / chars), frame("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": delta_type, field: piece}})))
        if kind == "thinking":
            out.append(Event(out[-1].tokens, frame("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "signature_delta", "signature": block["signature"]}})))
        out.append(Event(out[-1].tokens, frame("content_block_stop", {
            "type": "content_block_stop", "index": index})))
    out.append(Event(total, frame("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": usage})))
    out.append(Event(total, frame("message_stop", {"type": "message_stop"})))
    return out
