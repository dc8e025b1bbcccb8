"""The Message Batches API: create, retrieve, list, results (JSONL), cancel, delete.

Shapes follow the SDK's ``MessageBatch`` / ``MessageBatchIndividualResponse`` types (see
``docs/batches-api.md``). How a batch runs here:

- Each request gets a seeded finish time within ``batch_processing_s`` of the batch's
  creation; the batch ends when its last request has finished, or at ``batch_expires_s``
  (requests not finished by then are ``expired``, as after the provider's 24 h).
- A request is answered by a second ``Engine`` with no rate limits and no random faults (the
  batch queue is not the realtime limits), so content, usage, validation and the
  ``[[sim:...]]`` triggers are those of ``messages.create``: an error reply becomes an
  ``errored`` result carrying the same error body. ``[[sim:expire]]`` (or
  ``[[sim:expire:N]]``, the first N submissions of that body) makes a request ``expired``;
  ``batch_errored_rate`` / ``batch_expired_rate`` draw those outcomes at random.
- Requests are answered when the batch ends (what they say does not depend on when), so the
  realtime stats never see them; their counters are under ``/_sim/stats`` ``"batches"``.
- Cancel: the batch is ``canceling`` for a moment, then ends; requests that had finished
  before the cancel keep their results, the others are ``canceled``.
- Limits of their own, per API key: ``batch_rpm`` over every call to the batches
  endpoints, ``batch_queue_cap`` over requests waiting in in-progress batches (a create that
  would pass it is a 429 with ``retry-after``), ``batch_max_requests`` per batch.

Synchronous like the engine: every change happens in one step on the event-loop thread.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import responses, triggers
from .buckets import TokenBucket
from .engine import Engine, Pending, Reply, canonical_digest
from .responses import error_body, json_body

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
CANCEL_S = 0.2  # how long a cancelled batch stays `canceling`
_JSON = "application/json"


def batch_id() -> str:
    return "msgbatch_01" + os.urandom(12).hex()


def rfc3339(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1e6):06d}Z"


@dataclass
class _Request:
    custom_id: str
    raw: bytes
    done_at: float                      # wall time this request finishes
    outcome: str = "processing"         # succeeded | errored | canceled | expired
    result: dict[str, Any] | None = None


@dataclass
class _Batch:
    id: str
    api_key: str
    created: float
    requests: list[_Request]
    ends_at: float
    cancel_at: float | None = None
    ended_at: float | None = None
    archived: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.ended_at is not None:
            return "ended"
        return "canceling" if self.cancel_at is not None else "in_progress"


class BatchStats:
    def __init__(self) -> None:
        self.calls = {"create": 0, "retrieve": 0, "list": 0, "results": 0, "cancel": 0,
                      "delete": 0}
        self.batches_created = 0
        self.requests = 0
        self.outcomes = {"succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        self.rejected_429 = 0
        self.queue_cap_429 = 0
        self.max_queued = 0


class Batches:
    """Every batch of every API key of one simulator, and the batches endpoints' limits."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine  # its config is the simulator's config
        self.reset()

    def reset(self) -> None:
        self.inner = Engine(self._inner_config())
        self.stats = BatchStats()
        self._batches: dict[str, _Batch] = {}
        self._rpm: dict[str, TokenBucket] = {}
        self._expire_attempts: dict[bytes, int] = {}

    def _inner_config(self) -> Any:
        return self.engine.config.replaced(
            rpm=None, itpm=None, otpm=None, overload_rate=0.0, error_5xx_rate=0.0,
            inject_429_rate=0.0, latency_mean_s=0.0, latency_p95_s=0.0,
            spend_limit_calls=None, key_spend_limit_calls={})  # realtime calls count there

    # -- progress ------------------------------------------------------------------------

    def advance(self, now: float | None = None) -> None:
        """End every batch whose time has come (called before any batch is looked at)."""
        now = time.time() if now is None else now
        for batch in self._batches.values():
            if batch.ended_at is None:
                end = batch.ends_at if batch.cancel_at is None else batch.cancel_at + CANCEL_S
                if now >= end:
                    self._end(batch, end)

    def _end(self, batch: _Batch, end: float) -> None:
        self.inner.config = self._inner_config()  # follow /_sim/config changes
        cfg = self.engine.config
        expires = batch.created + cfg.batch_expires_s
        for req in batch.requests:
            if batch.cancel_at is not None and req.done_at > batch.cancel_at:
                req.outcome, req.result = "canceled", {"type": "canceled"}
            elif req.done_at > expires:
                req.outcome, req.result = "expired", {"type": "expired"}
            else:
                req.outcome, req.result = self._answer(batch.api_key, req)
            self.stats.outcomes[req.outcome] += 1
            req.raw = b""  # the body is not needed any more
        batch.ended_at = end
        batch.counts = {k: sum(1 for r in batch.requests if r.outcome == k)
                        for k in ("succeeded", "errored", "canceled", "expired")}

    def _answer(self, api_key: str, req: _Request) -> tuple[str, dict[str, Any]]:
        cfg = self.engine.config
        try:
            body = json.loads(req.raw)
        except ValueError:
            body = None
        messages = body.get("messages") if isinstance(body, dict) else None
        if isinstance(messages, list) and triggers.MARKER in req.raw:
            digest = canonical_digest(body)
            for trig in triggers.find(messages):
                if trig.name != "expire":
                    continue
                seen = self._expire_attempts[digest] = self._expire_attempts.get(digest, 0) + 1
                if not (trig.arg and trig.arg.isdigit() and seen > int(trig.arg)):
                    return "expired", {"type": "expired"}
        if cfg.batch_errored_rate or cfg.batch_expired_rate:
            rng = random.Random(_seed(cfg.seed, req.raw, req.custom_id, req.done_at))
            u_err, u_exp = rng.random(), rng.random()
            if u_exp < cfg.batch_expired_rate:
                return "expired", {"type": "expired"}
            if u_err < cfg.batch_errored_rate:
                return "errored", {"type": "errored", "error": json.loads(error_body(
                    "overloaded_error", "Overloaded", responses.request_id()))}
        headers = {"x-api-key": api_key}  # the inner engine's buckets are per key too
        outcome = self.inner.begin_message(headers, req.raw)
        if isinstance(outcome, Pending):
            outcome = outcome.finish()
        reply = json.loads(outcome.body)
        if outcome.status == 200:
            return "succeeded", {"type": "succeeded", "message": reply}
        return "errored", {"type": "errored", "error": reply}

    # -- limits --------------------------------------------------------------------------

    def _admit_call(self, api_key: str) -> Reply | None:
        """One call to a batches endpoint against ``batch_rpm``: None, or the 429 reply."""
        cfg = self.engine.config
        if cfg.batch_rpm is None:
            return None
        now = time.monotonic()
        bucket = self._rpm.get(api_key)
        if bucket is None or bucket.limit != cfg.batch_rpm:
            bucket = self._rpm[api_key] = TokenBucket(cfg.batch_rpm, cfg.burst_s, now)
        bucket.refill(now)
        wait = bucket.shortfall_s(1)
        if wait > 0:
            self.stats.rejected_429 += 1
            return _error(429, "rate_limit_error",
                          f"This request would exceed your organization's rate limit of "
                          f"{int(cfg.batch_rpm):,} batch requests per minute. Please try "
                          "again later.", retry_after=max(1, math.ceil(wait)))
        bucket.level -= 1
        return None

    def queued(self, api_key: str | None = None) -> int:
        return sum(len(b.requests) for b in self._batches.values()
                   if b.status == "in_progress" and (api_key is None or b.api_key == api_key))

    # -- endpoints -----------------------------------------------------------------------

    def handle(self, op: str, headers: Mapping[str, str], origin: str, batch: str | None = None,
               raw: bytes = b"", query: Mapping[str, str] | None = None) -> Reply:
        api_key = _api_key(headers)
        if not api_key:
            return _error(401, "authentication_error", "x-api-key header is required")
        self.stats.calls[op] += 1
        refused = self._admit_call(api_key)
        if refused is not None:
            return refused
        self.advance()
        if op == "create":
            return self._create(api_key, raw, origin)
        if op == "list":
            return self._list(api_key, query or {}, origin)
        found = self._batches.get(batch or "")
        if found is None or found.api_key != api_key or found.archived:
            return _error(404, "not_found_error", f"Batch {batch!r} not found")
        if op == "retrieve":
            return _ok(self._shape(found, origin))
        if op == "cancel":
            if found.ended_at is None and found.cancel_at is None:
                found.cancel_at = time.time()
            return _ok(self._shape(found, origin))
        if op == "delete":
            if found.ended_at is None:
                return _error(400, "invalid_request_error",
                              f"Batch {found.id} is still {found.status}: cancel it and wait "
                              "for it to end before deleting it")
            found.archived = True
            del self._batches[found.id]
            return _ok({"id": found.id, "type": "message_batch_deleted"})
        if found.ended_at is None:  # results
            return _error(400, "invalid_request_error",
                          f"Batch {found.id} is still {found.status}; its results are "
                          "available once processing_status is 'ended'")
        lines = b"".join(json_body({"custom_id": r.custom_id, "result": r.result}) + b"\n"
                         for r in _shuffled(found.requests, found.id))
        return Reply(200, lines, {"Content-Type": "application/binary",
                                  "request-id": responses.request_id()})

    def _create(self, api_key: str, raw: bytes, origin: str) -> Reply:
        cfg = self.engine.config
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return _error(400, "invalid_request_error",
                          f"There was an error parsing the body of your request: {exc}")
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            return _error(400, "invalid_request_error",
                          "requests: Field required (a non-empty list of {custom_id, params})")
        if len(requests) > cfg.batch_max_requests:
            return _error(400, "invalid_request_error",
                          f"requests: a batch holds at most {cfg.batch_max_requests:,} requests, "
                          f"got {len(requests):,}")
        seen: set[str] = set()
        parsed: list[tuple[str, bytes]] = []
        for i, item in enumerate(requests):
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            params = item.get("params") if isinstance(item, dict) else None
            if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
                return _error(400, "invalid_request_error",
                              f"requests.{i}.custom_id: must be 1-64 characters of "
                              "[a-zA-Z0-9_-]")
            if custom_id in seen:
                return _error(400, "invalid_request_error",
                              f"requests.{i}.custom_id: {custom_id!r} is not unique in this batch")
            if not isinstance(params, dict):
                return _error(400, "invalid_request_error", f"requests.{i}.params: Field required")
            seen.add(custom_id)
            parsed.append((custom_id, json_body(params)))
        queued = self.queued(api_key)
        if cfg.batch_queue_cap is not None and queued + len(parsed) > cfg.batch_queue_cap:
            self.stats.queue_cap_429 += 1
            self.stats.rejected_429 += 1
            waiting = [b.ends_at for b in self._batches.values()
                       if b.api_key == api_key and b.status == "in_progress"]
            retry = max(1, math.ceil(min(waiting, default=time.time() + 1) - time.time()))
            return _error(429, "rate_limit_error",
                          f"This batch of {len(parsed):,} requests would exceed your "
                          f"organization's limit of {cfg.batch_queue_cap:,} batch requests "
                          f"waiting to be processed ({queued:,} are waiting now). Please try "
                          "again later.", retry_after=retry)
        now = time.time()
        new_id = batch_id()
        rng = random.Random(_seed(cfg.seed, new_id))
        reqs = [_Request(cid, body_raw, now + cfg.batch_processing_s * rng.random())
                for cid, body_raw in parsed]
        ends = min(max(r.done_at for r in reqs), now + cfg.batch_expires_s)
        batch = self._batches[new_id] = _Batch(new_id, api_key, now, reqs, ends)
        self.stats.batches_created += 1
        self.stats.requests += len(reqs)
        self.stats.max_queued = max(self.stats.max_queued, self.queued())
        if ends <= now:
            self._end(batch, now)
        return _ok(self._shape(batch, origin))

    def _list(self, api_key: str, query: Mapping[str, str], origin: str) -> Reply:
        try:
            limit = int(query.get("limit", 20))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            return _error(400, "invalid_request_error", "limit: must be an integer in 1..1000")
        newest_first = sorted((b for b in self._batches.values() if b.api_key == api_key),
                              key=lambda b: b.created, reverse=True)
        ids = [b.id for b in newest_first]
        after, before = query.get("after_id"), query.get("before_id")
        if after:
            if after not in ids:
                return _error(400, "invalid_request_error", f"after_id: unknown batch {after!r}")
            page = newest_first[ids.index(after) + 1:][:limit]
            more = ids.index(after) + 1 + limit < len(ids)
        elif before:
            if before not in ids:
                return _error(400, "invalid_request_error", f"before_id: unknown batch {before!r}")
            start = max(0, ids.index(before) - limit)
            page = newest_first[start:ids.index(before)]
            more = start > 0
        else:
            page, more = newest_first[:limit], len(ids) > limit
        return _ok({"data": [self._shape(b, origin) for b in page], "has_more": more,
                    "first_id": page[0].id if page else None,
                    "last_id": page[-1].id if page else None})

    def _shape(self, batch: _Batch, origin: str) -> dict[str, Any]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if batch.ended_at is None:
            counts["processing"] = len(batch.requests)
        else:
            counts.update(batch.counts)
        return {
            "id": batch.id, "type": "message_batch", "processing_status": batch.status,
            "request_counts": counts,
            "created_at": rfc3339(batch.created),
            "expires_at": rfc3339(batch.created + self.engine.config.batch_expires_s),
            "ended_at": rfc3339(batch.ended_at) if batch.ended_at is not None else None,
            "cancel_initiated_at": rfc3339(batch.cancel_at) if batch.cancel_at else None,
            "archived_at": None,
            "results_url": (f"{origin}/v1/messages/batches/{batch.id}/results"
                            if batch.ended_at is not None else None),
        }

    # -- stats ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        self.advance()
        inner = self.inner.stats
        statuses = [b.status for b in self._batches.values()]
        now = time.time()
        return {
            "calls": dict(self.stats.calls),
            "batches_created": self.stats.batches_created,
            "requests": self.stats.requests,
            "outcomes": dict(self.stats.outcomes),
            "in_progress": statuses.count("in_progress"),
            # requests of batches still in progress whose processing time has passed (their
            # outcome is decided when the batch ends): how far along the open batches are
            "in_progress_done": sum(1 for b in self._batches.values()
                                    if b.status == "in_progress"
                                    for r in b.requests if r.done_at <= now),
            "canceling": statuses.count("canceling"),
            "ended": statuses.count("ended"),
            "queued": self.queued(),
            "max_queued": self.stats.max_queued,
            "rejected_429": self.stats.rejected_429,
            "queue_cap_429": self.stats.queue_cap_429,
            "accepted": inner.accepted,
            "duplicate_accepted": inner.duplicate_accepted,
            "input_tokens": inner.input_tokens,
            "output_tokens": inner.output_tokens,
            "cache_creation_input_tokens": inner.cache_creation_input_tokens,
            "cache_read_input_tokens": inner.cache_read_input_tokens,
            "max_request_input_tokens": inner.max_request_input_tokens,
            "billing": self.inner.billing(self.engine.config.batch_discount),
        }


def _api_key(headers: Mapping[str, str]) -> str:
    # The SDK sends x-api-key, or (2.x) Authorization: Bearer; the engine accepts both too.
    key = headers.get("x-api-key")
    if not key:
        auth = headers.get("authorization", "")
        key = auth[7:] if auth.lower().startswith("bearer ") else ""
    return key


def _seed(*parts: Any) -> int:
    h = hashlib.sha256("\0".join(p.hex() if isinstance(p, bytes) else str(p)
                                 for p in parts).encode())
    return int.from_bytes(h.digest()[:8], "big")


def _shuffled(items: list[_Request], salt: str) -> list[_Request]:
    # The provider does not keep request order in the results file: neither do we.
    out = list(items)
    random.Random(salt).shuffle(out)
    return out


def _ok(value: Any) -> Reply:
    return Reply(200, json_body(value), {"Content-Type": _JSON,
                                         "request-id": responses.request_id()})


def _error(status: int, error_type: str, message: str, retry_after: int | None = None) -> Reply:
    req_id = responses.request_id()
    headers = {"Content-Type": _JSON, "request-id": req_id}
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    return Reply(status, error_body(error_type, message, req_id), headers)
