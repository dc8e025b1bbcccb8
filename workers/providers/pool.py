"""A pool's keys (``DROVER_KEYS``) and one SDK client per key, built once per worker process
by its root (``Services.loop_parts``); the agent's routes pick a key's client from it."""

from __future__ import annotations

from typing import Any

from drover.config import PoolKey

__all__ = ["Pool"]


class Pool:
    """A pool's keys and one SDK client per key (connections pooled per key)."""

    def __init__(self, keys: list[PoolKey], clients: dict[str, Any]) -> None:
        self.keys = keys
        self.clients = clients

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
