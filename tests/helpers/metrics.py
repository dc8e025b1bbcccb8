"""Reading `drover metrics`' exposition in tests: one scrape, parsed, and a sample's value."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from drover.orchestrator.ops.metrics import DroverCollector

__all__ = ["scrape", "value"]


def scrape(collector: DroverCollector) -> dict[str, object]:
    """The exposition text a scrape returns, parsed back by prometheus_client's parser."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, object], family: str, sample: str | None = None,
          **labels: str) -> float:
    found = [s.value for s in families[family].samples  # type: ignore[attr-defined]
             if s.name == (sample or family)
             and all(s.labels.get(k) == v for k, v in labels.items())]
    assert found, f"no {sample or family} sample with {labels}"
    return sum(found)
