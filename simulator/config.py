"""SimConfig: every knob of the simulator, in one dataclass.

Limits are per API key and per minute, like the provider's. Runtime changes go through
`SimConfig.replaced(**changes)`, which validates, so a bad `/_sim/config` body is a 400
instead of a half-applied change.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Any, Literal

OtpmMode = Literal["generated", "max_tokens"]
OtherModel = Literal["refill", "draws"]

# Changing one of these rebuilds the rate-limit buckets (they start full again).
LIMIT_FIELDS = frozenset({"rpm", "itpm", "otpm", "tpm", "burst_s", "otpm_mode", "pool",
                          "model_classes", "refuse_oversized", "provider"})
Provider = Literal["anthropic", "openai", "bedrock", "vertex"]
RetryAfterHeaders = Literal["seconds", "ms", "both", "none"]
_POOL_ENTRY = {"alias", "api_key", "rpm", "itpm", "otpm", "revoke_after_s"}


@dataclass(frozen=True)
class SimConfig:
    # Which API it speaks: "anthropic" (Messages, /v1/messages) or "openai" (Chat
    # Completions, /v1/chat/completions: simulator/openai.py). OpenAI's limits are rpm and
    # tpm, one tokens bucket charged input + max_completion_tokens at admission, nothing
    # given back within the minute (../shared/openai-api.md); itpm/otpm are Anthropic's.
    # "bedrock" and "vertex": Claude on Amazon Bedrock (rpm and tpm, output counted
    # output_burndown times) or Google Vertex AI (rpm/itpm/otpm), their routes, credentials,
    # errors and streams (simulator/clouds.py).
    provider: Provider = "anthropic"
    # Bedrock: how many times an output token counts against the tokens quota once the answer
    # is done (AWS's quota docs: 5 for the current Claude models).
    output_burndown: float = 5.0
    tpm: float | None = None
    # OpenAI's 429s: which retry headers they carry (retry-after, retry-after-ms, both, none).
    retry_after_headers: RetryAfterHeaders = "seconds"
    # Per-minute limits per API key; None = unlimited (no bucket, no headers).
    rpm: float | None = None
    itpm: float | None = None
    otpm: float | None = None
    # Bucket capacity in seconds of refill: 60 holds a full minute, like the provider.
    burst_s: float = 60.0
    # generated: debit output when generated (admission needs the bucket > 0; a stream is
    # debited write by write, a reply sent whole at its end);
    # max_tokens: reserve max_tokens at admission and refund the unused part.
    otpm_mode: OtpmMode = "generated"
    # A request that needs more than a whole minute of a limit (input tokens over the ITPM;
    # in max_tokens mode, max_tokens over the OTPM): False admits it once the bucket is full
    # (its cost capped at the capacity); True answers it 429 "This request would exceed the
    # rate limit ... of N input tokens per minute" every time, with a retry-after, as the
    # provider is seen to answer a request larger than the limit, so a client that retries it
    # waits for ever.
    refuse_oversized: bool = False
    # Another consumer of the same key, taking this fraction of every limit all the time:
    # each bucket refills at (1 - other_share) x its rate for us. Changing it at runtime
    # keeps the buckets (the other user starts or stops).
    other_share: float = 0.0
    # How that other consumer takes its share. refill: our buckets refill at (1 - share) x
    # their rate (an easy model: a full bucket stays full). draws: it sends requests of its
    # own (Poisson arrivals at share x the request limit, each the limits' mean size) that
    # draw from the same buckets, at full capacity and full refill, so the remaining the
    # headers show drops between our calls as it does at the provider.
    other_model: OtherModel = "refill"
    cache_reads_count: bool = False
    # A pool of keys inside one organisation: a list of {"alias", "api_key", "rpm", "itpm",
    # "otpm", "revoke_after_s"}, each key's own (its workspace's) limits; rpm/itpm/otpm above
    # are then the organisation's, shared by every key (a key not listed has only those). A
    # key answers 401 once revoke_after_s have passed since the pool was configured.
    pool: tuple[dict[str, Any], ...] = ()
    # Aliases of pool keys revoked now (401 authentication_error); changing it keeps buckets.
    revoked: tuple[str, ...] = ()
    # Model -> class: models of one class share one set of buckets; with any class set, every
    # model has buckets of its own class (a model not listed is its own). Empty: one set of
    # buckets per key for every model.
    model_classes: dict[str, str] = dataclasses.field(default_factory=dict)
    overload_rate: float = 0.0
    error_5xx_rate: float = 0.0
    inject_429_rate: float = 0.0
    inject_429_retry_after: int = 1
    latency_mean_s: float = 0.0
    latency_p95_s: float = 0.0
    output_tokens_mean: int = 200
    # --- generation physics: how long an answer takes (both paths; streams pace their events)
    # Output tokens generated per second once the first token is out; 0 = instantly (the
    # default, so tests that do not ask for physics stay fast). A reply of N output tokens
    # then takes latency + ttft_s + N / output_tokens_per_s.
    output_tokens_per_s: float = 0.0
    # Time to first token, after admission (on top of the latency draw).
    ttft_s: float = 0.0
    # A Messages stream waiting for its next event (a long prompt read, hidden thinking, a
    # `[[sim:think=S]]` first token) sends a `ping` event after this many seconds without
    # bytes, as the API does; 0: never. A stall (`[[sim:stall=S]]`: a dead connection) sends
    # nothing, and neither do OpenAI's streams.
    ping_every_s: float = 5.0
    # Answers of a chosen share of max_tokens: a final text answer's length is drawn within
    # [output_share_min, output_share_max] x max_tokens (both 0: output_tokens_mean rules).
    output_share_min: float = 0.0
    output_share_max: float = 0.0
    tool_turns: int = 2
    tools_per_turn: int = 2
    plan_items: int = 6
    cache_min_tokens: int = 1024
    cache_ttl_s: float = 300.0
    # The docs round token `-remaining` headers to the nearest thousand; tests of header
    # sync with tiny limits may want exact values.
    round_token_headers: bool = True
    seed: int = 0
    # --- the Message Batches API (simulator/batches.py) ---
    # Each request of a batch finishes at a seeded time within this many seconds of the
    # batch's creation; the batch ends when its last request has (or at batch_expires_s).
    batch_processing_s: float = 1.0
    # Requests not finished this long after creation become `expired` (the provider: 24 h).
    batch_expires_s: float = 86400.0
    # Fractions of requests that end `errored` (a retryable overloaded_error) or `expired`.
    batch_errored_rate: float = 0.0
    batch_expired_rate: float = 0.0
    # The batches endpoints' own limits, per API key: requests/min to /v1/messages/batches*
    # and requests waiting in in-progress batches; None = unlimited.
    batch_rpm: float | None = None
    batch_queue_cap: int | None = None
    batch_max_requests: int = 100_000
    # The create call's answer: held back this many seconds after the batch was created, or
    # dropped (the connection closed, no answer), so a test can stop the client in between.
    batch_create_delay_s: float = 0.0
    batch_create_drop: bool = False
    # --- money (simulator/billing.py) ---
    # Dollars per million tokens by model: {"claude-sonnet-4-6": {"input": 3.0, "output":
    # 15.0[, "cache_write": 3.75, "cache_read": 0.3]}}; stats()["billing"] is the bill at these.
    prices: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    batch_discount: float = 0.5  # a Message Batch result pays this fraction of the price
    # The organisation's spend limit, in paid (admitted) calls of every key; once reached,
    # every request is refused (429 enforced_spend_limit_reached / insufficient_quota) until
    # it is raised or set to None through /_sim/config.
    spend_limit_calls: int | None = None
    # A pool key's (its workspace's) spend limit: alias -> paid calls of that key.
    key_spend_limit_calls: dict[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.provider not in ("anthropic", "openai", "bedrock", "vertex"):
            raise ValueError("provider must be 'anthropic', 'openai', 'bedrock' or 'vertex', "
                             f"got {self.provider!r}")
        if self.output_burndown < 1:
            raise ValueError("output_burndown must be >= 1")
        if self.retry_after_headers not in ("seconds", "ms", "both", "none"):
            raise ValueError("retry_after_headers must be seconds, ms, both or none, got "
                             f"{self.retry_after_headers!r}")
        for name in ("rpm", "itpm", "otpm", "tpm"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None (unlimited), got {value!r}")
        if not self.burst_s > 0:
            raise ValueError(f"burst_s must be > 0, got {self.burst_s!r}")
        if self.otpm_mode not in ("generated", "max_tokens"):
            raise ValueError("otpm_mode must be 'generated' or 'max_tokens', "
                             f"got {self.otpm_mode!r}")
        if self.other_model not in ("refill", "draws"):
            raise ValueError(f"other_model must be 'refill' or 'draws', got {self.other_model!r}")
        if not 0.0 <= self.other_share < 1.0:
            raise ValueError(f"other_share must be within [0, 1), got {self.other_share!r}")
        for name in ("overload_rate", "error_5xx_rate", "inject_429_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value!r}")
        if self.inject_429_retry_after < 0:
            raise ValueError("inject_429_retry_after must be >= 0")
        if self.latency_mean_s < 0 or self.latency_p95_s < 0:
            raise ValueError("latency_mean_s and latency_p95_s must be >= 0")
        if self.output_tokens_per_s < 0 or self.ttft_s < 0 or self.ping_every_s < 0:
            raise ValueError("output_tokens_per_s, ttft_s and ping_every_s must be >= 0")
        if not 0.0 <= self.output_share_min <= self.output_share_max <= 1.0:
            raise ValueError("output shares must satisfy 0 <= output_share_min <= "
                             "output_share_max <= 1")
        if self.output_tokens_mean < 1:
            raise ValueError("output_tokens_mean must be >= 1")
        if self.tool_turns < 0:
            raise ValueError("tool_turns must be >= 0")
        if self.tools_per_turn < 1:
            raise ValueError("tools_per_turn must be >= 1")
        if self.plan_items < 0:
            raise ValueError("plan_items must be >= 0")
        if self.cache_min_tokens < 0 or self.cache_ttl_s < 0:
            raise ValueError("cache_min_tokens and cache_ttl_s must be >= 0")
        if self.batch_processing_s < 0 or not self.batch_expires_s > 0:
            raise ValueError("batch_processing_s must be >= 0 and batch_expires_s > 0")
        for name in ("batch_errored_rate", "batch_expired_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)!r}")
        if self.batch_rpm is not None and not self.batch_rpm > 0:
            raise ValueError("batch_rpm must be > 0 or None (unlimited)")
        if self.batch_queue_cap is not None and self.batch_queue_cap < 1:
            raise ValueError("batch_queue_cap must be >= 1 or None (unlimited)")
        if self.batch_max_requests < 1:
            raise ValueError("batch_max_requests must be >= 1")
        aliases = []
        for entry in self.pool:
            if not isinstance(entry, dict) or not entry.get("alias") or not entry.get("api_key"):
                raise ValueError("each pool entry must be an object with an alias and an api_key")
            unknown = sorted(set(entry) - _POOL_ENTRY)
            if unknown:
                raise ValueError(f"unknown pool entry field(s) {unknown}; expected some of "
                                 f"{sorted(_POOL_ENTRY)}")
            for name in ("rpm", "itpm", "otpm"):
                value = entry.get(name)
                if value is not None and not (isinstance(value, int | float) and value > 0):
                    raise ValueError(f"pool entry {entry['alias']}: {name} must be > 0")
            aliases.append(entry["alias"])
        if len(set(aliases)) != len(aliases):
            raise ValueError("pool aliases must be unique")
        for model, entry in self.prices.items():
            if not isinstance(entry, dict) or not {"input", "output"} <= set(entry) or not all(
                    isinstance(v, int | float) and v >= 0 for v in entry.values()):
                raise ValueError(f"prices[{model!r}] must hold numbers >= 0 for input and "
                                 "output (cache_write and cache_read optional)")
        if not 0.0 < self.batch_discount <= 1.0:
            raise ValueError("batch_discount must be within (0, 1]")
        if self.spend_limit_calls is not None and self.spend_limit_calls < 0:
            raise ValueError("spend_limit_calls must be >= 0 or None (no limit)")
        if not all(isinstance(v, int) and v >= 0 for v in self.key_spend_limit_calls.values()):
            raise ValueError("key_spend_limit_calls maps pool aliases to paid calls (>= 0)")
        if not all(isinstance(k, str) and isinstance(v, str)
                   for k, v in self.model_classes.items()):
            raise ValueError("model_classes maps model names to class names (strings)")

    def replaced(self, **changes: Any) -> SimConfig:
        """A copy with `changes` applied; unknown names and bad values raise ValueError."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown SimConfig field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **{k: _coerce(k, v) for k, v in changes.items()})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FLOAT_OR_NONE = {"rpm", "itpm", "otpm", "tpm", "batch_rpm"}
_INT_OR_NONE = {"batch_queue_cap", "spend_limit_calls"}
_FLOATS = {"burst_s", "other_share", "overload_rate", "error_5xx_rate", "inject_429_rate",
           "latency_mean_s", "latency_p95_s", "cache_ttl_s", "batch_processing_s",
           "batch_expires_s", "batch_errored_rate", "batch_expired_rate",
           "batch_create_delay_s", "output_tokens_per_s", "ttft_s", "output_share_min",
           "output_share_max", "batch_discount", "ping_every_s", "output_burndown"}
_INTS = {"inject_429_retry_after", "output_tokens_mean", "tool_turns", "tools_per_turn",
         "plan_items", "cache_min_tokens", "seed", "batch_max_requests"}
_BOOLS = {"cache_reads_count", "round_token_headers", "batch_create_drop", "refuse_oversized"}


def _coerce(name: str, value: Any) -> Any:
    """JSON bodies and CLI strings arrive loosely typed; accept the obvious spellings."""
    if name in ("pool", "revoked", "model_classes", "prices", "key_spend_limit_calls"):
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else None
            except ValueError:
                raise ValueError(f"{name} must be JSON, got {value!r}") from None
        if name in ("model_classes", "prices", "key_spend_limit_calls"):
            return dict(value or {})
        return tuple(value or ())
    if name in _FLOAT_OR_NONE:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _number(name, value, float)
    if name in _INT_OR_NONE:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _number(name, value, int)
    if name in _FLOATS:
        return _number(name, value, float)
    if name in _INTS:
        return _number(name, value, int)
    if name in _BOOLS:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in (
                "1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ValueError(f"{name} must be a boolean, got {value!r}")
    return value


def _number(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return number
