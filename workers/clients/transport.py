"""The limited clients' HTTP transport: each request the SDK sends to the generation endpoint
(``/v1/messages``, ``/chat/completions``) takes the one call path (``agent.call.Call``:
reserve, send, settle) with the SDK's own request as what is sent.

- The request's JSON body is read into drover's params, estimated as the workers estimate
  (the runtime's calibration), and reserved from the same scope or pool, cooldowns, leases
  and tenant budget as a worker's call; the call waits in line for its grant (a wait past
  the horizon is waited out too: the caller holds no worker slot to free), then goes out.
- A whole answer is settled from its JSON ``usage`` before the SDK sees it; a streamed one
  as its bytes pass to the SDK (``SettledStream`` reads the server-sent events), when the
  stream ends or when the caller closes it early (then at what had streamed, counted
  unanswered like a worker's cancelled call).
- An error answer is settled and judged by the retry policy (a 429 with retry-after cools the
  scope down fleet-wide), then handed to the SDK as it came: the SDK raises its own exception
  or retries as it always does. Its retry is a new request through this transport, so every
  attempt reserves and settles. The transport does not wait out a 429 itself: the SDK sleeps
  retry-after before its retry, and that retry's reservation then waits behind the
  fleet-wide cooldown and the calls granted before it, which spreads the retries the way
  jitter would; a caller who set ``max_retries=0`` sees the 429 as the SDK raises it.
- The request goes out on the key or entry the grant chose, as its provider sends it
  (``Provider.send_http``): the Anthropic API's or OpenAI's keys take the SDK's own request
  with the key's credentials and endpoint; a pool's Bedrock or Vertex AI entry sends it
  through that entry's SDK client and answers as the Anthropic API would have (its JSON, its
  server-sent events, its error shape: ``providers/_cloud.py``), so the caller's SDK, the
  settle and the retry policy read the same answer whichever entry served it.
- Other endpoints (``count_tokens``, the Message Batches, models) pass through uncounted, to
  the Anthropic API (a pool's clouds serve the generation endpoint only): their limits are
  not the generation endpoint's (count_tokens has a requests-a-minute of its own and spends
  no input or output tokens).

The call path runs on the runtime's event loop (its Redis client and limiter are bound
there); a client used on another loop (a notebook's, a web app's) hops there for the
reserve and the settle and sends on its own loop, except through a cloud entry's SDK client,
which lives on the runtime's loop (its send and its stream's reads hop there too). The
blocking clients run the whole exchange on that loop and read the stream from it
(``BlockingTransport``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, TypeVar

import httpx2

from drover._signals import ClaimLost
from drover.errors import AgentError
from drover.workers.agent.call import Call, CallContext, wait_or_cancel
from drover.workers.agent.errors import Cancelled, LimiterSaysLater
from drover.workers.agent.llm import race
from drover.workers.agent.runtime import Runtime
from drover.workers.jobs.journal import Journal, Kept
from drover.workers.providers import Failure, SseEvents, json_body, provider, went_out
from drover.workers.telemetry import client_call

__all__ = ["BlockingTransport", "LimitedTransport", "SettledStream", "shared_connections"]

log = logging.getLogger(__name__)
T = TypeVar("T")
# The SDKs' own connection limits (their default HTTP clients'): many calls of one client
# wait in the limiter's line, not for a connection.
CONNECTION_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=100,
                                  keepalive_expiry=5.0)


def shared_connections(rt: Runtime) -> httpx2.AsyncHTTPTransport:
    """The runtime's connection pool, under the limited transports of the sub-agents on its
    loop: their calls reuse its keep-alive connections, and it is made once (a transport
    costs ~23 ms of CPU to make: its TLS context). Closed with the runtime."""
    if rt.connections is None:
        rt.connections = httpx2.AsyncHTTPTransport(limits=CONNECTION_LIMITS)
    return rt.connections  # type: ignore[no-any-return]


class LimitedTransport(httpx2.AsyncBaseTransport):
    """An async transport that sends the generation endpoint's requests through the call
    path. ``ctx``: the sub-agent whose calls these are (its usage, cancel, tenant, checks);
    None for a process's own calls (each gets a context of its own). ``journal``: where a
    sub-agent's answered calls are kept and replayed from. ``decides``: drover's own loop's
    transport: a failed attempt (an error answer, a lost connection, a stream cut or ended by
    an ``error`` event) ends with the retry policy's decision, drover's ``RetryableFailure``
    or ``CallFailed`` (as the SDK's base error, its cause), never with the SDK's exception;
    the loop's ``llm_call`` counts its attempts in the call series, so the transport does
    not. ``watches``: a worker's sub-agent's calls, whose job's cancel also stops a stream
    mid-answer wherever it is read (``SettledStream``); drover's loop's always are."""

    def __init__(self, rt: Runtime, provider_name: str, ctx: CallContext | None = None,
                 journal: Journal | None = None, *, wait_in_line: bool = True,
                 inner: httpx2.AsyncBaseTransport | None = None, decides: bool = False,
                 watches: bool = False) -> None:
        self.rt = rt
        self.wait_in_line = wait_in_line
        self.decides = decides
        self.watches = watches
        self.provider = provider(provider_name)
        self.ctx = ctx
        self.journal = journal
        self.own_inner = inner is None  # a pool handed in is its owner's to close
        self.inner = inner or httpx2.AsyncHTTPTransport(limits=CONNECTION_LIMITS)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST" or not self.provider.counted_path(request.url.path):
            return await self.inner.handle_async_request(request)
        try:
            return await self._limited(request)
        except (AgentError, ClaimLost) as signal:
            # drover's own word (a cancel, a claim another delivery holds, a wait handed back
            # to Celery, a call that can never fit): as the SDK's base error, which it passes
            # on as it is, never retrying; the signal is its cause.
            raise self.provider.sdk_error(f"drover: {signal}") from signal

    async def _limited(self, request: httpx2.Request) -> httpx2.Response:
        content = await request.aread()
        body = json_body(content)
        if not isinstance(body, dict) or not body.get("model"):
            return await self.inner.handle_async_request(request)  # the provider says why
        field = None
        if self.journal is not None:
            field = self.journal.field(request.url.path, content)
            kept = await self.journal.answer(field)
            if kept is not None:  # answered before this sub-agent's worker died: not sent
                return _replayed(kept, request)
        ctx = self.ctx or CallContext("", -1, asyncio.Event())
        if ctx.cancel.is_set():  # the sub-agent was cancelled: nothing more goes out
            raise Cancelled()
        call = await self._on_loop(self._open(self.provider.call_params(body), ctx,
                                              bool(body.get("stream"))))
        handed_on = False  # a stream settles (and closes the call) when it ends
        try:
            while True:
                if not await self._on_loop(self._reserve(call)):
                    continue  # a cooldown began while it waited: it plans again
                response = await self._send(request, call)
                if response.status_code >= 400:
                    answer = await response.aread()
                    await response.aclose()
                    failure = call.provider.response_failure(response, answer,
                                                             str(request.url))
                    decision = await self._on_loop(call.failed(failure, lost=False,
                                                               headers=response.headers))
                    self._counted(call, decision.counter if decision else "n4xx", failure.kind)
                    if decision is None:
                        continue  # a pool's key was refused: the call moves to another key
                    if self.decides:
                        raise call.failure(decision, lost=False)
                    return _answer(response, request, answer)
                if body.get("stream"):
                    call.seen.headers = response.headers
                    await self._on_loop(call.admitted())  # (a paced send's: hold_back.lua)
                    handed_on = True
                    return _answer(response, request, stream=SettledStream(
                        response, call, self._on_loop, self.journal, field,
                        decides=self.decides, watches=self.watches))
                answer = await response.aread()
                await response.aclose()
                usage = call.provider.answer_usage(json_body(answer) or {})
                await self._on_loop(call.answered(usage, response.headers))
                self._counted(call, "ok", "", usage)
                if self.journal is not None and field is not None:
                    await self._on_loop(self.journal.keep(field, _kept(response, answer)))
                return _answer(response, request, answer)
        finally:
            if not handed_on:
                await self._on_loop(call.close())

    async def aclose(self) -> None:
        if self.own_inner:
            await self.inner.aclose()

    async def _send(self, request: httpx2.Request, call: Call) -> httpx2.Response:
        """Send on the key or entry the grant chose, raced against the sub-agent's cancel; a
        try that ends without an answer is settled here (an error of the connection as a
        failure the SDK may retry)."""
        key = self._key(call.key_alias) if call.route.pooled else None
        send = call.provider.send_http(request, self.inner, key, call.client)
        try:
            if asyncio.get_running_loop() is self.rt.loop:
                return await race(send, call.ctx.cancel)
            if call.provider.sends_through_client:  # that client lives on the runtime's loop
                return _read_on(self.rt, await self._on_loop(send))
            return await send
        except (Cancelled, asyncio.CancelledError) as error:
            await self._on_loop(call.ended(error, sent=True))
            self._counted(call, "unanswered", "cancelled")
            raise
        except httpx2.TransportError as error:
            timeout = isinstance(error, httpx2.TimeoutException)
            failure = Failure("timeout" if timeout else "connection_error",
                              type(error).__name__, timeout=timeout)
            lost = went_out(error)
            decision = await self._on_loop(call.failed(failure, lost=lost, headers={},
                                                       error=error))
            self._counted(call, "unanswered" if lost else "nconn", failure.kind)
            if self.decides and decision is not None:
                raise call.failure(decision, lost=lost) from error
            raise
        except Exception as error:
            # Not the connection's: this process's, before the request went out (a cloud
            # entry's SDK client without credentials), as the loop's call judges it.
            await self._on_loop(call.ended(error, sent=False))
            counted(call, "aborted", type(error).__name__)
            raise

    def _counted(self, call: Call, *args: Any) -> None:
        if not self.decides:  # (the loop's calls are counted by its llm_call)
            counted(call, *args)

    async def _open(self, params: dict[str, Any], ctx: CallContext, streams: bool) -> Call:
        call = Call(self.rt, params, ctx, streams=streams)
        if self.decides:
            # drover's loop asks the provider's count of a request of a new size, as it did
            # before it sent through here. The other doors do not: counted in the gateway's
            # process, `python -m bench.gateway --only binding` drew one input-token 429 and
            # 1.083 x in each of four runs (0 and 1.062 x without it); not yet explained.
            await call.count_new_size()
        if self.wait_in_line:
            await _in_line(call.open, ctx)
        else:
            await call.open()
        return call

    async def _reserve(self, call: Call) -> bool:
        if self.wait_in_line:
            return bool(await _in_line(call.reserve, call.ctx))
        return await call.reserve()

    def _key(self, alias: str) -> Any:
        """The pool's key the limiter chose (its credentials and endpoint)."""
        return next(k for k in self.rt.settings.keys if k.alias == alias)

    async def _on_loop(self, coro: Awaitable[T]) -> T:
        """Run a step of the call path on the runtime's loop (where its Redis lives)."""
        if asyncio.get_running_loop() is self.rt.loop:
            return await coro
        return await asyncio.wrap_future(self.rt.submit(coro))  # type: ignore[arg-type]


async def _in_line(step: Any, ctx: CallContext) -> Any:
    """``step()``, waiting out the limiter's "later" (past the horizon, a long cooldown) in
    place: a limited client holds no worker slot, so it waits in line like any call."""
    while True:
        try:
            return await step()
        except LimiterSaysLater as later:
            await wait_or_cancel(later.countdown, ctx.cancel)


def _read_on(rt: Runtime, response: httpx2.Response) -> httpx2.Response:
    """``response`` of the runtime's loop, read from another loop (each chunk and the close
    hop there)."""
    return httpx2.Response(response.status_code, headers=response.headers,
                           stream=_OnLoop(rt, response), request=response.request,
                           extensions=response.extensions)


class _OnLoop(httpx2.AsyncByteStream):
    def __init__(self, rt: Runtime, response: httpx2.Response) -> None:
        self.rt, self.response = rt, response
        self.chunks = response.aiter_bytes()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                yield await asyncio.wrap_future(self.rt.submit(_next(self.chunks)))
            except StopAsyncIteration:
                return

    async def aclose(self) -> None:
        await asyncio.wrap_future(self.rt.submit(self.response.aclose()))


class SettledStream(httpx2.AsyncByteStream):
    """A streamed answer's bytes on their way to the SDK, read as server-sent events; the call
    settles when the stream ends (with the usage it said) or is closed before its end (at
    what had streamed). A whole stream is kept in the sub-agent's journal. The sub-agent is
    told when its answer starts generating (its first token) and when that ends
    (``CallContext.generating``). ``decides``: a stream cut short, or ended by the provider's
    ``error`` event, is settled as a failed attempt there and then, and ends with the retry
    policy's decision (``LimitedTransport``). ``watches``: the stream is a sub-agent's, whose
    job's cancel stops it mid-answer wherever it is read (``_watch_cancel``); drover's loop's
    is always watched."""

    def __init__(self, response: httpx2.Response, call: Call, on_loop: Any,
                 journal: Journal | None, field: str | None, *, decides: bool = False,
                 watches: bool = False) -> None:
        self.response, self.call, self.on_loop = response, call, on_loop
        self.events = SseEvents()
        self.journal, self.field = journal, field
        self.kept: list[bytes] | None = [] if journal is not None else None
        self.error: BaseException | None = None
        self.settled = False
        self.decides = decides
        self.generating = False
        self.read = False
        self.watches = watches or decides
        self.reading = False  # its reader waits for the next bytes (not in its own code)
        self.job_cancelled = False  # the job's cancel stopped the reader (``_watch_cancel``)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        provider, seen = self.call.provider, self.call.seen
        if self.read:  # read again (the openai SDK drains a stream after its [DONE]): no
            return     # more bytes, as from a stream consumed
        self.read = True
        watch = self._watch_cancel() if self.watches else None
        self.reading = True
        try:
            async for chunk in self.response.aiter_bytes():
                for event in self.events.feed(chunk):
                    provider.on_stream_event(seen, event)
                    failure = provider.stream_failure(event) if self.decides else None
                    if failure is not None:  # the provider's error, mid-answer
                        signal = await self._failed(failure, None)
                        raise provider.sdk_error(f"drover: {signal}") from signal
                if self.kept is not None:
                    self.kept.append(chunk)
                if not self.generating and seen.first_token_s is not None:
                    await self._generating(True)
                self.reading = False
                yield chunk
                self.reading = True
                if self.job_cancelled and not self.decides:  # closed while its reader was away
                    stopped = self._cancelled()
                    raise provider.sdk_error(f"drover: {stopped}") from stopped
        except asyncio.CancelledError as error:
            task = asyncio.current_task()
            if not self.job_cancelled or task is None or task.uncancel():
                self.error = error
                raise  # (a cancel of the task itself: a worker shutting down)
            stopped = self._cancelled()  # the job's cancel: the stream closes unanswered
            raise provider.sdk_error(f"drover: {stopped}") from stopped
        except AgentError as error:
            self.error = error
            raise
        except Exception as error:
            if self.job_cancelled and not self.decides:  # closed by the cancel under its reader
                stopped = self._cancelled()
                raise provider.sdk_error(f"drover: {stopped}") from stopped
            self.error = error
            if self.decides and not self.settled and not seen.finished:  # cut mid-answer
                timeout = isinstance(error, httpx2.TimeoutException)
                signal = await self._failed(Failure(
                    "timeout" if timeout else "connection_error", str(error)[:500] or
                    type(error).__name__, timeout=timeout), error)
                raise provider.sdk_error(f"drover: {signal}") from signal
            raise
        except BaseException as error:
            self.error = error
            raise
        finally:
            self.reading = False
            if watch is not None:
                watch.cancel()

    def _cancelled(self) -> Cancelled:
        """The job's cancel stopped the stream: drover's ``Cancelled``, what it settles as."""
        if not isinstance(self.error, Cancelled):
            self.error = Cancelled()
        return self.error

    def _watch_cancel(self) -> asyncio.Task[None]:
        """The job's cancel stops the stream until the answer is whole (the stream is then
        closed unanswered, billed what it had streamed); once it is whole, its reader gets
        the answer, settled as answered: a cancel never drops an answer it paid for.

        A reader waiting for the stream's next bytes (drover's loop's always) is stopped
        there; one away in its own code (a sub-agent function's task that its cancel does not
        reach: one it waits for with ``asyncio.wait``, or left reading) has the stream closed
        under it, settled here, and meets the cancel at its next read."""
        reader, seen, cancel = asyncio.current_task(), self.call.seen, self.call.ctx.cancel

        async def watch() -> None:
            await cancel.wait()
            if reader is None or seen.finished or self.settled:
                return
            self.job_cancelled = True
            if self.decides or self.reading:
                reader.cancel()
            else:
                self.error = Cancelled()
                await self.aclose()

        return asyncio.ensure_future(watch())

    async def _failed(self, failure: Failure, error: BaseException | None) -> Exception:
        """Settle a stream that failed mid-answer as a failed attempt (sent, so billed what
        it had streamed): drover's exception for the policy's decision (raised as the SDK's
        base error, which the SDK passes on as it is)."""
        self.settled = True
        await self._generating(False)
        call = self.call
        try:
            decision = await asyncio.shield(self.on_loop(call.failed(
                failure, lost=True, headers=call.seen.headers or {}, error=error)))
        finally:
            await asyncio.shield(self.on_loop(call.close()))
        if decision is None:  # a pool's key was taken out meanwhile: try another key
            return LimiterSaysLater(0.0, f"key {call.key_alias} was taken out of the pool "
                                         "mid-answer")
        return call.failure(decision, lost=True)

    async def _generating(self, on: bool) -> None:
        told = self.call.ctx.generating
        if self.generating != on and told is not None:
            self.generating = on
            await asyncio.shield(self.on_loop(told(on)))

    async def aclose(self) -> None:
        try:
            await self.response.aclose()
        finally:
            await self._generating(False)
            if not self.settled:
                self.settled = True
                await asyncio.shield(self.on_loop(self._settle()))

    async def _settle(self) -> None:
        call = self.call
        try:
            if call.seen.finished:
                usage = call.provider.stream_usage(call.seen, call.est_in)
                await call.answered(usage, call.seen.headers)
                if not self.decides:
                    counted(call, "ok", "", usage)
                if self.kept is not None and self.journal is not None and self.field:
                    await self.journal.keep(self.field, _kept(self.response,
                                                              b"".join(self.kept)))
            else:  # closed before its end (by its reader, a timeout, a cut connection)
                await call.ended(self.error, sent=True)
                if not self.decides:
                    counted(call, "unanswered", type(self.error).__name__ if self.error
                            else "closed")
        finally:
            await call.close()


def counted(call: Call, outcome: str, error_type: str, usage: Any = None) -> None:
    """The attempt in the fleet's call series (Prometheus, as a worker's calls are)."""
    client_call(call.provider.name, call.scope, call.model, outcome, error_type,
                max(0.0, time.monotonic() - call.seen.opened), usage)


def _answer(response: httpx2.Response, request: httpx2.Request, content: bytes | None = None,
            stream: httpx2.AsyncByteStream | None = None) -> httpx2.Response:
    """The answer as the SDK receives it: its status and headers, the body read (or the
    stream that settles as it is read)."""
    # Read (or decoded as it streams) here: the SDK gets the plain bytes.
    headers = httpx2.Headers([(k, v) for k, v in response.headers.multi_items()
                              if k.lower() not in ("content-length", "transfer-encoding",
                                                   "content-encoding")])
    return httpx2.Response(response.status_code, headers=headers, content=content,
                           stream=stream, request=request, extensions=response.extensions)


def _kept(response: httpx2.Response, content: bytes) -> Kept:
    return Kept(response.status_code, response.headers.get("content-type", ""), content)


def _replayed(kept: Kept, request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(kept.status, headers={"content-type": kept.content_type,
                                                 "x-drover-replayed": "journal"},
                           content=kept.content, request=request)


class BlockingTransport(httpx2.BaseTransport):
    """The blocking clients' transport: the async one, run on the runtime's loop (one call
    path, one connection pool there); a streamed answer is read from that loop chunk by
    chunk. Used from the runtime's own loop it would wait on itself: refused."""

    def __init__(self, rt: Runtime, provider_name: str) -> None:
        self.rt = rt
        self.limited = LimitedTransport(rt, provider_name)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self._not_on_the_loop()
        content = request.read()
        moved = httpx2.Request(request.method, request.url, headers=request.headers,
                               content=content, extensions=request.extensions)
        response = self.rt.submit(self._exchange(moved)).result()
        if isinstance(response.stream, SettledStream):
            return httpx2.Response(response.status_code, headers=response.headers,
                                   stream=_BlockingStream(self.rt, response), request=request,
                                   extensions=response.extensions)
        return httpx2.Response(response.status_code, headers=response.headers,
                               content=response.content, request=request,
                               extensions=response.extensions)

    async def _exchange(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.limited.handle_async_request(request)
        if not isinstance(response.stream, SettledStream):
            await response.aread()
        return response

    def close(self) -> None:
        if not self.rt.loop.is_closed():
            self.rt.submit(self.limited.aclose()).result()

    def _not_on_the_loop(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self.rt.loop:
            raise RuntimeError("a blocking limited client (drover.Anthropic, drover.OpenAI) "
                               "cannot be used on drover's own event loop: use "
                               "drover.AsyncAnthropic / drover.AsyncOpenAI in async code")


class _BlockingStream(httpx2.SyncByteStream):
    """A streamed answer of the runtime's loop, read from a blocking caller's thread."""

    def __init__(self, rt: Runtime, response: httpx2.Response) -> None:
        self.rt, self.response = rt, response
        self.chunks = response.aiter_bytes()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                yield self.rt.submit(_next(self.chunks)).result()
            except StopAsyncIteration:
                return

    def close(self) -> None:
        self.rt.submit(self.response.aclose()).result()


async def _next(chunks: AsyncIterator[bytes]) -> bytes:
    return await chunks.__anext__()

