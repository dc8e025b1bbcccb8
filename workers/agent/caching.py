"""Why a job's shared prefix was (or was not) read from the prompt cache, in one line.

drover marks the system prompt and the tool definitions for caching (``cache_control``), but
the provider caches a prefix only from a model's minimum cacheable length on: a shorter one
is sent whole every time, with no error and no word. This module says so where a user looks
(``drover result``, ``drover submit --wait``).
"""

from __future__ import annotations

from drover.workers.agent.estimate import CHARS_PER_TOKEN
from drover.workers.jobs.records import Usage
from drover.workers.jobs.spec import JobSpec

__all__ = ["cache_line", "min_cacheable_tokens"]

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
