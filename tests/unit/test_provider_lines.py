"""A provider is its module and its line in ``config/providers.PROVIDERS``: the line's facts
are read without importing the module, and name the module that serves it."""

from __future__ import annotations

import sys

import pytest

from drover.config.providers import PROVIDERS, about
from drover.workers.providers import provider


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_each_line_names_the_module_that_serves_it_and_its_sdk(name: str) -> None:
    served = provider(name)
    assert served.name == name
    assert PROVIDERS[name].sdk in sys.modules  # the module imported the SDK the line names


def test_an_unknown_provider_is_refused_naming_those_there_are() -> None:
    with pytest.raises(ValueError, match="unknown provider 'nope': one of anthropic, openai"):
        about("nope")


def test_a_gateway_route_and_a_key_setting_are_given_for_each_api_of_its_own() -> None:
    for name, each in PROVIDERS.items():
        if each.api_key_setting is not None:  # a DROVER_PROVIDER: the gateway can serve it
            assert each.gateway_routes and each.api_key_env and each.base_url_env, name
