"""Turns through the Message Batches API: the sub-agent's side and the batcher.

Why parking and not waiting: a batch may take hours, and a worker thread that waits for it
is a slot no other job can use. So a batch sub-agent's turn (``batch_message``) puts its
request in the scope's pending set and raises ``Parked``; the task saves the Celery signature
that resumes it and ends without counting towards the chord (``Ignore``). The *batcher*
(one per worker process, under a Redis lock per API key alias: one at a time fleet-wide for
each key, using that key) does the rest on each tick:

0. recovers: an intent (a batch about to be created, recorded with its requests' custom_ids
   before the create call) that no batch resolved means a batcher died between the create
   call and recording its batch. The provider's recent batches are listed; one of our
   key's, created around the intent's time with as many requests (and, once it has ended,
   the same custom_ids), not known to drover, is adopted as that batch; when none is, no
   batch was made and the requests, still pending, go out in the next submit. Until every
   intent is resolved nothing is submitted, so no request is put in two batches;
1. cancels: a cancelled job (or one past its deadline) has its unsent requests dropped and
   its open batches cancelled at the provider; their results (``canceled``, or what still
   ended) come back like any other, so every sub-agent resumes and writes its record;
2. submits: a scope's pending requests go out, one batch per job, once ``batch_size`` wait
   or the oldest has waited ``batch_linger_s``; each request holds a lease of the
   ``batchq:{key}`` limiter scope (``max_in_flight`` = the provider's queue cap, shared by
   every host) until its batch is collected;
3. polls: open batches are retrieved every ``batch_poll_s``; an ended one's results are
   stored under their jobs and the owners marked ready;
4. resumes: each ready sub-agent's parked signature is sent again (same task id, same
   chord), so it continues from its checkpoint with its result.

Every call to the batches endpoints first takes a grant of the ``batchapi:{key}`` scope
(``DROVER_BATCH_RPM``); a 429 there sets that scope's cooldown for every host. Tokens that
came back by batch are counted on the ``batch:{key}:{model}`` scope, so ``drover stats``
shows them apart (they are billed at half the price).

A result is consumed like a realtime reply: ``succeeded`` is the answer (drover's ``Answer``,
read from the result's JSON that the provider's ``batch_results`` gave); ``errored`` carries
the error body a realtime call would have got and goes through the same
``classify`` (retryable: the next batch, counting an attempt; else ``failed``); ``expired``
is sent again, or fails the sub-agent once the job's deadline has passed; ``canceled``
means the job was cancelled (else it is sent again).

The caps in dollars (``caps.py``) hold as for a realtime call: a turn's worst case at the
batch price is reserved before it is queued (a cap it would pass ends the sub-agent
``budget_exceeded``), and settled with what its result cost when it comes back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from drover._signals import Parked
from drover.workers.agent.caps import CostHold, reserve_cost, settle_cost
from drover.workers.agent.delivery import uses_batch
from drover.workers.agent.errors import CallFailed, Cancelled, RetryableFailure
from drover.workers.agent.limits import bucket_seconds
from drover.workers.agent.llm import CallContext, counted_input
from drover.workers.agent.retry import Decision, classify
from drover.workers.agent.runtime import Runtime
from drover.workers.jobs.batches import Intent, OpenBatch, custom_id
from drover.workers.jobs.meta import ACTIVE
from drover.workers.jobs.records import Checkpoint
from drover.workers.jobs.store import JobNotFound
from drover.workers.limiter import Grant, ScopeLimits, llm_scope
from drover.workers.providers import Answer, AnswerUsage, BatchSeen, Failure
from drover.workers.telemetry import call_cost

__all__ = ["PLAN_PART", "SYNTHESIS_PART", "Batcher", "Parked", "batch_message",
           "job_batch_message", "uses_batch"]

log = logging.getLogger(__name__)
T = TypeVar("T")
# Error types in a result body -> the status a realtime call would have had (for classify).
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401,
                "billing_error": 402, "permission_error": 403, "not_found_error": 404,
                "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                "timeout_error": 504, "overloaded_error": 529}
QUEUE_LEASE_S = 25 * 3600  # a batch ends within 24 h; a lease outlives it by a margin
# An intent's batch is looked for among the provider's batches created this long before and
# after it was recorded (the provider's clock against Redis's, and a slow create call).
ADOPT_BEFORE_S, ADOPT_AFTER_S = 120.0, 900.0


async def _io(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


# --- the sub-agent's side ------------------------------------------------------------------

async def batch_message(rt: Runtime, params: dict[str, Any], ctx: CallContext,
                        state: Checkpoint, token: int = 0) -> Answer:
    """This turn's reply from its batch result; else queue the request and raise ``Parked``.

    ``state.batch_cid`` (checkpointed) names the request in flight, so a resumed or
    redelivered sub-agent finds its result instead of sending the turn again. The checkpoint
    that names it is written under the delivery's claim ``token``: a delivery the sweep has
    taken the sub-agent from stops there (``ClaimLost``) instead of queueing the turn again
    beside the new delivery's request."""
    store = rt.shared.batches
    cid = state.batch_cid
    if cid:
        got = await _io(store.result, ctx.job_id, ctx.index)
        if got and got.get("custom_id") == cid:
            state.batch_cid = None
            await _io(store.clear_result, ctx.job_id, ctx.index)
            await _settle(rt, params["model"], state, got["result"])
            return await _consume(rt, got["result"], ctx)
    if await _io(rt.store.cancels.cancelled, ctx.job_id):
        raise Cancelled()
    scope = llm_scope(rt.settings.key_alias, params["model"])
    waiting: bool = bool(cid) and await _io(store.waiting, scope, cid)
    if waiting:
        raise Parked()
    # The caps in dollars, as before a realtime call: the turn's worst case at the batch
    # price (CostCapReached: not queued). A hold of an earlier request whose fate is unknown
    # (queued or not before its delivery died) stays reserved: the cap may stop the job a
    # little early, never late.
    hold = await reserve_cost(
        rt, ctx.job_id, ctx.tenant, ctx.max_cost_usd, params["model"],
        rt.calibration.input_reservation(scope, rt.calibration.input_tokens(scope, params, True)),
        int(params["max_tokens"]), batch=True)
    state.batch_hold = hold.holds if hold is not None else []
    state.batch_n += 1
    state.batch_cid = cid = custom_id(ctx.job_id, ctx.index, state.turns, state.batch_n)
    # Checkpoint first: a sub-agent that dies here resumes knowing the id it queued.
    try:
        await _io(rt.store.checkpoints.save, ctx.job_id, ctx.index, state, token)
    except BaseException:  # not queued (another delivery holds the sub-agent): give it back
        await settle_cost(rt, hold)
        raise
    await _io(store.enqueue, scope, ctx.job_id, cid, params)
    raise Parked()


async def _settle(rt: Runtime, model: str, state: Checkpoint, result: dict[str, Any]) -> None:
    """The turn's reservation under the caps becomes what its result cost: a ``succeeded``
    one's usage at the batch price, nothing for the others (not billed)."""
    holds, state.batch_hold = state.batch_hold, []
    price = rt.settings.price_of(model)
    if not holds or price is None:
        return
    usage = result["message"].get("usage") if result.get("type") == "succeeded" else None
    await settle_cost(rt, CostHold(holds, price, batch=True),
                      AnswerUsage.from_json(usage) if usage is not None else None)


# A job's own calls (its planning, its synthesis) in a batch job go by batch too, as parts of
# their own: these stand for the sub-agent index in their custom_ids, results and parking.
PLAN_PART, SYNTHESIS_PART = -1, -2


async def job_batch_message(rt: Runtime, params: dict[str, Any], ctx: CallContext,
                            part: int) -> Answer:
    """A job-level call (``part``: PLAN_PART or SYNTHESIS_PART) of a batch job: its reply
    from its batch result, else the request is queued and ``Parked`` raised (the task that
    makes it parks like a sub-agent, and is sent again when the result is in). The request's
    custom_id is kept under the job (``bjob``), as a sub-agent keeps its in its checkpoint."""
    store = rt.shared.batches
    key = rt.store.keys.job(ctx.job_id, "bjob")
    raw = await _io(store.r.hget, key, str(part))
    state: dict[str, Any] = json.loads(raw) if raw else {"cid": None, "n": 0}
    cid = state["cid"]
    if cid:
        got = await _io(store.result, ctx.job_id, part)
        if got and got.get("custom_id") == cid:
            await _io(store.r.hset, key, str(part), json.dumps({"cid": None, "n": state["n"]}))
            await _io(store.clear_result, ctx.job_id, part)
            return await _consume(rt, got["result"], ctx)
    if await _io(rt.store.cancels.cancelled, ctx.job_id):
        raise Cancelled()
    scope = llm_scope(rt.settings.key_alias, params["model"])
    if cid and await _io(store.waiting, scope, cid):
        raise Parked()
    n = state["n"] + 1
    cid = custom_id(ctx.job_id, part, 0, n)
    pipe = store.r.pipeline()
    pipe.hset(key, str(part), json.dumps({"cid": cid, "n": n}))
    pipe.expire(key, rt.store.ttl_s)
    await _io(pipe.execute)
    await _io(store.enqueue, scope, ctx.job_id, cid, params)
    raise Parked()


async def _consume(rt: Runtime, result: dict[str, Any], ctx: CallContext) -> Answer:
    kind = result.get("type")
    settings = rt.settings
    if kind == "succeeded":
        answer = Answer.from_json(result["message"])  # the provider's JSON (batch_results)
        # The fleet's dollars (drover_cost_usd), at the batch discount.
        call_cost(settings, answer.model, ctx.tenant, answer.usage, batch=True)
        return answer
    if kind == "errored":
        decision = classify(_body_failure(result.get("error") or {}), attempt=ctx.failures,
                            base_s=settings.backoff_base_s, cap_s=settings.countdown_cap_s)
        await _io(rt.store.counters.count_failed_call, ctx.job_id, decision.counter)
        log.warning("batch result errored job=%s sub=%d type=%s next=%s", ctx.job_id,
                    ctx.index, decision.error_type, decision.action)
        if decision.action == "retry":
            # The next batch is its backoff: no Celery countdown on top of the linger.
            raise RetryableFailure(0.0, decision)
        raise CallFailed(decision)
    if kind == "expired":
        left = await _io(rt.store.meta.deadline_in, ctx.job_id)
        if left is not None and left <= 0:
            raise CallFailed(Decision("fail", "expired", "the batch request expired before it "
                                      "was processed, and the job's deadline has passed"))
        raise RetryableFailure(0.0, Decision("retry", "expired", "the batch request expired "
                                             "before it was processed; sent again"))
    if await _io(rt.store.cancels.cancelled, ctx.job_id):
        raise Cancelled()
    raise RetryableFailure(0.0, Decision("retry", "canceled", "the batch was cancelled "
                                         "outside drover; sent again"))


def _body_failure(body: dict[str, Any]) -> Failure:
    """What a realtime answer with this error body would have said."""
    inner: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else body
    status = ERROR_STATUS.get(str(inner.get("type")), 500)
    from drover.workers.providers import ANTHROPIC  # Message Batches are Anthropic's only

    return ANTHROPIC.body_failure(status, body)


# --- the batcher ---------------------------------------------------------------------------

Resume = Callable[[str], None]  # sends a parked Celery signature (JSON) again


class Batcher:
    """Submits pending requests, polls open batches, resumes sub-agents; see the docstring."""

    def __init__(self, rt: Runtime, resume: Resume):
        self.rt = rt
        self.resume = resume
        self.store = rt.shared.batches
        s = rt.settings
        # Its API key's scopes only: batches are created and read with this worker's key.
        self.alias = s.key_alias
        self.api_scope = f"batchapi:{s.key_alias}"
        self.api_limits = ScopeLimits(rpm=s.batch_rpm * s.target_utilization,
                                      burst_s=bucket_seconds(s))
        self.queue_scope = f"batchq:{s.key_alias}"
        self.queue_limits = ScopeLimits(max_in_flight=s.batch_queue_cap)
        self.sent = False  # whether the last _call's request went out
        # The Message Batches endpoints, Anthropic's only (imported here with its SDK: a
        # worker on OpenAI runs no batcher).
        from drover.workers.providers import batches

        self.api = batches

    async def run_forever(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis or the API away: try again next tick
                log.warning("batcher tick failed (%s: %s)", type(error).__name__, error)
            await asyncio.sleep(self.rt.settings.batch_tick_s)

    async def tick(self) -> None:
        """One pass, by at most one batcher fleet-wide at a time."""
        # Not thread-local: acquire and release run on different threads of the I/O pool.
        lock = self.store.r.lock(self.store.lock(self.alias),
                                 timeout=self.rt.settings.batch_lock_s, blocking=False,
                                 thread_local=False)
        if not await _io(lock.acquire):
            return
        try:
            recovered = await self._recover()
            await self._cancels()
            if recovered:
                await self._submit()
            await self._poll()
            await self._resume()
        finally:
            try:
                await _io(lock.release)
            except Exception:  # expired under a very long tick: the next one takes it again
                pass

    # -- calls to the batches endpoints -------------------------------------------------
    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """``call()`` within the batches endpoints' RPM; None when it has to wait or failed."""
        from drover.workers.providers import ConnectionFailed, StatusError  # Anthropic's SDK's

        limiter = self.rt.limiter
        self.sent = False
        grant = await limiter.acquire(self.api_scope, self.api_limits, lease_ttl_s=120)
        if not grant.granted:  # a cooldown, or past the horizon: next tick
            return None
        await asyncio.sleep(grant.wait_s)
        try:
            self.sent = True  # the call went out (whatever comes back)
            return await call()
        except StatusError as error:
            decision = classify(error, attempt=0, base_s=1.0, cap_s=60.0)
            if decision.cooldown_s is not None:  # every host backs off the batches endpoints
                await limiter.cooldown(self.api_scope, self.api_limits, decision.cooldown_s)
            log.warning("batch %s failed: %s %s", what, decision.status_code,
                        decision.error_type)
            if decision.action == "fail" and what == "create":
                raise
            return None
        except ConnectionFailed as error:
            log.warning("batch %s failed: %s", what, type(error).__name__)
            return None
        finally:
            await limiter.settle(self.api_scope, self.api_limits, grant, input_tokens=0,
                                 output_tokens=0)

    # -- 0. recovers ---------------------------------------------------------------------
    async def _recover(self) -> bool:
        """Resolve the intents a dead batcher left; False while some could not be (the
        provider's list was not read): then nothing is submitted this tick."""
        intents = await _io(self.store.intents, self.alias)
        if not intents:
            return True
        known = {b.id for b in await _io(self.store.open_batches)}
        since = min(i.at for i in intents) - ADOPT_BEFORE_S
        listed = await self._call("list", lambda: self.api.created_since(
            self.rt.batch_client, since))
        if listed is None:
            return False
        for intent in intents:
            match = await self._match(intent, listed, known)
            if match is None:
                await _io(self.store.drop_intent, intent)
                await self._release(intent.leases)
                log.warning("batch intent %s of job %s: no batch was created for its %d "
                            "requests (the batcher stopped before the create call reached "
                            "the provider); they go out in a new batch", intent.id,
                            intent.job_id, len(intent.custom_ids))
                continue
            known.add(match.id)
            await _io(self.store.opened, OpenBatch(
                id=match.id, scope=intent.scope, job_id=intent.job_id,
                custom_ids=intent.custom_ids, leases=intent.leases, created=intent.at,
                polled=0.0), intent.id)
            log.warning("batch %s adopted: created for job %s (%d requests) by a batcher that "
                        "stopped before recording it", match.id, intent.job_id,
                        len(intent.custom_ids))
        return True

    async def _match(self, intent: Intent, listed: list[BatchSeen], known: set[str]
                     ) -> BatchSeen | None:
        """The listed batch that is ``intent``'s, if any: as many requests, created around
        its time, not already drover's; once ended, its results' custom_ids must be the
        intent's too. The closest in time wins."""
        candidates = sorted(
            (b for b in listed if b.id not in known and b.requests == len(intent.custom_ids)
             and intent.at - ADOPT_BEFORE_S <= b.created_at <= intent.at + ADOPT_AFTER_S),
            key=lambda b: abs(b.created_at - intent.at))
        for batch in candidates:
            if batch.ended and batch.results_url:
                seen = OpenBatch(id=batch.id, scope=intent.scope, job_id=intent.job_id,
                                 custom_ids=[], results_url=batch.results_url)
                lines = await self._call("results", partial(self._results, seen))
                if lines is None or set(lines) != set(intent.custom_ids):
                    continue
            return batch
        return None

    # -- 1. cancels ---------------------------------------------------------------------
    async def _cancels(self) -> None:
        for job_id in await _io(self.store.active_jobs):
            try:
                reason = await _io(self.rt.store.cancels.cancelled, job_id)
                status = (await _io(self.rt.store.meta.get, job_id)).get("status")
            except JobNotFound:
                await _io(self.store.retire_job, job_id)
                continue
            open_ids = set(await _io(self.store.job_open_batches, job_id))
            if reason:
                dropped = await _io(self.store.drop_pending, job_id, {"type": "canceled"},
                                    self.alias)
                if dropped:
                    log.info("job %s cancelled: %d unsent batch requests dropped", job_id,
                             dropped)
                for batch in await _io(self.store.open_batches, self.alias):
                    if batch.id in open_ids and not batch.cancel_sent:
                        done = await self._call(
                            "cancel",
                            partial(self.api.cancel, self.rt.batch_client, batch.id))
                        if done is not None:
                            batch.cancel_sent, batch.polled = True, 0.0
                            await _io(self.store.update, batch)
            elif status not in ACTIVE and not open_ids:
                await _io(self.store.retire_job, job_id)

    # -- 2. submits ---------------------------------------------------------------------
    async def _submit(self) -> None:
        s = self.rt.settings
        now = await _io(self.rt.store.meta.server_time)
        for scope in await _io(self.store.scopes, self.alias):
            count, oldest = await _io(self.store.pending_state, scope)
            if not count:
                await _io(self.store.forget_scope_if_empty, scope)
                continue
            if count < s.batch_size and oldest is not None and now - oldest < s.batch_linger_s:
                continue
            grouped = await _io(self.store.take, scope, min(s.batch_max_requests, count))
            for job_id, items in grouped.items():
                if await _io(self.rt.store.cancels.cancelled, job_id):
                    continue  # the cancel pass drops them
                if not await self._open(scope, job_id, items):
                    return  # the queue is full or the endpoints want a pause: next tick

    async def _open(self, scope: str, job_id: str,
                    items: list[tuple[str, dict[str, Any]]]) -> bool:
        from drover.workers.providers import StatusError  # Anthropic's SDK's

        leases = await self._queue_leases(len(items))
        if not leases:
            return False
        items = items[:len(leases)]
        requests = [{"custom_id": cid, "params": params} for cid, params in items]
        # Recorded before the call: a batcher that dies before recording the batch it made
        # leaves this behind, and the next one adopts that batch instead of making another.
        intent = Intent(id=uuid.uuid4().hex[:12], scope=scope, job_id=job_id,
                        custom_ids=[c for c, _ in items], leases=leases,
                        at=await _io(self.rt.store.meta.server_time))
        await _io(self.store.intend, intent)
        try:
            made = await self._call("create", lambda: self.api.create(self.rt.batch_client,
                                                                      requests))
        except StatusError as error:
            # The provider will not take these requests (e.g. 413): their owners fail with it.
            await _io(self.store.drop_intent, intent)
            await self._release(leases)
            body = error.body if isinstance(error.body, dict) else {
                "type": "error", "error": {"type": "api_error", "message": str(error)}}
            await _io(self.store.fail_pending, scope, [c for c, _ in items],
                      {"type": "errored", "error": body})
            return True
        if made is None:
            if not self.sent:  # the endpoints' limit said later: no call was made
                await _io(self.store.drop_intent, intent)
                await self._release(leases)
            # Else no answer: the call may still have made a batch (a timeout, a cut
            # connection), so the intent stays for the next tick's recovery to resolve.
            return False
        now = await _io(self.rt.store.meta.server_time)
        await _io(self.store.opened, OpenBatch(
            id=made.id, scope=scope, job_id=job_id, custom_ids=[c for c, _ in items],
            leases=leases, created=now, polled=now), intent.id)
        log.info("batch %s created: job=%s scope=%s requests=%d", made.id, job_id, scope,
                 len(items))
        return True

    async def _queue_leases(self, n: int) -> list[str]:
        """Up to ``n`` leases of the queue-capacity scope (the provider's cap, fleet-wide)."""
        leases: list[str] = []
        for _ in range(n):
            grant = await self.rt.limiter.acquire(self.queue_scope, self.queue_limits,
                                                  lease_ttl_s=QUEUE_LEASE_S)
            if not grant.granted or grant.lease_id is None:
                break
            leases.append(grant.lease_id)
        return leases

    async def _release(self, leases: list[str]) -> None:
        for lease in leases:
            await self.rt.limiter.release(
                self.queue_scope, Grant(True, 0.0, 0.0, lease, "ok", 0, 0))

    # -- 3. polls -----------------------------------------------------------------------
    async def _poll(self) -> None:
        s = self.rt.settings
        now = await _io(self.rt.store.meta.server_time)
        for batch in await _io(self.store.open_batches, self.alias):
            if not (batch.ended and batch.results_url):
                if not batch.cancel_sent and now - batch.polled < s.batch_poll_s:
                    continue
                seen = await self._call("retrieve", partial(self.api.retrieve,
                                                            self.rt.batch_client, batch.id))
                if seen is None:
                    continue
                batch.polled = now
                batch.ended = seen.ended
                batch.results_url = seen.results_url
                await _io(self.store.update, batch)
                if not batch.ended:
                    continue
            lines = await self._call("results", partial(self._results, batch))
            if lines is None:
                continue
            await _io(self.store.store_results, batch, lines)
            await self._release(batch.leases)
            await self._count_tokens(batch.scope, lines)
            log.info("batch %s ended: job=%s %s", batch.id, batch.job_id,
                     " ".join(f"{k}={v}" for k, v in sorted(_outcomes(lines).items())))

    async def _results(self, batch: OpenBatch) -> dict[str, dict[str, Any]]:
        """The JSONL at the batch's ``results_url``, in one call.

        ``batches.results(id)`` would retrieve the batch first: two calls back to back, which
        the endpoints' RPM can refuse every time (the second one) when it is tight."""
        if batch.results_url is None:  # asked for only once the batch has ended with them
            raise ValueError(f"batch {batch.id} has no results_url yet")
        return await self.api.results(self.rt.batch_client, batch.results_url)

    async def _count_tokens(self, scope: str, lines: dict[str, dict[str, Any]]) -> None:
        """Tokens that came back by batch, on a scope of their own (for ``drover stats``)."""
        ok = [r["message"]["usage"] for r in lines.values() if r.get("type") == "succeeded"]
        if not ok:
            return
        model = scope.rsplit(":", 1)[-1]
        configured = self.rt.settings.limits_for(model)
        reads = bool(configured and configured.cache_reads_count)
        used_in = sum(counted_input(AnswerUsage.from_json(u), reads) for u in ok)
        used_out = sum(u.get("output_tokens") or 0 for u in ok)
        stats_scope = f"batch:{self.rt.settings.key_alias}:{model}"
        limits = ScopeLimits()
        grant = await self.rt.limiter.acquire(stats_scope, limits, lease_ttl_s=60)
        await self.rt.limiter.settle(stats_scope, limits, grant, input_tokens=used_in,
                                     output_tokens=used_out)
        if len(ok) > 1:
            await self.rt.limiter.record(stats_scope, requests=len(ok) - 1)

    # -- 4. resumes ---------------------------------------------------------------------
    async def _resume(self) -> None:
        for job_id, index in await _io(self.store.ready):
            signature = await _io(self.store.unpark, job_id, index)
            if signature is None:
                # Not parked (yet): it is still on its way out of its task, or long done.
                if await _io(self.rt.store.records.get, job_id, index) is not None:
                    await _io(self.store.not_ready, job_id, index)
                continue
            try:
                await _io(self.resume, signature)
            except Exception:
                await _io(self.store.park, job_id, index, signature)  # try again next tick
                raise
            await _io(self.store.not_ready, job_id, index)


def _outcomes(lines: dict[str, dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in lines.values():
        counts[result.get("type", "?")] = counts.get(result.get("type", "?"), 0) + 1
    return counts

