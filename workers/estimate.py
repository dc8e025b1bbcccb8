"""A fast local estimate of a request's input tokens, calibrated by the responses.

Counting exactly would need the provider's tokenizer (or a count_tokens round trip per call,
which is itself rate limited). Instead the estimate is characters / 4 over the text that
counts (system, tool definitions, messages), multiplied by a per-scope correction factor: each
response's ``usage`` says what the request really cost, and the factor follows the ratio
(an exponentially weighted mean). The limiter reserves the estimate and trues it up after the
call, so an estimate only has to be close, not exact.
"""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 4.0
SMOOTHING = 0.2
MESSAGE_OVERHEAD = 4


def raw_estimate(params: dict[str, Any]) -> int:
    chars = 0
    system = params.get("system")
    if isinstance(system, str):
        chars += len(system)
    elif system:
        chars += sum(len(block.get("text", "")) for block in system)
    for tool in params.get("tools") or ():
        chars += len(tool.get("name", "")) + len(tool.get("description", ""))
        chars += len(json.dumps(tool.get("input_schema", {})))
    tokens = 0
    for message in params.get("messages", ()):
        tokens += MESSAGE_OVERHEAD
        chars += _content_chars(message.get("content"))
    return int(chars / CHARS_PER_TOKEN) + tokens + 1


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    total = 0
    for block in content or ():
        kind = block.get("type")
        if kind == "text":
            total += len(block.get("text", ""))
        elif kind == "tool_use":
            total += len(block.get("name", "")) + len(json.dumps(block.get("input", {})))
        elif kind == "tool_result":
            total += _content_chars(block.get("content"))
    return total


class Calibration:
    """Per-scope correction of the raw estimate, and a running estimate of output length."""

    def __init__(self) -> None:
        self._input_ratio: dict[str, float] = {}
        self._output: dict[str, float] = {}

    def input_tokens(self, scope: str, params: dict[str, Any]) -> int:
        return max(1, round(raw_estimate(params) * self._input_ratio.get(scope, 1.0)))

    def output_tokens(self, scope: str, max_tokens: int) -> int:
        guess = self._output.get(scope, min(max_tokens, 512))
        return max(1, min(max_tokens, round(guess)))

    def observe(self, scope: str, params: dict[str, Any], total_input: int, output: int) -> None:
        raw = raw_estimate(params)
        if raw > 0 and total_input > 0:
            old = self._input_ratio.get(scope, total_input / raw)
            self._input_ratio[scope] = old + SMOOTHING * (total_input / raw - old)
        old_out = self._output.get(scope, float(output))
        self._output[scope] = old_out + SMOOTHING * (output - old_out)
