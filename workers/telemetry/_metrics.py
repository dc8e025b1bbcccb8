"""Every metric drover exports, in one table: name, type, labels, buckets, help.

Two sources feed the same scrape target (``drover metrics``):

- ``process`` series are counted where they happen (the LLM call, the limiter wait, a tool
  call, a finished sub-agent, a submit) by whichever process on whichever host did it. Each
  process sums them in memory and adds the sums to one Redis hash every
  ``DROVER_METRICS_FLUSH_S`` (``drover.workers.telemetry._recorder``), so the exporter reads
  fleet-wide cumulative counters and histogram buckets. Prometheus' multiprocess mode would sum the
  processes of one host only; Redis already holds everything else that is fleet-wide.
- ``state`` series are read by the exporter from the state the fleet already keeps in Redis:
  the limiter (through ``drover.workers.limiter.Limiter``), the job store, the broker queue, the
  processes' heartbeats.

Names follow Prometheus' conventions (``drover_`` prefix, base units, ``_total`` counters;
``prometheus_client`` adds ``_total`` and the histogram suffixes). The LLM call series carry
the OpenTelemetry GenAI semantic conventions' meanings and attribute names (dots become
underscores): ``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``.

Labels stay bounded: scopes, models, tools, tenants and outcomes are few. Job ids appear only
on the ``drover_job_*`` gauges, and only for active jobs, at most ``DROVER_METRICS_MAX_JOBS``
of them (the newest); every job counts in its tenant's series whatever the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CALL_OUTCOMES", "DIMENSIONS", "METRICS", "Metric", "SUBAGENT_STATUSES",
           "TOKEN_TYPES", "metric"]

Kind = Literal["counter", "gauge", "histogram"]

# The GenAI semconv's advice for gen_ai.client.operation.duration, in seconds.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
# A limiter wait is 0 when there is headroom and up to the horizon (15 s) when there is not.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
                30.0, 60.0)
# Time to first token: the GenAI semconv's advice for gen_ai.server.time_to_first_token.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
# Seconds per output token (gen_ai.server.time_per_output_token's advice): 100 to 4 a second.
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0)

CALL_OUTCOMES = ("ok", "429", "529", "5xx", "4xx", "connection", "cancelled", "unanswered",
                 "error")
TOKEN_TYPES = ("input", "output", "cache_read", "cache_write")
DIMENSIONS = ("requests", "input_tokens", "output_tokens", "tokens")  # tokens: OpenAI's one bucket
SUBAGENT_STATUSES = ("waiting", "running", "ok", "failed", "cancelled", "budget_exceeded")

GENAI = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")


@dataclass(frozen=True)
class Metric:
    """One metric family as prometheus_client names it (counters without ``_total``)."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    source: Literal["process", "state"]
    buckets: tuple[float, ...] = ()

    @property
    def exposed(self) -> str:
        """The sample name a scrape shows (counters get ``_total``)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


METRICS: tuple[Metric, ...] = (
    # --- counted by the processes that do the work --------------------------------------
    Metric("drover_gen_ai_client_operation_duration_seconds", "histogram",
           (*GENAI, "error_type"), "gen_ai.client.operation.duration: one LLM call, from "
           "sending the request to its response or error (the limiter wait excluded); "
           "error_type is empty for a success", "process", DURATION_BUCKETS),
    Metric("drover_gen_ai_server_time_to_first_token_seconds", "histogram", GENAI,
           "gen_ai.server.time_to_first_token: from sending a streamed LLM call to its first "
           "content token, as the client sees it", "process", TTFT_BUCKETS),
    Metric("drover_gen_ai_server_time_per_output_token_seconds", "histogram", GENAI,
           "gen_ai.server.time_per_output_token: seconds per output token after the first "
           "(1 / output tokens a second) of a streamed LLM call", "process", TPOT_BUCKETS),
    Metric("drover_gen_ai_client_token_usage", "counter", (*GENAI, "gen_ai_token_type"),
           "gen_ai.client.token.usage summed: tokens of finished LLM calls by type (input = "
           "uncached input, output, cache_read, cache_write = cache creation; "
           "unanswered_input, unanswered_output = calls sent whose answer never came back, "
           "which the provider bills: what their stream had generated, or the estimate)",
           "process"),
    Metric("drover_cost_usd", "counter", ("gen_ai_request_model", "tenant"),
           "dollars the LLM calls cost at list prices (DROVER_PRICES over the bundled table): "
           "answers at their usage, Message Batch results at the batch discount, calls sent "
           "and never answered at what they are counted; a model without a price adds to "
           "drover_unpriced_calls instead", "process"),
    Metric("drover_unpriced_calls", "counter", ("gen_ai_request_model",),
           "LLM calls (answered or sent and never answered) of a model without a price "
           "(set it in DROVER_PRICES)", "process"),
    Metric("drover_llm_calls", "counter", ("scope", "outcome"),
           "LLM calls by outcome: ok, 429, 529, 5xx, 4xx, connection (incl. timeouts), "
           "cancelled (the job was cancelled or ran out of time before the send), unanswered "
           "(sent, and the answer never came back: aborted by a cancel or deadline, timed out, "
           "cut off; billed), error (anything else raised: a bug or a broken deployment)",
           "process"),
    Metric("drover_limiter_acquire_wait_seconds", "histogram", ("scope",),
           "time from asking the limiter to being allowed to send (in-flight polls and the "
           "reservation's wait)", "process", WAIT_BUCKETS),
    Metric("drover_limiter_deferrals", "counter", ("scope", "reason"),
           "acquires the limiter sent away for a Celery retry (reason: horizon, cooldown, "
           "in_flight), freeing the worker slot, or that a cooldown emptied while their call "
           "waited for its send (reason: held_back; the call asks again)", "process"),
    Metric("drover_tool_calls", "counter", ("tool", "outcome"),
           "tool calls by outcome (ok, error: the model got an is_error result)", "process"),
    Metric("drover_tool_call_duration_seconds", "histogram", ("tool",),
           "one tool call, its rate-limit wait excluded", "process", TOOL_BUCKETS),
    Metric("drover_subagents_finished", "counter", ("status",),
           "sub-agents that ended, by their record's status", "process"),
    Metric("drover_jobs_submitted", "counter", ("tenant",), "jobs submitted", "process"),
    Metric("drover_gateway_requests", "counter", ("tenant", "outcome"),
           "requests to drover gateway by the caller's tenant (unknown: no valid gateway key) "
           "and outcome: ok, 429, 4xx, 5xx (as the provider answered), refused (no valid "
           "gateway key: 401, not forwarded), unavailable (Redis did not answer: 503, not "
           "forwarded), disconnected (the caller left mid-call)", "process"),
    Metric("drover_gateway_tokens", "counter", ("tenant", "gen_ai_token_type"),
           "tokens of the calls through drover gateway by the caller's tenant and type (as "
           "drover_gen_ai_client_token_usage)", "process"),
    # --- read from the fleet's state in Redis at each scrape ----------------------------
    Metric("drover_scope_limit_per_second", "gauge", ("scope", "dimension"),
           "the provider's limit of a scope (configured, else learned from -limit headers), "
           "per second (a per-minute limit / 60)", "state"),
    Metric("drover_scope_target_per_second", "gauge", ("scope", "dimension"),
           "what the limiter aims at: the limit times DROVER_TARGET_UTILIZATION, per second",
           "state"),
    Metric("drover_scope_planned_per_second", "gauge", ("scope", "dimension"),
           "planned use: the limiter's counters over the last 60 s (requests at their "
           "planned send second, tokens as settled) / 60", "state"),
    Metric("drover_scope_headroom_per_second", "gauge", ("scope", "dimension"),
           "target minus planned use (negative: over the target)", "state"),
    Metric("drover_scope_leases_in_flight", "gauge", ("scope",),
           "requests holding an in-flight lease of the scope", "state"),
    Metric("drover_scope_cooldown_seconds", "gauge", ("scope",),
           "seconds left of the scope's cooldown after a 429 (0: none)", "state"),
    Metric("drover_pool_key_disabled", "gauge", ("key",),
           "1 while a pool's key (DROVER_KEYS, by alias) is disabled after a 401/403, else 0",
           "state"),
    Metric("drover_job_subagents", "gauge", ("job", "tenant", "status"),
           "an active job's sub-agents by status (waiting: queued or waiting for a retry; "
           "running: in a worker's loop now); active jobs only, at most "
           "DROVER_METRICS_MAX_JOBS of them", "state"),
    Metric("drover_job_oldest_waiting_seconds", "gauge", ("job", "tenant"),
           "how long the job's waiting sub-agents have been outstanding (since its fan-out; "
           "0 when none waits)", "state"),
    Metric("drover_job_in_line", "gauge", ("job", "tenant"),
           "an active job's sub-agents waiting in the fair-share window's line (not yet "
           "published: behind other jobs' share, or beyond what the limiter serves within "
           "its horizon); same job cap as drover_job_subagents", "state"),
    Metric("drover_job_last_dispatch_seconds", "gauge", ("job", "tenant"),
           "expected seconds until the job's last sub-agent is published, at the rate its "
           "records have come in (0 when none waits in line; absent before its first record)",
           "state"),
    Metric("drover_gateway_calls", "gauge", ("tenant", "state"),
           "drover gateway's calls in the fair-share window by the caller's tenant, over all "
           "gateway processes: in_line (waiting for a place: behind other tenants' share, or "
           "beyond what the limiter serves within its horizon), out (holding one: waiting for "
           "the limiter, sent, streaming)", "state"),
    Metric("drover_line_cap", "gauge", ("queue",),
           "sub-agents the limiter can serve within its horizon, the most the queue's window "
           "lets out while the key is the bottleneck (0: no cap reported)", "state"),
    Metric("drover_jobs_stalled", "gauge", (),
           "jobs the recovery sweep found stalled (sub-agents out, no record for three "
           "heartbeat TTLs, no live worker holding any) and not seen moving since", "state"),
    Metric("drover_window_repairs", "counter", ("kind",),
           "repairs the recovery sweep had to make (kind: resent = parts whose claim named a "
           "dead worker that its list did not, window_places = places counted as deferred "
           "that were not, stalled_jobs = jobs found stalled)", "state"),
    Metric("drover_tenant_subagents", "gauge", ("tenant", "status"),
           "sub-agents of a tenant's active jobs by status", "state"),
    Metric("drover_tenant_jobs_active", "gauge", ("tenant",),
           "a tenant's jobs that are queued, planning or running", "state"),
    Metric("drover_tenant_oldest_waiting_seconds", "gauge", ("tenant",),
           "the longest drover_job_oldest_waiting_seconds among a tenant's active jobs",
           "state"),
    Metric("drover_queue_messages", "gauge", ("queue",),
           "task messages waiting in the broker queue (retries counting down in a worker's "
           "memory are not in it: see the waiting sub-agents)", "state"),
    Metric("drover_workers_alive", "gauge", (),
           "Celery worker nodes whose heartbeat is fresh", "state"),
    Metric("drover_worker_processes_alive", "gauge", (),
           "worker processes whose liveness heartbeat (workers.jobs.liveness, the one the "
           "recovery sweep trusts) has not expired", "state"),
    Metric("drover_results_store_behind_jobs", "gauge", (),
           "jobs whose records or end the results store (DROVER_RESULTS_URL) missed and has "
           "not caught up on yet (Redis keeps them)", "state"),
    Metric("drover_results_store_behind_seconds", "gauge", (),
           "how long the results store has been behind on the oldest of them (0: caught up)",
           "state"),
    Metric("drover_exporter_jobs_without_series", "gauge", (),
           "active jobs left out of the drover_job_* series by DROVER_METRICS_MAX_JOBS",
           "state"),
    Metric("drover_exporter_redis_up", "gauge", (),
           "1 when the exporter could read Redis at this scrape", "state"),
    Metric("drover_exporter_scrape_duration_seconds", "gauge", (),
           "how long the exporter took to read the fleet's state", "state"),
)

_BY_NAME = {m.name: m for m in METRICS}


def metric(name: str) -> Metric:
    return _BY_NAME[name]
