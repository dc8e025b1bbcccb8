"""Counters the tests and benchmarks read back: what was accepted, refused, and how fast.

Memory stays bounded per request: sliding windows hold only the last 60 s of events, the
timeline one row per second, duplicate detection 16 bytes per accepted body.
"""

from __future__ import annotations

from collections import deque
from typing import Any

WINDOW_S = 60.0


class SlidingMax:
    """Largest sum of amounts within any window of WINDOW_S seconds, computed exactly.

    The maximum over all windows is reached by a window ending at an event, so checking
    after each event (with events in time order) is exact.
    """

    __slots__ = ("events", "total", "max")

    def __init__(self) -> None:
        self.events: deque[tuple[float, int]] = deque()
        self.total = 0
        self.max = 0

    def add(self, ts: float, amount: int) -> None:
        events = self.events
        events.append((ts, amount))
        self.total += amount
        horizon = ts - WINDOW_S
        while events and events[0][0] <= horizon:
            self.total -= events.popleft()[1]
        if self.total > self.max:
            self.max = self.total


# Timeline row columns.
_REQ, _IN, _OUT, _429, _529 = range(5)


class SimStats:
    def __init__(self) -> None:
        self.accepted = 0
        self.rejected_429 = 0
        # The 429s by the limit that refused ("requests", "input tokens", ...): at a small key
        # which bucket a late send hit is the question (bench/small_keys.py prints it).
        self.rejected_429_by_limit: dict[str, int] = {}
        self.rejected_429_gaps_s: list[float] = []  # each 429's time since the last admission
        self.last_accept_ts: float | None = None
        self.spend_cap_429 = 0
        self.spend_limited: dict[str, int] = {}  # spend-limit refusals by whose limit
        self.first_spend_limited_at: float | None = None  # wall clock (time.time())
        self.max_request_input_tokens = 0  # the largest input of one admitted request
        self.overloaded_529 = 0
        self.errors_5xx = 0
        self.errors_4xx = 0
        self.input_tokens = 0
        self.output_tokens = 0
        # What a provider that bills every request it admitted charges for output: the whole
        # generated reply, counted at admission, whether or not the client stayed for it
        # (output_tokens counts only replies that were delivered).
        self.billed_output_tokens = 0
        # The same bill by model (the dollars are billing.bill's): [requests, input, cache
        # write, cache read, output] tokens billed.
        self.billed_by_model: dict[str, list[int]] = {}
        self.cache_creation_input_tokens = 0
        self.cache_read_input_tokens = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.aborted = 0  # admitted requests whose client left before the reply
        # Streamed replies: begun, cut by a fault, left by their client before the end.
        self.streams = 0
        self.streams_cut = 0
        self.streams_abandoned = 0
        self.stream_tokens_sent = 0  # output tokens written by streams, open ones included
        self.duplicate_accepted = 0
        self.per_key: dict[str, dict[str, int]] = {}  # a pool's keys, by alias
        # Every API key a request carried, by fingerprint (sha256's first 12 hex digits): which
        # keys reached the provider (a proxy in front must send its own, never its callers').
        self.keys_seen: dict[str, int] = {}
        self._key_windows: dict[str, tuple[SlidingMax, SlidingMax]] = {}
        self.first_request_ts: float | None = None
        self.first_accept_ts: float | None = None
        self.last_done_ts: float | None = None
        self.by_status: dict[int, int] = {}
        # How long after its arrival a request was judged: the event loop's delay, which the
        # simulator no longer counts against the sender (simulator/arrival.py).
        self.loop_lag_max_s = 0.0
        self.loop_lag_over_50ms = 0
        self._seen: set[bytes] = set()
        self._win_requests = SlidingMax()
        self._win_input = SlidingMax()
        self._win_output = SlidingMax()
        self._timeline: dict[int, list[int]] = {}

    def _row(self, now: float) -> list[int]:
        if self.first_request_ts is None:
            self.first_request_ts = now
        second = int(now - self.first_request_ts)
        row = self._timeline.get(second)
        if row is None:
            row = self._timeline[second] = [0, 0, 0, 0, 0]
        return row

    def begin(self, now: float) -> None:
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        if self.first_request_ts is None:
            self.first_request_ts = now

    def end(self, now: float, status: int) -> None:
        self.in_flight -= 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if status == 200:
            self.last_done_ts = now

    def admitted(self, now: float, digest: bytes, counted_input: int, usage: dict[str, int],
                 model: str = "") -> None:
        self.accepted += 1
        whole_input = (usage["input_tokens"] + usage["cache_creation_input_tokens"]
                       + usage["cache_read_input_tokens"])
        self.max_request_input_tokens = max(self.max_request_input_tokens, whole_input)
        row = self.billed_by_model.setdefault(model, [0, 0, 0, 0, 0])
        for i, n in enumerate((1, usage["input_tokens"], usage["cache_creation_input_tokens"],
                               usage["cache_read_input_tokens"], usage["output_tokens"])):
            row[i] += n
        if self.first_accept_ts is None:
            self.first_accept_ts = now
        self.last_accept_ts = now
        if digest in self._seen:
            self.duplicate_accepted += 1
        else:
            self._seen.add(digest)
        self.input_tokens += usage["input_tokens"]
        self.billed_output_tokens += usage["output_tokens"]
        self.cache_creation_input_tokens += usage["cache_creation_input_tokens"]
        self.cache_read_input_tokens += usage["cache_read_input_tokens"]
        self._win_requests.add(now, 1)
        self._win_input.add(now, counted_input)
        row = self._row(now)
        row[_REQ] += 1
        row[_IN] += counted_input

    def generated(self, now: float, output_tokens: int) -> None:
        self.output_tokens += output_tokens
        self._win_output.add(now, output_tokens)
        self._row(now)[_OUT] += output_tokens

    def undelivered(self, output_tokens: int) -> None:
        """An admitted reply whose client had gone: billed (billed_output_tokens), and no
        longer counted in the delivered ``output_tokens``."""
        self.aborted += 1
        self.output_tokens -= output_tokens

    def stream_sent(self, tokens: int) -> None:
        self.stream_tokens_sent += tokens

    def stream_closed(self, now: float, total: int, sent: int, how: str,
                      model: str = "") -> None:
        """A streamed reply ended: ``done``, ``cut`` (a fault) or ``abandoned`` (its client
        closed it). What was generated until then is billed and counted; the rest of the
        answer never was (closing the stream stops the bill)."""
        self.generated(now, sent)
        self.billed_output_tokens -= total - sent
        if model in self.billed_by_model:
            self.billed_by_model[model][4] -= total - sent
        if how == "cut":
            self.streams_cut += 1
        elif how == "abandoned":
            self.streams_abandoned += 1

    def key_event(self, alias: str, kind: str, *, level: str | None = None,
                  now: float | None = None, input_tokens: int = 0) -> None:
        """A pool key's own counts: accepted (with its 60 s windows), n429 (by level), n401."""
        row = self.per_key.get(alias)
        if row is None:
            row = self.per_key[alias] = {"accepted": 0, "n429": 0, "n401": 0, "n429_key": 0,
                                         "n429_org": 0}
            self._key_windows[alias] = (SlidingMax(), SlidingMax())
        row[kind] += 1
        if level is not None:
            row[f"n429_{level}"] += 1
        if kind == "accepted" and now is not None:
            requests, inputs = self._key_windows[alias]
            requests.add(now, 1)
            inputs.add(now, input_tokens)

    def refused_by(self, limit_name: str, now: float) -> None:
        """A rate-limit 429's limit, and how long after the last admission it came (the first
        100: at a bucket of one request, how late the send before it was)."""
        by_limit = self.rejected_429_by_limit
        by_limit[limit_name] = by_limit.get(limit_name, 0) + 1
        if self.last_accept_ts is not None and len(self.rejected_429_gaps_s) < 100:
            self.rejected_429_gaps_s.append(round(now - self.last_accept_ts, 3))

    def judged(self, lag_s: float) -> None:
        if lag_s > self.loop_lag_max_s:
            self.loop_lag_max_s = lag_s
        if lag_s > 0.05:
            self.loop_lag_over_50ms += 1

    def rate_limited(self, now: float) -> None:
        self.rejected_429 += 1
        self._row(now)[_429] += 1

    def overloaded(self, now: float) -> None:
        self.overloaded_529 += 1
        self._row(now)[_529] += 1

    def snapshot(self, limits: dict[str, float | None],
                 billing: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "billing": billing or {},
            "accepted": self.accepted,
            "rejected_429": self.rejected_429,
            "rejected_429_by_limit": dict(self.rejected_429_by_limit),
            "rejected_429_gaps_s": list(self.rejected_429_gaps_s),
            "spend_cap_429": self.spend_cap_429,
            "spend_limited": dict(self.spend_limited),
            "first_spend_limited_at": self.first_spend_limited_at,
            "max_request_input_tokens": self.max_request_input_tokens,
            "overloaded_529": self.overloaded_529,
            "errors_5xx": self.errors_5xx,
            "errors_4xx": self.errors_4xx,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "billed": {"requests": self.accepted,
                       "input_tokens": self.input_tokens + self.cache_creation_input_tokens
                       + self.cache_read_input_tokens,
                       "output_tokens": self.billed_output_tokens},
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "max_60s": {"requests": self._win_requests.max,
                        "input_tokens": self._win_input.max,
                        "output_tokens": self._win_output.max},
            "limits": limits,
            "in_flight": self.in_flight,
            "aborted": self.aborted,
            "streams": {"begun": self.streams, "cut": self.streams_cut,
                        "abandoned": self.streams_abandoned,
                        "tokens_sent": self.stream_tokens_sent},
            "max_in_flight": self.max_in_flight,
            "duplicate_accepted": self.duplicate_accepted,
            "first_accept_ts": self.first_accept_ts,
            "last_done_ts": self.last_done_ts,
            "loop_lag": {"max_s": round(self.loop_lag_max_s, 4),
                         "over_50ms": self.loop_lag_over_50ms},
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "keys_seen": dict(self.keys_seen),
            "per_key": {alias: {**row, "max_60s": {"requests": self._key_windows[alias][0].max,
                                                   "input_tokens": self._key_windows[alias][1].max}}
                        for alias, row in sorted(self.per_key.items())},
            "timeline": [
                {"t": t, "requests": r[_REQ], "input_tokens": r[_IN], "output_tokens": r[_OUT],
                 "n429": r[_429], "n529": r[_529]}
                for t, r in sorted(self._timeline.items())
            ],
        }
