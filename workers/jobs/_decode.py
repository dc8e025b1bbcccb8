"""Redis replies as text: the job store's clients do not decode (records are JSON bytes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def members(reply: Iterable[Any]) -> list[str]:
    """A ZRANGE's members as text. redis-py types its reply with WITHSCORES' (member, score)
    pairs too, which a call without WITHSCORES never returns."""
    return [text(cast(bytes | str, member)) for member in reply]


def entries(reply: Any) -> list[list[Any]]:
    """An XREAD's reply, [[stream, [(id, fields), ...]], ...] or None when nothing came.
    redis-py types it with RESP3's dict too, which drover's clients (RESP2) never get."""
    return cast(list[list[Any]], reply or [])
