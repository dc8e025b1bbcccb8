"""The hook the limited SDK clients (``drover.AsyncAnthropic`` and its kin) get their HTTP
client from.

The clients are the SDKs' own classes (``anthropic_clients``, ``openai_clients``: only this
room imports an SDK); what makes them limited is the HTTP transport under them, which reserves
from the fleet's limiter before each attempt and settles with the answer's usage. That
transport lives above this room (``drover.workers.clients``, on the agent's call path), so it
is handed in: the root of a process that offers the clients (``drover.orchestrator.client.
limited``, imported by ``drover.AsyncAnthropic``) registers how to make one with
``limit_clients_with``. A client is given a limited HTTP client or makes one through the hook;
an HTTP client of the caller's own would bypass the limits and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drover.config.providers import about

__all__ = ["LIMITED_MARK", "limit_clients_with", "limited_client_args"]

# (provider name, async?) -> (a limited HTTP client, the client's default arguments: the key
# and endpoint of the DROVER_* settings)
MakeHttp = Callable[[str, bool], tuple[Any, dict[str, Any]]]
LIMITED_MARK = "drover_limited"  # the attribute a limited HTTP client carries (True)
_make: MakeHttp | None = None


def limit_clients_with(make: MakeHttp) -> None:
    """Register how a process makes the limited clients' HTTP clients."""
    global _make
    _make = make


def limited_client_args(name: str, is_async: bool, http_client: Any,
                        given: dict[str, Any]) -> dict[str, Any]:
    """The SDK client's arguments for a limited client of provider ``name``: ``given`` with
    the limited ``http_client`` (made through the hook when None) and the settings' key and
    endpoint where ``given`` names none."""
    what = _public_name(name, is_async)
    if http_client is not None:
        if not getattr(http_client, LIMITED_MARK, False):
            raise TypeError(
                f"drover.{what} brings its own http_client (its transport is what keeps every "
                "request inside the fleet's limits): drop http_client=, or use the SDK's own "
                f"{name}.{what} for calls outside the limits")
        return {**given, "http_client": http_client}
    if _make is None:
        raise RuntimeError(f"import the limited clients from drover (drover.{what}): it sets "
                           "up their connection to the fleet's limiter")
    made, defaults = _make(name, is_async)
    return {**{k: v for k, v in defaults.items() if v is not None}, **given,
            "http_client": made}


def _public_name(name: str, is_async: bool) -> str:
    return ("Async" if is_async else "") + about(name).client_class
