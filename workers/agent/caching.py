"""Why a job's shared prefix was (or was not) read from the prompt cache, in one line.

drover marks the system prompt and the tool definitions for caching (``cache_control``), but
the provider caches a prefix only from a model's minimum cacheable length on: a shorter one
is sent whole every time, with no error and no word. This module says so where a user looks
(``drover result``, ``drover submit --wait``, and ``drover stats`` from the counters each
answer adds to: ``cache_counts``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drover.workers.agent.estimate import CHARS_PER_TOKEN, prefix_estimate
from drover.workers.jobs.records import Usage
from drover.workers.jobs.spec import JobSpec

if TYPE_CHECKING:  # the light readers (`drover stats`) import this module
    from drover.workers.providers import AnswerUsage

__all__ = ["cache_counts", "cache_line", "min_cacheable_tokens", "stats_cache_line"]

# The provider's minimum cacheable prompt length, by model family (its prompt-caching docs);
# the first prefix that a model's name starts with wins.
MIN_CACHEABLE = (("claude-opus-4-5", 4096), ("claude-haiku-4-5", 4096),
                 ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048), ("claude-haiku-3", 2048))
DEFAULT_MIN_CACHEABLE = 1024


def min_cacheable_tokens(model: str) -> int:
    return next((n for prefix, n in MIN_CACHEABLE if model.startswith(prefix)),
                DEFAULT_MIN_CACHEABLE)


def prefix_tokens(spec: JobSpec, tool_chars: int = 0) -> int:
    """About how many tokens the shared prefix (system prompt, tool definitions) holds."""
    return int((len(spec.system or "") + tool_chars) / CHARS_PER_TOKEN)


def cache_counts(params: dict[str, Any], usage: AnswerUsage) -> dict[str, int]:
    """An answer's cache figures for the limiter's counters (``drover stats``): tokens read
    and written, and when it did neither, ``uncached`` and (if its shared prefix was below
    the model's minimum cacheable length, or absent) ``short_prefix``."""
    read = int(getattr(usage, "cache_read_input_tokens", 0) or 0)
    written = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
    counts = {"cache_read": read, "cache_write": written}
    if not read and not written:
        counts["uncached"] = 1
        if prefix_estimate(params) < min_cacheable_tokens(str(params.get("model", ""))):
            counts["short_prefix"] = 1
    return counts


def stats_cache_line(model: str, read: int, written: int, uncached: int, short: int) -> str:
    """``drover stats``' cache figures of one scope (of ``model`` or its class) over the
    window: what was read and written, and why the calls that did neither did not."""
    said = f"{read:,} tokens read from the cache, {written:,} written to it"
    if not uncached:
        return said
    why = []
    if short:
        why.append(f"{short:,} had a shared prefix (system prompt and tool definitions) below "
                   f"{model}'s minimum cacheable length of {min_cacheable_tokens(model):,} "
                   "tokens, or none, so each sent it whole")
    if uncached > short:
        why.append(f"{uncached - short:,} had one long enough, but the API (or a proxy before "
                   "it) reported no cache use")
    head = "nothing cached" if not (read or written) else said
    return f"{head}; of the {uncached:,} answers that used no cache, " + "; ".join(why)


def cache_line(usage: Usage, spec: JobSpec, model: str, tool_chars: int = 0) -> str | None:
    """``cache: ...``: why nothing was read from or written to the cache (None if something
    was: the usage line has those counts)."""
    if usage.cache_read_input_tokens or usage.cache_creation_input_tokens:
        return None
    if not spec.system and not spec.tools:
        return "cache: nothing cached: the job has no system prompt or tools to share"
    size, least = prefix_tokens(spec, tool_chars), min_cacheable_tokens(model)
    if size < least:
        return (f"cache: nothing cached: the shared prefix (system prompt and tool definitions, "
                f"about {size:,} tokens) is below {model}'s minimum cacheable length of "
                f"{least:,} tokens, so every call sends it whole")
    return (f"cache: nothing cached, though the shared prefix (about {size:,} tokens) is long "
            "enough: the API (or a proxy before it) reported no cache use")
