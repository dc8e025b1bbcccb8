"""Prices: the bundled table, DROVER_PRICES over it, and the dollars a Usage adds up."""

from __future__ import annotations

import pytest

from drover.config import load_settings
from drover.config.prices import bundled_table
from drover.errors import SettingsError
from drover.workers.jobs.records import Usage, total_usage


class _Answer:  # an SDK usage's attributes
    def __init__(self, i: int, o: int, cw: int = 0, cr: int = 0) -> None:
        self.input_tokens, self.output_tokens = i, o
        self.cache_creation_input_tokens, self.cache_read_input_tokens = cw, cr


def test_the_bundled_table_has_its_date_and_sources_and_prices_dated_versions():
    table = bundled_table()
    assert table.date and set(table.source) == {"anthropic", "openai"}
    sonnet = table.price_of("claude-sonnet-4-5")
    assert sonnet is not None and (sonnet.input, sonnet.output) == (3.0, 15.0)
    assert table.price_of("claude-sonnet-4-5-20250929") == sonnet
    # the longest name a dated version begins with: gpt-4o-mini's, not gpt-4o's
    assert table.price_of("gpt-4o-mini-2024-07-18") == table.price_of("gpt-4o-mini")
    assert table.price_of("llama-3") is None


def test_prices_override_and_missing_cache_prices_are_derived_as_the_provider_does(monkeypatch):
    monkeypatch.setenv("DROVER_PRICES", '{"claude-x": {"input": 2, "output": 10}, '
                       '"gpt-4.1-mini": {"input": 0.8, "output": 3.2}}')
    settings = load_settings()
    claude = settings.price_of("claude-x")
    assert claude is not None
    assert (claude.cache_write, claude.cache_read) == pytest.approx((2.5, 0.2))  # 1.25x, 0.1x
    gpt = settings.price_of("gpt-4.1-mini")
    assert gpt is not None  # OpenAI: no cache-write premium, cached input at the table's 1/4
    assert (gpt.cache_write, gpt.cache_read) == pytest.approx((0.8, 0.2))
    assert settings.price_table.source_of("gpt-4.1-mini") == "DROVER_PRICES"


@pytest.mark.parametrize("value, says", [
    ("{nope", "DROVER_PRICES: not valid JSON"),
    ('{"m": {"input": 1}}', "DROVER_PRICES (m.output): Field required"),
    ('{"m": {"input": -1, "output": 1}}', "DROVER_PRICES (m.input)"),
    ('{"m": {"input": 1, "output": 1, "cache_reed": 1}}', "(m.cache_reed)"),
])
def test_bad_prices_are_refused_naming_the_variable(monkeypatch, value, says):
    monkeypatch.setenv("DROVER_PRICES", value)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    assert says in str(raised.value)


def test_usage_prices_answers_batches_and_unanswered_calls():
    price = bundled_table().price_of("claude-sonnet-4-5")
    usage = Usage()
    usage.add(_Answer(1_000_000, 100_000, 200_000, 1_000_000), price=price)
    assert usage.cost_usd == pytest.approx(3.0 + 1.5 + 0.75 + 0.3)
    usage.add(_Answer(1_000_000, 0), batch=True, price=price)  # half price
    usage.add_unanswered(0, 1_000_000, price)  # at what it is counted
    assert usage.cost_usd == pytest.approx(5.55 + 1.5 + 15.0)


def test_a_model_without_a_price_is_unpriced_never_zero_dollars():
    unpriced = Usage()
    unpriced.add(_Answer(1000, 100), price=None)
    assert unpriced.cost_usd is None and unpriced.unpriced_calls == 1
    priced = Usage()
    priced.add(_Answer(1_000_000, 0), price=bundled_table().price_of("claude-haiku-4-5"))
    both = Usage()
    both.merge(unpriced)
    assert both.cost_usd is None
    both.merge(priced)  # part priced: the dollars of that part, the rest counted as unpriced
    assert both.cost_usd == pytest.approx(1.0) and both.unpriced_calls == 1
    assert total_usage([]).cost_usd == 0.0  # nothing sent costs nothing
