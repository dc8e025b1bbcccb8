"""`drover stats` and its plot read the limiter's per-second counters, which every worker on
every host writes, and telemetry's calls by outcome: what they report must be what the
provider saw."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from drover import JobSpec, submit
from drover.config import get_settings
from drover.orchestrator.ops.stats import collect, print_stats, rolling_sum, usage_figure
from drover.workers.limiter import llm_scope
from drover.workers.services import services
from tests.helpers import ROOT


def _run_job_with_a_429_and_a_529(sim, worker):  # noqa: ANN001, ANN202
    worker(concurrency=4)
    subtasks = [f"Research topic {i}" for i in range(6)]
    subtasks[1] += " [[sim:529:1]]"
    subtasks[4] += " [[sim:429:1]]"
    result = submit(JobSpec(subtasks=subtasks, max_tokens=200)).wait(timeout=90)
    assert result.counts["ok"] == 6
    services().recorder.flush()  # the in-process worker's calls by outcome, into Redis now
    return result


def _our_scope(usages):  # noqa: ANN001, ANN202
    settings = get_settings()
    scope = llm_scope(settings.key_alias, settings.model)
    (usage,) = [u for u in usages if u.scope == scope]
    return usage


def test_stats_count_what_the_provider_saw_and_each_error_kind(sim, worker):
    _run_job_with_a_429_and_a_529(sim, worker)
    provider = sim.stats()

    usage = _our_scope(collect(services(get_settings())))
    whole = usage.last(len(usage.series))
    # Every request that reached the provider is counted once, failed ones included.
    assert whole["requests"] == (provider["accepted"] + provider["rejected_429"]
                                 + provider["overloaded_529"])
    assert whole["input_tokens"] == provider["input_tokens"]
    assert whole["output_tokens"] == provider["output_tokens"]
    assert (usage.outcomes["429"], usage.outcomes["529"]) == (1, 1)  # telemetry's
    assert (provider["rejected_429"], provider["overloaded_529"]) == (1, 1)
    assert usage.limits["requests"] == pytest.approx(6000)  # DROVER_RPM of this test
    assert usage.leases == 0  # every lease was given back


def test_drover_stats_prints_each_limit_and_the_error_counts(sim, worker):
    _run_job_with_a_429_and_a_529(sim, worker)
    provider = sim.stats()
    console = Console(record=True, width=250)

    assert print_stats(console, services(get_settings())) == 0

    text = console.export_text()
    scope = llm_scope(get_settings().key_alias, get_settings().model)
    assert scope in text
    requests = provider["accepted"] + provider["rejected_429"] + provider["overloaded_529"]
    # "requests | <last 60 s> | <limit> | <use>": the job ran within the last minute.
    assert re.search(rf"requests\s*│\s*{requests}\s*│\s*6,000\s*│", text), text
    assert re.search(r"input tokens\s*│\s*" + f"{provider['input_tokens']:,}", text), text
    # waits, avg wait, then the failed calls by kind: 429s, 529s, 5xxs, 4xxs, conns
    row = next(line for line in text.splitlines() if line.startswith(f"│ {scope}")
               and "(" in line and "%" not in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[3:8] == ["1", "1", "0", "0", "0"], row


def test_usage_plot_draws_rolling_minutes_against_limits_with_error_marks(sim, worker):
    _run_job_with_a_429_and_a_529(sim, worker)
    usage = _our_scope(collect(services(get_settings())))

    fig = usage_figure(get_settings(), [usage])
    ax_requests, ax_input, ax_output = fig.axes
    lines = {line.get_label(): line for line in ax_requests.get_lines()}
    curve = lines["requests/min (rolling 60 s)"].get_ydata()
    assert max(curve) == usage.peak("requests") > 0
    limit = [label for label in lines if label.startswith("rpm limit")]
    assert limit == ["rpm limit 6,000"]
    assert lines[limit[0]].get_ydata()[0] == pytest.approx(6000)
    assert ax_requests.get_title().endswith("(429s 1, 529s 1 in all)")
    assert any(line.get_label().startswith("itpm limit") for line in ax_input.get_lines())
    assert any(line.get_label().startswith("otpm limit") for line in ax_output.get_lines())


def test_drover_stats_cli_writes_the_plot(sim, worker, drover_env, tmp_path):
    _run_job_with_a_429_and_a_529(sim, worker)
    plot = tmp_path / "usage.png"
    out = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "stats", "--plot",
                          str(plot)],
                         cwd=ROOT, env={**os.environ, **drover_env, "COLUMNS": "200"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"usage plot written to {plot}" in out.stdout.replace("\n", "")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_drover_stats_imports_neither_the_sdk_nor_celery(sim, worker, drover_env):
    # `drover stats` reads counters: importing the anthropic SDK (through drover.workers.agent)
    # took seconds on a loaded host. Run after a job, so every part of the output is printed.
    _run_job_with_a_429_and_a_529(sim, worker)
    probe = ("import sys\n"
             "from drover.orchestrator.cli import main\n"
             "code = main(['stats'])\n"
             "print('heavy:', sorted(m for m in ('anthropic', 'celery') if m in sys.modules))\n"
             "sys.exit(code)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT,
                         env={**os.environ, **drover_env, "COLUMNS": "200"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "use of the limits" in out.stdout, out.stdout
    assert "heavy: []" in out.stdout, out.stdout


def test_stats_say_so_when_the_prefix_saw_no_activity(drover_env, monkeypatch, tmp_path):
    monkeypatch.setenv("DROVER_KEY_PREFIX", "drovertest-nothing-here")
    get_settings.cache_clear()
    console = Console(record=True, width=200)
    assert print_stats(console, services(get_settings()), plot=tmp_path / "empty.png") == 0
    assert "no limiter activity" in console.export_text()
    assert (tmp_path / "empty.png").exists()


def test_rolling_sum_is_a_per_minute_rate_at_every_second():
    values = [1] * 90 + [0] * 70
    sums = rolling_sum(values)
    assert sums[0] == 1 and sums[59] == 60 and sums[89] == 60
    assert sums[120] == 29 and sums[149] == 0
    assert rolling_sum([5, 0, 5], window=2) == [5, 5, 5]


def test_demo_prints_its_stats_and_writes_the_plot(tmp_path, redis_url):
    plot = tmp_path / "demo-usage.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DROVER_")}
    env.update(DROVER_REDIS_URL=redis_url, COLUMNS="200")
    out = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "demo",
                          "--subagents", "6",
                          "--keep", "--plot", str(plot)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout.replace("\n", " ")
    assert "use of the limits (per minute)" in text
    assert f"usage plot written to {plot}" in text
    prefix = re.search(r"DROVER_KEY_PREFIX=(drover-demo-[0-9a-f]+)", text)
    assert prefix, text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _delete_prefix(redis_url, prefix.group(1))


def _delete_prefix(redis_url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
