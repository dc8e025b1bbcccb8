"""Redis replies as text: the job store's clients do not decode (records are JSON bytes)."""

from __future__ import annotations


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
