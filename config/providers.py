"""What drover knows of each provider without importing its module or its SDK: its
settings, its limits' dimensions, its gateway routes, whether it has batches.

The submitting side (``submit``'s fit check, delivery), start-up lines, the gateway and the
settings read these; the provider itself (``drover.workers.providers.registry.provider``) is
imported on a worker's first call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PROVIDERS", "About", "TokensLimit", "about"]


@dataclass(frozen=True)
class TokensLimit:
    """The limit a call's input must fit in a minute of: its ``ModelLimits`` attribute, the
    header that teaches it, and its noun in messages."""

    setting: str
    header: str
    word: str


@dataclass(frozen=True)
class About:
    """A provider's facts that need neither its module nor its SDK: read by the settings'
    start-up lines, the batcher's start, the gateway and the limiter's fit checks, which
    must not import an SDK they would not use."""

    module: str  # where its ``Provider`` is, and the attribute holding it
    attribute: str
    sdk: str  # its SDK's package (``loaded``)
    display_name: str  # in messages: "the OpenAI API"
    limit_settings: tuple[str, ...]  # the ModelLimits attributes its limits are given in
    tokens_limit: TokensLimit
    # Its one key and endpoint among the settings (None: a pool entry's only, a cloud's),
    # the environment variables that set them, and the SDK's endpoint when none is set.
    api_key_setting: str | None = None
    api_key_env: str | None = None
    base_url_setting: str | None = None
    base_url_env: str | None = None
    default_base_url: str | None = None
    # What its base URL already ends in (OpenAI's "/v1"), dropped from a gateway path.
    base_url_path: str = ""
    gateway_routes: tuple[str, ...] = ()  # the paths ``drover gateway`` serves for it
    has_batches: bool = False  # a Message Batches API: the batcher runs on its workers
    # A DROVER_KEYS entry of it: the fields it needs and those it takes beside alias,
    # base_url, provider and the limits; and whether it is Claude on a cloud (a pool entry
    # under no organisation, with the cloud's model ids).
    entry_required: frozenset[str] = frozenset({"api_key"})
    entry_allowed: frozenset[str] = frozenset({"api_key"})
    cloud: bool = False
    # Its tokens limit counts cached input (cache reads) too: OpenAI's one bucket.
    cache_reads_count: bool = False
    # What its one tokens limit counts, in the settings' refusal of an itpm or otpm.
    tokens_bucket: str = ""
    # A base URL may stand in for a key (a proxy that needs none; the openai SDK refuses to
    # build a client without one), and the variable of a credential other than its key.
    keyless_endpoint: bool = True
    auth_token_env: str | None = None
    sim_args: str = ""  # `drover sim`'s arguments that simulate it
    client_class: str = ""  # its SDK's client class, drover's limited one of the same name
    console: str = "the provider's console"  # where a refused key is checked
    # Where a spend limit is raised.
    spend_limit_page: str = ("the provider's billing page (add credit or raise the usage "
                             "limit)")

    def api_key(self, settings: Any) -> Any:
        """Its one key among ``settings`` (a SecretStr), or None (unset, or it has none)."""
        return getattr(settings, self.api_key_setting) if self.api_key_setting else None

    def base_url(self, settings: Any) -> str | None:
        """Its endpoint among ``settings``, or None (unset: the SDK's default)."""
        return getattr(settings, self.base_url_setting) if self.base_url_setting else None


_ANTHROPIC_INPUT = TokensLimit("itpm", "anthropic-ratelimit-input-tokens-limit", "input-token")
_ONE_BUCKET = TokensLimit("tpm", "x-ratelimit-limit-tokens", "token")

# name -> what drover knows of each provider it speaks, and where its module is: a provider
# is its module (beside workers/providers/_base.py) and its line here
PROVIDERS: dict[str, About] = {
    "anthropic": About(
        "drover.workers.providers._anthropic", "ANTHROPIC", "anthropic", "Anthropic",
        ("rpm", "itpm", "otpm"), _ANTHROPIC_INPUT, "anthropic_api_key", "ANTHROPIC_API_KEY",
        "anthropic_base_url", "DROVER_ANTHROPIC_BASE_URL", "https://api.anthropic.com",
        gateway_routes=("/v1/messages", "/v1/messages/count_tokens"), has_batches=True,
        auth_token_env="ANTHROPIC_AUTH_TOKEN", client_class="Anthropic",
        console="the Anthropic console",
        spend_limit_page="the Anthropic console (Settings > Limits: the organisation's or the "
                         "workspace's monthly spend limit)"),
    "openai": About(
        "drover.workers.providers._openai", "OPENAI", "openai", "OpenAI", ("rpm", "tpm"),
        _ONE_BUCKET, "openai_api_key", "OPENAI_API_KEY", "openai_base_url", "OPENAI_BASE_URL",
        "https://api.openai.com/v1", base_url_path="/v1",
        gateway_routes=("/v1/chat/completions",), keyless_endpoint=False, client_class="OpenAI",
        cache_reads_count=True, tokens_bucket="one tokens bucket (input + max tokens)",
        sim_args=" --provider openai"),
    "bedrock": About("drover.workers.providers._bedrock", "BEDROCK", "anthropic", "Bedrock",
                     ("rpm", "tpm"), _ONE_BUCKET,
                     tokens_bucket="one tokens quota (input + output_burndown x output)",
                     entry_required=frozenset({"region"}), cloud=True,
                     entry_allowed=frozenset({"region", "api_key", "models", "output_burndown"})),
    "vertex": About("drover.workers.providers._vertex", "VERTEX", "anthropic", "Vertex AI",
                    ("rpm", "itpm", "otpm"), _ANTHROPIC_INPUT, cloud=True,
                    entry_required=frozenset({"region", "project"}),
                    entry_allowed=frozenset({"region", "project", "access_token", "models"})),
}


def about(name: str) -> About:
    """What drover knows of the provider called ``name``."""
    found = PROVIDERS.get(name)
    if found is None:
        raise ValueError(f"unknown provider {name!r}: one of {', '.join(PROVIDERS)}")
    return found
