"""Flower on drover's app shows every task of a job by its readable name, with ids as the only
arguments, and the workers that ran them; beyond loopback it needs a password, which never
shows up in a command line or a log."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator import JobSpec, submit
from orchestrator.flower import AUTH_ENV, FlowerRefused, is_loopback, resolve
from orchestrator.services import free_port
from tests.conftest import ROOT, stop_process_group, wait_until


@dataclass
class Flower:
    url: str
    user: str
    password: str
    proc: subprocess.Popen
    log: Path

    def get(self, path: str, *, auth: bool = True) -> tuple[int, object]:
        request = urllib.request.Request(self.url + path)
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                body = response.read().decode()
                status = response.status
        except urllib.error.HTTPError as error:
            return error.code, None
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body


@pytest.fixture
def flower(drover_env: dict[str, str], tmp_path: Path) -> Iterator[Flower]:
    """``drover flower`` on a free loopback port, with basic auth from the environment."""
    port = free_port()
    password = secrets.token_urlsafe(16)
    log = tmp_path / "flower.log"
    env = {**os.environ, **drover_env, AUTH_ENV: f"drover:{password}"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "flower", f"--port={port}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Flower(f"http://127.0.0.1:{port}", "drover", password, proc, log)
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return server.get("/healthcheck", auth=False)[0] == 200
            except OSError:
                return False

        wait_until("Flower to answer", up)
        # Its event receiver must be connected before the job runs: events are not replayed.
        wait_until("Flower's event receiver", lambda: "Connected to" in log.read_text())
        yield server
    finally:
        stop_process_group(proc, timeout=15)


def test_flower_lists_the_jobs_tasks_by_name_with_ids_only_and_its_workers(
        flower, spawn_worker, drover_env, sim):
    worker = spawn_worker(concurrency=4)
    # /api/workers asks the workers over the broker: this one must answer.
    workers = wait_until("the worker in /api/workers",
                    lambda: flower.get("/api/workers?refresh=1")[1] or None)
    assert isinstance(workers, dict)
    (name,) = [n for n in workers if n.startswith("w0-")]
    queues = [q["name"] for q in workers[name].get("active_queues", [])]
    assert drover_env["DROVER_QUEUE"] in queues

    subtasks = [f"Secret research plan number {i} for ACME-PRIVATE" for i in range(5)]
    handle = submit(JobSpec(subtasks=subtasks, max_tokens=100))
    assert handle.wait(timeout=90).counts["ok"] == 5

    def job_tasks() -> dict | None:
        status, tasks = flower.get("/api/tasks?limit=1000")
        assert status == 200
        mine = {u: t for u, t in tasks.items() if handle.id in (t.get("args") or "")}
        done = [t for t in mine.values() if t.get("state") == "SUCCESS"]
        return mine if len(done) == 6 else None  # five sub-agents and the join

    tasks = wait_until("the job's tasks in /api/tasks", job_tasks)
    by_name: dict[str, list[dict]] = {}
    for task in tasks.values():
        by_name.setdefault(task["name"], []).append(task)
    assert sorted(by_name) == ["drover.join_results", "drover.run_subagent"]
    assert sorted(t["args"] for t in by_name["drover.run_subagent"]) == [
        f"('{handle.id}', {i})" for i in range(5)]
    assert all(t["worker"] == name for t in tasks.values())
    for task in tasks.values():  # nothing of the prompts travels in a task, nor its answers
        assert "ACME-PRIVATE" not in task["args"] + (task.get("kwargs") or "")
        assert "ACME-PRIVATE" not in (task.get("result") or "")
    # The join's first argument is the chord's header results (Celery puts them there; the
    # join itself reads the records from Redis): ids, status and counts only.
    (join,) = by_name["drover.join_results"]
    assert join["args"].startswith(f"([{{'job_id': '{handle.id}', 'index': 0, 'status': 'ok'")
    worker.send_signal(signal.SIGTERM)


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
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "flower", *args], cwd=ROOT,
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
