"""The SDK clients a worker's root builds (``Services.loop_parts``): the provider's client
and a key pool's, each configured from the settings in one place."""

from __future__ import annotations

import os
from typing import Any

from drover.config import PoolKey, Settings
from drover.config.providers import about
from drover.workers.providers._base import Provider
from drover.workers.providers.pool import Pool
from drover.workers.providers.registry import provider

__all__ = ["client_defaults", "key_pool", "provider_client"]


def _sdk_client(settings: Settings, of: Provider, api_key: str | None, base_url: str | None,
                *, keyless: bool = False) -> Any:
    """A provider's client: every realtime call streams, so a connect timeout and the gap
    between reads (the stream's idle limit), never a total."""
    return of.build_client(api_key=api_key, base_url=base_url,
                           connect_s=settings.connect_timeout_s, idle_s=settings.stream_idle_s,
                           keyless=keyless)


def client_defaults(settings: Settings, name: str) -> dict[str, Any]:
    """Provider ``name``'s key and endpoint from the settings (None: not set)."""
    facts = about(name)
    key = facts.api_key(settings)
    return {"api_key": key.get_secret_value() if key else None,
            "base_url": facts.base_url(settings)}


def provider_client(settings: Settings) -> Any:
    """DROVER_PROVIDER's client, on its key and endpoint."""
    defaults = client_defaults(settings, settings.provider)
    key, base_url = defaults["api_key"], defaults["base_url"]
    # No key but a base URL: a proxy that may need none (the client omits the header).
    facts = about(settings.provider)
    keyless = bool(not key and base_url and facts.keyless_endpoint
                   and not (facts.auth_token_env and os.environ.get(facts.auth_token_env)))
    return _sdk_client(settings, provider(settings.provider), key, base_url, keyless=keyless)


def _key_client(settings: Settings, key: PoolKey) -> Any:
    name = settings.key_provider(key)
    # A cloud's entry without a base_url: the SDK's own endpoint of its region.
    base_url = key.base_url or (None if key.cloud else about(name).base_url(settings))
    return provider(name).build_key_client(key, base_url=base_url,
                                           connect_s=settings.connect_timeout_s,
                                           idle_s=settings.stream_idle_s)


def key_pool(settings: Settings) -> Pool | None:
    """A pool (DROVER_KEYS): one client per entry, of the entry's provider (a cloud's: its
    SDK client and model ids), each with the entry's own endpoint (else its provider's);
    None without a pool."""
    if not settings.pooled:
        return None
    return Pool(settings.keys, {k.alias: _key_client(settings, k) for k in settings.keys})
