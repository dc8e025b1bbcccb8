"""Running a test's workers on OpenAI (DROVER_PROVIDER=openai) against the simulator's
OpenAI mode (Chat Completions, requests and one tokens bucket)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers import configure

__all__ = ["MODEL", "on_openai"]

MODEL = "gpt-sim-1"


def on_openai(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
              sim_factory: Callable[..., object], **sim_config: object) -> object:
    """Start a simulator in its OpenAI mode with ``sim_config`` and point this test's
    settings (and the workers it starts after this) at it; returns the simulator."""
    sim = sim_factory(provider="openai", seed=1, **sim_config)
    configure(monkeypatch, env, provider="openai", openai_base_url=sim.url + "/v1",
              openai_api_key="sk-sim", model=MODEL, rpm=sim_config.get("rpm", 6000),
              tpm=sim_config.get("tpm", 10_000_000))
    return sim
