"""The records a job leaves behind: one per sub-agent, one for the job.

A ``SubagentResult`` is what travels in the chord callback message, so it stays small:
status, counts and a short summary. The long parts (findings, the transcript) live in Redis
under the job and expire with it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "failed", "cancelled", "budget_exceeded"]
STATUSES: tuple[Status, ...] = ("ok", "failed", "cancelled", "budget_exceeded")
SUMMARY_CHARS = 400


class Usage(BaseModel):
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def add(self, usage: object) -> None:
        """Add an SDK ``Usage`` (or anything with the same attributes) from one LLM call."""
        self.calls += 1
        self.input_tokens += getattr(usage, "input_tokens", 0) or 0
        self.output_tokens += getattr(usage, "output_tokens", 0) or 0
        self.cache_creation_input_tokens += getattr(usage, "cache_creation_input_tokens", 0) or 0
        self.cache_read_input_tokens += getattr(usage, "cache_read_input_tokens", 0) or 0

    @property
    def total_tokens(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_creation_input_tokens
                + self.cache_read_input_tokens)


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

    @property
    def calls(self) -> int:
        return self.usage.calls


class SubagentReport(BaseModel):
    """The structured report of one sub-agent, kept in Redis (not in the chord message)."""

    findings: str = ""
    tried: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)


class JobResult(BaseModel):
    job_id: str
    status: Literal["done", "failed", "cancelled"]
    reason: str | None = None
    results: list[SubagentResult]
    counts: dict[str, int]
    usage: Usage
    wall_s: float
    synthesis: str | None = None

    def by_status(self, status: Status) -> list[SubagentResult]:
        return [r for r in self.results if r.status == status]


def total_usage(results: list[SubagentResult]) -> Usage:
    usage = Usage()
    for result in results:
        for name in Usage.model_fields:
            setattr(usage, name, getattr(usage, name) + getattr(result.usage, name))
    return usage


def status_counts(results: list[SubagentResult]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for result in results:
        counts[result.status] += 1
    return counts
