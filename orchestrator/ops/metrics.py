"""``drover metrics --port 9808``: one Prometheus scrape target for the whole fleet.

A small exporter process (like celery-exporter): at each scrape a custom ``Collector``
reads, from Redis,

- the counters and histograms every worker and submitter adds there
  (``drover.workers.telemetry._recorder``): LLM calls by outcome, their duration, tokens by type,
  limiter waits and deferrals, tool calls, finished sub-agents, submitted jobs;
- the limiter's state of every scope it saw within ``DROVER_STATS_WINDOW_S``, through the
  limiter's public ``Limiter.scopes/state/usage`` (what ``drover stats`` reads): limits,
  targets, planned use over the last 60 s and headroom per dimension, leases, cooldown;
- the active jobs (registered at submit, dropped here once they end): sub-agents by status,
  how long the waiting ones have waited, per job (newest ``DROVER_METRICS_MAX_JOBS``) and per
  tenant; the broker queues' backlog; the workers whose heartbeat is fresh.

So it can run anywhere that reaches Redis and the broker, as one instance: every series is
fleet-wide, and Prometheus needs no service discovery of the workers. Finished records are
read from each job's event stream incrementally (only the entries since the last scrape).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from drover.orchestrator.ops.stats import scope_usage
from drover.workers.jobs import liveness
from drover.workers.jobs.meta import ACTIVE
from drover.workers.jobs.records import STATUSES
from drover.workers.limiter import split_llm_scope
from drover.workers.recovery import stalled_jobs, window_repairs
from drover.workers.services import Services
from drover.workers.telemetry import (
    CALL_OUTCOMES,
    METRICS,
    SUBAGENT_STATUSES,
    TelemetryReader,
    metric,
)

__all__ = ["DroverCollector", "serve"]

log = logging.getLogger(__name__)
STREAM_PAGE = 2000
SCOPES_REFRESH_S = 15.0


@dataclass
class _JobSeen:
    """What the exporter has read of one active job's event stream so far."""

    last_id: str = "0-0"
    done: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))


class DroverCollector(Collector):
    """Reads the fleet's series from Redis at every ``collect()`` (every scrape)."""

    def __init__(self, shared: Services, *, broker_queues: bool = True):
        # ``shared``: the root's parts (the CLI's, or a test's own with a client of its own).
        self.settings = shared.settings
        self.r, self.limiter, self.store = shared.redis, shared.limiter, shared.store
        self.shared = shared
        self.telemetry = TelemetryReader(self.r, self.settings.key_prefix)
        self.broker_queues = broker_queues
        self._broker: Any = None
        self._jobs: dict[str, _JobSeen] = {}
        self._scope_list: list[str] | None = None
        self._lock = threading.Lock()  # one scrape at a time: the stream cursors are shared

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not read Redis

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            started = time.perf_counter()
            families: list[Metric] = []
            up = 1.0
            try:
                process, scopes = self._process_series()
                families += process
                families += self._scope_series(scopes)
                procs = self._procs()
                families += self._job_series(procs)
                families.append(self._gauge("drover_workers_alive", [((), len(
                    {p["node"] for p in procs if p.get("node")}))]))
                families.append(self._gauge("drover_worker_processes_alive",
                                            [((), self._live_processes())]))
                jobs, oldest_s = self.store.outcomes.behind()
                families.append(self._gauge("drover_results_store_behind_jobs", [((), jobs)]))
                families.append(self._gauge("drover_results_store_behind_seconds",
                                            [((), oldest_s)]))
            except redis.RedisError as error:
                log.warning("cannot read Redis for this scrape (%s: %s)",
                            type(error).__name__, error)
                up = 0.0
            families.append(self._gauge("drover_exporter_redis_up", [((), up)]))
            families.append(self._gauge("drover_exporter_scrape_duration_seconds",
                                        [((), time.perf_counter() - started)]))
        yield from families

    # --- what the processes counted -------------------------------------------------------
    def _process_series(self) -> tuple[list[Metric], list[str]]:
        """The processes' series, and the limiter's scopes (see ``_scopes``)."""
        counters: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        hists: dict[str, dict[tuple[str, ...], dict[str, float]]] = defaultdict(
            lambda: defaultdict(dict))
        known = {m.name: m for m in METRICS if m.source == "process"}
        for name, labels, part, value in self.telemetry.counters():
            m = known.get(name)
            if m is None or len(labels) != len(m.labels):  # another version's series
                continue
            if m.kind == "counter":
                counters[name][labels] = value
            elif part is not None:
                hists[name][labels][part] = value
        scopes = self._scopes({labels[0] for labels in counters.get("drover_llm_calls", {})})
        # Every outcome of every LLM scope exists from the scope's first call on, at 0 until
        # it happens: rate() and increase() see the first 429 only if the series was there
        # before it.
        calls = counters["drover_llm_calls"]
        for scope in scopes:
            if split_llm_scope(scope) is not None:
                for outcome in CALL_OUTCOMES:
                    calls.setdefault((scope, outcome), 0.0)
        out: list[Metric] = []
        for m in known.values():
            family: CounterMetricFamily | HistogramMetricFamily
            if m.kind == "counter":
                family = CounterMetricFamily(m.name, m.help, labels=m.labels)
                for labels, value in sorted(counters.get(m.name, {}).items()):
                    family.add_metric(list(labels), value)
            else:
                family = HistogramMetricFamily(m.name, m.help, labels=m.labels)
                for labels, parts in sorted(hists.get(m.name, {}).items()):
                    total, buckets = 0.0, []
                    for bound in (*m.buckets, float("inf")):
                        le = "+Inf" if bound == float("inf") else repr(float(bound))
                        total += parts.get(le, 0.0)
                        buckets.append((le, total))
                    family.add_metric(list(labels), buckets, parts.get("sum", 0.0))
            out.append(family)
        return out, scopes

    def refresh_scopes(self) -> None:
        """List the limiter's scopes again. Listing walks Redis's whole keyspace (SCAN): on a
        Redis that also holds millions of other keys it takes seconds, more than Prometheus
        waits for a scrape, so ``serve`` calls this from a thread of its own."""
        self._scope_list = self.limiter.scopes()

    def _scopes(self, counted: set[str]) -> list[str]:
        """The last listing's scopes (the first scrape lists them), and every LLM scope a
        process counted calls of, listed or not yet."""
        if self._scope_list is None:
            self.refresh_scopes()
        return sorted(set(self._scope_list or ()) | counted)

    # --- the limiter ----------------------------------------------------------------------
    def _scope_series(self, scopes: list[str]) -> list[Metric]:
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = defaultdict(list)
        for scope in scopes:
            usage = scope_usage(self.limiter, self.settings, scope, 60)
            last = usage.last(60)
            for name, _attr, _label in usage.dimensions():
                limit, target = usage.limits.get(name), usage.targets.get(name)
                planned = last.get(name, 0) / 60.0
                labels = (scope, name)
                if limit is not None:
                    rows["drover_scope_limit_per_second"].append((labels, limit / 60.0))
                if target is not None:
                    rows["drover_scope_target_per_second"].append((labels, target / 60.0))
                    rows["drover_scope_headroom_per_second"].append(
                        (labels, target / 60.0 - planned))
                rows["drover_scope_planned_per_second"].append((labels, planned))
            rows["drover_scope_leases_in_flight"].append(((scope,), usage.leases))
            rows["drover_scope_cooldown_seconds"].append(((scope,), max(0.0, usage.cooldown_s)))
        names = ("drover_scope_limit_per_second", "drover_scope_target_per_second",
                 "drover_scope_planned_per_second", "drover_scope_headroom_per_second",
                 "drover_scope_leases_in_flight", "drover_scope_cooldown_seconds")
        out = [self._gauge(name, rows.get(name, [])) for name in names]
        # A pool's keys (with one key, that key: never disabled, its refusal fails the job)
        disabled = self.limiter.disabled_keys()
        aliases = sorted({k.alias for k in self.settings.keys} | set(disabled)) or [
            self.settings.key_alias]
        out.append(self._gauge("drover_pool_key_disabled",
                               [((alias,), 1.0 if alias in disabled else 0.0)
                                for alias in aliases]))
        return out

    # --- processes, jobs, tenants, queues -------------------------------------------------
    def _procs(self) -> list[dict[str, str]]:
        """The live processes' heartbeats (an expired one leaves the registry here)."""
        return self.telemetry.processes()

    def _live_processes(self) -> int:
        """Processes alive by the recovery sweep's own heartbeats (the sweep prunes the dead)."""
        return sum(liveness.registered_workers(self.r, self.settings.key_prefix).values())

    def _job_series(self, procs: list[dict[str, str]]) -> list[Metric]:
        now = time.time()
        registered = self.telemetry.jobs()
        job_ids = [job.job_id for job in registered]
        running: dict[str, int] = defaultdict(int)
        for beat in procs:
            for k, v in beat.items():
                if k.startswith("running:"):
                    running[k.removeprefix("running:")] += int(v)
        metas = self.store.meta.many(job_ids, "status", "n", "launched", "created", "queue")
        ended = [job for job, meta in zip(registered, metas, strict=True)
                 if meta[0] is None or meta[0] not in ACTIVE]
        self.telemetry.forget_jobs(ended)
        for job in ended:
            self._jobs.pop(job.job_id, None)
        gone = {job.job_id for job in ended}
        active = [(job.job_id, meta, job.tenant)
                  for job, meta in zip(registered, metas, strict=True) if job.job_id not in gone]
        self._read_streams([j for j, _, _ in active])

        per_job: list[tuple[tuple[str, ...], float]] = []
        oldest_job: list[tuple[tuple[str, ...], float]] = []
        in_line: list[tuple[tuple[str, ...], float]] = []
        last_dispatch: list[tuple[tuple[str, ...], float]] = []
        shares: dict[str, dict[str, Any]] = {}
        server_now = self.store.meta.server_time()
        by_tenant: dict[str, dict[str, int]] = defaultdict(
            lambda: dict.fromkeys(SUBAGENT_STATUSES, 0))
        tenant_jobs: dict[str, int] = defaultdict(int)
        tenant_oldest: dict[str, float] = defaultdict(float)
        queues = {self.settings.queue}
        cap = self.settings.metrics_max_jobs
        for rank, (job_id, meta, tenant) in enumerate(active):
            _status, n, launched, created, queue = meta
            if queue:
                queues.add(queue)
            done = self._jobs[job_id].done
            counts = dict.fromkeys(SUBAGENT_STATUSES, 0)
            counts.update(done)
            counts["running"] = running.get(job_id, 0)
            total = int(n or 0)
            counts["waiting"] = max(0, total - sum(done.values()) - counts["running"])
            since = float(launched or created or now)
            oldest = max(0.0, now - since) if counts["waiting"] else 0.0
            tenant_jobs[tenant] += 1
            tenant_oldest[tenant] = max(tenant_oldest[tenant], oldest)
            for status, value in counts.items():
                by_tenant[tenant][status] += value
            if rank < cap:
                per_job += [((job_id, tenant, s), v) for s, v in counts.items()]
                oldest_job.append(((job_id, tenant), oldest))
                line_queue = queue or self.settings.queue
                if line_queue not in shares:
                    shares[line_queue] = {
                        j.job_id: j for j in self.shared.fairshare(line_queue).jobs()}
                share = shares[line_queue].get(job_id)
                in_line.append(((job_id, tenant), share.waiting if share else 0))
                eta = share.last_dispatch_in_s(server_now) if share else 0.0
                if eta is not None:
                    last_dispatch.append(((job_id, tenant), eta))
        tenant_rows = [((t, s), v) for t, counts in sorted(by_tenant.items())
                       for s, v in counts.items()]
        return [
            self._gauge("drover_job_subagents", per_job),
            self._gauge("drover_job_oldest_waiting_seconds", oldest_job),
            self._gauge("drover_tenant_subagents", tenant_rows),
            self._gauge("drover_tenant_jobs_active", [((t,), n) for t, n in tenant_jobs.items()]),
            self._gauge("drover_tenant_oldest_waiting_seconds",
                        [((t,), v) for t, v in tenant_oldest.items()]),
            self._gauge("drover_queue_messages", self._queue_lengths(sorted(queues))),
            self._gauge("drover_job_in_line", in_line),
            self._gauge("drover_job_last_dispatch_seconds", last_dispatch),
            self._gauge("drover_line_cap", [((q,), self.shared.fairshare(q).cap() or 0)
                                            for q in sorted(queues)]),
            self._gauge("drover_gateway_calls", self._gateway_calls(sorted(queues), shares)),
            self._gauge("drover_jobs_stalled", [((), len(stalled_jobs(
                self.r, self.settings.key_prefix)))]),
            self._repairs(),
            self._gauge("drover_exporter_jobs_without_series",
                        [((), max(0, len(active) - cap))]),
        ]

    def _read_streams(self, job_ids: list[str]) -> None:
        """Count the records each job's stream gained since the last scrape."""
        todo = list(job_ids)
        while todo:
            after = {job_id: self._jobs.setdefault(job_id, _JobSeen()).last_id
                     for job_id in todo}
            found = self.store.stream.new_statuses(after, count=STREAM_PAGE)
            for job_id, entries in found.items():
                seen = self._jobs[job_id]
                for entry_id, status in entries:
                    seen.last_id = entry_id
                    if status in seen.done:
                        seen.done[status] += 1
            todo = [job_id for job_id, entries in found.items() if len(entries) == STREAM_PAGE]

    def _gateway_calls(self, queues: list[str], shares: dict[str, dict[str, Any]]
                       ) -> list[tuple[tuple[str, ...], float]]:
        """The gateway's calls of each tenant in the queues' windows (calls jobs)."""
        calls: dict[tuple[str, ...], float] = defaultdict(float)
        for queue in queues:
            jobs = shares.get(queue)
            listed = jobs.values() if jobs is not None else self.shared.fairshare(queue).jobs()
            for share in listed:
                if share.calls:
                    calls[(share.tenant, "in_line")] += share.waiting
                    calls[(share.tenant, "out")] += share.out
        return sorted(calls.items())

    def _queue_lengths(self, queues: list[str]) -> list[tuple[tuple[str, ...], float]]:
        if not self.broker_queues:
            return []
        from kombu.exceptions import ChannelError, OperationalError

        try:
            if self._broker is None:
                # This exporter's own settings, not the Celery app's import-time ones.
                from kombu import Connection

                from drover.config.celery import celery_config

                conf = celery_config(self.settings)
                self._broker = Connection(conf["broker_url"],
                                          transport_options=conf["broker_transport_options"])
            virtual = self._broker.transport.driver_type == "redis"
            channel = self._broker.channel()
            out: list[tuple[tuple[str, ...], float]] = []
            try:
                for queue in queues:
                    if virtual:
                        # kombu's passive declare looks for the queue without the transport's
                        # global_keyprefix (so never finds it); on Redis a declare creates
                        # nothing and returns the list's length, priorities included.
                        count = channel.queue_declare(queue=queue).message_count
                    else:
                        try:
                            count = channel.queue_declare(queue=queue, passive=True).message_count
                        except ChannelError:  # no such queue yet; the broker closed the channel
                            count = 0
                            channel = self._broker.channel()
                    out.append(((queue,), float(count)))
            finally:
                channel.close()
            return out
        except (OperationalError, OSError, redis.RedisError) as error:
            log.warning("cannot read the broker's queues (%s)", type(error).__name__)
            if self._broker is not None:
                self._broker.release()
            self._broker = None
            return []

    def _repairs(self) -> Metric:
        m = metric("drover_window_repairs")
        family = CounterMetricFamily(m.name, m.help, labels=m.labels)
        counted = window_repairs(self.r, self.settings.key_prefix)
        for kind in ("resent", "window_places", "stalled_jobs"):
            family.add_metric([kind], float(counted.get(kind, 0)))
        return family

    @staticmethod
    def _gauge(name: str, rows: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
        m = metric(name)
        family = GaugeMetricFamily(m.name, m.help, labels=m.labels)
        for labels, value in rows:
            family.add_metric(list(labels), float(value))
        return family


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refresh_scopes(collector: DroverCollector, stop: threading.Event) -> None:
    while not stop.wait(SCOPES_REFRESH_S):
        try:
            collector.refresh_scopes()
        except redis.RedisError as error:
            log.warning("cannot list the limiter's scopes (%s: %s)", type(error).__name__, error)


def serve(shared: Services, port: int = 9808, addr: str = "127.0.0.1",
          *, ready: threading.Event | None = None) -> int:
    """Serve ``/metrics`` until SIGTERM or Ctrl-C."""
    from prometheus_client import start_http_server

    settings = shared.settings
    registry = CollectorRegistry(auto_describe=False)
    collector = DroverCollector(shared)
    registry.register(collector)
    server, thread = start_http_server(port, addr=addr, registry=registry)
    stop = threading.Event()
    threading.Thread(target=_refresh_scopes, args=(collector, stop), daemon=True,
                     name="drover-metrics-scopes").start()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info("serving drover's metrics on http://%s:%d/metrics", addr, port)
    print(f"drover metrics on http://{addr}:{port}/metrics "
          f"(prefix {settings.key_prefix!r})", flush=True)
    if ready is not None:
        ready.set()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(timeout=5)
    return 0
