"""The global limiter: one atomic Redis acquire over a scope's requests, input and output
tokens per minute, with in-flight leases, cooldowns and header sync. Depends on redis only."""

from workers.limiter._limiter import (
    STAT_FIELDS,
    AsyncLimiter,
    Grant,
    Limiter,
    ScopeLimits,
    llm_scope,
    parse_ratelimit_headers,
    tool_scope,
)

__all__ = ["STAT_FIELDS", "AsyncLimiter", "Grant", "Limiter", "ScopeLimits", "llm_scope",
           "parse_ratelimit_headers", "tool_scope"]
