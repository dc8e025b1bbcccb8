"""Who is calling: the gateway key a request carries (``x-api-key``, or ``Authorization:
Bearer``), looked up among ``DROVER_GATEWAY_KEYS``.

A key is compared in constant time against every configured key (a timing difference must
not tell a caller how much of a guess was right), and never logged: a request is named by
its tenant only. A key's own limits (``rpm``, ``itpm``/``otpm`` or ``tpm``) are a limiter
scope of the key's, ``gateway:<tenant>:<8 hex digits of the key's SHA-256>`` (the digest
names the key in ``drover stats`` without saying it), reserved beside the model's on every
call of the key (``own_limits``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from drover.config import GatewayKey
from drover.workers.limiter import ScopeLimits

__all__ = ["Callers", "key_scope", "own_limits"]


class Callers:
    """The gateway's callers, from ``DROVER_GATEWAY_KEYS``."""

    def __init__(self, keys: list[GatewayKey]) -> None:
        self._keys = [(k.key.get_secret_value().encode(), k) for k in keys]

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, headers: Mapping[str, str]) -> GatewayKey | None:
        """The caller whose key ``headers`` carry, or None (no key, or not one of ours)."""
        sent = presented_key(headers)
        if not sent:
            return None
        found = None
        for key, entry in self._keys:  # every key compared: the time says nothing
            if hmac.compare_digest(key, sent.encode()):
                found = entry
        return found


def presented_key(headers: Mapping[str, str]) -> str:
    """The key a request presents: ``x-api-key`` (Anthropic's SDKs), else the bearer token of
    ``Authorization`` (OpenAI's SDKs, curl, most tools)."""
    key = headers.get("x-api-key", "").strip()
    if key:
        return key
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def key_scope(entry: GatewayKey) -> str:
    """The limiter scope of a gateway key's own limits."""
    digest = hashlib.sha256(entry.key.get_secret_value().encode()).hexdigest()[:8]
    return f"gateway:{entry.tenant}:{digest}"


def own_limits(entry: GatewayKey, burst_s: float) -> tuple[tuple[str, ScopeLimits], ...]:
    """The key's own limits as the call path reserves them (none when it has none): buckets
    of ``burst_s`` of refill, as the key's (DROVER_BURST_SECONDS)."""
    if not any((entry.rpm, entry.itpm, entry.otpm, entry.tpm)):
        return ()
    return ((key_scope(entry), ScopeLimits(rpm=entry.rpm, itpm=entry.itpm, otpm=entry.otpm,
                                           tpm=entry.tpm, burst_s=burst_s)),)
