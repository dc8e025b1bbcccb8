"""Limited HTTP clients, and the limited SDK client of a worker's sub-agent.

``limited_http_client`` is what a limited SDK client (``drover.AsyncAnthropic`` and its kin)
sends through: an ``httpx2`` client over ``LimitedTransport`` (async) or
``BlockingTransport``, marked as drover's (``providers.limited``). ``subagent_client`` is the
client a team's own sub-agent function is handed on a worker; ``turn_client`` the one drover's
own loop sends its turns with (``llm.create_message``).
"""

from __future__ import annotations

from typing import Any

import httpx2

from drover.workers.agent.call import CallContext
from drover.workers.agent.runtime import Runtime
from drover.workers.clients.transport import (
    BlockingTransport,
    LimitedTransport,
    shared_connections,
)
from drover.workers.jobs.journal import Journal
from drover.workers.providers.clients import client_defaults
from drover.workers.providers.limited import LIMITED_MARK

__all__ = ["limited_http_client", "subagent_client", "turn_client"]


class _LimitedAsyncClient(httpx2.AsyncClient):
    drover_limited = True


class _LimitedClient(httpx2.Client):
    drover_limited = True


assert LIMITED_MARK == "drover_limited"


def limited_http_client(rt: Runtime, provider_name: str, *, is_async: bool = True,
                        ctx: CallContext | None = None, journal: Journal | None = None,
                        wait_in_line: bool = True, decides: bool = False,
                        watches: bool = False) -> Any:
    """An HTTP client whose requests to ``provider_name``'s generation endpoint go through
    the call path on ``rt`` (``ctx``: the sub-agent they belong to, None for a process's own
    calls; ``journal``: where its answered calls are kept; ``wait_in_line``: wait out the
    limiter's "later" in place, else raise it, as the SDK's base error from
    ``LimiterSaysLater``; ``decides``: a failed attempt ends with the retry policy's decision;
    ``watches``: the job's cancel stops a stream mid-answer wherever it is read,
    ``LimitedTransport``)."""
    if is_async:
        # A worker's sub-agent sends on the runtime's loop, over its connection pool.
        inner = shared_connections(rt) if ctx is not None else None
        return _LimitedAsyncClient(transport=LimitedTransport(
            rt, provider_name, ctx, journal, wait_in_line=wait_in_line, inner=inner,
            decides=decides, watches=watches),
            follow_redirects=True)
    if ctx is not None or journal is not None:
        raise ValueError("a sub-agent's limited client is async (it runs on the worker's loop)")
    return _LimitedClient(transport=BlockingTransport(rt, provider_name), follow_redirects=True)


def _journal(rt: Runtime, ctx: CallContext) -> Journal:
    return Journal(rt.aredis, rt.store.keys.journal(ctx.job_id, ctx.index),
                   rt.settings.result_ttl_s)


def subagent_client(rt: Runtime, ctx: CallContext, *, max_retries: int = 2,
                    wait_in_line: bool = False) -> Any:
    """The limited async client of a worker's sub-agent (``ctx``: its job, index, cancel,
    tenant and hooks), for the provider of ``DROVER_PROVIDER``: an ``AsyncAnthropic`` or an
    ``AsyncOpenAI`` (drover's, the SDK's own classes) whose calls reserve from the fleet's
    limits, count in the sub-agent's usage (``ctx.answered``, ``ctx.unanswered``), race its
    cancel (a streamed answer mid-way too, wherever the function reads it), and are kept in
    its journal, so that a re-run after its worker died replays the
    calls answered before instead of paying for them again. ``max_retries``: the SDK's own
    retries (each attempt is reserved and settled).

    drover's signals (``Cancelled``, ``ClaimLost``, and with ``wait_in_line`` False the
    limiter's ``LimiterSaysLater`` past the horizon: free the worker slot, the re-run replays
    what was answered) reach the function as the SDK's base error (``anthropic.
    AnthropicError`` / ``openai.OpenAIError``, which the SDK neither wraps nor retries) whose
    ``__cause__`` is the signal."""
    name = rt.settings.provider
    journal = _journal(rt, ctx)
    http = limited_http_client(rt, name, ctx=ctx, journal=journal, wait_in_line=wait_in_line,
                               watches=True)
    defaults = {k: v for k, v in client_defaults(rt.settings, name).items() if v is not None}
    if name == "openai":
        from drover.workers.providers.openai_clients import AsyncOpenAI

        return AsyncOpenAI(http_client=http, max_retries=max_retries, **defaults)
    from drover.workers.providers.anthropic_clients import AsyncAnthropic

    return AsyncAnthropic(http_client=http, max_retries=max_retries, **defaults)


def turn_client(rt: Runtime, ctx: CallContext, model: str) -> Any:
    """The SDK client drover's own loop sends a turn of ``model`` with, for the sub-agent (or
    the job's own call) of ``ctx``: the provider's client of the worker (its key, endpoint and
    timeouts: a connect timeout and the stream's idle limit), on a limited transport that
    reserves, sends and settles each request as every door does, and ends a failed attempt
    with the retry policy's decision (``decides``). No retry of the SDK's own (max_retries
    0): a retry is the task's, through Celery, which frees the worker slot meanwhile; drover's
    signals reach the loop as the SDK's base error whose ``__cause__`` is the signal."""
    route = rt.route(model)
    base = rt.client
    if route.pooled:
        # A pool's first key of the model's provider (a cloud's entry has a client of another
        # SDK): the transport sets the granted key's credentials and endpoint on each request.
        base = next((k.client for k in route.keys if not k.provider.alone), None) or \
            rt.client.with_options(api_key="set per request")
    http = limited_http_client(rt, route.provider.name, ctx=ctx, wait_in_line=False,
                               decides=True)
    return base.with_options(http_client=http, max_retries=0)
