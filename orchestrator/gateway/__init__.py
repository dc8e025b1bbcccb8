"""``drover gateway``: the fleet's global limits over HTTP, for software that cannot import
drover (a TypeScript service, a Go tool, curl): the provider's own API, each call reserved,
sent with the pool's real key, streamed back and settled through the one call path
(docs/gateway.md)."""

from drover.orchestrator.gateway._callers import Callers
from drover.orchestrator.gateway._run import serve
from drover.orchestrator.gateway._server import make_app

__all__ = ["Callers", "make_app", "serve"]
