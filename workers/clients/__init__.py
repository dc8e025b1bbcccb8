"""The limited clients' room: an HTTP transport that sends a provider SDK's generation
requests through the one call path (``drover.workers.agent.call``), so the SDK's own clients
(``drover.AsyncAnthropic``, ``drover.Anthropic``, ``drover.AsyncOpenAI``, ``drover.OpenAI``)
keep every attempt inside the fleet's global limits, in any process.

Depends on the agent (the call path, the runtime), the job store (a sub-agent's journal) and
the providers (the SDK classes, the wire shapes); knows no Celery. ``subagent_client`` is the
client a worker hands a team's own sub-agent function.
"""

from drover.workers.clients.limited import limited_http_client, subagent_client
from drover.workers.clients.transport import BlockingTransport, LimitedTransport, SettledStream

__all__ = ["BlockingTransport", "LimitedTransport", "SettledStream",
           "limited_http_client", "subagent_client"]
