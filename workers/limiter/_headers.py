"""The provider's ``anthropic-ratelimit-*`` response headers, as the limiter folds them in."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["header_args", "parse_ratelimit_headers"]

_DIMS = ("requests", "input-tokens", "output-tokens")
Numbers = tuple[float | None, float | None, float | None]


def parse_ratelimit_headers(headers: Mapping[str, str | bytes]) -> tuple[Numbers, Numbers]:
    """(remaining, limit) of requests, input and output tokens; None where absent or bad."""
    lower = {str(k).lower(): v for k, v in headers.items()}

    def get(name: str) -> float | None:
        raw = lower.get(name)
        if raw is None:
            return None
        try:
            value = float(raw.decode() if isinstance(raw, bytes) else raw)
        except ValueError:
            return None
        return value if math.isfinite(value) and value >= 0 else None

    remaining = tuple(get(f"anthropic-ratelimit-{d}-remaining") for d in _DIMS)
    limit = tuple(get(f"anthropic-ratelimit-{d}-limit") for d in _DIMS)
    return remaining, limit  # type: ignore[return-value]


def header_args(headers: Mapping[str, str | bytes]) -> dict[str, dict[str, float]] | None:
    """The scripts' ``headers`` argument: {remaining: {r, i, o}, limit: {r, i, o}}, each
    without the dimensions the response had none of (a -limit of 0 is none); None when it
    had none at all."""
    remaining, limit = parse_ratelimit_headers(headers)
    out = {"remaining": {d: v for d, v in zip("rio", remaining, strict=True) if v is not None},
           "limit": {d: v for d, v in zip("rio", limit, strict=True) if v}}
    return out if out["remaining"] or out["limit"] else None
