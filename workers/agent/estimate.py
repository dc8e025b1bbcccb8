"""A fast local estimate of a request's input tokens, calibrated by the responses.

Counting exactly would need the provider's tokenizer (or a count_tokens round trip per call,
which is itself rate limited: it is asked once per new size of request, COUNTED_BAND).
Instead the estimate is characters / 4 over the text that counts (system, tool definitions,
messages), multiplied by a per-scope correction factor: each response's ``usage`` says what
the request really cost, and the factor follows the ratio (an exponentially weighted mean).
The limiter reserves the estimate and trues it up after the call, so an estimate only has to
be close, not exact; before a scope's answers have
calibrated it, the reservation carries a margin (``UNCALIBRATED``), since a job's first burst
has nothing but the target utilisation's slack to absorb its errors.

The factor is learnt per size of request (BAND_BASE: the raw estimate's power of 4), not one per
scope: a prompt's tokens per character depend on what it holds (markup and punctuation are
tokens of their own, long words several), and a job's short prompts are mostly its markup
while its long ones are mostly prose. One ratio learnt on a job's short prompts reserved its
long ones at 1.21-1.43 x what the provider counted (bench.small_keys --mix: 26 tokens counted
where characters / 4 gives 17, 927 where it gives 749), and a reservation too large waits for
input capacity the provider would have admitted it with. A size not answered yet borrows the
nearest size's factor (the larger of two as near).

Prompt caching changes what counts: on most models cache reads do not count towards ITPM, so
once this process has seen a cached prefix (system prompt and tools) answered from the cache,
later requests with that prefix are estimated without it. Over-estimating is not free: a
reservation's wait is fixed when it is made, so a large over-estimate delays callers even
though the difference is refunded afterwards.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

CHARS_PER_TOKEN = 4.0
# JSON (tool schemas, a tool call's arguments) counts twice as many tokens per character as
# prose: its quotes, braces, colons and short keys are tokens of their own, and a provider
# frames each tool definition with tokens of its own. Counted as prose, a first turn whose
# tool schema is most of the request was estimated at 0.60 x what the simulator's tokenizer
# counts (53 against 89 for bench.tool_turns' first call: its margin of 1.25 fell short,
# and that job's first burst reserved 266 tokens a call where OpenAI charged 289); weighted,
# 0.88 x (78), which the margin covers, and the calibration's ratio then differs less between
# a job's first turns (schema-heavy) and its later ones (tool results: prose).
JSON_WEIGHT = 2
TOOL_OVERHEAD = 4  # tokens per tool definition
SMOOTHING = 0.2
MESSAGE_OVERHEAD = 4
# What the limiter reserves for a scope's input carries a margin until its answers calibrate
# the estimate: characters / 4 counts 10-40% fewer tokens than the provider (bench.workload's
# first turns: 1.10-1.41 x, 1.14 x the median), and one answer calibrates it only roughly
# (a job's requests differ by +-20% in tokens per character: a ratio learnt on one long
# prompt is 25% low for a short one). A job's first burst goes out before any answer, into a
# provider's bucket in which the target utilisation leaves 5% (DROVER_TARGET_UTILIZATION
# 0.95), and the sends of a burst reach the provider bunched (a loaded host, new
# connections), so that 5% is all there is for every error of that burst. The margin starts
# at UNCALIBRATED and fades by SMOOTHING with each answer (x 1.25, 1.20, 1.16, ..., 1.03
# after ten), as the ratio's running mean settles; what it over-reserves is refunded at
# settle. The estimate itself (what an unanswered call is billed at) carries none.
UNCALIBRATED = 1.25
# A stream closed before its end is settled in the limiter at the characters received over
# this (or fewer: the fewest a token held in the scope's answers), not at the usage's
# characters / 4, which fell below the provider's bill (1,200 for 1,284 billed: short words
# and punctuation are tokens of their own). The limiter must not count less than the bill.
OUTPUT_CHARS_PER_TOKEN = 3.0
# Answers shorter than this teach nothing of characters per token (a few tokens of markup).
OUTPUT_CHARS_MIN_TOKENS = 20
# The sizes of request whose factor is learnt apart: the raw estimate's band, BAND_BASE ** n
# tokens and up (1-3, 4-15, 16-63, ..., 1,024-4,095, ...).
BAND_BASE = 4
# From this band up (256 raw tokens), the first request of a size not answered yet is counted
# by the provider (Anthropic's count_tokens, once per scope, size and process) before it is
# reserved: a job's calls are granted up to the horizon before the first of a size answers,
# so a borrowed factor was every one's (bench.small_keys --mix: eight long prompts of ten
# reserved at 1.24 x their count, 2.0 s a call where 1.47 once counted). Smaller requests
# cost too little for a wrong factor to matter.
COUNTED_BAND = 4


CACHE_WARM_S = 240.0  # the provider keeps a cached prefix for 5 minutes after its last use


def _prefix_chars(params: dict[str, Any]) -> int:
    """The prefix's characters, JSON weighted as JSON_WEIGHT characters of prose each."""
    chars = 0
    system = params.get("system")
    if isinstance(system, str):
        chars += len(system)
    elif system:
        chars += sum(len(block.get("text", "")) for block in system)
    for tool in params.get("tools") or ():
        chars += len(tool.get("name", "")) + len(tool.get("description", ""))
        chars += JSON_WEIGHT * len(json.dumps(tool.get("input_schema", {})))
        chars += int(TOOL_OVERHEAD * CHARS_PER_TOKEN)
    return chars


def prefix_estimate(params: dict[str, Any]) -> int:
    """About how many tokens a request's shared prefix (system prompt, tools) holds."""
    return int(_prefix_chars(params) / CHARS_PER_TOKEN)


def _prefix_key(params: dict[str, Any]) -> str | None:
    """Identifies a prefix marked for caching (system prompt and tools), else None."""
    marked = json.dumps([params.get("system"), params.get("tools")], sort_keys=True)
    if '"cache_control"' not in marked:
        return None
    return hashlib.sha1(f"{params.get('model')}|{marked}".encode()).hexdigest()


def raw_estimate(params: dict[str, Any], *, skip_prefix: bool = False) -> int:
    chars = 0 if skip_prefix else _prefix_chars(params)
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
            total += len(block.get("name", "")) + JSON_WEIGHT * len(json.dumps(block.get("input",
                                                                                     {})))
        elif kind == "tool_result":
            total += _content_chars(block.get("content"))
    return total


def band(raw: int) -> int:
    """The size band of a raw estimate (BAND_BASE's power it reaches)."""
    n, bound = 0, BAND_BASE
    while raw >= bound:
        n, bound = n + 1, bound * BAND_BASE
    return n


class Calibration:
    """Per-scope correction of the raw estimate (per size band), and a running estimate of
    output length."""

    def __init__(self) -> None:
        self._input_ratio: dict[str, dict[int, float]] = {}  # scope -> band -> ratio
        self._answers: dict[str, int] = {}  # answers that calibrated each scope's ratios
        self._output: dict[str, float] = {}
        self._output_chars: dict[str, float] = {}  # fewest characters an output token held
        self._counting: set[tuple[str, int]] = set()  # (scope, band) asked of the provider
        self._warm: dict[str, float] = {}  # cached prefix -> when it was last read or written

    def _cached(self, params: dict[str, Any], home: str) -> bool:
        key = _prefix_key(params)
        seen = self._warm.get(f"{home}|{key}") if key else None
        return seen is not None and time.monotonic() - seen < CACHE_WARM_S

    def _raw(self, params: dict[str, Any], cache_reads_count: bool, home: str) -> int:
        return raw_estimate(params, skip_prefix=not cache_reads_count and self._cached(
            params, home))

    def input_tokens(self, scope: str, params: dict[str, Any], cache_reads_count: bool,
                     cache_home: str = "") -> int:
        """Estimated input tokens as ITPM will count them. ``cache_home``: where the prompt
        cache would be (a pool's key: caches are not shared across workspaces)."""
        raw = self._raw(params, cache_reads_count, cache_home)
        return max(1, round(raw * self.input_ratio(scope, raw)))

    def input_ratio(self, scope: str, raw: int) -> float:
        """The factor for a raw estimate of ``raw`` tokens: its band's, else the nearest
        answered band's (the larger of two as near), else 1."""
        ratios = self._input_ratio.get(scope)
        if not ratios:
            return 1.0
        at = band(raw)
        near = min(abs(b - at) for b in ratios)
        return max(r for b, r in ratios.items() if abs(b - at) == near)

    def new_size(self, scope: str, params: dict[str, Any], cache_reads_count: bool,
                 cache_home: str = "") -> bool:
        """True (once per scope and size) when ``params`` is of a size (COUNTED_BAND up) that
        no answer nor count has calibrated yet: the caller asks the provider to count it and
        tells ``counted``. A prefix marked for caching is left out (cache reads the count
        does not know of)."""
        raw = self._raw(params, cache_reads_count, cache_home)
        at = band(raw)
        if at < COUNTED_BAND or _prefix_key(params) is not None or (scope, at) in \
                self._counting or at in self._input_ratio.get(scope, {}):
            return False
        self._counting.add((scope, at))
        return True

    def counted(self, scope: str, params: dict[str, Any], tokens: int | None,
                cache_reads_count: bool, cache_home: str = "") -> None:
        """The provider's count of a request ``new_size`` named: that size's factor, unless
        an answer came first. None (it gave none): the size borrows until it is answered,
        and is not asked again (a key without the endpoint would pay a failed request per
        call)."""
        raw = self._raw(params, cache_reads_count, cache_home)
        if tokens and raw > 0:
            self._input_ratio.setdefault(scope, {}).setdefault(band(raw), tokens / raw)

    def input_reservation(self, scope: str, estimate: int) -> int:
        """What the limiter reserves for an input ``estimate``: with the margin of a scope
        whose answers have not calibrated it yet (see UNCALIBRATED)."""
        margin = 1 + (UNCALIBRATED - 1) * (1 - SMOOTHING) ** self._answers.get(scope, 0)
        return max(estimate, round(estimate * margin))

    def output_chars_per_token(self, scope: str) -> float:
        """What a stream closed early is settled at in the limiter: characters received per
        output token (OUTPUT_CHARS_PER_TOKEN, fewer where this scope's answers had fewer)."""
        return self._output_chars.get(scope, OUTPUT_CHARS_PER_TOKEN)

    def observe_output_chars(self, scope: str, chars: int, tokens: int) -> None:
        """A streamed answer's characters received and its output count."""
        if tokens >= OUTPUT_CHARS_MIN_TOKENS and chars > 0:
            self._output_chars[scope] = min(self.output_chars_per_token(scope), chars / tokens)

    def output_tokens(self, scope: str, max_tokens: int) -> int:
        guess = self._output.get(scope, min(max_tokens, 512))
        return max(1, min(max_tokens, round(guess)))

    def observe(self, scope: str, params: dict[str, Any], usage: Any, total_input: int,
                cache_reads_count: bool, cache_home: str = "") -> None:
        """Learn from a response: how far off the estimate of ``total_input`` was, what is
        cached (at ``cache_home``), how long answers are."""
        raw = self._raw(params, cache_reads_count, cache_home)
        key = _prefix_key(params)
        if key and (usage.cache_read_input_tokens or usage.cache_creation_input_tokens):
            self._warm[f"{cache_home}|{key}"] = time.monotonic()
        output = usage.output_tokens or 0
        if raw > 0 and total_input > 0:
            ratios = self._input_ratio.setdefault(scope, {})
            at = band(raw)
            old = ratios.get(at, total_input / raw)
            ratios[at] = old + SMOOTHING * (total_input / raw - old)
            self._answers[scope] = self._answers.get(scope, 0) + 1
        old_out = self._output.get(scope, float(output))
        self._output[scope] = old_out + SMOOTHING * (output - old_out)
