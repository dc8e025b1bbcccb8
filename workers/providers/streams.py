"""What a realtime call's stream delivered (``Seen``), whichever provider streams it: a stream
is judged by the gap between its bytes, never by a total time.

A call that is making progress is never abandoned: the stream is closed only when its
connection carried no byte for ``DROVER_STREAM_IDLE_S`` (the client's read timeout, which the
SDK raises as an APITimeoutError, retried like a timeout), when the connection drops or an
``error`` event arrives mid-answer (retried like a 5xx / 529), or when the caller cancels it
(a job cancel or deadline: ``llm.race`` cancels the task, which closes the stream at once).
The idle limit is timed on the connection's bytes, not on the SDK's events: the API keeps a
stream whose first token is minutes away (a long prompt read, hidden thinking) alive with
``ping`` events, which the SDK drops before any event reaches drover. Timed per event, such a
healthy stream was abandoned at the idle limit and sent again, each attempt billed (16 calls
whose first token came after 75 s: none answered, 80 sent in 5 minutes).

``Seen`` keeps what had arrived, so a stream that ends early still counts what it cost: the
input from ``message_start`` and the output generated until then (the last usage seen, or the
characters received / 4); the limiter settles that output at fewer characters a token (what
the scope's answers showed, at most 3), so as not to fall below the bill.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

CHARS_PER_TOKEN = 4.0


@dataclass
class Seen:
    """What a stream delivered so far."""

    opened: float = field(default_factory=time.monotonic)
    headers: Any = None  # the response's headers (the limiter reads its rate-limit headers)
    started: bool = False  # message_start arrived: the provider admitted the request
    # The stream said its input count (Anthropic: message_start; OpenAI: only the last
    # chunk's usage, so a stream cut before it has admitted, and billed, an unsaid prompt).
    input_said: bool = False
    input_tokens: int = 0  # message_start's usage (input, cache creation and reads)
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0  # the output count message_delta said
    chars: int = 0  # characters of content received (text, tool input, thinking)
    first_token_s: float | None = None  # from the send to the first content delta
    last_event_s: float = 0.0  # from the send to the last event
    finished: bool = False  # the stream's last event came (the answer is whole)

    def on(self, event: Any) -> None:
        """Fold in one event of a Messages stream: the SDK's object, or the wire's JSON (the
        limited clients' transport reads the bytes as they pass)."""
        now = time.monotonic() - self.opened
        self.last_event_s = now
        kind = field_of(event, "type")
        if kind == "message_start":
            self.started = True
            self.input_said = True
            usage = field_of(field_of(event, "message"), "usage")
            self.input_tokens = field_of(usage, "input_tokens") or 0
            self.cache_creation_input_tokens = field_of(usage, "cache_creation_input_tokens") or 0
            self.cache_read_input_tokens = field_of(usage, "cache_read_input_tokens") or 0
            # (its output count, 1 or so, is not taken: nothing is generated before content)
        elif kind == "content_block_delta":
            delta = field_of(event, "delta")
            text = (field_of(delta, "text") or field_of(delta, "partial_json")
                    or field_of(delta, "thinking") or "")
            if text and self.first_token_s is None:
                self.first_token_s = now
            self.chars += len(text)
        elif kind == "message_delta":
            said = field_of(field_of(event, "usage"), "output_tokens") or 0
            self.output_tokens = max(self.output_tokens, said)
        elif kind == "message_stop":
            self.finished = True

    def partial_output(self) -> int:
        """Output tokens generated so far: the stream's own count, or estimated from the
        characters received."""
        return max(self.output_tokens, math.ceil(self.chars / CHARS_PER_TOKEN))

    def partial_output_at_most(self, max_tokens: int, chars_per_token: float) -> int:
        """The output a stream closed now is settled at by the limiter: the stream's own
        count, or the characters received at ``chars_per_token`` (fewer than the usage's
        estimate: characters / 4 settled 1,200 where the provider billed 1,284 for words of
        its own count), at most ``max_tokens``. A settle below the bill lets the next grants
        spend output the provider has counted; one above it only holds the scope back a
        little for a minute."""
        return max(self.output_tokens,
                   min(max_tokens, math.ceil(self.chars / max(chars_per_token, 1.0))))

    def partial_input(self, cache_reads_count: bool) -> int:
        total = self.input_tokens + self.cache_creation_input_tokens
        return total + (self.cache_read_input_tokens if cache_reads_count else 0)

    def counts(self, output_tokens: int) -> dict[str, int]:
        """The limiter's speed counters of this answer (STAT_FIELDS), for ``drover stats``."""
        if self.first_token_s is None:
            return {}
        gen_s = max(0.0, self.last_event_s - self.first_token_s)
        return {"streamed": 1, "ttft_ms": round(self.first_token_s * 1000),
                "gen_ms": round(gen_s * 1000), "gen_tokens": output_tokens}

    def output_per_s(self, output_tokens: int) -> float | None:
        """Output tokens a second after the first token (None: too short to say)."""
        if self.first_token_s is None:
            return None
        span = self.last_event_s - self.first_token_s
        return output_tokens / span if span > 0.05 and output_tokens > 1 else None


def field_of(value: Any, name: str) -> Any:
    """``value.name`` of an SDK object, ``value[name]`` of the wire's JSON (None: absent)."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


class SseEvents:
    """The JSON of each ``data:`` line of a server-sent event stream, from its bytes as they
    arrive (chunks split anywhere); ``DONE`` for OpenAI's ``data: [DONE]``."""

    DONE: dict[str, Any] = {"type": "[DONE]"}

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        out: list[dict[str, Any]] = []
        for line in lines:
            line = line.rstrip(b"\r")
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out.append(self.DONE)
                continue
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(event)
        return out
