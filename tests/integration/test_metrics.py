"""`drover metrics` serves the fleet's series from Redis: every metric has the name, type and
labels the table in workers/telemetry/_metrics.py promises, the counters of many processes add
up, job labels stay bounded, and a real job's counts are what the provider saw."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from drover.config.settings import Settings, load_settings
from drover.orchestrator.ops.metrics import DroverCollector
from drover.workers.connections.redis_clients import sync_redis
from drover.workers.jobs import liveness
from drover.workers.jobs.records import SubagentResult
from drover.workers.jobs.spec import JobSpec
from drover.workers.jobs.store import JobStore
from drover.workers.limiter import Limiter, ScopeLimits, llm_scope
from drover.workers.services import Services, services
from drover.workers.telemetry import (
    CALL_OUTCOMES,
    METRICS,
    Recorder,
    TelemetryReader,
    register_job,
)
from tests.helpers.metrics import scrape, value

SCOPE = llm_scope("obs", "claude-test")
LIMITS = ScopeLimits(rpm=600, itpm=60_000, otpm=6_000)


@pytest.fixture
def settings(key_prefix: str, redis_url: str) -> Settings:
    return load_settings(redis_url=redis_url, key_prefix=key_prefix, metrics_max_jobs=2)


@pytest.fixture
def recorders(settings: Settings) -> Iterator[list[Recorder]]:
    made: list[Recorder] = []
    yield made
    for rec in made:
        rec.close()


def _a_fleet(settings: Settings, recorders: list[Recorder]) -> JobStore:
    """Two worker processes that counted things, a scope the limiter saw, three active jobs."""
    client = sync_redis(settings.redis_url)
    for n in range(2):
        rec = Recorder(sync_redis(settings.redis_url), settings.key_prefix, flush_s=3600)
        recorders.append(rec)
        rec.worker_ready(f"celery@host{n}")
        genai = ("chat", "anthropic", "claude-test")
        rec.observe("drover_gen_ai_client_operation_duration_seconds", (*genai, ""), 0.5)
        rec.observe("drover_gen_ai_client_operation_duration_seconds",
                    (*genai, "rate_limit_error"), 0.05)
        for kind in ("input", "output", "cache_read", "cache_write"):
            rec.inc("drover_gen_ai_client_token_usage", (*genai, kind), 100)
        rec.observe("drover_gen_ai_server_time_to_first_token_seconds", genai, 0.4)
        rec.observe("drover_gen_ai_server_time_per_output_token_seconds", genai, 0.025)
        for outcome in CALL_OUTCOMES:
            rec.inc("drover_llm_calls", (SCOPE, outcome))
        rec.observe("drover_limiter_acquire_wait_seconds", (SCOPE,), 0.2)
        rec.inc("drover_limiter_deferrals", (SCOPE, "horizon"))
        rec.inc("drover_tool_calls", ("lookup", "ok"))
        rec.observe("drover_tool_call_duration_seconds", ("lookup",), 0.01)
        rec.inc("drover_subagents_finished", ("ok",))
        rec.inc("drover_jobs_submitted", ("acme",))
        rec.inc("drover_cost_usd", ("claude-test", "acme"), 0.25)
        rec.inc("drover_unpriced_calls", ("claude-test",))
        rec.inc("drover_gateway_requests", ("web", "ok"))
        rec.inc("drover_gateway_tokens", ("web", "output"), 40)
    limiter = Limiter(client, prefix=settings.key_prefix)
    grant = limiter.acquire(SCOPE, LIMITS, input_tokens=120, output_tokens=50, lease_ttl_s=60)
    limiter.settle(SCOPE, LIMITS, grant, input_tokens=120, output_tokens=30)
    limiter.acquire(SCOPE, LIMITS, input_tokens=10, output_tokens=10, lease_ttl_s=60)  # in flight
    store = JobStore(client, prefix=settings.key_prefix)
    for j, tenant in enumerate(("acme", "acme", "beta")):
        job_id = f"job{j}"
        store.specs.create(job_id, JobSpec(subtasks=["x"]), ["a", "b", "c", "d"], status="queued",
                           queue="q-obs")
        store.meta.claim_launch(job_id)
        register_job(client, settings.key_prefix, job_id, tenant, keep_s=3600)
        time.sleep(0.002)  # the newest is the last registered
    _broker_messages(settings, "q-obs", 3)
    store.records.put(SubagentResult(job_id="job2", index=0, status="ok"))
    store.records.put(SubagentResult(job_id="job2", index=1, status="failed"))
    recorders[0].running("job2", +1)
    _a_gateway_call(settings, "web")
    beat = liveness.Heartbeat(settings, client=client)
    beat.stop()  # one beat is enough: its key lives for DROVER_HEARTBEAT_TTL_S
    client.set(liveness.heartbeat_key(settings.key_prefix, beat.id), "{}", ex=60)
    for rec in recorders:
        rec.flush()
    return store


def _a_gateway_call(settings: Settings, tenant: str) -> None:
    """A gateway's call of ``tenant`` holding its place in the queue's fair-share window."""
    import asyncio

    import redis.asyncio

    from drover.workers.fairshare import CallPlaces

    async def enter() -> None:
        client = redis.asyncio.Redis.from_url(settings.redis_url)
        await CallPlaces(client, settings, lambda runs: None).enter(tenant)
        await client.aclose()

    asyncio.run(enter())


def _broker_messages(settings: Settings, queue: str, n: int) -> None:
    """``n`` messages waiting in ``queue`` of the broker the settings name."""
    from kombu import Connection

    from drover.config.celery import celery_config

    conf = celery_config(settings)
    with Connection(conf["broker_url"], transport_options=conf["broker_transport_options"]
                    ) as conn:
        q = conn.SimpleQueue(queue)
        for i in range(n):
            q.put({"n": i})
        q.close()


def test_every_metric_has_its_name_type_and_labels(settings, recorders):
    _a_fleet(settings, recorders)
    families = scrape(DroverCollector(services(settings)))

    for m in METRICS:
        assert m.name in families, f"{m.name} missing from the scrape"
        family = families[m.name]
        assert family.type == m.kind, m.name
        assert family.documentation, m.name
        assert family.samples, f"{m.name} has no samples"
        for sample in family.samples:
            if m.kind == "histogram":
                assert sample.name in {f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"}
            else:
                assert sample.name == m.exposed
            extra = {"le"} if sample.name.endswith("_bucket") else set()
            assert set(sample.labels) == set(m.labels) | extra, (sample.name, sample.labels)
        assert m.name.startswith("drover_"), m.name
        if m.kind == "histogram" or "seconds" in m.name:
            assert "_seconds" in m.name, f"{m.name}: durations are in seconds"


def test_counters_of_every_process_add_up_and_histograms_are_cumulative(settings, recorders):
    _a_fleet(settings, recorders)
    families = scrape(DroverCollector(services(settings)))

    assert value(families, "drover_llm_calls", "drover_llm_calls_total", scope=SCOPE,
                 outcome="429") == 2  # one from each process
    assert value(families, "drover_gen_ai_client_token_usage",
                 "drover_gen_ai_client_token_usage_total", gen_ai_token_type="cache_read") == 200
    hist = "drover_gen_ai_client_operation_duration_seconds"
    assert value(families, hist, f"{hist}_bucket", error_type="", le="0.32") == 0
    assert value(families, hist, f"{hist}_bucket", error_type="", le="0.64") == 2
    assert value(families, hist, f"{hist}_bucket", error_type="", le="+Inf") == 2
    assert value(families, hist, f"{hist}_count", error_type="rate_limit_error") == 2
    assert value(families, hist, f"{hist}_sum", error_type="") == pytest.approx(1.0)
    assert value(families, "drover_workers_alive") == 2
    assert value(families, "drover_worker_processes_alive") == 1  # the liveness heartbeat


def test_scope_series_come_from_the_limiter(settings, recorders):
    _a_fleet(settings, recorders)
    families = scrape(DroverCollector(services(settings)))

    target = value(families, "drover_scope_target_per_second", scope=SCOPE, dimension="requests")
    assert target == pytest.approx(600 / 60)
    planned = value(families, "drover_scope_planned_per_second", scope=SCOPE,
                    dimension="input_tokens")
    assert planned == pytest.approx(120 / 60)
    assert value(families, "drover_scope_headroom_per_second", scope=SCOPE,
                 dimension="input_tokens") == pytest.approx(60_000 / 60 - 120 / 60)
    assert value(families, "drover_scope_leases_in_flight", scope=SCOPE) == 1
    assert value(families, "drover_scope_cooldown_seconds", scope=SCOPE) == 0


def test_only_the_first_scrape_walks_the_keyspace_for_scopes(key_prefix, recorders):
    """Listing the limiter's scopes is a SCAN over every key in Redis, seconds on a Redis
    shared with millions of other keys: later scrapes reuse the listing (``drover metrics``
    lists again from a thread of its own), so none outlasts Prometheus's scrape timeout.

    On a redis-server of its own: SCANs are counted server-wide (INFO commandstats), and the
    tests beside it (pytest-xdist) scan the shared Redis (4 of theirs fell between the two
    counts in a fresh-clone run). It proves what it did on the shared one."""
    import redis

    from drover.orchestrator.ops.services import start_redis_server

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (Debian: apt-get install redis-server)")
    server = start_redis_server()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        settings = load_settings(redis_url=server.url, key_prefix=key_prefix,
                                 metrics_max_jobs=2)
        _a_fleet(settings, recorders)
        collector = DroverCollector(services(settings), broker_queues=False)
        scrape(collector)

        def scans() -> int:
            stats = client.info("commandstats").get("cmdstat_scan", {})
            return int(stats.get("calls", 0))

        before = scans()
        tool = "tool:lookup"
        Limiter(client, prefix=settings.key_prefix).acquire(tool, ScopeLimits(rpm=60))
        families = scrape(collector)
        assert scans() == before
        assert {s.labels["scope"] for s in families["drover_scope_leases_in_flight"].samples} \
            == {SCOPE}
        collector.refresh_scopes()  # what the exporter's thread does every SCOPES_REFRESH_S
        families = scrape(collector)
        assert {s.labels["scope"] for s in families["drover_scope_leases_in_flight"].samples} \
            == {SCOPE, tool}
    finally:
        for rec in recorders:  # their flush must not meet a stopped server
            rec.close()
        recorders.clear()
        client.close()
        server.close()


def test_the_worker_registry_expires_with_the_jobs(settings, redis_client):
    liveness.Heartbeat(settings, client=redis_client).stop()
    ttl = redis_client.ttl(liveness.workers_key(settings.key_prefix))
    assert 0 < ttl <= settings.result_ttl_s


def test_job_series_cover_active_jobs_only_and_at_most_the_cap(settings, recorders):
    store = _a_fleet(settings, recorders)
    collector = DroverCollector(services(settings))
    families = scrape(collector)

    jobs = {s.labels["job"] for s in families["drover_job_subagents"].samples}
    assert jobs == {"job2", "job1"}  # the newest two: DROVER_METRICS_MAX_JOBS=2
    assert value(families, "drover_exporter_jobs_without_series") == 1
    assert value(families, "drover_job_subagents", job="job2", status="ok") == 1
    assert value(families, "drover_job_subagents", job="job2", status="failed") == 1
    assert value(families, "drover_job_subagents", job="job2", status="running") == 1
    assert value(families, "drover_job_subagents", job="job2", status="waiting") == 1
    assert value(families, "drover_job_oldest_waiting_seconds", job="job2") >= 0
    # Every job counts in its tenant, capped or not.
    assert value(families, "drover_tenant_subagents", tenant="acme", status="waiting") == 8
    assert value(families, "drover_tenant_jobs_active", tenant="acme") == 2
    assert value(families, "drover_queue_messages", queue="q-obs") == 3

    store.outcomes.save(_done("job2"))  # job2 ends
    families = scrape(collector)
    jobs = {s.labels["job"] for s in families["drover_job_subagents"].samples}
    assert jobs == {"job1", "job0"}
    assert value(families, "drover_exporter_jobs_without_series") == 0
    assert "beta" not in {s.labels["tenant"] for s in families["drover_tenant_jobs_active"]
                          .samples}
    counted = {(job.job_id, job.tenant)
               for job in TelemetryReader(store.r, settings.key_prefix).jobs()}
    assert ("job2", "beta") not in counted and ("job1", "acme") in counted


def _done(job_id: str):  # noqa: ANN202
    from drover.workers.jobs.records import JobResult, Usage

    return JobResult(job_id=job_id, status="done", results=[], counts={}, usage=Usage(),
                     wall_s=1.0)


def test_a_scrape_with_redis_down_says_so_instead_of_failing(settings):
    broken = load_settings(redis_url="redis://127.0.0.1:1/0", key_prefix=settings.key_prefix)
    import redis

    client = redis.Redis.from_url(broken.redis_url, socket_connect_timeout=0.2)
    families = scrape(DroverCollector(Services(broken, client=client), broker_queues=False))
    assert value(families, "drover_exporter_redis_up") == 0


def test_a_job_on_the_simulator_counts_what_the_provider_saw(sim, worker, drover_env):
    from drover import submit
    from drover.config import get_settings
    from drover.workers.services import services

    worker(concurrency=4)
    settings = get_settings()
    scope = llm_scope(settings.key_alias, settings.model)
    subtasks = [f"Research topic {i} {uuid.uuid4().hex[:4]}" for i in range(5)]
    subtasks[2] += " [[sim:429:1]]"
    # What earlier tests ran in this process is counted before, not in, this job's figures.
    services().recorder.flush()
    before = scrape(DroverCollector(services(settings), broker_queues=False))
    tokens_before = {t: _tokens(before, settings.model, t)
                     for t in ("input", "output", "cache_read", "cache_write")}

    result = submit(JobSpec(subtasks=subtasks, max_tokens=200)).wait(timeout=90)
    assert result.counts["ok"] == 5
    services().recorder.flush()
    families = scrape(DroverCollector(services(settings), broker_queues=False))

    provider = sim.stats()
    calls = "drover_llm_calls_total"
    assert value(families, "drover_llm_calls", calls, scope=scope, outcome="ok") == \
        provider["accepted"]
    assert value(families, "drover_llm_calls", calls, scope=scope, outcome="429") == \
        provider["rejected_429"] == 1
    assert _tokens(families, settings.model, "output") - tokens_before["output"] == \
        provider["output_tokens"]
    counted_in = sum(_tokens(families, settings.model, t) - tokens_before[t]
                     for t in ("input", "cache_write"))
    assert counted_in == provider["input_tokens"]
    wait = "drover_limiter_acquire_wait_seconds"
    # Each send acquired once, and a call that a 429's cooldown held back while it waited for
    # its send (four run at once) acquired again (one run in about seven had one such call).
    held = sum(s.value for s in families["drover_limiter_deferrals"].samples
               if s.labels.get("scope") == scope and s.labels.get("reason") == "held_back")
    assert value(families, wait, f"{wait}_count", scope=scope) == provider["accepted"] + 1 + held
    assert value(families, "drover_scope_target_per_second", scope=scope,
                 dimension="requests") == pytest.approx(6000 * 0.95 / 60)


def _tokens(families: dict[str, object], model: str, kind: str) -> float:
    return sum(s.value for s in families["drover_gen_ai_client_token_usage"].samples
               if s.labels.get("gen_ai_request_model") == model
               and s.labels.get("gen_ai_token_type") == kind)


# --- the dashboard and the compose Prometheus use these series ------------------------------

def _exposed_names() -> set[str]:
    names = set()
    for m in METRICS:
        names.add(m.exposed)
        if m.kind == "histogram":
            names |= {f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"}
    return names


def test_the_grafana_dashboard_queries_only_series_that_exist():
    import json
    import re

    from tests.helpers import ROOT

    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/drover.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    used = {name for e in exprs for name in re.findall(r"\b(drover_[a-z0-9_]+)", e)}
    assert used <= _exposed_names(), used - _exposed_names()
    # limits vs use per scope, waits, 429/529 rates, jobs and backlog, workers alive
    for wanted in ("drover_scope_planned_per_second", "drover_scope_limit_per_second",
                   "drover_limiter_acquire_wait_seconds_bucket", "drover_llm_calls_total",
                   "drover_tenant_subagents", "drover_queue_messages", "drover_workers_alive"):
        assert wanted in used, wanted
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboards_tenant_views_show_the_gateways_callers_too():
    """drover gateway's callers are tenants of the dashboard: the tenant variable lists the
    tenants of gateway requests and of spending (not only those with active jobs), and its
    gateway row shows each tenant's requests, tokens, calls in the fair-share line and
    spend, each filtered by that variable (test_gateway scrapes these series with a real
    gateway's calls in them)."""
    import json

    from tests.helpers import ROOT

    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/drover.json").read_text())
    [tenant] = [v for v in dashboard["templating"]["list"] if v["name"] == "tenant"]
    for series in ("drover_tenant_jobs_active", "drover_gateway_requests_total",
                   "drover_cost_usd_total"):
        assert series in tenant["query"]["query"], series
    [row] = [p for p in dashboard["panels"] if p["type"] == "row" and "gateway" in p["title"]]
    below = [p for p in dashboard["panels"] if p["gridPos"]["y"] > row["gridPos"]["y"]]
    exprs = [t["expr"] for p in below for t in p.get("targets", [])]
    for series in ("drover_gateway_requests_total", "drover_gateway_tokens_total",
                   "drover_gateway_calls", "drover_cost_usd_total"):
        [expr] = [e for e in exprs if series in e]
        assert 'tenant=~"$tenant"' in expr and "by (tenant" in expr, expr


def test_compose_runs_prometheus_on_the_exporter_and_flower_and_grafana_on_the_dashboard():
    """The compose Prometheus scrapes both, loads the alerts; promtool checks config and rules."""
    import shutil
    import subprocess

    yaml = pytest.importorskip("yaml", reason="PyYAML parses docker-compose.yml")
    from tests.helpers import ROOT

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert services["metrics"]["command"][:2] == ["drover", "metrics"]
    port = services["metrics"]["command"][services["metrics"]["command"].index("--port") + 1]
    config_path = ROOT / "deploy/prometheus/prometheus.yml"
    mounts = services["prometheus"]["volumes"]
    assert f"./{config_path.relative_to(ROOT)}:/etc/prometheus/prometheus.yml:ro" in mounts
    config = yaml.safe_load(config_path.read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"]
               for job in config["scrape_configs"]}
    assert targets == {"drover": [f"metrics:{port}"], "flower": ["flower:5555"]}
    assert "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    assert config["rule_files"] == ["alerts.yml"]
    import re

    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    used = {name for group in rules["groups"] for rule in group["rules"]
            for name in re.findall(r"\b(drover_[a-z0-9_]+)", rule["expr"])}
    assert used and used <= _exposed_names(), used - _exposed_names()
    grafana = services["grafana"]["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian package prometheus) checks the config's syntax")
    out = subprocess.run(["promtool", "check", "config", str(config_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# --- the exporter process and the benchmark -------------------------------------------------

def test_drover_metrics_serves_the_scrape_over_http_and_stops_on_sigterm(settings, recorders):
    import os
    import subprocess
    import sys
    import urllib.request

    from tests.helpers import ROOT, stop_process_group, wait_until
    from tests.helpers.ports import free_port

    _a_fleet(settings, recorders)
    env = {**os.environ, "DROVER_REDIS_URL": settings.redis_url,
           "DROVER_KEY_PREFIX": settings.key_prefix}

    def body(port: int) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "drover.orchestrator.cli", "metrics",
                             "--port", str(port)], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    text = wait_until("drover metrics to answer or exit",
                      lambda: body(port) or proc.poll() is not None, timeout=60)
    assert isinstance(text, str), proc.stderr.read()[-2000:]
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert value(families, "drover_llm_calls", "drover_llm_calls_total", scope=SCOPE,
                     outcome="ok") == 2
        assert value(families, "drover_exporter_redis_up") == 1
    finally:
        stop_process_group(proc, timeout=10)
    assert proc.returncode == 0
    assert f"127.0.0.1:{port}/metrics" in proc.stdout.read()


def test_the_scrape_benchmark_runs_and_leaves_no_key(redis_url, redis_client):
    import os
    import re
    import subprocess
    import sys

    from tests.helpers import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "bench.metrics_scrape", "--jobs", "3", "--subagents", "6",
         "--procs", "2", "--scrapes", "2", "--finish", "2"],
        cwd=ROOT, env={**os.environ, "DROVER_REDIS_URL": redis_url}, capture_output=True,
        text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "first scrape" in proc.stdout and "steady scrapes (2," in proc.stdout
    # Its own prefix's keys, which it names (other benchmarks' may come and go meanwhile: the
    # tests run side by side).
    [prefix] = re.findall(r"^keys under (drover-bench-\w+): \d+ deleted$", proc.stdout, re.M)
    assert not list(redis_client.scan_iter(match=f"{prefix}:*"))
