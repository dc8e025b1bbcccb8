"""The simulator's core: one request in, one reply (now, or after the drawn latency) out.

Synchronous on purpose: every state change of a request happens in one uninterrupted step
on the event loop thread, so concurrent requests need no locks and admission, cache writes
and debits are atomic. Only the latency wait happens between `begin_message` and
`Pending.finish`.

Randomness: content (lengths, tool picks, tool input) is drawn from an RNG seeded by
(seed, canonical body), so it never depends on request order or concurrency. Fault draws
(529 / 500 / injected 429) and latency also mix in `x-stainless-retry-count` and a per-body
attempt counter, or a body that drew a 529 would draw it on every retry.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import billing, clouds, generate, openai, responses, streaming, triggers
from .buckets import KeyBuckets, NestedBuckets, Rejection
from .cache import PromptCache
from .config import LIMIT_FIELDS, SimConfig
from .stats import SimStats
from .tokens import REQUEST_OVERHEAD, cacheable_prefix, count_text, prefix_key_material, segments
from .validation import InvalidRequest, validate

_JSON = "application/json"
# Triggers that hold for a body's first attempt only: cut its stream after N events (by a
# dropped connection, or an overloaded_error event), or stall S seconds before its first token.
_FIRST_ONLY = frozenset({"cut", "cut_error", "stall"})
_RATE_LIMIT_DOCS = ("For details, refer to: https://docs.claude.com/en/api/rate-limits. "
                    "You can see the response headers for current usage.")


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]


@dataclass(slots=True)
class Pending:
    """An admitted request: sleep `delay` seconds, then call `finish()` for the reply.

    A streamed one (``stream`` set) is sent as ``stream.events`` instead, paced by the server
    (simulator/server.py), which calls ``stream.close`` with what it sent."""
    delay: float
    finish: Callable[[], Reply]
    output_tokens: int = 0  # the reply's, for a client that left before it was sent
    stream: Streamed | None = None


@dataclass(slots=True)
class Streamed:
    """A reply sent as server-sent events: headers now, the first token ``first_s`` after
    admission, then ``tokens_per_s`` (0: at once); cut after ``cut_after`` events (None:
    never) by dropping the connection (``cut_mode`` "drop") or an ``error`` event ("error")."""
    headers: dict[str, str]
    events: list[streaming.Event]
    first_s: float
    tokens_per_s: float
    close: Callable[[int, str], None]  # (output tokens generated, "done"|"cut"|"abandoned")
    sent: Callable[[int], None]  # told of the output tokens each write adds
    cut_after: int | None = None
    cut_mode: str = "drop"
    error_data: bytes = b""  # the error frame of cut_mode "error" (empty: Messages' own)
    # A ping after this many seconds without bytes while the next event is not due (0: none).
    ping_every_s: float = 0.0


def _seconds(arg: str | None) -> float:
    try:
        return max(0.0, float(arg or 0))
    except ValueError:
        return 0.0


def canonical_digest(body: dict[str, Any]) -> bytes:
    # What defines "the same conversation turn": repeated digests mean a repeated LLM call.
    canon = json.dumps([body.get("model"), body.get("system"), body.get("tools"),
                        body.get("messages")], sort_keys=True, separators=(",", ":"),
                       ensure_ascii=False)
    return hashlib.sha256(canon.encode()).digest()[:16]


def _seed(*parts: Any) -> int:
    h = hashlib.sha256("\0".join(p.hex() if isinstance(p, bytes) else str(p)
                                 for p in parts).encode())
    return int.from_bytes(h.digest()[:8], "big")


def lognormal_params(mean: float, p95: float) -> tuple[float, float]:
    """(mu, sigma) of a lognormal with this mean and 95th percentile."""
    z = 1.6448536269514722
    if p95 <= mean:
        return math.log(mean), 0.0
    # ln p95 - ln mean = z*s - s^2/2: take the smaller root; past the vertex use the vertex.
    d = math.log(p95) - math.log(mean)
    disc = z * z - 2 * d
    sigma = z - math.sqrt(disc) if disc > 0 else z
    return math.log(mean) - sigma * sigma / 2, sigma


class Engine:
    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.reset()

    # -- control ---------------------------------------------------------------------------

    def reset(self) -> None:
        self.stats = SimStats()
        self.cache = PromptCache()
        self._buckets: dict[str, KeyBuckets] = {}
        self._pool_since = time.monotonic()  # revoke_after_s counts from here
        self._attempts: dict[bytes, int] = {}
        self._last_judged = 0.0
        # When each Messages request arrived (this host's wall clock, the kernel's receive
        # time where the platform gives it: arrival.py), so a test can put
        # requests in order with events on the same host without polling the counters.
        self.arrivals: collections.deque[float] = collections.deque(maxlen=100_000)

    def configure(self, **changes: Any) -> SimConfig:
        new = self.config.replaced(**changes)
        if any(getattr(new, f) != getattr(self.config, f) for f in LIMIT_FIELDS):
            self._buckets.clear()  # new limits: buckets start full again
        if new.pool != self.config.pool:
            self._pool_since = time.monotonic()
        for buckets in self._buckets.values():
            buckets.other_share = new.other_share
            buckets.other_model = new.other_model
        self.config = new
        return new

    def billing(self, factor: float = 1.0) -> dict[str, Any]:
        """The bill at the configured prices (``factor``: a batch engine's discount)."""
        c = self.config
        return billing.bill(self.stats.billed_by_model, c.prices, c.provider, factor)

    def snapshot(self) -> dict[str, Any]:
        c = self.config
        snap = self.stats.snapshot({"rpm": c.rpm, "itpm": c.itpm, "otpm": c.otpm},
                                   self.billing())
        snap["config"] = c.to_dict()
        # The other consumer of a shared key (other_model="draws"): its requests taken/refused.
        snap["other"] = {"admitted": sum(b.other_admitted for b in self._buckets.values()),
                         "refused": sum(b.other_refused for b in self._buckets.values())}
        return snap

    def enter(self) -> None:
        self.stats.begin(time.monotonic())

    def leave(self, status: int) -> None:
        self.stats.end(time.monotonic(), status)

    # -- helpers ---------------------------------------------------------------------------

    def _judged_at(self, arrived: float | None) -> float:
        """The monotonic instant a request is judged at: its arrival, however late the loop
        got to it, but never before a request judged already (buckets and sliding windows run
        forward; one that arrived earlier but was read later is judged as if it came then)."""
        now = time.monotonic()
        if arrived is not None:
            # (At most 5 s back: a clock step must not judge a request in the distant past.)
            lag = min(max(0.0, time.time() - arrived), 5.0)
            self.stats.judged(lag)
            now -= lag
        self._last_judged = now = max(now, self._last_judged)
        return now

    def _bucket_set(self, name: str, now: float,
                    limits: tuple[float | None, float | None, float | None] | None = None
                    ) -> KeyBuckets:
        buckets = self._buckets.get(name)
        if buckets is None:
            if limits is None and self.config.provider in ("openai", "bedrock"):
                # OpenAI's and Bedrock's structure: requests and one tokens bucket (input +
                # max tokens at admission).
                limits = (self.config.rpm, self.config.tpm, None)
            buckets = self._buckets[name] = KeyBuckets(self.config, now, limits)
        return buckets

    def _pool_entry(self, api_key: str) -> dict[str, Any] | None:
        return next((e for e in self.config.pool if e["api_key"] == api_key), None)

    def _buckets_for(self, api_key: str, now: float, model: str | None = None
                     ) -> KeyBuckets | NestedBuckets:
        """The key's buckets of ``model``'s class; in a pool, inside the organisation's."""
        cfg = self.config
        cls = cfg.model_classes.get(model, model) if cfg.model_classes and model else ""
        if not cfg.pool:
            return self._bucket_set(f"{api_key}\0{cls}" if cls else api_key, now)
        org = ("org", self._bucket_set(f"\0org\0{cls}", now))
        entry = self._pool_entry(api_key)
        if entry is None:
            return NestedBuckets([org])
        limits = (entry.get("rpm"), entry.get("itpm"), entry.get("otpm"))
        return NestedBuckets([("key", self._bucket_set(f"{api_key}\0{cls}", now, limits)), org])

    def _revoked(self, api_key: str, now: float) -> str | None:
        """The alias of a pool key that is revoked now."""
        entry = self._pool_entry(api_key)
        if entry is None:
            return None
        after = entry.get("revoke_after_s")
        if entry["alias"] in self.config.revoked or (
                after is not None and now - self._pool_since >= float(after)):
            return str(entry["alias"])
        return None

    def _alias(self, api_key: str) -> str | None:
        entry = self._pool_entry(api_key) if self.config.pool else None
        return None if entry is None else str(entry["alias"])

    def _headers(self, req_id: str, buckets: KeyBuckets | NestedBuckets | None, now: float
                 ) -> dict[str, str]:
        headers = {"Content-Type": _JSON, "request-id": req_id}
        if self.config.provider in clouds.CLOUDS:  # neither cloud tells its quotas' levels
            return headers
        if buckets is not None and self.config.provider == "openai":
            headers.update(openai.ratelimit_headers(buckets, now))
        elif buckets is not None:
            headers.update(responses.ratelimit_headers(buckets, now, time.time(),
                                                       self.config.round_token_headers))
        return headers

    def _error(self, status: int, error_type: str, message: str, req_id: str,
               buckets: KeyBuckets | NestedBuckets | None, now: float,
               details: dict[str, Any] | None = None,
               retry_after: int | None = None, limit_name: str | None = None) -> Reply:
        headers = self._headers(req_id, buckets, now)
        if retry_after is not None and self.config.provider == "openai":
            headers.update(openai.retry_headers(self.config.retry_after_headers, retry_after))
        elif retry_after is not None:
            headers["retry-after"] = str(retry_after)
        stats = self.stats
        if status == 429:
            if details:
                stats.spend_cap_429 += 1
            else:
                stats.rate_limited(now)
        elif status == 529:
            stats.overloaded(now)
        elif status >= 500:
            stats.errors_5xx += 1
        else:
            stats.errors_4xx += 1
        if self.config.provider == "openai":
            status, body = openai.error_reply(status, error_type, message, details, limit_name)
            return Reply(status, body, headers)
        if self.config.provider in clouds.CLOUDS:  # no retry-after there: the SDK backs off
            headers.pop("retry-after", None)
            status, body, extra = clouds.error_reply(self.config.provider, status, error_type,
                                                     message)
            return Reply(status, body, headers | extra)
        return Reply(status, responses.error_body(error_type, message, req_id, details), headers)

    def _parse(self, headers: Mapping[str, str], raw: bytes, req_id: str, now: float,
               need_max_tokens: bool) -> tuple[str, dict[str, Any]] | Reply:
        cloud = self.config.provider in clouds.CLOUDS
        api_key = clouds.caller(self.config.provider, headers) if cloud else headers.get(
            "x-api-key")
        if not api_key and cloud:
            return self._error(401, "authentication_error", "the request carries no "
                               "credential (drover's simulator takes any bearer token or SigV4 "
                               "access key)", req_id, None, now)
        if not api_key:
            auth = headers.get("authorization", "")
            api_key = auth[7:] if auth.lower().startswith("bearer ") else ""
        if api_key:
            seen = hashlib.sha256(api_key.encode()).hexdigest()[:12]
            self.stats.keys_seen[seen] = self.stats.keys_seen.get(seen, 0) + 1
        if not api_key:
            # The API's own words, then what to do about it here (any key will do).
            return self._error(401, "authentication_error", "x-api-key header is required "
                               "(drover's simulator takes any key: set ANTHROPIC_API_KEY, e.g. "
                               "ANTHROPIC_API_KEY=sk-sim)", req_id, None, now)
        revoked = self._revoked(api_key, now) if self.config.pool else None
        if revoked is not None:
            self.stats.key_event(revoked, "n401")
            return self._error(401, "authentication_error", "invalid x-api-key", req_id, None,
                               now)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return self._error(400, "invalid_request_error",
                               f"There was an error parsing the body of your request: {exc}",
                               req_id, None, now)
        model = body.get("model") if isinstance(body, dict) else None
        buckets = self._buckets_for(api_key, now, model if isinstance(model, str) else None)
        try:
            if self.config.provider == "openai":
                body = openai.to_messages(body)  # judged as the Messages request it stands for
            validate(body, need_max_tokens=need_max_tokens)
        except InvalidRequest as exc:
            return self._error(400, "invalid_request_error", str(exc), req_id, buckets, now)
        return api_key, body

    # -- endpoints -------------------------------------------------------------------------

    def count_tokens(self, headers: Mapping[str, str], raw: bytes) -> Reply:
        now = time.monotonic()
        req_id = responses.request_id()
        parsed = self._parse(headers, raw, req_id, now, need_max_tokens=False)
        if isinstance(parsed, Reply):
            return parsed
        api_key, body = parsed
        total = REQUEST_OVERHEAD + sum(s.tokens for s in segments(body))
        return Reply(200, responses.json_body({"input_tokens": total}),
                     self._headers(req_id, self._buckets_for(api_key, now, body.get("model")),
                                   now))

    def begin_message(self, headers: Mapping[str, str], raw: bytes,
                      arrived: float | None = None) -> Reply | Pending:
        """``arrived``: when the request reached the host (wall clock, simulator/arrival.py),
        if that was before now; it is judged against the buckets then."""
        now = self._judged_at(arrived)
        self.arrivals.append(time.time() - (time.monotonic() - now))
        req_id = responses.request_id()
        parsed = self._parse(headers, raw, req_id, now, need_max_tokens=True)
        if isinstance(parsed, Reply):
            return parsed
        api_key, body = parsed
        cfg = self.config
        model: str = body["model"]
        buckets = self._buckets_for(api_key, now, model)
        alias = self._alias(api_key)
        whose = billing.spend_limited(
            self.stats.accepted, self.stats.per_key.get(alias or "", {}).get("accepted"),
            alias, cfg.spend_limit_calls, cfg.key_spend_limit_calls)
        if whose is not None:
            return self._spend_limit_reply(whose, req_id, buckets, now)
        max_tokens: int = body["max_tokens"]
        messages: list[dict[str, Any]] = body["messages"]
        digest = canonical_digest(body)

        found = triggers.find(messages) if triggers.MARKER in raw else []
        counted_fault = any(t.arg and t.name in ("529", "500", "429") or t.name in _FIRST_ONLY
                            for t in found)
        random_faults = cfg.overload_rate > 0 or cfg.error_5xx_rate > 0 or cfg.inject_429_rate > 0
        attempt = 0
        if counted_fault or random_faults:
            attempt = self._attempts.get(digest, 0) + 1
            self._attempts[digest] = attempt

        tool_trigger: str | None = None
        first_only: dict[str, float] = {}
        for trig in found:
            if trig.name == "tool":
                tool_trigger = trig.arg or tool_trigger
                continue
            if trig.name in _FIRST_ONLY:
                try:
                    if attempt == 1:
                        first_only[trig.name] = float(trig.arg or 0)
                except ValueError:
                    pass
                continue
            if trig.name in ("529", "500", "429") and trig.arg:
                try:
                    if attempt > int(trig.arg):
                        continue  # the counted failures are used up
                except ValueError:
                    pass
            reply = self._trigger_reply(trig.name, req_id, buckets, now, model)
            if reply is not None:
                return reply

        retry_count = headers.get("x-stainless-retry-count", "0")
        fault_rng: random.Random | None = None
        if random_faults:
            fault_rng = random.Random(_seed(cfg.seed, digest, retry_count, attempt))
            u_overload, u_5xx, u_429 = fault_rng.random(), fault_rng.random(), fault_rng.random()
            if u_overload < cfg.overload_rate:
                return self._error(529, "overloaded_error", "Overloaded", req_id, buckets, now)
            if u_5xx < cfg.error_5xx_rate:
                return self._error(500, "api_error", "Internal server error", req_id, buckets, now)
            if u_429 < cfg.inject_429_rate:
                return self._error(
                    429, "rate_limit_error",
                    "Your organization has exceeded its rate limits due to a sharp increase in "
                    f"usage (model: {model}). Please ramp up traffic gradually and try again "
                    f"later. {_RATE_LIMIT_DOCS}",
                    req_id, buckets, now, retry_after=cfg.inject_429_retry_after)

        # Token accounting, with the cache looked up but not yet written (a 429 writes nothing).
        segs = segments(body)
        total = REQUEST_OVERHEAD + sum(s.tokens for s in segs)
        cache_read = cache_creation = 0
        cache_key: bytes | None = None
        if b"cache_control" in raw:
            n, prefix_tokens = cacheable_prefix(segs)
            if body.get("cache_control"):
                # Top-level cache_control (automatic caching): the whole prompt is the prefix.
                n, prefix_tokens = len(segs), total - REQUEST_OVERHEAD
            if n and prefix_tokens >= cfg.cache_min_tokens:
                cache_key = self.cache.key(api_key, model, prefix_key_material(segs, n))
                if self.cache.hit(cache_key, now):
                    cache_read = prefix_tokens
                else:
                    cache_creation = prefix_tokens
        input_tokens = total - cache_read - cache_creation
        counted_input = input_tokens + cache_creation + (cache_read if cfg.cache_reads_count else 0)

        if cfg.provider in ("openai", "bedrock"):  # one tokens bucket: input + max tokens
            rejection = buckets.try_admit(counted_input + max_tokens, 0, now)
        else:
            rejection = buckets.try_admit(counted_input, max_tokens, now)
        if rejection is not None:
            if alias is not None:
                self.stats.key_event(alias, "n429", level=rejection.level)
            return self._rate_limited(rejection, model, req_id, buckets, now)
        if alias is not None:
            self.stats.key_event(alias, "accepted", now=now, input_tokens=counted_input)

        if cache_key is not None:
            # Written at admission, so requests admitted after this one read it.
            self.cache.store(cache_key, now, cfg.cache_ttl_s)
        content_rng = random.Random(_seed(cfg.seed, digest))
        knobs = triggers.conversation_knobs(messages) if triggers.MARKER in raw else {}
        generated = self._generate(body, digest, content_rng, tool_trigger, knobs)
        usage = {"input_tokens": input_tokens, "output_tokens": generated.output_tokens,
                 "cache_creation_input_tokens": cache_creation,
                 "cache_read_input_tokens": cache_read}
        self.stats.admitted(now, digest, counted_input, usage, model)

        delay = 0.0
        if cfg.latency_mean_s > 0:
            mu, sigma = lognormal_params(cfg.latency_mean_s, cfg.latency_p95_s)
            latency_rng = fault_rng or random.Random(_seed(cfg.seed, digest, "latency"))
            delay = latency_rng.lognormvariate(mu, sigma) if sigma > 0 else math.exp(mu)
        # The physics: the first token after ttft_s, then the rest at output_tokens_per_s.
        think = sum(_seconds(t.arg) for t in found if t.name == "think")
        first_s = delay + cfg.ttft_s + think + first_only.get("stall", 0.0)
        tps = cfg.output_tokens_per_s
        out_tokens = generated.output_tokens

        def burn_down(output_tokens: int, done: float) -> None:
            # Bedrock took input + max_tokens at admission; once the answer is done it counts
            # input + burndown x output instead (more than it took when the answer is long).
            if cfg.provider == "bedrock":
                buckets.adjust_tokens(max_tokens - cfg.output_burndown * output_tokens, done)

        if body.get("stream") is True:
            self.stats.streams += 1

            # Output is debited write by write, as the provider counts it while it generates
            # (an answer in flight draws on the bucket before it ends); the close settles the
            # rest (max_tokens mode: refunds what was reserved and not generated).
            debited = [0]

            def sent(tokens: int) -> None:
                buckets.generating(tokens, time.monotonic())
                debited[0] += tokens
                self.stats.stream_sent(tokens)

            def close(sent_tokens: int, how: str) -> None:
                done = time.monotonic()
                buckets.settle_output(sent_tokens, max_tokens, done, debited[0])
                burn_down(sent_tokens, done)
                self.stats.stream_closed(done, out_tokens, sent_tokens, how, model)

            chunk = max(3, math.ceil(tps * 0.1)) if tps > 0 else 256
            cut = first_only.get("cut_error", first_only.get("cut"))
            make = openai.chunk_events if cfg.provider == "openai" else streaming.events
            events = make(model, generated.content, generated.stop_reason, usage, chunk)
            kind, error_data = "text/event-stream; charset=utf-8", b""
            if cfg.provider == "openai":
                error_data = openai.error_frame("The server is overloaded")
            elif cfg.provider == "bedrock":  # AWS's binary event stream, never pinged
                events = [streaming.Event(e.tokens, clouds.bedrock_chunk(e.data)) for e in events
                          if e.data != streaming.PING]
                kind = "application/vnd.amazon.eventstream"
                error_data = clouds.bedrock_stream_error("The server is overloaded")
            streamed = Streamed(self._headers(req_id, buckets, now) | {
                "Content-Type": kind, "Cache-Control": "no-cache"},
                events, first_s, tps, close, sent, None if cut is None else max(1, int(cut)),
                "error" if "cut_error" in first_only else "drop", error_data,
                # A stalled connection is dead: it sends nothing, pings included.
                0.0 if cfg.provider in ("openai", "bedrock") or "stall" in first_only
                else cfg.ping_every_s)
            return Pending(0.0, lambda: Reply(500, b"", {}), out_tokens, streamed)

        if tps > 0:
            delay = first_s + out_tokens / tps
        else:
            delay = first_s

        def finish() -> Reply:
            done = time.monotonic()
            buckets.settle_output(generated.output_tokens, max_tokens, done)
            burn_down(generated.output_tokens, done)
            self.stats.generated(done, generated.output_tokens)
            shape = openai.completion_body if cfg.provider == "openai" else responses.message_body
            return Reply(200, shape(model, generated.content, generated.stop_reason, usage),
                         self._headers(req_id, buckets, done))

        return Pending(delay, finish, generated.output_tokens)

    def _trigger_reply(self, name: str, req_id: str, buckets: KeyBuckets | NestedBuckets,
                       now: float,
                       model: str) -> Reply | None:
        if name == "400":
            return self._error(400, "invalid_request_error",
                               "Simulated invalid request ([[sim:400]] trigger)", req_id,
                               buckets, now)
        if name == "500":
            return self._error(500, "api_error", "Internal server error", req_id, buckets, now)
        if name == "529":
            return self._error(529, "overloaded_error", "Overloaded", req_id, buckets, now)
        if name == "429":
            return self._error(429, "rate_limit_error",
                               f"This request would exceed your organization's rate limit "
                               f"(simulated, model: {model}). {_RATE_LIMIT_DOCS}",
                               req_id, buckets, now, retry_after=self.config.inject_429_retry_after)
        if name == "spend_cap":
            return self._spend_limit_reply("organization", req_id, buckets, now)
        return None  # unknown trigger names are ignored, like any other text

    def _spend_limit_reply(self, whose: str, req_id: str,
                           buckets: KeyBuckets | NestedBuckets, now: float) -> Reply:
        """The spend limit reached, in the provider's words (simulator/openai.py turns it
        into OpenAI's ``insufficient_quota``); no retry-after: it will keep failing."""
        self.stats.spend_limited[whose] = self.stats.spend_limited.get(whose, 0) + 1
        if self.stats.first_spend_limited_at is None:  # wall clock: a test times the job's end
            self.stats.first_spend_limited_at = time.time()
        return self._error(429, "rate_limit_error",
                           "You have reached your specified "
                           + ("workspace " if whose == "workspace" else "")
                           + "API usage limits. You will regain access on the first day of "
                           "next month at 00:00 UTC.", req_id, buckets, now,
                           details={"error_code": "enforced_spend_limit_reached"})

    def _rate_limited(self, rejection: Rejection, model: str, req_id: str,
                      buckets: KeyBuckets | NestedBuckets, now: float) -> Reply:
        self.stats.refused_by(rejection.limit_name, now)
        advice = ("Please reduce the prompt length or the maximum tokens requested, or try "
                  "again later." if rejection.limit_name != "requests"
                  else "Please try again later.")
        whose = "your workspace's" if self.config.pool and rejection.level == "key" else (
            "your organization's")
        message = (f"This request would exceed {whose} rate limit of "
                   f"{int(rejection.limit):,} {rejection.limit_name} per minute "
                   f"(model: {model}). {_RATE_LIMIT_DOCS} {advice}")
        if self.config.provider == "openai":
            what = "requests" if rejection.limit_name == "requests" else "tokens"
            short = "RPM" if what == "requests" else "TPM"
            message = (f"Rate limit reached for {model} on {what} per min ({short}): Limit "
                       f"{int(rejection.limit)}. Please try again in {rejection.retry_after_s}s.")
            return self._error(429, "rate_limit_error", message, req_id, buckets, now,
                               retry_after=rejection.retry_after_s, limit_name=what)
        return self._error(429, "rate_limit_error", message, req_id, buckets, now,
                           retry_after=rejection.retry_after_s)

    def _generate(self, body: dict[str, Any], digest: bytes, rng: random.Random,
                  tool_trigger: str | None, knobs: dict[str, int] | None = None
                  ) -> generate.Generated:
        """The reply; with extended thinking on, a thinking block first (its tokens are
        output tokens, within max_tokens), then the answer in what is left."""
        thinking = body.get("thinking")
        if not (isinstance(thinking, dict) and thinking.get("type") == "enabled"):
            return self._answer(body, digest, rng, tool_trigger, knobs, body["max_tokens"])
        budget = int(thinking["budget_tokens"])
        block = generate.thinking_block(generate.task_words(body["messages"]),
                                        rng.randint(max(1, budget // 8), max(1, budget // 4)),
                                        rng)
        spent = count_text(block["thinking"])
        answer = self._answer(body, digest, rng, tool_trigger, knobs,
                              max(1, body["max_tokens"] - spent))
        return generate.Generated([block, *answer.content], answer.stop_reason,
                                  spent + answer.output_tokens)

    def _answer(self, body: dict[str, Any], digest: bytes, rng: random.Random,
                tool_trigger: str | None, knobs: dict[str, int] | None,
                max_tokens: int) -> generate.Generated:
        cfg = self.config
        knobs = knobs or {}
        messages = body["messages"]
        tools: list[dict[str, Any]] = body.get("tools") or []
        choice: dict[str, Any] = body.get("tool_choice") or {"type": "auto"}
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        task = generate.task_words(messages)
        if choice["type"] == "tool":
            tool = next(t for t in tools if t.get("name") == choice["name"])
            return generate.tool_turn([tool], 1, None, task, turn, digest, max_tokens,
                                      cfg.plan_items, rng, with_text=False)
        wants_tool = choice["type"] != "none" and (tools or tool_trigger) and (
            turn < knobs.get("turns", cfg.tool_turns) or choice["type"] == "any")
        if wants_tool:
            count = 1 if choice.get("disable_parallel_tool_use") or not tools \
                else cfg.tools_per_turn
            return generate.tool_turn(tools, count, tool_trigger, task, turn, digest, max_tokens,
                                      cfg.plan_items, rng)
        mean = max(1, knobs.get("out", cfg.output_tokens_mean))
        target = rng.randint(max(1, mean // 2), max(1, mean + mean // 2))
        if cfg.output_share_max > 0 and "out" not in knobs:  # a share of max_tokens
            target = max(1, round(rng.uniform(cfg.output_share_min, cfg.output_share_max)
                                  * body["max_tokens"]))
        text, capped = generate.text_reply(task, target, max_tokens, rng)
        return generate.Generated([{"type": "text", "text": text}],
                                  "max_tokens" if capped else "end_turn", count_text(text))
