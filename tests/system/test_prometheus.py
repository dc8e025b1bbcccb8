"""A real Prometheus server scrapes `drover metrics` while a job runs on real worker processes
against the simulator: the request rate it reports for the scope is what the provider
accepted, and an injected 429 shows in the 429 series."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from drover import JobSpec
from drover.workers.limiter import llm_scope
from tests.helpers import ROOT, configure, stop_process_group, wait_until
from tests.helpers.fleet import submit_elsewhere
from tests.helpers.ports import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs the Prometheus server: apt-get install prometheus "
    "(.ci/run installs it)")
SCRAPE_MS = 250  # Prometheus extrapolates increase() by up to one interval: keep it short


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


@pytest.fixture
def own_prefix(monkeypatch: pytest.MonkeyPatch, drover_env: dict[str, str]) -> Iterator[str]:
    """A key prefix of this test's own (Celery's keys too), so the exporter reads this job's
    series only: by the end of a full run the session's prefix holds the counters of hundreds
    of scopes, and on a loaded box a scrape of them outlasts the 250 ms timeout. The jobs are
    submitted from processes of their own (this process's Celery app keeps the session's)."""
    prefix = f"drovertest-prom-{uuid.uuid4().hex[:8]}"
    configure(monkeypatch, drover_env, DROVER_KEY_PREFIX=prefix)
    yield prefix
    client = redis.Redis.from_url(drover_env["DROVER_REDIS_URL"])
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def exporter(drover_env: dict[str, str], own_prefix: str) -> Iterator[str]:
    """`drover metrics` as its own process; yields its host:port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "drover.orchestrator.cli", "metrics", "--port", str(port)],
        cwd=ROOT, env={**os.environ, **drover_env}, start_new_session=True,
        stdout=subprocess.DEVNULL)
    target = f"127.0.0.1:{port}"

    def up() -> bool:
        with contextlib.suppress(OSError):
            return b"drover_exporter_redis_up 1.0" in _get(f"http://{target}/metrics")
        return False

    try:
        wait_until("drover metrics to serve", up, timeout=30)
        yield target
    finally:
        stop_process_group(proc, timeout=5)


@pytest.fixture
def prometheus(exporter: str, tmp_path: Path) -> Iterator[Callable[[str, float | None], list]]:
    """A Prometheus server of this test's own scraping the exporter; yields a query function."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_MS}ms\n  scrape_timeout: {SCRAPE_MS}ms\n"
        f"scrape_configs:\n  - job_name: drover\n    static_configs:\n"
        f"      - targets: ['{exporter}']\n")
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def query(expr: str, at: float | None = None) -> list:
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        reply = json.loads(_get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}"))
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}")
        with contextlib.suppress(OSError):
            return bool(query('up{job="drover"} == 1'))
        return False

    def last_error() -> str:
        with contextlib.suppress(OSError, ValueError, KeyError):
            targets = json.loads(_get(f"{base}/api/v1/targets"))["data"]["activeTargets"]
            return "; ".join(f"{t['health']}: {t['lastError']!r} "
                             f"({t['lastScrapeDuration']:.3f} s)" for t in targets)
        return "unknown"

    try:
        try:
            wait_until("prometheus to scrape the exporter", ready, timeout=60)
        except AssertionError as error:
            raise AssertionError(f"{error}; its last scrape: {last_error()}") from None
        query.last_error = last_error  # type: ignore[attr-defined]
        yield query
    finally:
        with contextlib.suppress(ProcessLookupError):  # its data dir goes: no clean shutdown
            os.killpg(proc.pid, 9)
        proc.wait()
        log.close()


def _last(series: str) -> str:
    """The series' last scraped value: a scrape that timed out on a loaded machine marks every
    series stale, and a plain instant query right after it finds none."""
    return f"last_over_time({series}[10s])"


def _wait_for(prometheus: Callable[[str, float | None], list], what: str, series: str,
              expected: float) -> None:
    """Wait until the series' last scraped value is ``expected``; a timeout says what it was
    and how the last scrape went."""
    seen: list[float] = []

    def check() -> bool:
        seen.append(_value(prometheus(_last(series))))
        return seen[-1] == expected

    try:
        wait_until(what, check, timeout=30)
    except AssertionError as error:
        raise AssertionError(
            f"{error}: expected {expected}, last seen {seen[-3:]}; the last scrape: "
            f"{prometheus.last_error()}") from None  # type: ignore[attr-defined]


def _scraped_since(prometheus: Callable[[str, float | None], list], what: str, series: str,
                   t: float) -> None:
    """Wait until Prometheus holds a sample of the series scraped at ``t`` or later."""
    def check() -> bool:
        newest = prometheus(f"timestamp({series})")
        return bool(newest) and float(newest[0]["value"][1]) >= t

    try:
        wait_until(what, check, timeout=60)
    except AssertionError as error:
        raise AssertionError(f"{error}; the last scrape: {prometheus.last_error()}"  # type: ignore[attr-defined]
                             ) from None


def _value(result: list) -> float:
    return sum(float(r["value"][1]) for r in result)


def test_prometheus_sees_the_request_rate_the_provider_saw_and_the_429(
        monkeypatch, drover_env, sim, spawn_worker, prometheus):
    configure(monkeypatch, drover_env, DROVER_RPM=300, DROVER_METRICS_FLUSH_S=0.25)
    from drover.config import get_settings

    settings = get_settings()
    scope = llm_scope(settings.key_alias, settings.model)
    ok = f'drover_llm_calls_total{{scope="{scope}",outcome="ok"}}'
    limited = f'drover_llm_calls_total{{scope="{scope}",outcome="429"}}'
    spawn_worker(concurrency=8)

    # A first small job makes the scope's series exist, so the window below starts on them.
    submit_elsewhere(drover_env, JobSpec(subtasks=["Warm up"], max_tokens=100)).wait(timeout=60)
    warm = sim.stats()["accepted"]
    _wait_for(prometheus, "prometheus to see the warm-up calls", ok, warm)
    start = time.time()
    # the window starts on flat samples (scraped after the warm-up's last call), so
    # increase() counts the whole job
    _scraped_since(prometheus, "flat samples before the job", ok, start + 2)

    subtasks = [f"Research topic {i}" for i in range(20)]
    subtasks[7] += " [[sim:429:1]]"
    # Two calls per sub-agent (the simulator asks for one tool call first): ~40 calls at
    # 300 RPM, about 8 s.
    result = submit_elsewhere(drover_env, JobSpec(
        subtasks=subtasks, max_tokens=150, tools=["lookup_fact"])).wait(timeout=120)
    assert result.counts["ok"] == 20
    provider = sim.stats()
    accepted = provider["accepted"] - warm
    assert provider["rejected_429"] == 1
    _wait_for(prometheus, "prometheus to see the job's last calls", ok, provider["accepted"])
    # and ends on flat ones: extrapolation stays a small share of the window
    last_call = time.time()
    _scraped_since(prometheus, "flat samples after the job", ok, last_call + 3)
    end = time.time()
    window = f"{int(end - start) + 1}s"

    # The request rate over the job, as a dashboard asks for it, times the window.
    seen = _value(prometheus(f"sum(increase({ok}[{window}]))", end))
    print(f"prometheus: increase {seen:.2f} over {window}, simulator accepted {accepted}")
    assert seen == pytest.approx(accepted, rel=0.05), (seen, accepted)
    rate = _value(prometheus(f"sum(rate({ok}[{window}]))", end))
    assert rate * (int(end - start) + 1) == pytest.approx(accepted, rel=0.05)
    assert _value(prometheus(_last(limited))) == 1
    assert _value(prometheus(f"sum(increase({limited}[{window}]))", end)) >= 0.9
    target = _value(prometheus(_last(
        f'drover_scope_target_per_second{{scope="{scope}",dimension="requests"}}')))
    assert target == pytest.approx(300 * 0.95 / 60)
    assert _value(prometheus(_last("drover_workers_alive"))) >= 1
