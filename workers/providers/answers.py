"""drover's own answer types: what a provider's turn returns, whichever API answered.

Each provider converts at its edge (``Provider.stream_turn``; Anthropic's Message Batches
results too), so the agent loop, the join, planning, the batcher and the accounting read
these and never an SDK's objects; this module imports no SDK (an OpenAI-only fleet never
imports the anthropic one).

drover's conversation is in the Messages API's shape (``{"role", "content": [blocks]}``), so
a ``Block`` keeps its block's JSON in that shape as it is (a thinking block's signature, a
block type drover does not read) and is appended to the conversation as ``Block.json``;
``Answer`` adds the turn's stop reason, model and ``AnswerUsage`` in the Messages API's names
(what drover counts and bills: a provider's cached prompt tokens are cache reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Answer", "AnswerUsage", "BatchSeen", "Block"]


@dataclass
class AnswerUsage:
    """An answer's usage in the Messages API's names (what drover counts and bills)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @classmethod
    def from_json(cls, usage: Mapping[str, Any] | None) -> AnswerUsage:
        """A Messages-shaped usage (``input_tokens``, ...; absent or null: 0)."""
        usage = usage or {}
        return cls(*(int(usage.get(name) or 0) for name in (
            "input_tokens", "output_tokens", "cache_creation_input_tokens",
            "cache_read_input_tokens")))


@dataclass(frozen=True)
class Block:
    """One content block of an answer; ``json`` is the block in the Messages shape."""

    json: Mapping[str, Any]

    @property
    def type(self) -> str:
        return str(self.json.get("type") or "")

    @property
    def text(self) -> str:
        """A text block's text ("" for any other block)."""
        return str(self.json.get("text") or "") if self.type == "text" else ""

    @property
    def name(self) -> str:
        """A tool call's tool ("" for any other block)."""
        return str(self.json.get("name") or "") if self.type == "tool_use" else ""

    @property
    def id(self) -> str:
        return str(self.json.get("id") or "")

    @property
    def input(self) -> dict[str, Any]:
        """A tool call's arguments ({} for any other block, or arguments not an object)."""
        value = self.json.get("input") if self.type == "tool_use" else None
        return dict(value) if isinstance(value, Mapping) else {}

    def to_json(self) -> dict[str, Any]:
        """A copy of the block, as the conversation (and a checkpoint) keeps it."""
        return dict(self.json)


@dataclass(frozen=True)
class Answer:
    """One turn's answer: its blocks, why it stopped (the Messages API's ``stop_reason``:
    end_turn, tool_use, max_tokens, ...), the model that answered and its usage."""

    content: tuple[Block, ...]
    stop_reason: str | None
    model: str
    usage: AnswerUsage = field(default_factory=AnswerUsage)
    id: str = ""

    @classmethod
    def from_json(cls, message: Mapping[str, Any]) -> Answer:
        """An answer from a Messages-shaped message's JSON (a Message, as its SDK dumps it
        or as a Message Batch result carries it)."""
        return cls(content=tuple(Block(dict(b)) for b in message.get("content") or []
                                 if isinstance(b, Mapping)),
                   stop_reason=message.get("stop_reason"),
                   model=str(message.get("model") or ""),
                   usage=AnswerUsage.from_json(message.get("usage")),
                   id=str(message.get("id") or ""))

    def text(self) -> str:
        """The answer's text blocks, joined."""
        return "".join(block.text for block in self.content)

    def content_json(self) -> list[dict[str, Any]]:
        """The blocks as the conversation keeps them (the assistant message's content)."""
        return [block.to_json() for block in self.content]


@dataclass(frozen=True)
class BatchSeen:
    """A Message Batch as the provider showed it (created, retrieved, listed or cancelled):
    what the batcher reads, in drover's words."""

    id: str
    created_at: float  # seconds since the epoch
    requests: int  # its requests, whatever their state
    ended: bool  # processing has ended: its results can be read
    results_url: str | None = None
