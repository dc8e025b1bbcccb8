"""drover's settings: environment variables with the prefix ``DROVER_`` (and a ``.env`` file).

Every value is checked when the settings are built, so a wrong value stops start-up with a
message that names the variable and says what to put there instead of failing later, deep
inside a worker. The API key is the Anthropic SDK's usual ``ANTHROPIC_API_KEY``; it is a
``SecretStr`` so it never shows up in a repr, a log line or an exception message.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from drover.config.prices import Price, PriceTable, bundled_table
from drover.config.providers import PROVIDERS, about
from drover.config.sentinel import parse_sentinel
from drover.errors import SettingsError

PositiveRate = Annotated[float, Field(gt=0)]
ORG_ALIAS = "org"  # the organisation's level of a pool, in scope names
RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0  # RabbitMQ's default consumer_timeout (30 min)


class ModelLimits(BaseModel):
    """The provider's limits for one model class, per minute (as the console shows them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: PositiveRate | None = Field(default=None, description="Requests per minute.")
    itpm: PositiveRate | None = Field(default=None, description="Input tokens per minute.")
    otpm: PositiveRate | None = Field(default=None, description="Output tokens per minute.")
    tpm: PositiveRate | None = Field(
        default=None, description="Tokens per minute, input and output in one bucket: an "
        "OpenAI model's one tokens limit (instead of itpm and otpm).")
    cache_reads_count: bool = Field(
        default=False,
        description="Whether cache reads count towards ITPM (not on most current models; a few "
        "older ones do).")
    models: list[str] = Field(
        default_factory=list,
        description="A model class: these models share this entry's one set of limits (the "
        "provider's combined limit of a model family); the entry's name is the class's name.")


def _check_dimensions(where: str, entry: ModelLimits | PoolKey | GatewayKey, provider: str
                      ) -> None:
    """Limits in the dimensions ``provider`` counts: OpenAI and Bedrock one tokens bucket
    (tpm), Anthropic and Vertex AI input and output apart (itpm, otpm)."""
    if provider in ONE_TOKENS_BUCKET and (entry.itpm is not None or entry.otpm is not None):
        raise ValueError(f"{where} has an itpm or otpm, but it is on {provider}, whose limit is "
                         f"{about(provider).tokens_bucket}: give it as tpm")
    if provider not in ONE_TOKENS_BUCKET and getattr(entry, "tpm", None) is not None:
        raise ValueError(f"{where} has a tpm, but it is on {provider}, which counts input and "
                         "output tokens apart: give them as itpm and otpm")


# The APIs whose token limit is one bucket of input and output together.
ONE_TOKENS_BUCKET = tuple(name for name, each in PROVIDERS.items()
                          if "tpm" in each.limit_settings)
# Claude's clouds: each serves the Anthropic API's models (the Messages API), with limits of
# its own and no organisation over them.
CLOUDS = tuple(name for name, each in PROVIDERS.items() if each.cloud)
# What each kind of DROVER_KEYS entry takes beside alias, base_url, provider, the limits and
# ``limits``: (required, allowed).
_ENTRY_FIELDS = {name: (each.entry_required, each.entry_allowed)
                 for name, each in PROVIDERS.items()}
_CLOUD_FIELDS = ("api_key", "region", "project", "access_token", "models", "output_burndown")


_NAME = r"^[A-Za-z0-9_.@-]+$"  # an alias or a model class: goes into limiter scope names


class PoolKey(BaseModel):
    """One entry of a pool (``DROVER_KEYS``): a key's workspace's own limits, inside the
    organisation's (``DROVER_RPM``/``ITPM``/``OTPM`` and ``DROVER_LIMITS``); or Claude on a
    cloud, whose limits are its own and under no organisation.

    ``rpm``/``itpm``/``otpm`` (``tpm``) are the entry's limits for the default model
    (``DROVER_MODEL``)'s class, ``limits`` those of other models or classes, in the form
    ``DROVER_LIMITS`` uses; a dimension left out is limited by the organisation's limit only.
    ``base_url``: this entry's endpoint (a proxy in front of part of the traffic), else its
    provider's (``DROVER_ANTHROPIC_BASE_URL`` or ``OPENAI_BASE_URL``; a cloud's own).
    ``provider``: the API the entry is for, else ``DROVER_PROVIDER``; a call goes to an entry
    of its model's provider (``DROVER_MODEL_PROVIDERS``), so one fleet serves models of both;
    ``bedrock`` and ``vertex`` entries serve the Anthropic API's models (docs/bedrock.md,
    docs/vertex.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    alias: str = Field(pattern=_NAME, description="The key's name in logs, stats and metrics.")
    api_key: SecretStr | None = Field(
        default=None, description="The API key (never logged or shown); on bedrock a Bedrock "
        "API key, else the AWS credential chain signs the calls.")
    base_url: str | None = Field(
        default=None, description="This key's endpoint; else its provider's "
        "(DROVER_ANTHROPIC_BASE_URL or OPENAI_BASE_URL, a cloud's own).")
    provider: Literal["anthropic", "openai", "bedrock", "vertex"] | None = Field(
        default=None, description="The API this key is for; else DROVER_PROVIDER. A call goes "
        "to a key of its model's provider (DROVER_MODEL_PROVIDERS); bedrock and vertex serve "
        "the Anthropic API's models.")
    region: str | None = Field(
        default=None, min_length=1,
        description="bedrock and vertex: the cloud's region (e.g. us-east-1, us-east5).")
    project: str | None = Field(
        default=None, min_length=1, description="vertex: the Google Cloud project id.")
    access_token: SecretStr | None = Field(
        default=None, description="vertex: an OAuth access token (never logged or shown); "
        "else Google's application default credentials.")
    models: dict[str, str] = Field(
        default_factory=dict, description="bedrock and vertex: drover's model names -> the "
        "cloud's model ids (a name not here is sent as it is).")
    output_burndown: float | None = Field(
        default=None, ge=1, description="bedrock: how many times each output token counts "
        "against the tpm once the answer is done (default 5, the current Claude models').")
    rpm: PositiveRate | None = Field(
        default=None, description="The key's requests per minute (the default model's class).")
    itpm: PositiveRate | None = Field(
        default=None, description="The key's input tokens per minute.")
    otpm: PositiveRate | None = Field(
        default=None, description="The key's output tokens per minute.")
    tpm: PositiveRate | None = Field(
        default=None, description="An OpenAI key's or a Bedrock entry's tokens per minute "
        "(input and output; on Bedrock output counts output_burndown times).")
    limits: dict[str, ModelLimits] = Field(
        default_factory=dict, description="The key's limits of other models or classes.")

    @field_validator("alias")
    @classmethod
    def _not_org(cls, value: str) -> str:
        if value == ORG_ALIAS:
            raise ValueError(f"the alias {ORG_ALIAS!r} names the organisation's own limits in "
                             "drover stats; give this key another alias")
        return value

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value, ("http", "https"))

    @model_validator(mode="after")
    def _fields_of_its_provider(self) -> PoolKey:
        # Without "provider" the entry is DROVER_PROVIDER's (the Anthropic API or OpenAI),
        # which takes an api_key and nothing of a cloud's.
        kind = self.provider or "anthropic"
        required, allowed = _ENTRY_FIELDS[kind]
        given = {name for name in _CLOUD_FIELDS if getattr(self, name) not in (None, {})}
        named = f"DROVER_KEYS entry {self.alias!r}"
        on = f"a {kind} entry" if self.provider else "an entry without \"provider\""
        missing, extra = sorted(required - given), sorted(given - allowed)
        if missing:
            raise ValueError(f"{named} needs \"{missing[0]}\" ({on})")
        if extra:
            which = " or ".join(k for k, (_, can) in _ENTRY_FIELDS.items() if extra[0] in can)
            raise ValueError(f"{named} has \"{extra[0]}\", which only {which} entries take "
                             f"(this is {on}); remove it or set the entry's \"provider\"")
        if self.cloud and not (self.rpm or self.itpm or self.otpm or self.tpm or self.limits):
            *first, last = about(self.provider or "").limit_settings
            quota = f"{', '.join(first)} and {last}"
            raise ValueError(f"{named} gives no limits: {self.provider} sends no rate-limit "
                             f"headers to learn them from; give its quotas as {quota}")
        return self

    def secret(self) -> str:
        """Its API key's value ("" without one: a cloud's entry on other credentials)."""
        return self.api_key.get_secret_value() if self.api_key is not None else ""

    def secrets(self) -> list[str]:
        """Every credential's value it holds (its API key, a Vertex entry's access token):
        what must never reach a caller or a log."""
        return [s.get_secret_value() for s in (self.api_key, self.access_token) if s is not None]

    @property
    def cloud(self) -> bool:
        """Claude on a cloud (bedrock, vertex): its limits are its own, under no
        organisation."""
        return self.provider in CLOUDS

    def cloud_model(self, model: str) -> str:
        """The cloud's id of drover's ``model`` (``models``; else the name as it is)."""
        return self.models.get(model, model)


class TenantBudget(BaseModel):
    """A tenant's own token budget (input + output tokens), on top of the key's limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_minute: PositiveRate | None = Field(
        default=None, description="Tokens per minute (a bucket holding a minute's worth, refilled "
        "continuously).")
    per_day: PositiveRate | None = Field(
        default=None,
        description="Tokens per day (a bucket holding a day's worth, refilled continuously).")
    usd_per_month: PositiveRate | None = Field(
        default=None,
        description="Dollars per calendar month (UTC) at DROVER_PRICES, across all the "
        "tenant's jobs: a call whose worst case would pass it is not sent (docs/cost.md).")


class GatewayKey(BaseModel):
    """A caller of ``drover gateway``: the key it sends (in place of a provider key) and the
    tenant its traffic counts as (fair share, budgets, usage, metrics)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: SecretStr = Field(description="The gateway key the caller sends as `x-api-key` or "
                           "`Authorization: Bearer` (never logged or forwarded).")
    tenant: str = Field(pattern=_NAME, description="The tenant this key's calls count as.")
    budget: TenantBudget | None = Field(
        default=None, description="The tenant's token budget (as DROVER_TENANT_BUDGETS): its "
        "calls through the gateway wait in line for it.")
    rpm: PositiveRate | None = Field(
        default=None, description="This key's own requests per minute: its calls wait in line "
        "for it (the key's alone, not its tenant's).")
    itpm: PositiveRate | None = Field(
        default=None, description="This key's own input tokens per minute (Anthropic).")
    otpm: PositiveRate | None = Field(
        default=None, description="This key's own output tokens per minute (Anthropic).")
    tpm: PositiveRate | None = Field(
        default=None, description="This key's own tokens per minute, input and max tokens in "
        "one bucket (OpenAI's dimension).")

    @field_validator("key")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("a gateway key must be at least 16 characters: make one with "
                             "`python -c \"import secrets; print('dgw-' + "
                             "secrets.token_urlsafe(24))\"`")
        return value


class ModelPrice(BaseModel):
    """One model's prices in dollars per million tokens (``DROVER_PRICES``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, description="Input tokens, dollars per million.")
    output: float = Field(ge=0, description="Output tokens, dollars per million.")
    cache_write: float | None = Field(
        default=None, ge=0, description="Cache writes, dollars per million (left out: "
        "Anthropic's 1.25 x input; OpenAI charges none).")
    cache_read: float | None = Field(
        default=None, ge=0, description="Cache reads (OpenAI: cached input), dollars per "
        "million (left out: Anthropic's 0.1 x input; OpenAI's ratio for the model in the "
        "bundled table, else 0.5 x input).")


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
    if "://" not in value:  # host:port parses as a scheme 'host': say what is missing
        raise ValueError(f"the URL has no scheme: write it as {schemes[0]}://{value}; "
                         f"expected {forms}")
    if parts.scheme not in schemes:
        raise ValueError(f"the scheme {parts.scheme!r} is not one drover can use here; "
                         f"expected {forms}")
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
    """Every field is one ``DROVER_`` variable; its ``description`` is what docs/settings.md says
    about it (generated: ``python -m drover.config.docs > docs/settings.md``)."""

    model_config = SettingsConfigDict(
        env_prefix="DROVER_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
        env_ignore_empty=True,  # `export DROVER_LIMITS=`, a compose file's `X:`: unset
    )

    # --- where things are ---------------------------------------------------------------
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="The Redis that holds job state, the limiter and the results, and by "
        "default Celery's broker and result backend: `redis://`, `rediss://`, `unix://`, or a "
        "Redis Sentinel list `sentinel://HOST:PORT;sentinel://HOST:PORT;...` (with "
        "`DROVER_SENTINEL_MASTER`).")
    broker_url: str | None = Field(
        default=None,
        description="Celery's broker: Redis, or RabbitMQ (`amqp://user:pass@host:5672/vhost`, "
        "what Celery recommends for production). Defaults to `DROVER_REDIS_URL`.")
    result_backend: str | None = Field(
        default=None,
        description="Celery's result backend (a Redis). Defaults to `DROVER_REDIS_URL`.")
    sentinel_master: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Redis Sentinel (docs/high-availability.md): with a `sentinel://` list in "
        "any of the three URLs above, the name of the master the sentinels monitor.")
    sentinel_password: SecretStr | None = Field(
        default=None,
        description="The sentinels' own password where they have one (the master's is the one "
        "in the `sentinel://` list).")
    results_url: SecretStr | None = Field(
        default=None,
        description="The durable results store (docs/results-store.md): "
        "`postgresql://USER:PASSWORD@HOST:PORT/DATABASE`. Each sub-agent's record is copied "
        "there as Redis stores it, and each job's spec, usage and result when it ends; "
        "`drover result`, `drover jobs` and `JobHandle` read a job from there once Redis no "
        "longer has it. Needs the `postgres` extra (`pip install 'drover[postgres]'`). Unset: "
        "results live in Redis only, for DROVER_RESULT_TTL_S.")
    results_timeout_s: float = Field(
        default=5.0, gt=0, le=600,
        description="The results store's statement timeout, in seconds: the server cancels a "
        "statement that runs longer, and a connection that stays silent 2 s beyond it is cut "
        "(records stay in Redis and are copied once the store answers).")
    anthropic_base_url: str | None = Field(
        default=None,
        description="Where API calls go (the simulator, a proxy); the SDK's default (the real "
        "API) when unset.")
    anthropic_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("ANTHROPIC_API_KEY", "DROVER_ANTHROPIC_API_KEY"),
        description="The API key, needed by workers only; never logged, never in a task "
        "message.")
    provider: Literal["anthropic", "openai"] = Field(
        default="anthropic",
        description="The API the workers call: `anthropic` (Messages) or `openai` (Chat "
        "Completions, also Azure OpenAI and OpenAI-compatible servers; its key and endpoint are "
        "the SDK's own `OPENAI_API_KEY` and `OPENAI_BASE_URL`, its limits `DROVER_RPM` and "
        "`DROVER_TPM`). docs/providers.md.")
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("OPENAI_BASE_URL", "DROVER_OPENAI_BASE_URL"),
        description="With `DROVER_PROVIDER=openai`: where calls go (ends in `/v1`); the SDK's "
        "default (the real API) when unset.")
    openai_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("OPENAI_API_KEY", "DROVER_OPENAI_API_KEY"),
        description="With `DROVER_PROVIDER=openai`: the API key, needed by workers only; never "
        "logged, never in a task message.")
    key_alias: str = Field(
        default="default", pattern=r"^[A-Za-z0-9_.-]+$",
        description="Names the API key in the limiter's scopes (two keys: two aliases).")
    key_prefix: str = Field(
        default="drover", pattern=r"^[A-Za-z0-9_.:-]+$",
        description="The prefix of every Redis key drover writes (separate deployments on one "
        "Redis).")
    queue: str = Field(
        default="drover", pattern=r"^[A-Za-z0-9_.-]+$",
        description="The Celery queue the sub-agents go to and the workers consume.")

    # --- the model and its limits -------------------------------------------------------
    model: str = Field(
        default="claude-sonnet-4-6", description="The model of jobs that name none (the "
        "submitting process's, fixed in the job when it is submitted).")
    rpm: PositiveRate = Field(
        default=50, description="The default model's requests per minute, as the console "
        "shows it.")
    itpm: PositiveRate = Field(
        default=30_000, description="The default model's input tokens per minute.")
    otpm: PositiveRate = Field(
        default=8_000, description="The default model's output tokens per minute.")
    tpm: PositiveRate | None = Field(
        default=None, description="With `DROVER_PROVIDER=openai`: the default model's tokens "
        "per minute (one bucket: each call's input estimate plus its max tokens at admission, "
        "settled to what it used); DROVER_ITPM and DROVER_OTPM are Anthropic's.")
    limits: dict[str, ModelLimits] = Field(
        default_factory=dict,
        description="Other models' limits, JSON: `{\"claude-haiku-4-5\": {\"rpm\": 50, "
        "\"itpm\": 50000, \"otpm\": 10000, \"cache_reads_count\": false}}`. A model with none "
        "learns them from the `anthropic-ratelimit-*-limit` headers.")
    cache_reads_count: bool = Field(
        default=False,
        description="Whether cache reads count towards ITPM for the default model (they do "
        "not on most current models).")
    limit_groups: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Model classes, JSON: `{\"claude-sonnet-4\": [\"claude-sonnet-4-5\", "
        "\"claude-sonnet-4-6\"]}`: the models of a class share one set of limits (the class's "
        "entry in DROVER_LIMITS, or DROVER_RPM/ITPM/OTPM when DROVER_MODEL is one of them).")
    model_providers: dict[str, Literal["anthropic", "openai"]] = Field(
        default_factory=dict,
        description="Models (or model classes) served by another API than DROVER_PROVIDER, "
        "JSON: `{\"gpt-4o\": \"openai\"}`. Needs a pool (DROVER_KEYS) holding a key of each "
        "provider named; a job's model then picks a key of its provider, so one fleet serves "
        "both. An OpenAI model's limits go in DROVER_LIMITS as `rpm` and `tpm` (its one "
        "tokens bucket). docs/providers.md.")
    keys: list[PoolKey] = Field(
        default_factory=list,
        description="A pool of keys, JSON: `[{\"alias\": \"eu\", \"api_key\": \"sk-...\", "
        "\"rpm\": 1000, \"itpm\": 200000, \"otpm\": 40000}, ...]`, each with its own "
        "(workspace's) limits; the limits above are then the organisation's. Unset: the one key "
        "ANTHROPIC_API_KEY, named DROVER_KEY_ALIAS.")
    key_reenable_s: float = Field(
        default=0.0, ge=0,
        description="A pool's key that answered 401/403 is disabled fleet-wide for this long "
        "(0: until `drover keys enable ALIAS`).")
    key_sticky_s: float = Field(
        default=0.5, ge=0,
        description="A sub-agent's later turns stay on the key of its earlier ones (its prompt "
        "cache is there) while that key's grant comes at most this much later (capped at half "
        "DROVER_BURST_SECONDS).")
    target_utilization: float = Field(
        default=0.95, gt=0, le=1,
        description="The fraction of each limit drover plans to use (learned limits too).")
    max_in_flight: int = Field(
        default=32, ge=1,
        description="Concurrent requests per (key, model) scope, as leases that expire by "
        "themselves.")
    burst_seconds: float = Field(
        default=1.0, gt=0, le=60,
        description="A bucket's capacity in seconds of refill: how much a quiet scope may send "
        "at once.")
    late_send_s: float = Field(
        default=0.2, ge=0, le=60,
        description="How late a granted call may reach the provider (CPU load, thread "
        "scheduling) and still fit its bucket: the limiter's buckets hold this much less than "
        "DROVER_BURST_SECONDS of refill (at least 0.1 s, or the whole burst if smaller).")
    horizon_s: float = Field(
        default=15.0, gt=0,
        description="A reservation further ahead than this is not made: the sub-agent frees "
        "its worker slot with a Celery retry instead of sleeping in it.")
    stats_window_s: int = Field(
        default=3600, ge=60,
        description="How long the limiter's per-second usage counters are kept (for `drover "
        "stats`).")

    prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description="Prices in dollars per million tokens by model, JSON, over the bundled "
        "table (drover/config/prices.json): `{\"claude-sonnet-4-5\": {\"input\": 3.0, "
        "\"output\": 15.0, \"cache_write\": 3.75, \"cache_read\": 0.3}}`; cache prices left "
        "out are derived from the input price as the provider derives them. A model with no "
        "price is reported as unpriced. docs/cost.md.")

    _classes: dict[str, str] = PrivateAttr(default_factory=dict)  # model -> its class
    _prices: PriceTable | None = PrivateAttr(default=None)

    # --- the call path, retries and the broker ------------------------------------------
    call_timeout_s: float = Field(
        default=120.0, gt=0,
        description="The timeout of one non-streamed request (the Message Batches API's "
        "calls). Realtime Messages calls stream and have no total timeout: "
        "`DROVER_STREAM_IDLE_S` and `DROVER_CONNECT_TIMEOUT_S` judge them.")
    stream_idle_s: float = Field(
        default=60.0, gt=0,
        description="The longest a streamed LLM call's connection may carry no byte (the "
        "provider's pings count: the API pings a stream whose first token is minutes away): "
        "a stream silent for this long is closed, counted with what it had generated, and "
        "retried like a timeout. A call that is making progress or kept alive is never "
        "abandoned, however long its answer or its first token takes.")
    record_thinking: bool = Field(
        default=False,
        description="Show extended thinking (`JobSpec.thinking`) in `handle.transcript()`. "
        "Off: thinking blocks are kept only where the API needs them (the conversation "
        "passed back in tool turns), never in logs, records or reports.")
    connect_timeout_s: float = Field(
        default=10.0, gt=0,
        description="The timeout of opening a connection to the provider (a call that "
        "never connected was not sent, and costs nothing).")
    max_attempts: int = Field(
        default=8, ge=1,
        description="Failed attempts (429, 529, 5xx, timeouts) before a sub-agent is `failed`; "
        "also how many workers may die while running one sub-agent before it is `failed` "
        "(`task_lost`). A broker's faults (a lost message, a stuck connection) never count.")
    backoff_base_s: float = Field(
        default=1.0, gt=0,
        description="The base of the exponential backoff with full jitter after a failed "
        "call.")
    countdown_cap_s: float = Field(
        default=300.0, gt=0,
        description="The longest countdown drover schedules (a backoff, a retry-after, the "
        "limiter's horizon or cooldown, Redis away, an early join).")
    task_time_limit_s: int = Field(
        default=1800, ge=10, description="The longest run of one task.")
    visibility_timeout_s: int = Field(
        default=3600, ge=5,
        description="Redis broker only: how long a task taken but never acked stays with the "
        "worker that took it before the broker hands it out again. Not the recovery path "
        "(drover's heartbeats and claims re-send a dead worker's tasks in seconds): the last "
        "line of defence, and a late copy it delivers finds a newer claim or a record and "
        "stops. It must exceed the longest countdown plus task run "
        "(`DROVER_COUNTDOWN_CAP_S` + `DROVER_TASK_TIME_LIMIT_S`), or a retry waiting in a "
        "worker's memory is delivered twice.")
    result_ttl_s: int = Field(
        default=7 * 24 * 3600, ge=60,
        description="How long job records, results, transcripts and the worker registry are "
        "kept.")
    resend_after_s: float = Field(
        default=120.0, gt=0,
        description="A running job that gains no record for this long is checked for "
        "sub-agents whose task message is gone (the Redis broker lost it, or a Redis failover "
        "lost what a delivery wrote) and for a join that never came (see "
        "workers/recovery/sweep.py); those are sent again.")
    heartbeat_s: float = Field(
        default=2.0, gt=0, le=60,
        description="Liveness (workers/jobs/liveness.py): each worker process refreshes a Redis "
        "key this often, and the recovery sweep runs this often on one live worker at a time.")
    heartbeat_ttl_s: float = Field(
        default=10.0, gt=0, le=600,
        description="A worker's heartbeat key expires after this long (at least twice "
        "`DROVER_HEARTBEAT_S`); once it has, the sweep re-sends what that worker held. A killed "
        "worker's sub-agents resume elsewhere within about TTL + 2 x `DROVER_HEARTBEAT_S`.")
    shutdown_grace_s: float = Field(
        default=8.0, ge=0, le=3600,
        description="On SIGTERM (docker stop, Kubernetes, scale-in), calls in flight get this "
        "long to finish; then every sub-agent of the worker is checkpointed and handed back to "
        "the broker. Keep it below the platform's own grace (docker stop: 10 s; Kubernetes: "
        "30 s).")

    # --- connections that go silent (workers/connections/redis_clients.py, config/celery.py) ---
    socket_timeout_s: float = Field(
        default=10.0, ge=2, le=300,
        description="Every Redis command (drover's clients, the Celery broker and result "
        "backend) and every RabbitMQ read or write waits this long for its peer: a connection "
        "that went silent (a managed failover, a NAT or load balancer that dropped its state, "
        "with no FIN or RST) is then dropped and a new one made, and the command is retried "
        "as after a Redis restart. Longer than any blocking read drover makes (1 s).")
    keepalive_s: float = Field(
        default=5.0, ge=1, le=600,
        description="TCP keepalive on every Redis and broker connection: the kernel probes a "
        "connection idle this long, every third of it, and closes it after 3 unanswered "
        "probes (a peer gone from the network is noticed in about twice this).")
    health_check_s: float = Field(
        default=5.0, ge=1, le=300,
        description="A Redis connection idle this long is checked with a PING before it is "
        "used; Celery's long-lived broker connections (the consumer's BRPOP, pub/sub) are "
        "checked this often and dropped once a reply is overdue by this much.")
    broker_heartbeat_s: float = Field(
        default=5.0, ge=1, le=600,
        description="RabbitMQ only: the AMQP heartbeat. A connection that carries no frame for "
        "two of these is closed by either side and a new one made; the messages it had "
        "delivered without an ack go back to the queue.")
    progress_stale_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="Liveness means progress: a worker whose Celery consumer or event loop has "
        "not moved for this long (stuck on a dead connection) stops beating its heartbeat "
        "though its process runs, so the sweep sends its sub-agents again elsewhere. Longer "
        "than `DROVER_SOCKET_TIMEOUT_S` plus a reconnect.")

    # --- the agent runtime --------------------------------------------------------------
    max_turns: int = Field(
        default=8, ge=1, description="LLM turns per sub-agent (a job may set its own).")
    max_parallel_tools: int = Field(
        default=8, ge=1, description="Tool calls running at once per sub-agent.")
    max_tool_calls_per_turn: int = Field(
        default=32, ge=1,
        description="Tool calls per turn beyond which the model gets an error result.")
    tool_timeout_s: float = Field(
        default=30.0, gt=0, description="The default timeout of one tool call.")
    tool_rps: dict[str, PositiveRate] = Field(
        default_factory=dict,
        description="Per-tool requests per second (JSON, e.g. `{\"lookup_fact\": 5}`), served "
        "by the global limiter.")
    tool_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["drover.workers.tools.demo"],
        description="Modules whose `@tool` functions workers register and `submit` checks "
        "against: a JSON list or plain comma-separated module names.")
    max_fanout: int = Field(
        default=100_000, ge=1,
        description="The most sub-agents one job may have (also caps planning).")
    max_spec_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024,
        description="A job's spec as stored in Redis (the spec's JSON plus every subtask, "
        "UTF-8): a bigger one is refused at submit, before anything is stored or enqueued.")
    max_tool_result_chars: int = Field(
        default=20_000, ge=100,
        description="A tool result longer than this is cut (with a marker the model sees) "
        "before it goes into the checkpoint and the next request.")
    log_http_bodies: bool = Field(
        default=False,
        description="The SDK's and httpx's DEBUG lines hold whole request bodies (prompts); "
        "they stay off at every log level unless this asks for them (never in production).")
    strict_settings: bool = Field(
        default=False,
        description="A `DROVER_` variable (environment or `.env`) that is no setting stops "
        "every command and worker with an error instead of a warning (each names the setting "
        "it resembles).")

    # --- observability (see workers/telemetry) ------------------------------------------
    tracing: bool = Field(
        default=False,
        description="OpenTelemetry traces; also on when `OTEL_TRACES_EXPORTER` or an OTLP "
        "endpoint is set.")
    trace_content: bool = Field(
        default=False,
        description="Prompt and completion text on LLM and tool spans: off unless asked for.")
    metrics_flush_s: float = Field(
        default=1.0, gt=0, le=60,
        description="How often each process adds its counters and histograms to Redis for "
        "`drover metrics`.")
    metrics_max_jobs: int = Field(
        default=100, ge=0,
        description="Active jobs that get series of their own (newest first); the rest count "
        "in their tenant's.")

    # --- fair share between jobs and tenants (workers/fairshare/scheduler.py) ----------------
    dispatch_window: int = Field(
        default=0, ge=0,
        description="Sub-agent messages of one queue allowed in the broker or running at once, "
        "over all jobs (each finished sub-agent frees one for whichever job is furthest below "
        "its share). 0: the live workers' slots, as they report them "
        "(`DROVER_DISPATCH_WINDOW_FALLBACK` before any has).")
    dispatch_window_fallback: int = Field(
        default=32, ge=1,
        description="The dispatch window while `DROVER_DISPATCH_WINDOW` is 0 and no worker has "
        "reported its slots yet.")
    wait_in_line: bool = Field(
        default=True,
        description="When the key is the bottleneck, sub-agents the limiter cannot serve "
        "within `DROVER_HORIZON_S` wait unpublished in the fair-share window's line (in "
        "Redis), not in Celery countdowns: the window also holds at most what the limiter "
        "serves within the horizon. false: the window is the workers' slots only.")
    tenant_weights: dict[str, PositiveRate] = Field(
        default_factory=dict,
        description="Tenant -> weight (JSON) for fair share; tenants not named weigh "
        "`DROVER_DEFAULT_TENANT_WEIGHT`.")
    default_tenant_weight: PositiveRate = Field(
        default=1.0, description="The weight of a tenant `DROVER_TENANT_WEIGHTS` does not name.")
    priority_floor: float = Field(
        default=0.1, gt=0, le=0.33,
        description="Each priority level below the highest one waiting in a tenant gets at "
        "least this share of the tenant's window (so batch work is never starved by "
        "interactive work).")
    tenant_budgets: dict[str, TenantBudget] = Field(
        default_factory=dict,
        description="Tenant -> token budget (input + output tokens), enforced by the limiter as "
        "a scope of the tenant's own: `{\"team-a\": {\"per_minute\": 200000, \"per_day\": "
        "20000000}}`.")

    gateway_keys: list[GatewayKey] = Field(
        default_factory=list,
        description="The callers of `drover gateway`, JSON: `[{\"key\": \"dgw-...\", "
        "\"tenant\": \"web\"}, ...]`, each optionally with `\"budget\": {\"per_minute\": "
        "N, \"per_day\": M}` (its tenant's token budget) and limits of the key's own "
        "(`\"rpm\"`, and `\"itpm\"`/`\"otpm\"`, or OpenAI's `\"tpm\"`). A request with no key "
        "of this list is refused (401). docs/gateway.md.")

    # --- offline jobs through the Message Batches API (JobSpec.delivery) -----------------
    batch_size: int = Field(
        default=1000, ge=1,
        description="A scope's pending requests go out as a batch once this many wait (or once "
        "the oldest has waited `DROVER_BATCH_LINGER_S`).")
    batch_linger_s: float = Field(
        default=5.0, ge=0,
        description="The longest a pending batch request waits for others before its batch "
        "goes out.")
    batch_max_requests: int = Field(
        default=100_000, ge=1, le=100_000,
        description="Requests per Message Batch at most (the API: 100k).")
    batch_poll_s: float = Field(
        default=30.0, gt=0, description="How often an open batch is retrieved.")
    batch_tick_s: float = Field(
        default=1.0, gt=0, description="How often the batcher looks at all.")
    batch_lock_s: float = Field(
        default=120.0, ge=1,
        description="How long a batcher's lock lasts (one batcher per API key fleet-wide, "
        "each tick under it): a batcher that died is replaced this long after its last tick "
        "began.")
    batch_rpm: PositiveRate = Field(
        default=50,
        description="The batches endpoints' own request limit per minute (per API key, "
        "separate from RPM/ITPM/OTPM).")
    batch_queue_cap: int = Field(
        default=100_000, ge=1,
        description="Batch requests allowed waiting at the provider (per API key).")
    batch_auto_min_deadline_s: float = Field(
        default=86_400.0, gt=0,
        description="`delivery=\"auto\"` uses batches when the job has no deadline or at least "
        "this long a one (the provider ends every batch within 24 h; most within an hour).")

    @field_validator("redis_url", "result_backend")
    @classmethod
    def _redis_like(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return _check_url(value, ("redis", "rediss", "unix", "sentinel"))

    @field_validator("results_url")
    @classmethod
    def _postgres_like(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        url = value.get_secret_value().strip()
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme not in ("postgresql", "postgres"):
            raise ValueError("expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
        try:
            urlsplit(url).port  # noqa: B018  (a port that is not a number raises)
        except ValueError:
            raise ValueError("the port is not a number from 1 to 65535; expected "
                             "postgresql://USER:PASSWORD@HOST:PORT/DATABASE") from None
        return SecretStr(url)

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
    def _gateway_keys(self) -> Settings:
        """Every gateway key once; a key's budget is its tenant's (one budget a tenant)."""
        keys = [k.key.get_secret_value() for k in self.gateway_keys]
        if len(set(keys)) != len(keys):
            tenants = sorted({k.tenant for k in self.gateway_keys
                              if keys.count(k.key.get_secret_value()) > 1})
            raise ValueError(f"DROVER_GATEWAY_KEYS: a key appears more than once (tenant "
                             f"{', '.join(tenants)}); give every caller a key of its own")
        for entry in self.gateway_keys:
            _check_dimensions(f"DROVER_GATEWAY_KEYS: the key of tenant {entry.tenant}", entry,
                              self.provider)
            if entry.budget is None:
                continue
            known = self.tenant_budgets.get(entry.tenant)
            if known is not None and known != entry.budget:
                raise ValueError(f"DROVER_GATEWAY_KEYS: tenant {entry.tenant} has a budget "
                                 "here and another one in DROVER_TENANT_BUDGETS (or on "
                                 "another of its keys); give it one budget")
            self.tenant_budgets[entry.tenant] = entry.budget
        return self

    @model_validator(mode="after")
    def _pool_and_classes(self) -> Settings:
        aliases = [k.alias for k in self.keys]
        twice = sorted({a for a in aliases if aliases.count(a) > 1})
        if twice:
            raise ValueError(f"DROVER_KEYS: the alias(es) {', '.join(twice)} appear more than "
                             "once; give every key its own alias")
        seen: dict[str, str] = {}
        groups = {name: list(models) for name, models in self.limit_groups.items()}
        for name, ml in self.limits.items():
            if ml.models:
                groups.setdefault(name, []).extend(ml.models)
        for name, models in groups.items():
            if not re.match(_NAME, name):
                raise ValueError(f"the model class {name!r} may hold only letters, digits and "
                                 "_ . @ -")
            for model in models:
                if model in seen and seen[model] != name:
                    raise ValueError(f"the model {model!r} is in two classes ({seen[model]!r} "
                                     f"and {name!r}); a model shares one class's limit")
                seen[model] = name
        self._classes = seen
        self._check_providers()
        return self

    def _check_providers(self) -> None:
        """Every provider a model is on has a key to call it with (see model_providers)."""
        others = sorted({p for p in self.model_providers.values() if p != self.provider})
        if others and not self.keys:
            raise ValueError(
                f"DROVER_MODEL_PROVIDERS puts models on {', '.join(others)}, but without a pool "
                f"the one key is DROVER_PROVIDER's ({self.provider}): set DROVER_KEYS with a "
                f"key of each provider (\"provider\": \"{others[0]}\" in its entry), or set "
                f"DROVER_PROVIDER={others[0]} and name no models")
        for name, entry in self.limits.items():
            _check_dimensions(f"DROVER_LIMITS[{name!r}]", entry, self.provider_of(name))
        for key in self.keys:
            _check_dimensions(f"DROVER_KEYS[{key.alias}]", key, self.key_provider(key))
            for name, entry in key.limits.items():
                _check_dimensions(f"DROVER_KEYS[{key.alias}].limits[{name!r}]", entry,
                                  self.key_provider(key))
        if not self.keys:
            return
        needed = {self.provider_of(self.model), *self.model_providers.values()}
        have = {self.key_serves(k) for k in self.keys}
        for name in sorted(needed - have):
            models = sorted(m for m, p in self.model_providers.items() if p == name)
            whose = (f"the models {', '.join(models)} are" if models
                     else f"DROVER_MODEL={self.model} is")
            raise ValueError(
                f"{whose} on {name}, but no key of DROVER_KEYS is: add one with "
                f"\"provider\": \"{name}\" (a key without \"provider\" is "
                f"DROVER_PROVIDER's, {self.provider})")
        unused = sorted(have - needed)
        if unused:
            aliases = [k.alias for k in self.keys if self.key_serves(k) in unused]
            raise ValueError(
                f"DROVER_KEYS: the key(s) {', '.join(aliases)} are for {', '.join(unused)}, "
                "but no model is: name its models in DROVER_MODEL_PROVIDERS (JSON: "
                f"{{\"MODEL\": \"{unused[0]}\"}}), or remove the keys")

    @property
    def price_table(self) -> PriceTable:
        """The bundled prices with DROVER_PRICES over them (built once per settings)."""
        if self._prices is None:
            overrides = {m: p.model_dump(exclude_none=True) for m, p in self.prices.items()}
            self._prices = bundled_table().with_overrides(overrides, self.provider)
        return self._prices

    def price_of(self, model: str) -> Price | None:
        """What ``model``'s tokens cost (None: unpriced)."""
        return self.price_table.price_of(model)

    def provider_of(self, model: str) -> str:
        """The API that serves ``model``: DROVER_MODEL_PROVIDERS by model or by its class,
        else DROVER_PROVIDER."""
        return (self.model_providers.get(model)
                or self.model_providers.get(self.limit_class(model)) or self.provider)

    def key_provider(self, key: PoolKey) -> str:
        """The API a pool key is for: its own ``provider``, else DROVER_PROVIDER."""
        return key.provider or self.provider

    def key_serves(self, key: PoolKey) -> str:
        """The API whose models a pool entry serves: a cloud's entry the Anthropic API's
        (Claude), any other its provider's."""
        return "anthropic" if key.cloud else self.key_provider(key)

    @model_validator(mode="after")
    def _countdowns_fit_the_broker(self) -> Settings:
        # Celery keeps ETA/countdown tasks in worker memory; the broker redelivers any task not
        # acked within visibility_timeout. A countdown or a task run longer than that would be
        # delivered twice, so the three are checked together. Every countdown drover schedules
        # (a failed call's backoff or retry-after, the limiter's horizon or cooldown, Redis
        # away, an early join) is capped at countdown_cap_s where the retry is made
        # (workers/tasklayer/_delivery.py), so this one sum bounds them all.
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
        if self.progress_stale_s <= 2 * self.socket_timeout_s:
            raise ValueError(
                f"DROVER_PROGRESS_STALE_S ({self.progress_stale_s:g}) must exceed twice "
                f"DROVER_SOCKET_TIMEOUT_S ({self.socket_timeout_s:g}): a command that times out "
                "and is retried on a new connection is not a worker that stopped moving")
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

    def limit_class(self, model: str) -> str:
        """The model class whose one limit ``model`` shares (DROVER_LIMIT_GROUPS, or a
        ``models`` list in DROVER_LIMITS); a model of no class is its own."""
        return self._classes.get(model, model)

    def limits_for(self, model: str) -> ModelLimits | None:
        """The configured limits of ``model`` (of its class; the organisation's when a pool
        is configured); None when only the provider's headers can tell."""
        cls = self.limit_class(model)
        for name in (cls, model):
            if name in self.limits:
                if about(self.provider_of(model)).cache_reads_count:
                    return self.limits[name].model_copy(update={"cache_reads_count": True})
                return self.limits[name]
        if (cls == self.limit_class(self.model)
                and about(self.provider_of(self.model)).cache_reads_count):
            return ModelLimits(rpm=self.rpm, tpm=self.tpm, cache_reads_count=True)
        if cls == self.limit_class(self.model):
            return ModelLimits(
                rpm=self.rpm, itpm=self.itpm, otpm=self.otpm,
                cache_reads_count=self.cache_reads_count,
            )
        return None

    @property
    def pooled(self) -> bool:
        """A pool of keys (DROVER_KEYS) rather than the one key."""
        return bool(self.keys)

    def key_limits_for(self, key: PoolKey, model: str) -> ModelLimits | None:
        """One pool key's own limits for ``model``'s class (None: only the organisation's,
        or a key of another provider, which never serves ``model``)."""
        if self.key_serves(key) != self.provider_of(model):
            return None
        cls = self.limit_class(model)
        for name in (cls, model):
            if name in key.limits:
                return key.limits[name]
        if cls == self.limit_class(self.model) and (key.rpm or key.itpm or key.otpm or key.tpm):
            return ModelLimits(rpm=key.rpm, itpm=key.itpm, otpm=key.otpm, tpm=key.tpm)
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
        # A key's value, or a DROVER_KEYS / DROVER_GATEWAY_KEYS entry written as a bare
        # string, is never echoed.
        secret = loc in (["anthropic_api_key"], ["openai_api_key"]) or (
            bool(loc) and loc[0] in ("keys", "gateway_keys"))
        if loc == ["anthropic_api_key"]:
            name = "ANTHROPIC_API_KEY"
        message = item["msg"].removeprefix("Value error, ")
        shown = loc and not secret and "input" in item and not isinstance(item["input"], dict)
        value = item.get("input")
        if isinstance(value, str) and "://" in value:
            value = mask_url(value)  # a Redis or broker URL may hold a password
        given = f" (got {value!r})" if shown else ""
        lines.append(f"  {name}: {message}{given}")
    return "\n".join(lines)


# DROVER_ variables read outside the Settings model (config/docs.py describes them): no typo.
READ_ELSEWHERE = frozenset({
    "DROVER_FLOWER_BASIC_AUTH",  # drover flower
    "DROVER_GRAFANA_ADMIN_PASSWORD", "DROVER_GRAFANA_PORT", "DROVER_FLOWER_PORT",
    "DROVER_PROMETHEUS_PORT", "DROVER_GATEWAY_PORT",  # docker-compose.yml
})
_log = logging.getLogger("drover.config")
_reported: set[str] = set()


def setting_names() -> set[str]:
    """Every variable a setting reads (DROVER_X, and the aliases such as ANTHROPIC_API_KEY)."""
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias else []
        names.update(str(choice).upper() for choice in choices)
        names.add(f"DROVER_{name.upper()}")
    return names


def unknown_variables(environ: dict[str, str] | None = None,
                      env_file: str | Path | None = ".env") -> list[str]:
    """One line per ``DROVER_`` variable (environment or ``.env``) that is no setting, naming
    the setting it resembles: a misspelled setting is otherwise silently ignored."""
    found = {name.upper(): "" for name in (os.environ if environ is None else environ)}
    if env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values  # pydantic-settings' own .env reader

        for name in dotenv_values(env_file):
            found.setdefault(name.upper(), f" (in {env_file})")
    known = setting_names() | READ_ELSEWHERE
    lines = []
    for name, where in sorted(found.items()):
        if not name.startswith("DROVER_") or name in known:
            continue
        # Compared without the prefix every candidate shares (else anything looks close).
        close = difflib.get_close_matches(name[7:], sorted(k[7:] for k in known
                                                           if k.startswith("DROVER_")), n=1)
        hint = f"; did you mean DROVER_{close[0]}?" if close else " (docs/settings.md lists them)"
        lines.append(f"{name}{where} is not a drover setting{hint}")
    return lines


def _check_names(settings: Settings) -> None:
    """Name every unknown DROVER_ variable once per process: an error with
    DROVER_STRICT_SETTINGS, else a warning."""
    lines = unknown_variables()
    if settings.strict_settings and lines:
        raise SettingsError("drover's settings are not valid (DROVER_STRICT_SETTINGS):\n"
                            + "\n".join(f"  {line}" for line in lines))
    for line in lines:
        if line not in _reported:
            _reported.add(line)
            _log.warning("%s", line)


def load_settings(**overrides: object) -> Settings:
    """Build the settings from the environment, raising SettingsError with a readable message."""
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        raise SettingsError(_explain(error)) from None
    except PydanticSettingsError as error:  # a JSON-valued variable that is not JSON
        match = re.search(r'field "(\w+)"', str(error))
        name = f"DROVER_{match.group(1).upper()}" if match else "a DROVER_ variable"
        raise SettingsError(
            f"drover's settings are not valid:\n  {name}: not valid JSON; write it as JSON, "
            + ('e.g. DROVER_PRICES=\'{"claude-sonnet-4-5": {"input": 3.0, "output": 15.0}}\' '
               "(dollars per million tokens)" if name == "DROVER_PRICES" else
               'e.g. DROVER_LIMITS=\'{"claude-haiku-4-5": {"rpm": 50, "itpm": 50000, '
            '"otpm": 10000}}\' or DROVER_TOOL_RPS=\'{"lookup_fact": 5}\'')) from None
    _check_names(settings)
    return settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, built once."""
    return load_settings()

