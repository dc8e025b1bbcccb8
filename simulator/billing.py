"""What the simulated provider charges, and its spend limit.

The bill: every request it admitted, at ``SimConfig.prices`` (dollars per million tokens by
model): its input, cache writes and cache reads at admission, and the output it generated,
delivered or not, until its stream closed (what ``SimStats`` counts as billed). Message Batch
results pay ``batch_discount`` of that. A cache price left out of a model's entry is derived
from its input price as the provider derives it (Anthropic: a cache write 1.25 x input, a
read 0.1 x input; OpenAI: no cache-write premium, cached input 0.5 x input). A model with no
price is counted, not charged (``unpriced_requests``).

The spend limit: the organisation's (``spend_limit_calls``: paid calls of every key) and a
pool key's workspace's (``key_spend_limit_calls``: alias -> paid calls of that key). Once
reached, every request is refused in the provider's words (Anthropic: 429 rate_limit_error
with ``error.details.error_code`` ``enforced_spend_limit_reached`` and no retry-after;
OpenAI: 429 ``insufficient_quota``) until the limit is raised (``POST /_sim/config``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["bill", "price_of", "spend_limited"]

_PER = 1_000_000


def price_of(prices: dict[str, dict[str, float]], model: str, provider: str
             ) -> tuple[float, float, float, float] | None:
    """(input, output, cache write, cache read) dollars per million tokens, or None."""
    entry = prices.get(model)
    if entry is None:
        return None
    price_in = float(entry["input"])
    if provider == "openai":
        write = entry.get("cache_write", price_in)
        read = entry.get("cache_read", price_in * 0.5)
    else:
        write = entry.get("cache_write", price_in * 1.25)
        read = entry.get("cache_read", price_in * 0.1)
    return price_in, float(entry["output"]), float(write), float(read)


def bill(by_model: dict[str, list[int]], prices: dict[str, dict[str, float]], provider: str,
         factor: float = 1.0) -> dict[str, Any]:
    """The bill of ``by_model`` (model -> [requests, input, cache write, cache read, output]
    tokens billed): dollars in all and by model, and the requests of unpriced models."""
    usd, unpriced, per = 0.0, 0, {}
    for model, (requests, *tokens) in sorted(by_model.items()):
        price = price_of(prices, model, provider)
        if price is None:
            unpriced += requests
            continue
        dollars = sum(n * p for n, p in zip(tokens, (price[0], price[2], price[3], price[1]),
                                            strict=True)) / _PER * factor
        per[model] = dollars
        usd += dollars
    return {"usd": usd, "by_model": per, "unpriced_requests": unpriced}


def spend_limited(org_calls: int, key_calls: int | None, alias: str | None,
                  org_limit: int | None, key_limits: dict[str, int]) -> str | None:
    """Whose spend limit refuses the next request: "organization", "workspace" or None."""
    if org_limit is not None and org_calls >= org_limit:
        return "organization"
    limit = key_limits.get(alias) if alias is not None else None
    if limit is not None and (key_calls or 0) >= limit:
        return "workspace"
    return None
