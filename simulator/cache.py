"""Prompt cache: which prefixes were written recently, keyed by (api key, model, prefix)."""

from __future__ import annotations

import hashlib


class PromptCache:
    def __init__(self) -> None:
        self._expiry: dict[bytes, float] = {}
        self._writes = 0

    @staticmethod
    def key(api_key: str, model: str, prefix_material: bytes) -> bytes:
        h = hashlib.sha256()
        h.update(api_key.encode())
        h.update(b"\0")
        h.update(model.encode())
        h.update(b"\0")
        h.update(prefix_material)
        return h.digest()[:16]

    def hit(self, key: bytes, now: float) -> bool:
        expiry = self._expiry.get(key)
        return expiry is not None and expiry > now

    def store(self, key: bytes, now: float, ttl_s: float) -> None:
        # A read refreshes the TTL too, as the provider's cache does.
        self._expiry[key] = now + ttl_s
        self._writes += 1
        if self._writes % 4096 == 0:
            self._expiry = {k: v for k, v in self._expiry.items() if v > now}

    def clear(self) -> None:
        self._expiry.clear()
