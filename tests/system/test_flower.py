"""Flower on drover's app tells an operator the truth: each sub-agent task shows its job and
index (``sub=<i>/<n> job=<id>``), its outcome first in its result, and why each retry
happened; the join's args are the job id and its result names the failed sub-agents; the search
recipe of docs/monitoring.md finds them. Beyond loopback Flower needs a password, which never
shows up in a command line or a log. Real Flower, real worker processes, the simulator's faults."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from drover import JobSpec, submit
from drover.orchestrator.ops.flower import (
    AUTH_ENV,
    TASK_COLUMNS,
    FlowerRefused,
    default_environment,
    is_loopback,
    resolve,
)
from drover.workers.agent.limits import llm_limits
from drover.workers.limiter import Limiter, llm_scope
from tests.helpers import ROOT, configure, wait_until
from tests.helpers.flower import SECRET, Flower, running_flower


@pytest.fixture
def flower(drover_env: dict[str, str], tmp_path: Path) -> Iterator[Flower]:
    """``drover flower`` on a free loopback port, with basic auth from the environment."""
    with running_flower(drover_env, tmp_path / "flower.log",
                        password=secrets.token_urlsafe(16)) as server:
        yield server


def _limiter_cooldown(env: dict[str, str], seconds: float) -> None:
    """A 429's cooldown on the test's scope, as another job's 429 would leave it."""
    from drover.config import get_settings

    settings = get_settings()
    limiter = Limiter(redis.Redis.from_url(env["DROVER_REDIS_URL"]),
                      prefix=env["DROVER_KEY_PREFIX"])
    limiter.cooldown(llm_scope(settings.key_alias, settings.model),
                     llm_limits(settings, settings.model), seconds)


def run_job_with_faults(flower: Flower, spawn_worker, drover_env, monkeypatch, sim):  # noqa: ANN001, ANN201
    """One job of five sub-agents behind a 429 cooldown: one ok, a 400, two 529s then ok, a
    429 then ok, 529s until its 3 attempts are used up. Returns (handle, worker name, the
    job's tasks in /api/tasks by sub-agent index, the join's task)."""
    # A 0.5 s horizon: the 5 s cooldown below is past it, so it frees the slots (Celery
    # retries). The injected 429 says retry-after 0, so it cools no one else down.
    configure(monkeypatch, drover_env, max_attempts=3, horizon_s=0.5)
    sim.configure(inject_429_retry_after=0)
    spawn_worker(concurrency=4)
    # /api/workers asks the workers over the broker: this one must answer.
    workers = wait_until("the worker in /api/workers",
                         lambda: flower.get("/api/workers?refresh=1")[1] or None)
    assert isinstance(workers, dict)
    (name,) = [n for n in workers if n.startswith("w0-")]
    queues = [q["name"] for q in workers[name].get("active_queues", [])]
    assert drover_env["DROVER_QUEUE"] in queues

    subtasks = [f"{SECRET} research plan {i}{fault}" for i, fault in enumerate(
        ["", " [[sim:400]]", " [[sim:529:2]]", " [[sim:429:1]]", " [[sim:529]]"])]
    # Every sub-agent's first delivery meets it (the fan-out itself runs on the worker).
    _limiter_cooldown(drover_env, 5.0)
    handle = submit(JobSpec(subtasks=subtasks, max_tokens=100))
    result = handle.wait(timeout=120)
    assert [r.status for r in result.results] == ["ok", "failed", "ok", "ok", "failed"]

    def job_tasks() -> tuple[dict, dict] | None:
        status, tasks = flower.get("/api/tasks?limit=1000&search=" + quote(f"args:job={handle.id}"))
        assert status == 200
        done = [t for t in tasks.values() if t.get("state") == "SUCCESS"]
        if len(done) != 6:  # five sub-agents and the join
            return None
        subagents = {int(t["args"].split("sub=")[1].split("/")[0]): t for t in done
                     if t["name"] == "drover.run_subagent"}
        (join,) = [t for t in done if t["name"] == "drover.join_results"]
        return subagents, join

    subagents, join = wait_until("the job's tasks in /api/tasks", job_tasks)
    return handle, name, subagents, join


def test_flower_shows_each_subagents_job_index_outcome_and_why_it_retried(
        flower, spawn_worker, drover_env, sim, monkeypatch):
    handle, name, subagents, join = run_job_with_faults(flower, spawn_worker, drover_env,
                                                        monkeypatch, sim)
    assert sorted(subagents) == [0, 1, 2, 3, 4]
    # Readable args, kept across retries: the job and the sub-agent, nothing else.
    for index, task in subagents.items():
        assert task["args"] == f"sub={index}/5 job={handle.id}", task
        assert task["worker"] == name

    # Outcome at a glance: the result starts with the status, the error in words.
    assert subagents[0]["result"].startswith("{'status': 'ok'")
    assert subagents[1]["result"].startswith(
        "{'status': 'failed', 'error': '400 invalid_request_error: Simulated invalid")
    assert subagents[4]["result"].startswith(
        "{'status': 'failed', 'error': '529 overloaded_error: gave up after 3 attempts")

    # Why a retry: each retried delivery's exception says it.
    assert "limiter cooldown: a 429's retry-after holds every worker" in subagents[0]["exception"]
    assert subagents[0]["retries"] == 1
    assert "529 overloaded_error: backoff" in subagents[2]["exception"]
    assert "attempt 2 of 3" in subagents[2]["exception"] and subagents[2]["retries"] == 3
    assert "429 rate_limit_error: retry-after 0 s" in subagents[3]["exception"]
    assert "attempt 1 of 3" in subagents[3]["exception"]

    # The join: an immutable signature whose args are the job id; its result names the failed.
    assert join["args"] == f"job={handle.id} join of 5"
    assert join["result"].startswith("{'status': 'done', 'failed_indexes': [1, 4], 'counts': ")

    # docs/monitoring.md's recipe finds the job's failed sub-agents, and only them.
    status, failed = flower.get("/api/tasks?search=" + quote(
        f"args:job={handle.id} result:\"'status': 'failed'\""))
    assert status == 200
    assert sorted(t["args"] for t in failed.values()) == [
        f"sub=1/5 job={handle.id}", f"sub=4/5 job={handle.id}"]

    status, not_ok = flower.get("/api/tasks?search=" + quote(
        f"args:job={handle.id} (result:\"'status': 'failed'\" OR "
        f"result:\"'status': 'cancelled'\" OR result:\"'status': 'budget_exceeded'\")"))
    assert status == 200 and len(not_ok) == 2

    # /metrics (which answers without the password) has runtime buckets up to the task limit.
    status, metrics = flower.get("/metrics", auth=False)
    assert status == 200
    assert 'flower_task_runtime_seconds_bucket{le="1800.0",task="drover.run_subagent"' in metrics
    assert SECRET not in metrics and handle.id not in metrics

    # Nothing of the prompts (nor any answer) in any task Flower has.
    status, everything = flower.get("/api/tasks?limit=1000")
    text = json.dumps(everything)
    assert handle.id in text and SECRET not in text and flower.password not in text


def test_flower_runs_with_drovers_defaults_and_metrics_answer_without_a_password(
        flower, drover_env):
    status, page = flower.get("/tasks")
    assert status == 200 and isinstance(page, str)
    columns = [c.split('"')[0] for c in page.split('<th data-column="')[1:]]
    assert columns == TASK_COLUMNS.split(",")
    assert flower.get("/metrics", auth=False)[0] == 200  # no password: docs/monitoring.md warns
    assert flower.get("/api/tasks", auth=False)[0] == 401


def test_drovers_flower_defaults_reach_the_longest_task_and_yield_to_the_user():
    env = default_environment({}, 1800)
    assert env["FLOWER_TASKS_COLUMNS"] == TASK_COLUMNS
    assert "args" in TASK_COLUMNS and "result" in TASK_COLUMNS and "retries" in TASK_COLUMNS
    buckets = [float(b) for b in env["FLOWER_TASK_RUNTIME_METRIC_BUCKETS"].split(",")]
    assert buckets == sorted(buckets) and buckets[-1] == 1800 and buckets[0] <= 1
    assert env["FLOWER_PURGE_OFFLINE_WORKERS"] == "600"
    assert default_environment({}, 45)["FLOWER_TASK_RUNTIME_METRIC_BUCKETS"].endswith(",30,45")
    # Set by the user (environment here; a config file or the command line also win, as
    # Flower reads them after its environment): left alone.
    mine = default_environment({"FLOWER_TASKS_COLUMNS": "name,state",
                                "FLOWER_PURGE_OFFLINE_WORKERS": "60"}, 1800)
    assert set(mine) == {"FLOWER_TASK_RUNTIME_METRIC_BUCKETS"}


def test_flower_api_needs_the_password_and_never_shows_or_logs_it(flower):
    assert flower.get("/api/workers", auth=False)[0] == 401
    flower.password, real = "wrong", flower.password
    assert flower.get("/api/workers")[0] == 401
    flower.password = real
    assert flower.get("/api/workers")[0] == 200

    cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes()
                for pid in _process_tree(flower.proc.pid)]
    assert cmdlines and not any(real.encode() in c for c in cmdlines)
    assert real not in flower.log.read_text()


def _process_tree(pid: int) -> list[int]:
    out = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        for child in children.read_text().split():
            out += _process_tree(int(child))
    return out


@pytest.mark.parametrize("args", [["--address=0.0.0.0"], ["--address", "10.1.2.3"],
                                  ["--address="], ["--port=5555", "--address=::"]])
def test_flower_refuses_to_listen_beyond_loopback_without_a_password(args):
    env = {k: v for k, v in os.environ.items() if "BASIC_AUTH" not in k}
    out = subprocess.run([sys.executable, "-m", "drover.orchestrator.cli", "flower", *args],
                         cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "refusing to start Flower" in out.stderr and AUTH_ENV in out.stderr


def test_flower_options_resolve_to_loopback_by_default_and_auth_through_the_environment():
    argv, credentials = resolve(["--port", "5600"], {})
    assert argv == ["flower", "--address=127.0.0.1", "--port=5600"] and credentials == []
    argv, credentials = resolve(["--address", "0.0.0.0", "--purge_offline_workers=60"],
                                {AUTH_ENV: "ops:pw1-long-enough,viewer:pw2-long-enough"})
    assert argv == ["flower", "--purge_offline_workers=60", "--address=0.0.0.0"]
    assert credentials == ["ops:pw1-long-enough", "viewer:pw2-long-enough"]
    assert not any("pw1" in a for a in argv)
    argv, credentials = resolve(["--basic-auth=ops:pw3-long-enough", "--address=0.0.0.0"], {})
    assert credentials == ["ops:pw3-long-enough"] and not any("pw3" in a for a in argv)
    with pytest.raises(FlowerRefused, match="shorter than 12 characters") as refused:
        resolve(["--address=0.0.0.0"], {AUTH_ENV: "ops:short-pw"})
    assert "short-pw" not in str(refused.value)
    assert resolve([], {AUTH_ENV: "ops:short-pw"})[1] == ["ops:short-pw"]  # loopback: allowed
    with pytest.raises(FlowerRefused, match="user:password") as refused:
        resolve(["--address=0.0.0.0"], {AUTH_ENV: "just-a-password"})
    assert "just-a-password" not in str(refused.value)


def test_loopback_is_told_apart_from_every_interface():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("::")
    assert not is_loopback("10.0.0.5")


def test_a_subagent_sent_again_says_so_in_flowers_args(drover_env, redis_client):
    """The sweep's resend is a new task, not a Celery retry: its args say why it exists."""
    from drover.config import get_settings
    from drover.workers.connections.redis_clients import sync_redis
    from drover.workers.jobs import JobStore
    from drover.workers.tasklayer.tasks import send_again

    settings = get_settings()
    store = JobStore(sync_redis(settings.redis_url), prefix=settings.key_prefix,
                     ttl_s=settings.result_ttl_s)
    job_id = f"resend-{secrets.token_hex(6)}"
    subtasks = [f"{SECRET} a", f"{SECRET} b", f"{SECRET} c"]
    store.specs.create(job_id, JobSpec(subtasks=subtasks), subtasks, status="queued",
                       queue=settings.queue)
    send_again(settings.queue, job_id, 2, 7)  # no worker runs: the message stays queued
    send_again(settings.queue, job_id, "join", 8)
    raws = redis_client.lrange(f"{settings.key_prefix}:celery:{settings.queue}", 0, -1)
    shown = sorted(json.loads(raw)["headers"]["argsrepr"] for raw in raws)
    assert shown == [f"job={job_id} join of 3 resent",
                     f"sub=2/3 job={job_id} resent: its worker or message was lost"]
    assert all(SECRET not in raw for raw in raws)
