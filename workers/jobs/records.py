"""The records a job leaves behind: one per sub-agent, one for the job.

A ``SubagentResult`` is what travels in the chord callback message, so it stays small:
status, counts and a short summary. The long parts (findings, the transcript) live in Redis
under the job and expire with it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from drover.config.prices import Price

Status = Literal["ok", "failed", "cancelled", "budget_exceeded"]
STATUSES: tuple[Status, ...] = ("ok", "failed", "cancelled", "budget_exceeded")
SUMMARY_CHARS = 400
# A JobResult is one Redis value that every reader parses whole, so its text is bounded: the
# summaries and errors of all its records share this many characters (each record keeps at
# least RECORD_CHARS_MIN). Up to 2,500 sub-agents nothing is cut; at 10,000 each keeps 100.
RESULT_TEXT_CHARS = 1_000_000
RECORD_CHARS_MIN = 80


class Usage(BaseModel):
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    # The part of the above that went through the Message Batches API (billed at 50%).
    batch_calls: int = 0
    batch_input_tokens: int = 0
    batch_output_tokens: int = 0
    batch_cache_creation_input_tokens: int = 0
    batch_cache_read_input_tokens: int = 0
    # Calls sent whose answer never came back (aborted by a cancel or a deadline, lost with
    # a worker, timed out or cut off after the send): the provider took them and bills them,
    # so they count here from the reservation's estimate (input as estimated, output the
    # reserved amount), outside ``calls`` and the tokens above, which are the answers' own.
    unanswered_calls: int = 0
    unanswered_input_tokens: int = 0
    unanswered_output_tokens: int = 0
    # Dollars at the prices of DROVER_PRICES over the bundled table (config/prices.py), each
    # call priced when it is counted: answers at their usage (batch results at the Batches
    # discount), unanswered calls at what they are counted. None while every call counted was
    # of a model without a price: unpriced is never reported as $0.
    cost_usd: float | None = 0.0
    unpriced_calls: int = 0  # calls (answered or not) of a model without a price

    def add_unanswered(self, input_tokens: int, output_tokens: int,
                       price: Price | None = None) -> None:
        """Count one call that was sent and never answered, at its estimate."""
        self.unanswered_calls += 1
        self.unanswered_input_tokens += input_tokens
        self.unanswered_output_tokens += output_tokens
        self._price(price, price.cost(input_tokens, output_tokens) if price else 0.0)

    def _price(self, price: Price | None, dollars: float) -> None:
        if price is None:
            self.unpriced_calls += 1
        self.cost_usd = (self.cost_usd or 0.0) + dollars
        self._unpriced_is_none()

    def _unpriced_is_none(self) -> None:
        if self.sent_calls and self.unpriced_calls >= self.sent_calls:
            self.cost_usd = None

    def merge(self, other: Usage) -> None:
        """Add ``other``'s counts and dollars to these."""
        for name in Usage.model_fields:
            if name != "cost_usd":
                setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cost_usd = (self.cost_usd or 0.0) + (other.cost_usd or 0.0)
        self._unpriced_is_none()

    @property
    def unanswered_tokens(self) -> int:
        return self.unanswered_input_tokens + self.unanswered_output_tokens

    @property
    def sent_calls(self) -> int:
        """Every call the provider took: answered and unanswered."""
        return self.calls + self.unanswered_calls

    def add(self, usage: object, *, batch: bool = False, price: Price | None = None) -> None:
        """Add an SDK ``Usage`` (or anything with the same attributes) from one LLM call,
        priced at ``price`` (None: the model has no price)."""
        names = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                 "cache_read_input_tokens")
        self.calls += 1
        self.batch_calls += batch
        counts = [getattr(usage, name, 0) or 0 for name in names]
        for name, n in zip(names, counts, strict=True):
            setattr(self, name, getattr(self, name) + n)
            if batch:
                setattr(self, "batch_" + name, getattr(self, "batch_" + name) + n)
        self._price(price, price.cost(*counts, batch=batch) if price else 0.0)

    @property
    def budget_tokens(self) -> int:
        return budget_tokens(self)

    @property
    def total_tokens(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_creation_input_tokens
                + self.cache_read_input_tokens)

    @property
    def batch_tokens(self) -> int:
        """Tokens billed at the batch rate (half the standard price)."""
        return (self.batch_input_tokens + self.batch_output_tokens
                + self.batch_cache_creation_input_tokens + self.batch_cache_read_input_tokens)


def budget_tokens(usage: object) -> int:
    """What a call costs against a token budget: input, output and cache writes (cache reads
    are cheap and left out), and the estimate of calls sent but never answered. ``usage`` is
    an SDK ``Usage`` or ours."""
    return sum(getattr(usage, name, 0) or 0 for name in (
        "input_tokens", "output_tokens", "cache_creation_input_tokens",
        "unanswered_input_tokens", "unanswered_output_tokens"))


class Checkpoint(BaseModel):
    """Where a running sub-agent is: the conversation so far and what it has cost.

    Saved after every LLM reply and every turn's tool results; a retry or a redelivered task
    resumes from it, so no completed call runs again.
    """

    messages: list[dict[str, Any]]
    turns: int = 0
    stop_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    tried: list[str] = Field(default_factory=list)  # tool calls made, for the report
    failed: list[str] = Field(default_factory=list)  # tool calls that failed, for the report
    failures: int = 0  # failed LLM attempts so far: the backoff exponent and the attempt cap
    last_error: dict[str, Any] | None = None
    # delivery="batch": the custom_id of this turn's request in a Message Batch (None when
    # none is out), and how many batch requests it has made (keeps a retry's id new).
    batch_cid: str | None = None
    batch_n: int = 0
    # Its reservations under the caps in dollars while that request is out ((key, dollars)
    # each: workers/agent/caps.py), settled when its result comes back.
    batch_hold: list[tuple[str, float]] = Field(default_factory=list)
    # Realtime calls sent so far: before each send its number (this count, plus one) is
    # marked in Redis with the sends in flight then (Checkpoints.before_send).
    sends: int = 0
    # The sends in flight when this state was saved ([number, input estimate, output bound]
    # each): their outcome is not this state's. A resume counts these, and the mark's sends
    # past ``sends``, as sent and never answered (a function may have several at once).
    in_flight: list[list[int]] = Field(default_factory=list)

    @classmethod
    def first(cls, task: str) -> Checkpoint:
        """The state of a sub-agent that has not started: its task as the first message."""
        return cls(messages=[{"role": "user", "content": task}])

    def findings(self) -> str:
        """The latest thing the model said: its answer, or for a sub-agent stopped mid-way
        (a budget, a cancel) its partial summary so far."""
        for message in reversed(self.messages):
            if message["role"] == "assistant" and isinstance(message["content"], list):
                text = "\n".join(b.get("text", "") for b in message["content"]
                                 if b.get("type") == "text").strip()
                if text:
                    return text
        return ""

    def report(self) -> SubagentReport:
        """The sub-agent's report, read from its final state (the one copy of its answer)."""
        return SubagentReport(findings=self.findings(), tried=self.tried, failed=self.failed)

    def pending_tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls of the model's last reply that still need their results."""
        last = self.messages[-1]
        if last["role"] != "assistant":
            return []
        return [b for b in last["content"] if b.get("type") == "tool_use"]


class SubagentResult(BaseModel):
    """The compact record of one finished sub-agent (what the join receives)."""

    job_id: str
    index: int
    status: Status
    summary: str = ""
    usage: Usage = Field(default_factory=Usage)
    turns: int = 0
    attempts: int = 1
    error_type: str | None = None
    status_code: int | None = None
    error: str | None = None
    finished_at: float = 0.0
    # What a team's own @subagent function returned (JSON); None for drover's own loop.
    output: Any = None

    @property
    def calls(self) -> int:
        return self.usage.calls

    @property
    def cost_usd(self) -> float | None:
        """What this sub-agent's calls cost in dollars (None: its model has no price)."""
        return self.usage.cost_usd


class SubagentReport(BaseModel):
    """The structured report of one sub-agent: not stored apart, but read from its final
    state (``Checkpoint.report``), which holds the one full copy of its answer."""

    findings: str = ""
    tried: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)


class JobResult(BaseModel):
    """A finished job: one record per sub-agent, in index order (``records``, stored as the
    field ``results``).

    The records' ``summary`` and ``error`` are cut to ``record_chars`` characters (see
    RESULT_TEXT_CHARS); the full record is ``JobHandle.record(index)`` and the full findings
    ``JobHandle.report(index)``, while the job's records live.
    """

    job_id: str
    status: Literal["done", "failed", "cancelled"]
    reason: str | None = None
    results: list[SubagentResult]
    counts: dict[str, int]
    usage: Usage
    wall_s: float
    synthesis: str | None = None
    record_chars: int = SUMMARY_CHARS
    # As stored: True when ``results`` is left out, to be read from the job's records
    # (Outcomes.get does, so a caller never sees it True).
    by_reference: bool = False

    @property
    def cost_usd(self) -> float | None:
        """What the job's calls cost in dollars, its planning and synthesis included (None:
        its model has no price; ``usage.unpriced_calls`` counts calls left unpriced)."""
        return self.usage.cost_usd

    @property
    def records(self) -> list[SubagentResult]:
        """The job's records, one per sub-agent in index order: the docs' word for them
        (``handle.records()`` pages the same). ``results`` is the field's name as stored and
        in ``drover result --json``, and stays."""
        return self.results

    def by_status(self, status: Status) -> list[SubagentResult]:
        return [r for r in self.results if r.status == status]


def total_usage(results: list[SubagentResult]) -> Usage:
    usage = Usage()
    for result in results:
        usage.merge(result.usage)
    return usage


def status_counts(results: list[SubagentResult]) -> dict[str, int]:
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for result in results:
        counts[result.status] += 1
    return counts


def record_chars(n: int) -> int:
    """How many characters of summary and of error each record keeps in a JobResult of ``n``."""
    return max(RECORD_CHARS_MIN, min(SUMMARY_CHARS, RESULT_TEXT_CHARS // max(1, n)))


def compact(record: SubagentResult, chars: int) -> SubagentResult:
    """``record`` with its summary and error cut to ``chars`` characters (itself if they fit)."""
    long_error = record.error is not None and len(record.error) > chars
    if len(record.summary) <= chars and not long_error:
        return record
    return record.model_copy(update={"summary": record.summary[:chars],
                                     "error": record.error[:chars] if record.error else None})
