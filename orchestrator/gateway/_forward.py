"""The gateway's one forwarding step: a caller's request, sent through the limited clients'
transport (``drover.workers.clients.LimitedTransport``), the same reserve -> send -> settle
path as the workers' calls and ``drover.AsyncAnthropic``'s (DESIGN.md, "Three doors, one
call path"): estimated and reserved from the same scope or pool, cooldowns, leases and
tenant budget, waited in line, sent with the pool's real key, settled with the answer's
usage (a stream from its events as they pass, or at what had streamed when the caller
leaves).

The caller's body goes out as it came (the bytes, not a re-encoding), with the caller's
headers except its gateway key and the hop-by-hop ones; the provider's key is added here.
Each request gets a ``CallContext`` of its caller's tenant: the call path counts its dollars
as that tenant's, and the context's hooks its tokens (of the answer, or of a call sent and
never answered).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx2

from drover.config import GatewayKey
from drover.config.providers import about
from drover.orchestrator.gateway._callers import own_limits
from drover.workers.agent.call import CallContext
from drover.workers.agent.retry import classify
from drover.workers.agent.runtime import Runtime
from drover.workers.clients import LimitedTransport
from drover.workers.clients.transport import CONNECTION_LIMITS
from drover.workers.providers import provider
from drover.workers.telemetry import get_recorder

__all__ = ["Forwarder"]

# Not forwarded: the caller's credentials, and what belongs to one hop (RFC 9110 7.6.1).
# accept-encoding: the answer comes back as it is read (event by event), not re-compressed.
_DROPPED = frozenset({"x-api-key", "authorization", "host", "content-length", "connection",
                      "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                      "proxy-authorization", "proxy-connection", "accept-encoding", "cookie"})


class Forwarder:
    """Sends callers' requests to one provider (``provider_name``) on the runtime ``rt``."""

    def __init__(self, rt: Runtime, provider_name: str) -> None:
        settings = rt.settings
        self.rt, self.provider_name = rt, provider_name
        self.provider, self.about = provider(provider_name), about(provider_name)
        base = self.about.base_url(settings) or self.about.default_base_url or ""
        self.base = base.rstrip("/")
        # The key a request goes out on: the provider's one key, or the first pool key of this
        # provider (the transport moves a counted call to the key the limiter chose).
        pool = [k for k in settings.keys if settings.key_provider(k) == provider_name]
        one = self.about.api_key(settings)
        key = pool[0].api_key if pool else one
        self.key = key.get_secret_value() if key is not None else ""
        # Every credential this gateway holds (any entry's: a pool's Bedrock or Vertex AI
        # entry may serve a call too): scrubbed from any answer a caller gets.
        held = {self.key, *(s for k in settings.keys for s in k.secrets())}
        self.secrets = [s.encode() for s in held if s]
        # One connection pool for every caller (the limiter, not a connection, is the line).
        self.inner = httpx2.AsyncHTTPTransport(limits=CONNECTION_LIMITS)
        self.timeout = {"connect": settings.connect_timeout_s, "read": settings.stream_idle_s,
                        "write": settings.stream_idle_s, "pool": None}

    def url(self, path: str, query: str) -> str:
        """The provider's URL of a gateway path: Anthropic's base names no ``/v1`` (its SDK
        adds it), OpenAI's ends in it (``base_url_path``)."""
        path = path.removeprefix(self.about.base_url_path)
        return f"{self.base}{path}" + (f"?{query}" if query else "")

    def request(self, path: str, query: str, headers: Mapping[str, str], body: bytes
                ) -> httpx2.Request:
        """The provider's request for a caller's: its body and headers, on the provider key."""
        sent = [(k, v) for k, v in headers.items() if k.lower() not in _DROPPED]
        sent.extend(self.provider.auth_headers(self.key).items())
        return httpx2.Request("POST", self.url(path, query), headers=sent, content=body,
                              extensions={"timeout": self.timeout})

    async def send(self, request: httpx2.Request, caller: GatewayKey, cancel: asyncio.Event
                   ) -> httpx2.Response:
        """The provider's answer to ``request`` (its stream settles as it is read and closed),
        sent through the limits as ``caller``'s call (its tenant's, within its key's own
        limits); ``cancel`` set: the caller left.

        A provider's 429 with retry-after is waited out here, not handed to the caller: the
        call path has cooled the scope down for the whole fleet already, and the request
        goes again through the limits, in line behind that cooldown and the calls granted
        before it, as a worker's call would (a caller with retries off saw the 429 itself).
        After ``DROVER_MAX_ATTEMPTS`` tries, or a 429 that no wait mends (a spend limit, no
        retry-after), the caller gets it as it came."""
        settings = self.rt.settings
        tenant = caller.tenant
        for attempt in range(1, settings.max_attempts + 1):
            ctx = CallContext("", -1, cancel, tenant=tenant,
                              own_limits=own_limits(caller, settings.burst_seconds))
            # The call path counts its dollars as the tenant's (drover_cost_usd); these hooks
            # count the tenant's tokens through the gateway.
            ctx.answered = _counted(tenant)
            ctx.unanswered = _counted_lost(tenant)
            transport = LimitedTransport(self.rt, self.provider_name, ctx, inner=self.inner)
            response = await transport.handle_async_request(request)
            if response.status_code != 429 or attempt == settings.max_attempts \
                    or cancel.is_set():
                return response
            content = await response.aread()
            if not self._cooled_down(request, response, content):
                return response
            await response.aclose()
        raise AssertionError("unreachable: the last try returns")

    def _cooled_down(self, request: httpx2.Request, response: httpx2.Response,
                     content: bytes) -> bool:
        """A 429 the call path met with a fleet-wide cooldown (a retry-after, not a spend
        limit): waited out by the next try's reservation."""
        failure = self.provider.response_failure(response, content, str(request.url))
        decision = classify(failure, attempt=0, base_s=0.0, cap_s=0.0)
        return decision.action == "retry" and decision.cooldown_s is not None

    def scrub(self, content: bytes) -> bytes:
        """``content`` without any provider key in it (an error message may quote one)."""
        for secret in self.secrets:
            content = content.replace(secret, b"***")
        return content

    async def aclose(self) -> None:
        await self.inner.aclose()


def _counted(tenant: str) -> Any:
    async def answered(usage: Any, *, model: str | None = None) -> None:
        """An answer's tokens, the tenant's."""
        rec = get_recorder()
        for kind, value in (("input", usage.input_tokens),
                            ("output", usage.output_tokens),
                            ("cache_read", getattr(usage, "cache_read_input_tokens", 0)),
                            ("cache_write", getattr(usage, "cache_creation_input_tokens", 0))):
            if value:
                rec.inc("drover_gateway_tokens", (tenant, kind), float(value))

    return answered


def _counted_lost(tenant: str) -> Any:
    async def unanswered(est_in: int, est_out: int, *, model: str | None = None) -> None:
        """A call sent and never answered (the caller left mid-stream): billed, the tenant's."""
        rec = get_recorder()
        rec.inc("drover_gateway_tokens", (tenant, "unanswered_input"), float(est_in))
        rec.inc("drover_gateway_tokens", (tenant, "unanswered_output"), float(est_out))

    return unanswered
