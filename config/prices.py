"""What tokens cost: the bundled price table (``prices.json``) and ``DROVER_PRICES`` over it.

The table is data, not code: each model's list prices in dollars per million tokens (input,
output, cache write, cache read), the provider's Batches discount, the date they were read and
the pages they came from. ``DROVER_PRICES`` replaces or adds models. A cache price left out of
an entry is derived from its input price the way the provider derives it: Anthropic bills a
5-minute cache write at 1.25 x input and a cache read at 0.1 x input; OpenAI bills no cache
write and a cached input at the ratio its table gives the model (the bundled entry's, or of the
model it is a version of; 0.5 x input, the highest ratio OpenAI lists, for a model it does not
know, so a bill is never under-stated). A model with no price at all has none: drover reports
its calls as unpriced, never as $0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["PRICE_TABLE", "Price", "PriceTable", "bundled_table", "derive_price"]

PER = 1_000_000  # prices are per million tokens
ANTHROPIC_CACHE_WRITE = 1.25  # x input: a 5-minute cache write
ANTHROPIC_CACHE_READ = 0.1  # x input
OPENAI_CACHE_READ_UNKNOWN = 0.5  # x input: the highest cached-input ratio OpenAI lists
PRICE_TABLE = "drover/config/prices.json"  # where the bundled table lives, for messages


@dataclass(frozen=True)
class Price:
    """One model's prices in dollars per million tokens, and its Batches discount (the
    fraction of the price a batch result pays: 0.5)."""

    input: float
    output: float
    cache_write: float
    cache_read: float
    batch: float = 0.5

    def cost(self, input_tokens: int = 0, output_tokens: int = 0, cache_write_tokens: int = 0,
             cache_read_tokens: int = 0, *, batch: bool = False) -> float:
        """Dollars for these tokens (``batch``: billed at the Batches discount)."""
        dollars = (input_tokens * self.input + output_tokens * self.output
                   + cache_write_tokens * self.cache_write
                   + cache_read_tokens * self.cache_read) / PER
        return dollars * self.batch if batch else dollars


def provider_of_model(model: str, default: str) -> str:
    """Whose prices a model follows when no table says: Claude models are Anthropic's."""
    return "anthropic" if model.startswith("claude") else default


def derive_price(entry: dict[str, Any], provider: str, *, batch: float = 0.5,
                 cached_ratio: float | None = None) -> Price:
    """A ``Price`` from ``entry`` (input and output, cache prices optional), its missing cache
    prices derived from its input price as ``provider`` derives them."""
    price_in = float(entry["input"])
    if provider == "openai":
        write = entry.get("cache_write", price_in)  # OpenAI charges no cache write
        ratio = OPENAI_CACHE_READ_UNKNOWN if cached_ratio is None else cached_ratio
        read = entry.get("cache_read", price_in * ratio)
    else:
        write = entry.get("cache_write", price_in * ANTHROPIC_CACHE_WRITE)
        read = entry.get("cache_read", price_in * ANTHROPIC_CACHE_READ)
    return Price(price_in, float(entry["output"]), float(write), float(read), batch)


@dataclass(frozen=True)
class PriceTable:
    """Prices by model: the bundled table with the overrides of ``DROVER_PRICES`` over it."""

    date: str
    source: dict[str, str]
    prices: dict[str, Price]
    overridden: frozenset[str] = frozenset()

    def price_of(self, model: str) -> Price | None:
        """The model's price, or that of the model it is a dated version of (the longest
        table name that ``model`` begins with, then ``-``); None: unpriced."""
        found = self.prices.get(model)
        if found is not None:
            return found
        names = [name for name in self.prices if model.startswith(name + "-")]
        return self.prices[max(names, key=len)] if names else None

    def source_of(self, model: str) -> str:
        """Where the model's price comes from, in a few words (for ``drover estimate``)."""
        if model in self.overridden:
            return "DROVER_PRICES"
        return f"bundled table of {self.date}" if self.price_of(model) else "unpriced"

    def with_overrides(self, overrides: dict[str, dict[str, Any]], default_provider: str
                       ) -> PriceTable:
        """This table with ``overrides`` (model -> {input, output[, cache_write,
        cache_read]}, dollars per million tokens) over it."""
        if not overrides:
            return self
        raw = _raw_table()
        prices = dict(self.prices)
        for model, entry in overrides.items():
            bundled = raw["models"].get(model)
            base = self.price_of(model)
            provider = (bundled or {}).get("provider") or provider_of_model(model,
                                                                            default_provider)
            ratio = base.cache_read / base.input if base is not None and base.input else None
            prices[model] = derive_price(entry, provider, batch=raw["batch_discount"].get(
                provider, 0.5), cached_ratio=ratio)
        return PriceTable(self.date, self.source, prices, frozenset(overrides))


@lru_cache(maxsize=1)
def _raw_table() -> dict[str, Any]:
    text = resources.files("drover.config").joinpath("prices.json").read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def bundled_table() -> PriceTable:
    """The table shipped in the package (``prices.json``)."""
    raw = _raw_table()
    prices = {}
    for model, entry in raw["models"].items():
        provider = entry["provider"]
        prices[model] = derive_price(entry, provider,
                                     batch=raw["batch_discount"].get(provider, 0.5))
    return PriceTable(raw["date"], dict(raw["source"]), prices)
