"""drover's settings: environment variables with the prefix ``DROVER_`` (and a ``.env`` file).

Every value is checked when the settings are built, so a wrong value stops start-up with a
message that names the variable and says what to put there instead of failing later, deep
inside a worker. The API key is the Anthropic SDK's usual ``ANTHROPIC_API_KEY``; it is a
``SecretStr`` so it never shows up in a repr, a log line or an exception message.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from drover.config.sentinel import parse_sentinel

PositiveRate = Annotated[float, Field(gt=0)]
RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0  # RabbitMQ's default consumer_timeout (30 min)


class ModelLimits(BaseModel):
    """The provider's limits for one model class, per minute (as the console shows them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: PositiveRate | None = None
    itpm: PositiveRate | None = None
    otpm: PositiveRate | None = None
    # Cache reads do not count towards ITPM on most current models; a few older ones do.
    cache_reads_count: bool = False


class TenantBudget(BaseModel):
    """A tenant's own token budget (input + output tokens), on top of the key's limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_minute: PositiveRate | None = None
    per_day: PositiveRate | None = None


class SettingsError(ValueError):
    """Raised instead of pydantic's ValidationError so the message tells the user what to fix."""


# What each kind of URL looks like, for the error message.
_FORMS = {
    "redis": "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]",
    "sentinel": ("sentinel://[:PASSWORD@]HOST:PORT[/DB];sentinel://HOST:PORT;... (Redis "
                 "Sentinel, with DROVER_SENTINEL_MASTER)"),
    "rediss": "rediss://[[USER]:PASSWORD@]HOST[:PORT][/DB]",
    "unix": "unix:///PATH/TO/redis.sock[?db=DB]",
    "amqp": "amqp://[USER:PASSWORD@]HOST[:PORT][/VHOST]",
    "pyamqp": "pyamqp://[USER:PASSWORD@]HOST[:PORT][/VHOST]",
    "http": "http://HOST[:PORT][/PATH]",
    "https": "https://HOST[:PORT][/PATH]",
}


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``: safe for messages and logs.

    A Sentinel list (``sentinel://...;sentinel://...``) is masked entry by entry."""
    if ";" in url:
        return ";".join(mask_url(part) for part in url.split(";"))
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{netloc}"))
    except ValueError:
        return re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", url)


def _check_url(value: str, schemes: tuple[str, ...]) -> str:
    """Check the whole URL now (scheme, host, port, database), not at the first connect."""
    value = value.strip()
    forms = " or ".join(_FORMS.get(scheme, f"{scheme}://HOST[:PORT]") for scheme in schemes)
    if value.lower().startswith("sentinel://") and "sentinel" in schemes:
        try:  # the master's name is checked with the other settings
            parse_sentinel(value, master="-")
        except ValueError as error:
            raise ValueError(f"{error}; expected {forms}") from None
        return value
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        given = value.partition("//")[2].partition("/")[0].rpartition("@")[2].rpartition(":")[2]
        raise ValueError(f"the port {given!r} is not a number from 1 to 65535; expected "
                         f"{forms}") from None
    if parts.scheme not in schemes:
        shown = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise ValueError(f"{shown} is not one drover can use here; expected {forms}")
    if port == 0:
        raise ValueError(f"port 0 is not a port a server listens on; expected {forms}")
    if parts.scheme == "unix":
        if not parts.path or parts.path == "/":
            raise ValueError(f"no socket path; expected {forms}")
        db = dict(p.partition("=")[::2] for p in parts.query.split("&") if p).get("db")
        if db is not None and not db.isdigit():
            raise ValueError(f"db={db!r} is not a database number (0, 1, ...); expected {forms}")
        return value
    if not parts.hostname:
        raise ValueError(f"no host; expected {forms}")
    if parts.scheme in ("redis", "rediss"):
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"the database {db!r} (after the host) is not a number (0, 1, "
                             f"...); expected {forms}")
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DROVER_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
    )

    # --- where things are ---------------------------------------------------------------
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str | None = None  # defaults to redis_url
    result_backend: str | None = None  # defaults to redis_url
    # Redis Sentinel (docs/high-availability.md): with a sentinel:// list in any of the three
    # URLs above, the name of the master the sentinels monitor, and the sentinels' own
    # password where they have one (the master's is the one in the list).
    sentinel_master: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]+$")
    sentinel_password: SecretStr | None = None
    anthropic_base_url: str | None = None  # the SDK's default (the real API) when unset
    anthropic_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("ANTHROPIC_API_KEY", "DROVER_ANTHROPIC_API_KEY"),
    )
    key_alias: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]+$")
    key_prefix: str = Field(default="drover", pattern=r"^[A-Za-z0-9_.:-]+$")
    queue: str = Field(default="drover", pattern=r"^[A-Za-z0-9_.-]+$")

    # --- the model and its limits -------------------------------------------------------
    model: str = "claude-sonnet-4-6"
    rpm: PositiveRate = 50
    itpm: PositiveRate = 30_000
    otpm: PositiveRate = 8_000
    limits: dict[str, ModelLimits] = Field(default_factory=dict)
    cache_reads_count: bool = False
    target_utilization: float = Field(default=0.95, gt=0, le=1)
    max_in_flight: int = Field(default=32, ge=1)
    burst_seconds: float = Field(default=1.0, gt=0, le=60)
    # A reservation further ahead than this is not made: the sub-agent frees its worker slot
    # with a Celery retry instead of sleeping in it.
    horizon_s: float = Field(default=15.0, gt=0)
    # How long the limiter's per-second usage counters are kept (for `drover stats`).
    stats_window_s: int = Field(default=3600, ge=60)

    # --- the call path, retries and the broker ------------------------------------------
    call_timeout_s: float = Field(default=120.0, gt=0)
    max_attempts: int = Field(default=8, ge=1)
    backoff_base_s: float = Field(default=1.0, gt=0)
    countdown_cap_s: float = Field(default=300.0, gt=0)
    task_time_limit_s: int = Field(default=1800, ge=10)
    # Redis broker only: how long a task taken but never acked stays with the worker that took
    # it before the broker hands it out again. Not the recovery path (drover's heartbeats and
    # claims re-send a dead worker's tasks in seconds): the last line of defence, and a late
    # copy it delivers finds a newer claim or a record and stops. It must exceed the longest
    # countdown plus task run, or a retry waiting in a worker's memory is delivered twice.
    visibility_timeout_s: int = Field(default=3600, ge=5)
    result_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    # A running job that gains no record for this long is checked for sub-agents whose task
    # message the broker lost (see workers/jobs/recovery.py); those are sent again.
    resend_after_s: float = Field(default=120.0, gt=0)
    # Liveness (workers/jobs/liveness.py): each worker process refreshes a Redis key every
    # HEARTBEAT_S that expires after HEARTBEAT_TTL_S; once it has expired, the recovery sweep
    # (every HEARTBEAT_S, on one live worker at a time) re-sends what that worker held. A
    # killed worker's sub-agents resume elsewhere within about TTL + 2 x HEARTBEAT_S.
    heartbeat_s: float = Field(default=2.0, gt=0, le=60)
    heartbeat_ttl_s: float = Field(default=10.0, gt=0, le=600)
    # SIGTERM (docker stop, Kubernetes, scale-in): calls in flight get this long to finish,
    # then every sub-agent of the worker is checkpointed and handed back to the broker. Keep it
    # below the platform's own grace (docker stop: 10 s; Kubernetes: 30 s).
    shutdown_grace_s: float = Field(default=8.0, ge=0, le=3600)

    # --- the agent runtime --------------------------------------------------------------
    max_turns: int = Field(default=8, ge=1)
    max_parallel_tools: int = Field(default=8, ge=1)
    max_tool_calls_per_turn: int = Field(default=32, ge=1)
    tool_timeout_s: float = Field(default=30.0, gt=0)
    tool_rps: dict[str, PositiveRate] = Field(default_factory=dict)
    # A JSON list or plain comma-separated module names.
    tool_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["drover.workers.demo_tools"])
    max_fanout: int = Field(default=10_000, ge=1)
    # A job's spec as stored in Redis (the spec's JSON plus every subtask, UTF-8): a bigger
    # one is refused at submit, before anything is stored or enqueued.
    max_spec_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    # A tool result longer than this is cut (with a marker the model sees) before it goes
    # into the checkpoint and the next request.
    max_tool_result_chars: int = Field(default=20_000, ge=100)
    # The SDK's and httpx's DEBUG lines hold whole request bodies (prompts); they stay off at
    # every log level unless this asks for them (never in production).
    log_http_bodies: bool = False

    # --- observability (see workers/telemetry) ------------------------------------------
    # OpenTelemetry traces; also on when OTEL_TRACES_EXPORTER or an OTLP endpoint is set.
    tracing: bool = False
    # Prompt and completion text on LLM and tool spans: off unless asked for.
    trace_content: bool = False
    # How often each process adds its counters and histograms to Redis for `drover metrics`.
    metrics_flush_s: float = Field(default=1.0, gt=0, le=60)
    # Active jobs that get series of their own (newest first); the rest count in their tenant's.
    metrics_max_jobs: int = Field(default=100, ge=0)

    # --- fair share between jobs and tenants (workers/jobs/fairshare.py) ----------------
    # Sub-agent messages of one queue allowed in the broker or running at once, over all jobs
    # (each finished sub-agent frees one for whichever job is furthest below its share).
    # 0: the live workers' slots, as they report them (DISPATCH_WINDOW_FALLBACK before any has).
    dispatch_window: int = Field(default=0, ge=0)
    dispatch_window_fallback: int = Field(default=32, ge=1)
    # Tenant -> weight; tenants not named weigh DEFAULT_TENANT_WEIGHT.
    tenant_weights: dict[str, PositiveRate] = Field(default_factory=dict)
    default_tenant_weight: PositiveRate = 1.0
    # Each priority level below the highest one waiting in a tenant gets at least this share
    # of the tenant's window (so batch work is never starved by interactive work).
    priority_floor: float = Field(default=0.1, gt=0, le=0.33)
    # Tenant -> token budget (input + output tokens), enforced by the limiter as a scope of
    # the tenant's own: {"team-a": {"per_minute": 200000, "per_day": 20000000}}.
    tenant_budgets: dict[str, TenantBudget] = Field(default_factory=dict)

    # --- offline jobs through the Message Batches API (JobSpec.delivery) -----------------
    # A scope's pending requests go out as a batch once this many wait, or once the oldest
    # has waited batch_linger_s; one batch holds at most batch_max_requests (the API: 100k).
    batch_size: int = Field(default=1000, ge=1)
    batch_linger_s: float = Field(default=5.0, ge=0)
    batch_max_requests: int = Field(default=100_000, ge=1, le=100_000)
    # How often an open batch is retrieved, and how often the batcher looks at all.
    batch_poll_s: float = Field(default=30.0, gt=0)
    batch_tick_s: float = Field(default=1.0, gt=0)
    # The batches endpoints' own limits (per API key, separate from RPM/ITPM/OTPM).
    batch_rpm: PositiveRate = 50
    batch_queue_cap: int = Field(default=100_000, ge=1)
    # delivery="auto" uses batches when the job has no deadline or at least this long a one
    # (the provider ends every batch within 24 h; most within an hour).
    batch_auto_min_deadline_s: float = Field(default=86_400.0, gt=0)

    @field_validator("redis_url", "result_backend")
    @classmethod
    def _redis_like(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return _check_url(value, ("redis", "rediss", "unix", "sentinel"))

    @field_validator("broker_url")
    @classmethod
    def _broker_like(cls, value: str | None) -> str | None:
        # Redis, or RabbitMQ (what Celery recommends for production); Redis always holds the
        # limiter, the job state and the results.
        if value is None:
            return None
        return _check_url(value, ("redis", "rediss", "unix", "sentinel", "amqp", "amqps",
                                  "pyamqp"))

    @field_validator("tool_modules", mode="before")
    @classmethod
    def _module_list(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [name.strip() for name in text.split(",") if name.strip()]
        return value

    @field_validator("anthropic_base_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return _check_url(value, ("http", "https"))

    @model_validator(mode="after")
    def _sentinel_has_a_master(self) -> Settings:
        named = [name for name, url in (("DROVER_REDIS_URL", self.redis_url),
                                        ("DROVER_BROKER_URL", self.broker_url),
                                        ("DROVER_RESULT_BACKEND", self.result_backend))
                 if url and urlsplit(url).scheme == "sentinel"]
        if named and not self.sentinel_master:
            raise ValueError(
                f"{' and '.join(named)} is a Sentinel list: set DROVER_SENTINEL_MASTER to the "
                "name of the master the sentinels monitor (their `sentinel monitor NAME ...`)")
        return self

    @model_validator(mode="after")
    def _countdowns_fit_the_broker(self) -> Settings:
        # Celery keeps ETA/countdown tasks in worker memory; the broker redelivers any task not
        # acked within visibility_timeout. A countdown or a task run longer than that would be
        # delivered twice, so the three are checked together. Every countdown drover schedules
        # (a failed call's backoff or retry-after, the limiter's horizon or cooldown, Redis
        # away, an early join) is capped at countdown_cap_s where the retry is made
        # (workers/_delivery.py), so this one sum bounds them all.
        longest = self.countdown_cap_s + self.task_time_limit_s
        if self.visibility_timeout_s <= longest:
            raise ValueError(
                f"DROVER_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s}) must exceed "
                f"DROVER_COUNTDOWN_CAP_S + DROVER_TASK_TIME_LIMIT_S ({longest:g}); raise it or "
                "lower the other two, or retried tasks will be delivered twice"
            )
        if self.broker_is_rabbitmq and self.countdown_cap_s >= RABBITMQ_CONSUMER_TIMEOUT_S / 2:
            raise ValueError(
                f"DROVER_COUNTDOWN_CAP_S ({self.countdown_cap_s:g}) must stay well below "
                f"RabbitMQ's consumer timeout ({RABBITMQ_CONSUMER_TIMEOUT_S:g} s): a retry "
                "waits out its countdown unacked in the worker; lower it")
        if self.heartbeat_ttl_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"DROVER_HEARTBEAT_TTL_S ({self.heartbeat_ttl_s:g}) must be at least twice "
                f"DROVER_HEARTBEAT_S ({self.heartbeat_s:g}), or one late beat declares a live "
                "worker dead")
        if self.call_timeout_s >= self.task_time_limit_s:
            raise ValueError(
                "DROVER_CALL_TIMEOUT_S must be below DROVER_TASK_TIME_LIMIT_S: one LLM call "
                "has to fit inside a task run"
            )
        return self

    # --- derived ------------------------------------------------------------------------
    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def broker_is_rabbitmq(self) -> bool:
        return urlsplit(self.broker).scheme in ("amqp", "amqps", "pyamqp")

    @property
    def backend(self) -> str:
        return self.result_backend or self.redis_url

    def limits_for(self, model: str) -> ModelLimits | None:
        """The configured limits of ``model``; None when only the provider's headers can tell."""
        if model in self.limits:
            return self.limits[model]
        if model == self.model:
            return ModelLimits(
                rpm=self.rpm, itpm=self.itpm, otpm=self.otpm,
                cache_reads_count=self.cache_reads_count,
            )
        return None

    def tenant_weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, self.default_tenant_weight)


def _explain(error: ValidationError) -> str:
    lines = ["drover's settings are not valid:"]
    for item in error.errors():
        loc = [str(part) for part in item["loc"] if part != "__root__"]
        name = f"DROVER_{loc[0].upper()}" if loc else "(settings)"
        if len(loc) > 1:  # inside a JSON value, e.g. DROVER_LIMITS
            name += f" ({'.'.join(loc[1:])})"
        secret = loc == ["anthropic_api_key"]
        if secret:
            name = "ANTHROPIC_API_KEY"
        message = item["msg"].removeprefix("Value error, ")
        shown = loc and not secret and "input" in item and not isinstance(item["input"], dict)
        value = item.get("input")
        if isinstance(value, str) and "://" in value:
            value = mask_url(value)  # a Redis or broker URL may hold a password
        given = f" (got {value!r})" if shown else ""
        lines.append(f"  {name}: {message}{given}")
    return "\n".join(lines)


def load_settings(**overrides: object) -> Settings:
    """Build the settings from the environment, raising SettingsError with a readable message."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        raise SettingsError(_explain(error)) from None
    except PydanticSettingsError as error:  # a JSON-valued variable that is not JSON
        match = re.search(r'field "(\w+)"', str(error))
        name = f"DROVER_{match.group(1).upper()}" if match else "a DROVER_ variable"
        raise SettingsError(
            f"drover's settings are not valid:\n  {name}: not valid JSON; write it as JSON, "
            'e.g. DROVER_LIMITS=\'{"claude-haiku-4-5": {"rpm": 50, "itpm": 50000, '
            '"otpm": 10000}}\' or DROVER_TOOL_RPS=\'{"lookup_fact": 5}\'') from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, built once."""
    return load_settings()

