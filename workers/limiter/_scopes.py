"""What a scope is, the limits it is held to, and what ``acquire`` hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["ORG", "POOL_TAG", "STAT_FIELDS", "Grant", "Held", "ScopeLimits", "llm_scope",
           "org_scope", "pool_scope", "split_llm_scope", "tool_scope"]

# A pool's scopes (its organisation's and its keys', every model class) share one hash tag,
# so one script reserves in the key's buckets and the organisation's at once.
POOL_TAG = "pool"
ORG = "org"  # the organisation's level, where a key's alias would be

# The per-second counters of a scope, the one list of them (_scripts.py hands it to the Lua):
# what the limiter planned and what the answers used. Then four of the answers' prompt
# cache, for ``drover stats``: tokens read from and written to the cache, calls that did
# neither, and those of them whose shared prefix was below the model's minimum cacheable
# length (the caller judges that; the limiter adds). The last four are the streams' speed:
# answers streamed with a first token, the sum of their times to first token (ms), of their
# generation times after it (ms) and of the output tokens generated then. Calls by outcome
# (429, 529, ...) are telemetry's ``drover_llm_calls``, not counted here.
STAT_FIELDS = ("requests", "input_tokens", "output_tokens", "waits", "wait_ms", "cache_read",
               "cache_write", "uncached", "short_prefix", "streamed", "ttft_ms", "gen_ms",
               "gen_tokens")


def llm_scope(key_alias: str, model: str) -> str:
    """The scope of one model class under one API key: what the provider limits together."""
    return f"llm:{key_alias}:{model}"


def pool_scope(key_alias: str, model_class: str) -> str:
    """One pool key's (its workspace's) limits of a model class."""
    return f"{POOL_TAG}/llm:{key_alias}:{model_class}"


def org_scope(model_class: str) -> str:
    """The organisation's limits of a model class, over every key of its pool."""
    return pool_scope(ORG, model_class)


def split_llm_scope(scope: str) -> tuple[str, str, bool] | None:
    """(key alias or ``org``, model or class, pooled) of an LLM scope; None for others."""
    pooled = scope.startswith(f"{POOL_TAG}/")
    kind, _, rest = scope.removeprefix(f"{POOL_TAG}/").partition(":")
    if kind != "llm":
        return None
    alias, _, model = rest.partition(":")
    return alias, model, pooled


def tool_scope(tool_name: str) -> str:
    """The scope of a rate-limited service that a tool calls."""
    return f"tool:{tool_name}"


class Held(float):
    """``hold_back``'s answer: its seconds (see ``Limiter.hold_back``), a float; ``report``:
    the send goes, paced on its admission, and its caller said it would report when the
    response headers come back: tell ``Limiter.admitted`` then (hold_back.lua, admitted.lua)."""

    report = False

    @classmethod
    def paced(cls) -> Held:
        held = cls(0.0)
        held.report = True
        return held


@dataclass(frozen=True)
class ScopeLimits:
    """The limits one scope is held to, per minute, after the caller's target utilisation:
    the dimensions its provider names (``tpm``: input and output in one bucket, OpenAI's).
    ``None``: unlimited, unless a ``-limit`` header taught one (times ``learned_utilization``).
    Each bucket holds ``burst_s`` of refill. ``learn_share``: the key may be shared with
    software drover does not run; learn from the headers and 429s what share is left for us."""

    rpm: float | None = None
    itpm: float | None = None
    otpm: float | None = None
    tpm: float | None = None
    burst_s: float = 1.0
    max_in_flight: int | None = None
    learned_utilization: float = 1.0
    learn_share: bool = False
    # How many times an output token counts in ``tpm`` (Bedrock's output burndown: 5).
    output_weight: float = 1.0
    # A pool's entry under no organisation (Claude on a cloud): its grants reserve in its own
    # buckets only, and the organisation's cooldown does not hold it.
    alone: bool = False

    def __post_init__(self) -> None:
        for name in ("rpm", "itpm", "otpm", "tpm"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ScopeLimits.{name} must be > 0 or None, got {value!r}")
        if not self.burst_s > 0:
            raise ValueError(f"ScopeLimits.burst_s must be > 0, got {self.burst_s!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("ScopeLimits.max_in_flight must be >= 1 or None, "
                             f"got {self.max_in_flight!r}")
        if not self.output_weight >= 1:
            raise ValueError(f"ScopeLimits.output_weight must be >= 1, got {self.output_weight!r}")
        if not 0 < self.learned_utilization <= 1:
            raise ValueError("ScopeLimits.learned_utilization must be in (0, 1], "
                             f"got {self.learned_utilization!r}")

    @classmethod
    def for_tool(cls, rps: float, burst_s: float = 1.0,
                 max_in_flight: int | None = None) -> ScopeLimits:
        """A tool's scope: requests per second only."""
        return cls(rpm=rps * 60, burst_s=burst_s, max_in_flight=max_in_flight)


class Grant(NamedTuple):
    """What ``acquire`` decided."""

    granted: bool          # True: debited, lease taken; send after wait_s
    wait_s: float          # when granted: seconds to wait before sending (0.0 = now)
    retry_after_s: float   # when not granted: seconds until it is worth coming back
    lease_id: str | None
    reason: str            # "ok" | "horizon" | "cooldown" | "in_flight"
    input_tokens: int      # what was reserved, for settle
    output_tokens: int
    now_us: float = 0.0    # Redis time (us) of the acquire
    key: str | None = None  # a pool's acquire: the alias of the key chosen
    max_tokens: int = 0  # the call's, which a tokens bucket took at least at admission

    @property
    def send_us(self) -> float:
        """Redis time (us) of the planned send."""
        return self.now_us + self.wait_s * 1e6

    @property
    def send_at(self) -> float:
        """Redis time (epoch s) of the planned send."""
        return self.now_us / 1e6 + self.wait_s

    @property
    def acquired_s(self) -> int:
        """The Redis second of the acquire (its wait is counted there)."""
        return int(self.now_us // 1e6)
