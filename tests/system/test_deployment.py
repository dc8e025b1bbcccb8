"""What a deployment looks like: ``drover worker`` and ``drover submit`` as commands, their
settings in a ``.env`` file, a Redis that wants a password.

The subprocesses get no DROVER_* or ANTHROPIC_* variable from the environment: everything
they know comes from the ``.env`` file in their working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.helpers import ROOT
from tests.helpers.ports import free_port

PASSWORD = "pw-" + uuid.uuid4().hex  # what must never show in a log or a record


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[str]:
    """A private redis-server that refuses clients without the password."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--requirepass", PASSWORD, "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(redis.ConnectionError):
            if client.ping():
                break
        assert time.monotonic() < deadline, "redis-server with a password did not start"
        time.sleep(0.05)
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port).ping()  # no password, no entry
    yield url
    client.close()
    proc.kill()
    proc.wait()


def _env_without_settings() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DROVER_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "200"
    return env


def _drover(*args: str) -> list[str]:
    return [sys.executable, "-m", "drover.orchestrator.cli", *args]


def test_drover_worker_and_submit_run_a_job_from_a_dotenv_file_on_a_redis_with_a_password(
        sim, password_redis: str, tmp_path: Path):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    (tmp_path / ".env").write_text("\n".join([
        f"DROVER_REDIS_URL={password_redis}",
        f"DROVER_ANTHROPIC_BASE_URL={sim.url}",
        "ANTHROPIC_API_KEY=sk-test-from-dotenv",
        f"DROVER_QUEUE={queue}",
        "DROVER_KEY_PREFIX=drovertest-dotenv",
        "DROVER_RPM=6000",
    ]) + "\n")
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"subtasks": [f"Assess site {i}" for i in range(6)]}))
    env = _env_without_settings()
    worker = subprocess.Popen(_drover("worker", "--concurrency", "4"), cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        submitted = subprocess.run(_drover("submit", "job.json", "--wait"), cwd=tmp_path,
                                   env=env, capture_output=True, text=True, timeout=120)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # how it stops is not what this test is about
        log, _ = worker.communicate(timeout=30)

    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + log
    assert "ok=6" in submitted.stdout, submitted.stdout
    assert sim.stats()["accepted"] == 6  # the worker called the simulator named in .env
    for output in (submitted.stdout, submitted.stderr, log):
        assert PASSWORD not in output and "sk-test-from-dotenv" not in output
    # The job lives in the password-protected Redis, under the prefix from .env.
    client = redis.Redis.from_url(password_redis, decode_responses=True)
    assert any(client.scan_iter(match="drovertest-dotenv:*", count=1000))
    client.close()
